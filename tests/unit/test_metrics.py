"""The metrics: readings computed from a reconcile, put on the registry, and gone with their job."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from psoperator import cli
from psoperator.api.models import PSTrainingJobStatus, ReplicaStatus
from psoperator.api.vocabulary import Phase
from psoperator.contract import ProgressReport
from psoperator.kube import StaleJob
from psoperator.metrics import doc as metrics_doc
from psoperator.metrics.readings import STEP_RATE_IDLE_SECONDS, JobReading, read_job, step_rate
from psoperator.metrics.registry import Metrics
from psoperator.plan.stages import plan_reconcile
from psoperator.timeutil import format_time
from tests.unit.builders import (
    NOW,
    came_up,
    chief_job,
    job,
    observed,
    pod,
    running_cluster,
    with_status,
)
from tests.unit.test_kube import RecordingKube

ROOT = Path(__file__).resolve().parents[2]
BASE = running_cluster()
Obj = dict[str, Any]


def samples(metrics: Metrics, name: str, **labels: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples called `name` whose labels include `labels`, by their sorted labels."""
    found = {}
    for family in metrics.registry.collect():
        for s in family.samples:
            if s.name == name and labels.items() <= s.labels.items():
                found[tuple(sorted(s.labels.items()))] = s.value
    return found


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    matching = samples(metrics, name, **labels)
    assert len(matching) <= 1, matching
    return next(iter(matching.values()), None)


def series_count(metrics: Metrics) -> int:
    """Every sample of every family: a histogram's buckets, sum and count each count."""
    return sum(len(family.samples) for family in metrics.registry.collect())


def _named(obj: Obj, name: str) -> Obj:
    renamed = {**obj, "metadata": {**obj["metadata"], "name": name}}
    renamed["metadata"]["creationTimestamp"] = format_time(NOW - timedelta(seconds=20))
    return renamed


def _a_job_lifetime(metrics: Metrics, name: str) -> None:
    """One job through the real pure path: created, running with progress, a PS OOMKilled and the chief
    restarted, recovered, succeeded; each reconcile's reading recorded as the handler does."""
    oom = {"exitCode": 137, "reason": "OOMKilled", "finishedAt": format_time(NOW - timedelta(seconds=2))}
    lost = [
        pod("ps", 1, restarts=1, last_terminated=oom) if p["metadata"]["name"] == "ctr-ps-1" else p
        for p in BASE
    ]
    report = ProgressReport(
        step=200, checkpoint_step=100, checkpoint_time=(NOW - timedelta(seconds=30)).timestamp()
    )
    steps = [
        (observed([], None), None),
        (observed(BASE, chief_job()), report),
        (observed(lost, chief_job()), None),
        (observed(running_cluster(attempt=1), chief_job(1)), None),
        (observed(running_cluster(attempt=1), chief_job(1, complete=True)), None),
    ]
    current = _named(job(), name)
    for seen, progress in steps:
        plan = plan_reconcile(current, seen, progress, NOW)
        metrics.record("team-a", name, read_job(current, plan, NOW))
        current = {**current, "status": plan.status}


