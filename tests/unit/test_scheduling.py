"""Unschedulable pods: which are waiting, how they are told, and when the wait is too long."""

from __future__ import annotations

from datetime import timedelta

from psoperator.api.models import PSTrainingJobSpec
from psoperator.policies import scheduling
from tests.unit.builders import NOW, chief_job, job, observed, pod, running_cluster

FULL = "0/4 nodes are available: 4 Insufficient memory."


def _spec(timeout: int | None) -> PSTrainingJobSpec:
    return PSTrainingJobSpec.model_validate(job(failurePolicy={"schedulingTimeoutSeconds": timeout})["spec"])


def test_only_pods_of_the_current_attempt_that_wait_are_unscheduled() -> None:
    old_chief = pod("chief", 0, attempt=0, phase="Pending", unschedulable=FULL)
    waiting = [pod("worker", index, phase="Pending", unschedulable=FULL) for index in range(7)]
    seen = observed([old_chief, *running_cluster(attempt=1)[:3], *waiting], chief_job(1))
    pods = scheduling.unscheduled(seen, attempt=1)
    assert [p.name for p in pods] == [f"ctr-worker-{i}" for i in range(7)]
    assert scheduling.describe(pods).endswith("; and 2 more")
    assert "worker 0 (ctr-worker-0): Unschedulable: 0/4 nodes are available" in scheduling.describe(pods)


def test_the_timeout_is_for_the_chief_and_the_ps_only() -> None:
    long_ago = NOW - timedelta(hours=1)
    worker = pod("worker", 0, phase="Pending", unschedulable=FULL, created=long_ago)
    ps = pod("ps", 1, phase="Pending", unschedulable=FULL, created=long_ago)
    assert scheduling.timed_out(_spec(60), scheduling.unscheduled(observed([worker]), 0), NOW) is None
    late = scheduling.timed_out(_spec(60), scheduling.unscheduled(observed([worker, ps]), 0), NOW)
    assert late is not None and late.name == "ctr-ps-1"
    assert scheduling.timed_out(_spec(None), scheduling.unscheduled(observed([ps]), 0), NOW) is None
