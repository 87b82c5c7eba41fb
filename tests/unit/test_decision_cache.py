"""A reconcile that changed nothing stands while nothing it was decided from changes
(control/decision_cache.py)."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

import kopf
import pytest

from psoperator.control import reconciler
from psoperator.control.state import OperatorState
from psoperator.metrics.registry import Metrics
from psoperator.observe.views import parse_pod
from psoperator.plan.stages import plan_reconcile
from tests.unit import builders
from tests.unit.test_reconciler import PodsKube, _as_created, _owned

KEY = ("team-a", "ctr")


class RunningJob:
    """A Running job in the watch cache, with its children and pods, and the API behind it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(kopf, "event", lambda *_, **__: None)
        self.plans: list[str] = []

        def counting(job: Any, *args: Any, **kwargs: Any) -> Any:
            self.plans.append(job["metadata"]["resourceVersion"])
            return plan_reconcile(job, *args, **kwargs)

        monkeypatch.setattr(reconciler, "plan_reconcile", counting)
        job = builders.with_status(builders.job(), phase="Pending")
        job["metadata"]["resourceVersion"] = "7"
        children = _as_created(job)
        owners = {c["metadata"]["name"]: c["metadata"]["uid"] for c in children}
        chief = _owned(builders.pod("chief", 0, attempt=0), "Job", "ctr-chief", owners["ctr-chief"])
        self.pods = [chief] + [
            _owned(builders.pod(role, i), "StatefulSet", f"ctr-{role}", owners[f"ctr-{role}"])
            for role in ("ps", "worker")
            for i in range(2)
        ]
        for pod in self.pods:
            pod["metadata"]["resourceVersion"] = "1"
        self.kube = PodsKube(job, children, self.pods)
        self.state = OperatorState(self.kube, Metrics())
        self.state.cache.job_seen(*KEY, job)
        for child in children:
            self.state.cache.child_seen("ADDED", child)
        for pod in self.pods:
            self.pod_seen(pod)

    def pod_seen(self, pod: Any) -> None:
        self.state.cache.pod_seen("MODIFIED", pod, parse_pod(pod))

    def reconcile(self) -> None:
        # Read fresh lately: the cache decides
        self.state.job(KEY, logging.getLogger("test")).read_at = time.monotonic()
        asyncio.run(reconciler.reconcile_once(self.state, *KEY, logging.getLogger("test")))

    def settle(self) -> None:
        """Reconcile until one changes nothing (the job's status is as the plan has it)."""
        for _ in range(5):
            # No status-write spacing in the way
            self.state.job(KEY, logging.getLogger("test")).written_at = -math.inf
            self.reconcile()
            if self.state.jobs[KEY].settled is not None:
                return
        raise AssertionError("the job never settled")


def test_a_job_at_rest_is_decided_once_and_then_costs_no_plan_and_no_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job = RunningJob(monkeypatch)
    job.settle()
    plans, requests = len(job.plans), len(job.kube.wire.sent)
    for _ in range(3):
        job.reconcile()
    assert len(job.plans) == plans and len(job.kube.wire.sent) == requests


def test_a_pod_that_changed_is_decided_again(monkeypatch: pytest.MonkeyPatch) -> None:
    job = RunningJob(monkeypatch)
    job.settle()
    plans = len(job.plans)
    restarted = builders.pod("worker", 1, restarts=1)
    worker = job.pods[-1]
    worker["status"] = restarted["status"]
    worker["metadata"]["resourceVersion"] = "2"
    job.pod_seen(worker)
    job.reconcile()
    assert len(job.plans) > plans  # (twice: it acts, so it reads fresh and decides again)


def test_a_settled_decision_ends_when_its_clock_says(monkeypatch: pytest.MonkeyPatch) -> None:
    job = RunningJob(monkeypatch)
    job.settle()
    settled = job.state.jobs[KEY].settled
    assert settled is not None
    plans = len(job.plans)
    job.state.jobs[KEY].settled = type(settled)(settled.inputs, time.monotonic() - 1, settled.plan)
    job.reconcile()
    assert len(job.plans) == plans + 1


def test_a_fresh_read_always_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    job = RunningJob(monkeypatch)
    job.settle()
    plans = len(job.plans)
    job.state.jobs[KEY].read_at = None
    asyncio.run(reconciler.reconcile_once(job.state, *KEY, logging.getLogger("test")))
    assert len(job.plans) == plans + 1


def test_a_job_tracked_by_an_earlier_version_is_decided_and_then_settles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """status.tracking.pods as versions before the records wrote it ("uid/restarts/sidecar restarts"):
    read as records, as the plan reads them (e2e/test_upgrade caught a reconcile failing on it)."""
    job = RunningJob(monkeypatch)
    job.settle()
    cached = job.state.cache.jobs[KEY].job
    pods = cached["status"]["tracking"]["pods"]
    cached["status"]["tracking"]["pods"] = {name: f"{entry['uid']}/0/0" for name, entry in pods.items()}
    job.kube.job = cached
    job.state.jobs[KEY].settled = None
    job.settle()