def test_a_job_lifetime_reads_in_the_metrics() -> None:
    metrics = Metrics(clock=lambda: NOW.timestamp())
    _a_job_lifetime(metrics, "ctr")
    job_labels = {"namespace": "team-a", "psjob": "ctr"}
    assert value(metrics, "psoperator_jobs_created_total", namespace="team-a") == 1
    assert value(metrics, "psoperator_jobs_restarted_total", reason="ParameterServerLost") == 1
    assert value(metrics, "psoperator_jobs_succeeded_total", namespace="team-a") == 1
    assert (
        value(metrics, "psoperator_job_pod_restarts_total", role="ps", reason="OOMKilled", **job_labels) == 1
    )
    assert value(metrics, "psoperator_job_replicas_ready", role="ps", **job_labels) == 2
    assert value(metrics, "psoperator_job_replicas_desired", role="worker", **job_labels) == 2
    assert value(metrics, "psoperator_job_phase", phase="Succeeded", **job_labels) == 1
    assert value(metrics, "psoperator_job_phase", phase="Running", **job_labels) == 0
    assert value(metrics, "psoperator_jobs", namespace="team-a", phase="Succeeded") == 1
    assert value(metrics, "psoperator_job_step", **job_labels) == 200
    assert value(metrics, "psoperator_job_checkpoint_step", **job_labels) == 100
    assert value(metrics, "psoperator_job_checkpoint_age_seconds", **job_labels) == 30
    # From the OOM kill's finishedAt, 2 s before the reconcile that saw the new chief run.
    assert value(metrics, "psoperator_job_recovery_seconds_sum", **job_labels) == 2
    assert value(metrics, "psoperator_job_startup_seconds_sum", namespace="team-a") == 20
    assert value(metrics, "psoperator_job_max_restarts", **job_labels) == 5  # the default


def test_a_reading_with_no_news_keeps_the_last_values_and_still_counts() -> None:
    """A gauge reads as the last reading that had news of it: a reconcile without the chief's report
    (no step, no rate) or without a role leaves the last step, rate and counts standing."""
    metrics = Metrics(clock=lambda: NOW.timestamp())
    labels = {"namespace": "team-a", "psjob": "ctr"}
    ps = ReplicaStatus(desired=2, ready=2, running=2)
    reading = JobReading(
        phase=Phase.RUNNING,
        step=10,
        step_rate=2.5,
        replicas={"ps": ps},
        restarted_reason="ParameterServerLost",
    )
    metrics.record("team-a", "ctr", reading)
    metrics.record("team-a", "ctr", JobReading(phase=Phase.RUNNING, restarted_reason="ParameterServerLost"))
    assert value(metrics, "psoperator_job_step", **labels) == 10
    assert value(metrics, "psoperator_job_step_rate", **labels) == 2.5
    assert value(metrics, "psoperator_job_replicas_ready", role="ps", **labels) == 2
    assert value(metrics, "psoperator_jobs_restarted_total", reason="ParameterServerLost") == 2
    metrics.record("team-a", "ctr", JobReading(phase=Phase.RUNNING, step=11, step_rate=0.0))
    assert value(metrics, "psoperator_job_step", **labels) == 11
    assert value(metrics, "psoperator_job_step_rate", **labels) == 0


def test_500_jobs_created_and_deleted_leave_the_series_count_where_it_was() -> None:
    metrics = Metrics(clock=lambda: NOW.timestamp())
    _a_job_lifetime(metrics, "warm-up")  # the namespace's own counters exist from here on
    metrics.forget("team-a", "warm-up")
    baseline = series_count(metrics)
    for i in range(500):
        _a_job_lifetime(metrics, f"job-{i}")
    jobs = [s.labels["psjob"] for f in metrics.registry.collect() for s in f.samples if "psjob" in s.labels]
    assert len(jobs) == 500 * len([j for j in jobs if j == "job-0"]) > 500 * 30
    pod_names = {p["metadata"]["name"] for p in BASE}
    labels = {
        k: v for family in metrics.registry.collect() for s in family.samples for k, v in s.labels.items()
    }
    assert "pod" not in labels and not pod_names & set(labels.values())
    for i in range(500):
        metrics.forget("team-a", f"job-{i}")
    assert series_count(metrics) == baseline
    assert value(metrics, "psoperator_jobs_created_total", namespace="team-a") == 501


def test_a_failed_job_counts_with_its_reason() -> None:
    started = format_time(NOW - timedelta(seconds=120))
    running = with_status(
        job(runPolicy={"activeDeadlineSeconds": 60}), **came_up(phase="Running", startTime=started)
    )
    plan = plan_reconcile(running, observed(BASE, chief_job()), None, NOW)
    reading = read_job(running, plan, NOW)
    assert (reading.failed_reason, reading.succeeded, reading.created) == ("DeadlineExceeded", False, False)
    again = read_job({**running, "status": plan.status}, plan, NOW)
    assert again.failed_reason is None  # counted once, when the phase changes


