"""The recovery matrix, row by row: observed failures in, the decision out."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from psoperator.api.models import PSTrainingJobSpec, PSTrainingJobStatus, TrackedPod, Tracking
from psoperator.observe.failures import classify_pod_failure, detect_failures
from psoperator.observe.views import parse_pod
from psoperator.policies.recovery import RecoveryAction, decide
from psoperator.status.tracking import next_start_errors, next_tracking, tracked
from psoperator.timeutil import format_time
from tests.unit.builders import NOW, chief_job, job, observed, pod, running_cluster, tracking_of


def _status(**fields: Any) -> PSTrainingJobStatus:
    return PSTrainingJobStatus.model_validate({"phase": "Running", **fields})


def _spec(**overrides: Any) -> PSTrainingJobSpec:
    return PSTrainingJobSpec.model_validate(job(**overrides)["spec"])


BASE = running_cluster()
TRACKED = tracking_of(BASE)
OOM = {"exitCode": 137, "reason": "OOMKilled", "message": ""}


def _with(role: str, index: int, **changes: Any) -> list[dict[str, Any]]:
    """The running cluster with one pod replaced by a changed one."""
    return [
        pod(role, index, **changes) if (p["metadata"]["name"] == f"ctr-{role}-{index}") else p for p in BASE
    ]


@pytest.mark.parametrize(
    "pods,job_obj,action,reason,counted",
    [
        pytest.param(BASE, chief_job(), RecoveryAction.NONE, "", False, id="all-healthy"),
        pytest.param(
            _with("worker", 1, restarts=1, last_terminated=OOM),
            chief_job(),
            RecoveryAction.RECORD,
            "WorkerLost",
            False,
            id="worker-restarted-in-place",
        ),
        pytest.param(
            [p for p in BASE if p["metadata"]["name"] != "ctr-worker-0"],
            chief_job(),
            RecoveryAction.RECORD,
            "WorkerLost",
            False,
            id="worker-deleted",
        ),
        pytest.param(
            _with("worker", 0, phase="Failed", disruption="EvictionByEvictionAPI"),
            chief_job(),
            RecoveryAction.RECORD,
            "WorkerLost",
            False,
            id="worker-evicted",
        ),
        pytest.param(
            _with("ps", 1, restarts=1, last_terminated=OOM),
            chief_job(),
            RecoveryAction.RESTART_FROM_CHECKPOINT,
            "ParameterServerLost",
            True,
            id="ps-restarted-in-place",
        ),
        pytest.param(
            _with("ps", 0, uid="new-uid"),
            chief_job(),
            RecoveryAction.RESTART_FROM_CHECKPOINT,
            "ParameterServerLost",
            True,
            id="ps-replaced",
        ),
        pytest.param(
            [p for p in BASE if p["metadata"]["name"] != "ctr-ps-1"],
            chief_job(),
            RecoveryAction.RESTART_FROM_CHECKPOINT,
            "ParameterServerLost",
            True,
            id="ps-deleted",
        ),
        pytest.param(
            _with("ps", 0, phase="Failed", disruption="PreemptionByScheduler"),
            chief_job(),
            RecoveryAction.RESTART_FROM_CHECKPOINT,
            "ParameterServerLost",
            False,
            id="ps-preempted",
        ),
        pytest.param(
            [
                pod("chief", 0, attempt=0, phase="Failed", terminated={"exitCode": 138, "reason": "Error"}),
                *BASE[1:],
            ],
            chief_job(failed="BackoffLimitExceeded"),
            RecoveryAction.RESTART_FROM_CHECKPOINT,
            "ChiefFailed",
            True,
            id="chief-retryable-exit",
        ),
        pytest.param(
            [
                pod("chief", 0, attempt=0, phase="Failed", terminated={"exitCode": 2, "reason": "Error"}),
                *BASE[1:],
            ],
            chief_job(failed="PodFailurePolicy"),
            RecoveryAction.FAIL,
            "PermanentExitCode",
            False,
            id="chief-permanent-exit",
        ),
    ],
)
def test_recovery_matrix(
    pods: list[dict[str, Any]], job_obj: dict[str, Any], action: RecoveryAction, reason: str, counted: bool
) -> None:
    decision = decide(_spec(), _status(tracking=TRACKED), observed(pods, job_obj), NOW)
    assert (decision.action, decision.reason, decision.counted) == (action, reason, counted)


def test_oom_is_reported_with_exit_code() -> None:
    decision = decide(
        _spec(),
        _status(tracking=TRACKED),
        observed(_with("ps", 1, restarts=1, last_terminated=OOM), chief_job()),
        NOW,
    )
    assert decision.failure is not None
    assert (decision.failure.reason, decision.failure.exit_code, decision.failure.index) == (
        "OOMKilled",
        137,
        1,
    )


def test_ps_failure_before_the_ps_were_established_is_only_recorded() -> None:
    tracking = {**TRACKED, "psEstablished": False}
    decision = decide(
        _spec(), _status(tracking=tracking), observed(_with("ps", 0, uid="new"), chief_job()), NOW
    )
    assert decision.action is RecoveryAction.RECORD


def test_a_restart_already_recorded_is_not_made_again() -> None:
    """Status says attempt 1 while the failed Job is attempt 0: the restart is under way, not new."""
    pods = [
        pod("chief", 0, attempt=0, phase="Failed", terminated={"exitCode": 138, "reason": "Error"}),
        *BASE[1:],
    ]
    status = _status(restarts=1, tracking={"psEstablished": False, "pods": TRACKED["pods"]})
    decision = decide(_spec(), status, observed(pods, chief_job(0, failed="BackoffLimitExceeded")), NOW)
    assert decision.action is RecoveryAction.NONE


def test_budget_runs_out_without_progress() -> None:
    status = _status(
        tracking=TRACKED, restarts=3, countedRestarts=2, restartCheckpointStep=100, checkpoint={"step": 100}
    )
    pods = _with("ps", 0, uid="again")
    spec = _spec(failurePolicy={"maxRestarts": 2})
    decision = decide(spec, status, observed(pods, chief_job(3)), NOW)
    assert (decision.action, decision.reason) == (RecoveryAction.FAIL, "RestartsExhausted")


def test_progress_resets_the_budget() -> None:
    status = _status(
        tracking=TRACKED, restarts=3, countedRestarts=2, restartCheckpointStep=100, checkpoint={"step": 200}
    )
    decision = decide(
        _spec(failurePolicy={"maxRestarts": 2}),
        status,
        observed(_with("ps", 0, uid="again"), chief_job(3)),
        NOW,
    )
    assert decision.action is RecoveryAction.RESTART_FROM_CHECKPOINT
    assert decision.counted is False


def _seen_stuck(pods: list[dict[str, Any]], tracking: dict[str, Any], since: timedelta) -> dict[str, Any]:
    """The tracking of a reconcile that first saw these pods unable to start `since` ago."""
    seen = observed(pods, chief_job())
    errors = next_start_errors(_status(tracking=tracking).tracking, seen, 0, NOW - since, 300)
    return {**tracking, "startErrors": errors}


def test_image_pull_error_fails_after_the_grace_period_only() -> None:
    pods = [pod("chief", 0, attempt=0, waiting="ErrImagePull"), *BASE[1:]]
    spec = _spec(failurePolicy={"startupErrorGraceSeconds": 300})
    young = _seen_stuck(pods, TRACKED, timedelta(seconds=30))
    assert (
        decide(spec, _status(tracking=young), observed(pods, chief_job()), NOW).action is RecoveryAction.NONE
    )
    old = _seen_stuck(pods, TRACKED, timedelta(seconds=400))
    decision = decide(spec, _status(tracking=old), observed(pods, chief_job()), NOW)
    assert (decision.action, decision.reason) == (RecoveryAction.FAIL, "StartupError")


def test_the_grace_runs_from_the_waiting_state_not_from_the_pods_creation() -> None:
    """A PS restarted in place whose image no longer pulls (a registry blip on :latest): its pod is
    ten minutes old, its waiting state new."""
    tracked = tracking_of(_with("ps", 1, restarts=1))
    pods = _with("ps", 1, restarts=1, waiting="ErrImagePull")
    spec = _spec(failurePolicy={"startupErrorGraceSeconds": 300})
    first = decide(spec, _status(tracking=tracked), observed(pods, chief_job()), NOW)
    assert first.action is RecoveryAction.NONE
    seen = _seen_stuck(pods, tracked, timedelta(seconds=301))
    decision = decide(spec, _status(tracking=seen), observed(pods, chief_job()), NOW)
    assert (decision.action, decision.reason) == (RecoveryAction.FAIL, "StartupError")


def test_a_new_waiting_episode_starts_the_grace_again() -> None:
    """The container ran in between (one more restart): the old sighting no longer counts."""
    before = _with("ps", 1, restarts=1, waiting="ErrImagePull")
    seen = _seen_stuck(before, tracking_of(_with("ps", 1, restarts=1)), timedelta(seconds=900))
    again = _with("ps", 1, restarts=2, waiting="ImagePullBackOff")
    errors = next_start_errors(_status(tracking=seen).tracking, observed(again, chief_job()), 0, NOW, 300)
    assert (errors["ctr-ps-1"].restarts, errors["ctr-ps-1"].since) == (2, format_time(NOW))


def test_a_worker_that_cannot_start_is_recorded_once_not_fatal() -> None:
    tracked = tracking_of(_with("worker", 0, restarts=3))
    pods = _with("worker", 0, restarts=3, waiting="ImagePullBackOff")
    seen = _seen_stuck(pods, tracked, timedelta(seconds=301))
    decision = decide(_spec(), _status(tracking=seen), observed(pods, chief_job()), NOW)
    assert (decision.action, decision.reason) == (RecoveryAction.RECORD, "WorkerLost")
    assert decision.failure is not None and decision.failure.reason == "ImagePullBackOff"
    told = {
        **seen,
        "startErrors": next_start_errors(
            _status(tracking=seen).tracking, observed(pods, chief_job()), 0, NOW, 300
        ),
    }
    assert (
        decide(_spec(), _status(tracking=told), observed(pods, chief_job()), NOW).action
        is RecoveryAction.NONE
    )


def test_classify_ignores_a_healthy_pod_and_unknown_objects() -> None:
    healthy = parse_pod(pod("ps", 0))
    assert classify_pod_failure(TrackedPod(uid=healthy.uid), healthy) is None
    assert classify_pod_failure(None, healthy) is None
    odd = parse_pod(
        {"metadata": {"name": "x", "labels": {"psoperator.io/role": "nonsense"}}, "status": "garbage"}
    )
    assert classify_pod_failure(TrackedPod(uid="uid"), odd) is None


def test_detect_failures_reports_each_vanished_pod_once() -> None:
    pods = [parse_pod(p) for p in BASE if p["metadata"]["name"] != "ctr-worker-1"]
    failures = detect_failures(Tracking.model_validate(TRACKED).pods, pods)
    assert [(f.pod, f.reason) for f in failures] == [("ctr-worker-1", "Deleted")]


def test_tracking_establishes_ps_only_when_all_run_under_the_current_chief() -> None:
    status = _status(tracking={"psEstablished": False, "pods": {}})
    tracking = next_tracking(status, observed(BASE, chief_job()), 2, restarted=False)
    assert tracking.ps_established
    assert set(tracking.pods) == {"ctr-ps-0", "ctr-ps-1", "ctr-worker-0", "ctr-worker-1"}
    one_ps = [p for p in BASE if p["metadata"]["name"] != "ctr-ps-1"]
    assert next_tracking(status, observed(one_ps, chief_job()), 2, restarted=False).ps_established is False
    restarted = next_tracking(_status(tracking=TRACKED), observed(BASE, chief_job()), 2, restarted=True)
    assert restarted.ps_established is False


def test_a_replaced_pod_is_classified_by_how_the_watch_saw_it_end() -> None:
    """The StatefulSet replaced the PS before the reconcile: its last watched state tells why."""
    gone = parse_pod(pod("ps", 0, phase="Failed", terminated=OOM))
    preempted = parse_pod(pod("ps", 1, deleting=True, disruption="PreemptionByScheduler"))
    pods = [parse_pod(p) for p in _with("ps", 0, uid="fresh")]
    pods = [p for p in pods if p.name != "ctr-ps-1"]
    failures = detect_failures(
        Tracking.model_validate(TRACKED).pods, pods, {gone.uid: gone, preempted.uid: preempted}
    )
    assert [(f.pod, f.reason, f.exit_code, f.disruption) for f in failures] == [
        ("ctr-ps-0", "OOMKilled", 137, False),
        ("ctr-ps-1", "Preempted", None, True),
    ]


def test_a_sidecar_restart_in_a_ps_is_recorded_and_restarts_nothing() -> None:
    tracked = tracking_of(_with("ps", 0, sidecar={"restartCount": 0}))
    pods = _with("ps", 0, sidecar={"restartCount": 1, "lastState": {"terminated": OOM}})
    decision = decide(_spec(), _status(tracking=tracked), observed(pods, chief_job()), NOW)
    assert (decision.action, decision.reason) == (RecoveryAction.RECORD, "SidecarRestarted")
    [failure] = decision.recorded
    assert (failure.role.value, failure.pod, failure.reason, failure.sidecar) == (
        "ps",
        "ctr-ps-0",
        "SidecarRestarted",
        True,
    )
    assert "fluent-bit" in failure.message
    # Recorded once: the next reconcile tracks the sidecar's count too.
    tracking = next_tracking(_status(tracking=tracked), observed(pods, chief_job()), 2, restarted=False)
    again = decide(
        _spec(), _status(tracking=tracking.model_dump(by_alias=True)), observed(pods, chief_job()), NOW
    )
    assert again.action is RecoveryAction.NONE


def test_a_ps_trainer_restart_is_classified_by_its_own_last_state_when_a_sidecar_sorts_first() -> None:
    tracked = tracking_of(_with("ps", 1, sidecar={"restartCount": 0}))
    pods = _with("ps", 1, restarts=1, last_terminated=OOM, sidecar={"restartCount": 0})
    decision = decide(_spec(), _status(tracking=tracked), observed(pods, chief_job()), NOW)
    assert (decision.action, decision.reason) == (
        RecoveryAction.RESTART_FROM_CHECKPOINT,
        "ParameterServerLost",
    )
    assert decision.failure is not None
    assert (decision.failure.reason, decision.failure.exit_code) == ("OOMKilled", 137)


def test_the_chiefs_exit_code_is_the_trainers_when_a_sidecar_sorts_first() -> None:
    """The trainer exits 138 (retryable); the sidecar, killed with the pod, exits 1: restart, not fail."""
    chief = pod(
        "chief",
        0,
        attempt=0,
        phase="Failed",
        terminated={"exitCode": 138, "reason": "Error"},
        sidecar={"state": {"terminated": {"exitCode": 1, "reason": "Error"}}},
    )
    pods = [chief, *BASE[1:]]
    decision = decide(
        _spec(), _status(tracking=TRACKED), observed(pods, chief_job(failed="BackoffLimitExceeded")), NOW
    )
    assert (decision.action, decision.reason) == (RecoveryAction.RESTART_FROM_CHECKPOINT, "ChiefFailed")
    assert decision.failure is not None and decision.failure.exit_code == 138


def test_tracking_entries_from_before_sidecars_were_tracked_are_understood() -> None:
    """An entry `uid/restarts` (older operator, restarts of every container): no failure is invented."""
    current = parse_pod(pod("ps", 0, restarts=1, sidecar={"restartCount": 2}))
    assert classify_pod_failure(TrackedPod(uid=current.uid, restarts=3), current) is None


@pytest.mark.parametrize("code,job_reason", [(1, "PodFailurePolicy"), (138, "BackoffLimitExceeded")])
def test_a_chief_failure_with_a_ps_loss_is_explained_by_it(code: int, job_reason: str) -> None:
    """The PS is the cause: restart (not fail on the chief's permanent code), and record both."""
    chief = pod("chief", 0, attempt=0, phase="Failed", terminated={"exitCode": code, "reason": "Error"})
    pods = [chief, *_with("ps", 1, restarts=1, last_terminated=OOM)[1:]]
    decision = decide(_spec(), _status(tracking=TRACKED), observed(pods, chief_job(failed=job_reason)), NOW)
    assert decision.action is RecoveryAction.RESTART_FROM_CHECKPOINT
    assert decision.reason == "ParameterServerLost" and decision.failure is not None
    assert (decision.failure.role.value, decision.failure.reason) == ("ps", "OOMKilled")
    assert [(f.role.value, f.exit_code) for f in decision.recorded] == [("chief", code)]
    assert f"exit code {code}" in decision.message


BUG = {"exitCode": 1, "reason": "Error", "message": "ZeroDivisionError"}


def test_a_worker_that_exits_with_a_permanent_code_fails_the_job() -> None:
    pods = _with("worker", 1, restarts=1, last_terminated=BUG)
    decision = decide(_spec(), _status(tracking=TRACKED), observed(pods, chief_job()), NOW)
    assert (decision.action, decision.reason) == (RecoveryAction.FAIL, "PermanentExitCode")
    assert decision.failure is not None
    assert (decision.failure.role.value, decision.failure.index, decision.failure.exit_code) == (
        "worker",
        1,
        1,
    )
    assert "ZeroDivisionError" in decision.message


def test_a_worker_permanent_code_is_only_recorded_when_the_policy_says_so() -> None:
    pods = _with("worker", 1, restarts=1, last_terminated=BUG)
    spec = _spec(failurePolicy={"workerPermanentExit": "Record"})
    decision = decide(spec, _status(tracking=TRACKED), observed(pods, chief_job()), NOW)
    assert (decision.action, decision.reason) == (RecoveryAction.RECORD, "WorkerLost")


def test_a_worker_that_exits_1_with_a_ps_loss_is_explained_by_it() -> None:
    pods = [
        p for p in _with("worker", 0, restarts=1, last_terminated=BUG) if p["metadata"]["name"] != "ctr-ps-0"
    ]
    decision = decide(_spec(), _status(tracking=TRACKED), observed(pods, chief_job()), NOW)
    assert (decision.action, decision.reason) == (
        RecoveryAction.RESTART_FROM_CHECKPOINT,
        "ParameterServerLost",
    )


WITH_EVALUATOR = [*BASE, pod("evaluator", 0)]


def _evaluator(**changes: Any) -> list[dict[str, Any]]:
    return [*BASE, pod("evaluator", 0, **changes)]


@pytest.mark.parametrize(
    "pods",
    [
        pytest.param(_evaluator(restarts=1, last_terminated=BUG), id="permanent-code"),
        pytest.param(_evaluator(restarts=1, last_terminated=OOM), id="oom-killed"),
        pytest.param(
            _evaluator(phase="Failed", terminated={"exitCode": 138, "reason": "Error"}), id="pod-failed"
        ),
        pytest.param(BASE, id="vanished"),
    ],
)
def test_an_evaluator_failure_is_recorded_and_never_touches_training(pods: list[dict[str, Any]]) -> None:
    spec = _spec(evaluator={"template": {"spec": {"containers": [{"name": "trainer"}]}}})
    decision = decide(spec, _status(tracking=tracking_of(WITH_EVALUATOR)), observed(pods, chief_job()), NOW)
    assert decision.action is RecoveryAction.RECORD
    [failure] = decision.recorded
    assert (failure.role.value, failure.pod) == ("evaluator", "ctr-evaluator-0")


def test_an_evaluator_that_cannot_start_is_recorded_not_fatal() -> None:
    tracked = tracking_of(WITH_EVALUATOR)
    pods = _evaluator(waiting="ErrImagePull")
    seen = _seen_stuck(pods, tracked, timedelta(seconds=400))
    decision = decide(_spec(), _status(tracking=seen), observed(pods, chief_job()), NOW)
    assert decision.action is RecoveryAction.RECORD
    assert decision.failure is not None and decision.failure.role.value == "evaluator"


def test_the_evaluator_is_tracked() -> None:
    tracking = next_tracking(_status(), observed(WITH_EVALUATOR, chief_job()), 2, restarted=False)
    assert "ctr-evaluator-0" in tracking.pods


def test_a_chief_that_timed_out_waiting_for_an_unschedulable_ps_is_restarted_without_counting() -> None:
    stuck = pod("ps", 1, phase="Pending", unschedulable="0/4 nodes are available: 4 Insufficient memory.")
    chief = pod("chief", 0, attempt=0, phase="Failed", terminated={"exitCode": 138, "reason": "Error"})
    pods = [chief, BASE[1], stuck, *BASE[3:]]
    tracking = {**tracking_of(pods), "psEstablished": False}
    status = _status(tracking=tracking, countedRestarts=5)
    decision = decide(_spec(), status, observed(pods, chief_job(failed="BackoffLimitExceeded")), NOW)
    assert (decision.action, decision.reason) == (RecoveryAction.RESTART_FROM_CHECKPOINT, "ChiefFailed")
    assert not decision.counted and decision.counted_restarts == 5
    assert "ctr-ps-1" in decision.message


SIGTERMED = {"exitCode": 143, "reason": "Error", "message": ""}


def test_a_chief_asked_to_stop_restarts_without_counting_even_without_progress() -> None:
    """Exit 143 is SIGTERM: someone stopped the pod (deleted it, drained its node); not a failure."""
    chief = pod("chief", 0, attempt=0, phase="Failed", terminated=SIGTERMED)
    decision = decide(
        _spec(),
        _status(tracking=TRACKED),
        observed([chief, *BASE[1:]], chief_job(failed="BackoffLimitExceeded")),
        NOW,
    )
    assert decision.action is RecoveryAction.RESTART_FROM_CHECKPOINT
    assert decision.failure is not None and decision.failure.exit_code == 143
    assert not decision.counted


def test_a_chief_pod_gone_before_the_reconcile_is_classified_by_its_last_watched_state() -> None:
    """On a real kubelet a deleted chief's pod is removed right after it exits: the Job says only
    BackoffLimitExceeded, the watch saw the exit code."""
    gone = parse_pod(pod("chief", 0, attempt=0, phase="Failed", terminated=SIGTERMED))
    seen = observed(BASE[1:], chief_job(failed="BackoffLimitExceeded"))
    seen.departed[gone.uid] = gone
    decision = decide(_spec(), _status(tracking=TRACKED), seen, NOW)
    assert decision.failure is not None
    assert (decision.failure.pod, decision.failure.exit_code) == (gone.name, 143)
    assert not decision.counted


def test_a_failure_carries_when_it_happened_as_the_api_tells_it() -> None:
    """Recovery time is measured from these: the termination, the disruption or the deletion request."""
    crashed = {"exitCode": 137, "reason": "OOMKilled", "finishedAt": "2026-11-29T11:59:58Z"}
    terminated = pod("ps", 0, phase="Failed", terminated=crashed)
    in_place = pod("ps", 0, restarts=1, last_terminated=crashed)
    preempted = pod("ps", 0, deleting=True, disruption="PreemptionByScheduler")
    preempted["status"]["conditions"][-1]["lastTransitionTime"] = "2026-11-29T11:59:57Z"
    deleted = pod("ps", 0, deleting=True)
    deleted["metadata"]["deletionGracePeriodSeconds"] = 30
    entry = tracked(parse_pod(pod("ps", 0)))
    times = [
        failure.at if (failure := classify_pod_failure(entry, parse_pod(p))) else "none"
        for p in (terminated, in_place, preempted, deleted)
    ]
    asked = format_time(NOW - timedelta(seconds=30))
    assert times == ["2026-11-29T11:59:58Z", "2026-11-29T11:59:58Z", "2026-11-29T11:59:57Z", asked]


def test_a_ps_marked_as_a_disruption_target_and_gone_before_the_watch_showed_more_was_disrupted() -> None:
    """Preempted: the watch showed its DisruptionTarget, the next read found it gone (or already
    replaced) and the watch lagged on how it ended; that last state says it, not "Deleted"."""
    marked = parse_pod(pod("ps", 0, disruption="PreemptionByScheduler"))
    entry = tracked(parse_pod(pod("ps", 0)))
    replacement = parse_pod(pod("ps", 0, uid="ctr-ps-0-new-uid", phase="Pending"))
    for now_there in (None, replacement):
        failure = classify_pod_failure(entry, now_there, {marked.uid: marked})
        assert failure is not None and (failure.reason, failure.disruption) == ("Preempted", True)
    healthy = parse_pod(pod("ps", 0))  # last seen running: how it ended is not known
    failure = classify_pod_failure(entry, replacement, {healthy.uid: healthy})
    assert failure is not None and failure.reason == "Replaced"


def test_a_ps_recorded_as_disrupted_stays_disrupted_when_it_is_gone_before_its_replacement_comes() -> None:
    """The DisruptionTarget went into status.tracking; the operator restarted (or failed over) before
    the pod went, and now finds neither the pod nor a new one of its name, and no watched last state."""
    entry = tracked(parse_pod(pod("ps", 1, disruption="EvictionByEvictionAPI")))
    assert entry.disruption == "EvictionByEvictionAPI"
    [failure] = detect_failures({"ctr-ps-1": entry}, [])
    assert (failure.role.value, failure.index, failure.reason, failure.disruption) == (
        "ps",
        1,
        "Evicted",
        True,
    )
    [deleted] = detect_failures({"ctr-ps-1": tracked(parse_pod(pod("ps", 1)))}, [])
    assert (deleted.reason, deleted.disruption) == ("Deleted", False)