def _status(step: int | None, seconds_ago: float) -> Obj:
    return {"step": step, "stepTime": format_time(NOW - timedelta(seconds=seconds_ago))}


@pytest.mark.parametrize(
    ("before", "after", "rate"),
    [
        (_status(100, 10), _status(150, 0), 5.0),  # 50 steps since step 100 was first seen, 10 s ago
        (_status(150, 30), _status(150, 30), None),  # no news yet: the last rate stands
        (_status(150, STEP_RATE_IDLE_SECONDS), _status(150, STEP_RATE_IDLE_SECONDS), 0.0),  # stalled
        (_status(150, 10), _status(100, 0), None),  # back to a checkpoint after a restart
        (_status(None, 10), _status(100, 0), None),  # the first report
    ],
)
def test_step_rate(before: Obj, after: Obj, rate: float | None) -> None:
    old, new = PSTrainingJobStatus.model_validate(before), PSTrainingJobStatus.model_validate(after)
    assert step_rate(old, new, NOW) == rate


def test_checkpoint_age_is_computed_when_scraped() -> None:
    clock = [NOW.timestamp()]
    metrics = Metrics(clock=lambda: clock[0])
    metrics.record("ns", "ctr", JobReading(phase=Phase.RUNNING, checkpoint_time=NOW.timestamp() - 5))
    assert value(metrics, "psoperator_job_checkpoint_age_seconds", psjob="ctr") == 5
    clock[0] += 60
    assert value(metrics, "psoperator_job_checkpoint_age_seconds", psjob="ctr") == 65


def test_operator_metrics_count_reconciles_and_api_requests() -> None:
    metrics = Metrics()
    metrics.reconciled("ok", 0.02)
    metrics.reconciled("error", 0.5)
    kube = RecordingKube()
    kube.on_response = metrics.api_request
    kube.list_children("ns", "ctr", "Service")
    kube.wire.status = 409
    with pytest.raises(StaleJob):  # a 409 on a status write: the job changed since it was read
        kube.patch_job_status("ns", "ctr", {"phase": "Running"}, "7")
    assert value(metrics, "psoperator_reconciles_total", outcome="error") == 1
    assert value(metrics, "psoperator_reconcile_duration_seconds_count", outcome="ok") == 1
    requests = "psoperator_api_requests_total"
    assert value(metrics, requests, verb="GET", resource="services", code="200") == 1
    assert value(metrics, requests, verb="PATCH", resource="pstrainingjobs/status", code="409") == 1
    durations = "psoperator_api_request_duration_seconds_count"
    assert value(metrics, durations, verb="GET", resource="services") == 1
    assert value(metrics, durations, verb="PATCH", resource="pstrainingjobs/status") == 1


def test_the_reference_lists_every_metric_registered() -> None:
    metrics = Metrics()
    metrics.record("ns", "ctr", JobReading(phase=Phase.RUNNING, checkpoint_time=0.0))
    registered = {f.name for f in metrics.registry.collect()}
    documented = {d.name.removesuffix("_total") for d in metrics.reference}
    assert registered == documented
    assert all(d.name.startswith("psoperator_") and d.help.endswith(".") for d in metrics.reference)


def test_the_committed_reference_is_generated_from_the_registry() -> None:
    committed = (ROOT / metrics_doc.DOC_FILE).read_text()
    stale = f"{metrics_doc.DOC_FILE} is stale: run `psoperator metrics --write`"
    assert committed == metrics_doc.render(), stale


def test_psoperator_metrics_prints_the_reference(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["metrics"]) == 0
    assert capsys.readouterr().out == metrics_doc.render()
