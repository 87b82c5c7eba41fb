"""Recovery that knows the roles: from what failed to what the operator does about it.

TensorFlow's ParameterServerStrategy tolerates a lost worker (the coordinator reschedules its
closures and the worker rejoins), but a lost parameter server takes its variables with it: the only
correct recovery is to restart the chief, which restores every variable from the latest checkpoint.

| observed (the first row that matches decides)             | action                     | counted     |
|------------------------------------------------------------|----------------------------|-------------|
| chief or PS cannot start for the grace period              | FAIL StartupError          |             |
| a pod on a fenced node (node_lost.py force-deletes it): NodeLost, a disruption, then as its role:|
|   PS or chief -> RESTART_FROM_CHECKPOINT, worker -> RECORD | (rows below)               | no          |
| PS failed, deleted, evicted, or restarted in place         | RESTART_FROM_CHECKPOINT    | yes** (a)   |
|   (only RECORD before every PS ran with the current chief) |                            |             |
| ... and the chief failed in the same reconcile             | RESTART (the PS the cause) | as the PS   |
| worker exited with a permanent code (FailJob, the default) | FAIL PermanentExitCode     |             |
| chief exited with a permanent code                         | FAIL PermanentExitCode     |             |
| chief exited otherwise                                     | RESTART_FROM_CHECKPOINT    | yes** (a,b) |
| restarts exhausted                                         | FAIL RestartsExhausted     |             |
| worker failed, evicted, deleted, restarted, cannot start   | RECORD (StatefulSet heals) | no          |
| evaluator failed, restarted, deleted, cannot start         | RECORD (its Job restarts)  | no          |
| a sidecar of a PS or worker restarted in place             | RECORD (kubelet heals)     | no          |

(a) not disruptions (eviction, preemption, node loss, exit 143: the pod was asked to stop);
(b) not while a PS is unscheduled.
(**) unless a newer checkpoint was written since the previous restart: progress resets the budget.
Every RESTART_FROM_CHECKPOINT also restarts the PS that served the old chief (ps_recycle.py); their
going away is not a failure.
Only the training container's exit codes and restarts count (observe/failures.py classifies what
happened to each pod; a sidecar's restart leaves the task's variables where they were).
Every function here is pure: the classified failures and the job's status in, a decision out.
docs/concepts/recovery.md has the same matrix with the reason each row gives; `RULES` apply it in
order.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime

from psoperator.api.models import PSTrainingJobSpec, PSTrainingJobStatus
from psoperator.api.vocabulary import ConditionType
from psoperator.contract import Role
from psoperator.observe.failures import Failure, chief_failure, detect_failures
from psoperator.observe.views import Observed
from psoperator.policies import ps_recycle
from psoperator.sizing.oom import suggestion_for_oom
from psoperator.status.tracking import overdue, start_error_of, tracked_pods
from psoperator.timeutil import parse_time


class RecoveryAction(enum.Enum):
    NONE = "None"
    RECORD = "Record"
    RESTART_FROM_CHECKPOINT = "RestartFromCheckpoint"
    FAIL = "Fail"


# Roles whose loss training survives: the coordinator reschedules a worker's steps, and the
# evaluator only reads checkpoints. Their failures are recorded, never a reason to restart.
TOLERATED_ROLES = frozenset({Role.WORKER, Role.EVALUATOR})


@dataclass(frozen=True)
class RecoveryDecision:
    action: RecoveryAction
    reason: str = ""
    message: str = ""
    failure: Failure | None = None
    counted: bool = False
    # Restarts counted against failurePolicy.maxRestarts once this decision is carried out.
    counted_restarts: int = 0
    # Worker (and other tolerated) failures seen in this reconcile, recorded whatever the action.
    recorded: list[Failure] = field(default_factory=list)


def _overdue_start_errors(
    spec: PSTrainingJobSpec, status: PSTrainingJobStatus, observed: Observed, now: datetime
) -> tuple[list[Failure], list[Failure]]:
    """Pods unable to start for longer than the grace period: the chief's and PS' (fatal), and the
    workers' and the evaluator's not told yet (tolerated: training goes on without them)."""
    grace = spec.failure_policy.startup_error_grace_seconds
    fatal: list[Failure] = []
    tolerated: list[Failure] = []
    for pod in observed.current_pods(status.restarts):
        error = start_error_of(status.tracking, pod, now)
        if error is None or pod.role is None or not overdue(error, now, grace):
            continue
        failure = Failure(pod.role, pod.name, pod.index, pod.waiting_reason or "", pod.waiting_message[:512])
        if pod.role not in TOLERATED_ROLES:
            fatal.append(failure)
        elif not error.told:
            tolerated.append(failure)
    return fatal, tolerated


def made_progress(status: PSTrainingJobStatus) -> bool:
    """A newer checkpoint was written since the last restart."""
    if status.checkpoint is None:
        return False
    return status.restart_checkpoint_step is None or status.checkpoint.step > status.restart_checkpoint_step


def restart_budget_used(status: PSTrainingJobStatus, counted: bool) -> int:
    """Counted restarts after one more restart: a newer checkpoint since the last one starts afresh."""
    return (0 if made_progress(status) else status.counted_restarts) + (1 if counted else 0)


def _restart(
    spec: PSTrainingJobSpec,
    status: PSTrainingJobStatus,
    failure: Failure,
    reason: str,
    recorded: list[Failure],
    note: str = "",
    excused: bool = False,
) -> RecoveryDecision:
    """Restart the chief, counted unless a disruption, progress or an `excused` cause explains it."""
    counted = not (failure.disruption or excused) and not made_progress(status)
    budget_used = restart_budget_used(status, counted)
    if budget_used > spec.failure_policy.max_restarts:
        return RecoveryDecision(
            RecoveryAction.FAIL,
            "RestartsExhausted",
            f"{failure.describe()}; {status.counted_restarts} restarts without a newer checkpoint "
            f"already, failurePolicy.maxRestarts is {spec.failure_policy.max_restarts}{note}",
            failure,
            recorded=recorded,
        )
    step = f", step {status.checkpoint.step}" if status.checkpoint is not None else ""
    what = f"restarting the chief from the latest checkpoint{step}"
    budget = "not counted" if not counted else f"restart {budget_used} of {spec.failure_policy.max_restarts}"
    return RecoveryDecision(
        RecoveryAction.RESTART_FROM_CHECKPOINT,
        reason,
        f"{failure.describe()}; {what} ({budget}){note}",
        failure,
        counted=counted,
        counted_restarts=budget_used,
        recorded=recorded,
    )


@dataclass(frozen=True)
class Situation:
    """What one reconcile found, sorted by what the recovery rules do with it."""

    spec: PSTrainingJobSpec
    status: PSTrainingJobStatus
    observed: Observed
    now: datetime
    tolerated: list[Failure]  # of TOLERATED_ROLES and sidecars: recorded whatever the action
    stuck: list[Failure]  # the chief or a PS unable to start for longer than the grace period
    ps: list[Failure]  # parameter servers lost
    chief: Failure | None  # the current attempt's chief Job failed, as its pod tells why
    chief_job_live: bool  # the current attempt's chief Job exists and is not going away


def situation(
    spec: PSTrainingJobSpec, status: PSTrainingJobStatus, observed: Observed, now: datetime
) -> Situation:
    # PS pods restarted with the chief went away on purpose: not failures (a status an older
    # operator wrote may still track them).
    tracking = ps_recycle.untracked(status.tracking.pods, status.tracking.recycling or {})
    stopped = _stopped_by_suspension(status, observed)
    seen = detect_failures(tracking, tracked_pods(observed), observed.departed)
    failures = [f for f in seen if f.pod not in stopped]
    job = observed.current_chief_job(status.restarts)
    live = job is not None and not job.deleting
    chief = None
    stranded = observed.chief_pod(status.restarts)
    if live and stranded is not None and stranded.node_lost is not None:
        # Its Job would wait for a terminal phase that a lost node never reports.
        chief = chief_failure(stranded, None, "")
    elif live and job is not None and job.failed:
        last = observed.last_chief_pod(status.restarts)
        chief = chief_failure(last, job.failure_reason, job.failure_message)
    ps = [_with_oom_advice(spec, f) for f in failures if f.role is Role.PS and not f.sidecar]
    stuck, tolerated_stuck = _overdue_start_errors(spec, status, observed, now)
    return Situation(
        spec,
        status,
        observed,
        now,
        tolerated=[f for f in failures if f.role in TOLERATED_ROLES or f.sidecar] + tolerated_stuck,
        stuck=stuck,
        ps=ps,
        chief=chief,
        chief_job_live=live,
    )


def _stopped_by_suspension(status: PSTrainingJobStatus, observed: Observed) -> set[str]:
    """Pods whose deletion was asked before the job was last resumed (or in the same second): the
    suspension stopped them. The resume's reconcile may have seen one still running, its watch
    behind, and tracked it; its ending is no failure."""
    resumed = next(
        (
            parse_time(c.last_transition_time)
            for c in status.conditions
            if c.type == ConditionType.SUSPENDED and c.status == "False"
        ),
        None,
    )
    if resumed is None:
        return set()
    pods = [*tracked_pods(observed), *observed.departed.values()]
    return {p.name for p in pods if (asked := parse_time(p.deleted_at)) is not None and asked <= resumed}


def _with_oom_advice(spec: PSTrainingJobSpec, failure: Failure) -> Failure:
    """An OOMKilled PS carries the planner's advice, so the event and lastFailure both show it."""
    if failure.reason != "OOMKilled":
        return failure
    return replace(failure, message=f"{failure.message}; {suggestion_for_oom(spec)}".strip("; "))


def _startup_error(s: Situation) -> RecoveryDecision | None:
    """The chief or a PS unable to start for longer than the grace period fails the job."""
    if not s.stuck:
        return None
    grace = s.spec.failure_policy.startup_error_grace_seconds
    message = f"{s.stuck[0].describe()}; failing after {grace}s"
    return RecoveryDecision(RecoveryAction.FAIL, "StartupError", message, s.stuck[0], recorded=s.tolerated)


def _ps_lost(s: Situation) -> RecoveryDecision | None:
    """A lost PS took its variables: restart the chief. It is also the cause of a chief that failed in
    the same reconcile (138 for a peer that vanished, or 1 from code that did not expect it): that
    chief is recorded, and its permanent exit code does not fail the job."""
    established = s.status.tracking.ps_established or s.chief is not None
    if not (s.ps and s.chief_job_live and established):
        return None
    recorded = s.tolerated + s.ps[1:]
    note = ""
    if s.chief is not None:
        recorded.append(s.chief)
        note = f"; the chief's failure follows from it: {s.chief.describe()}"
    return _restart(s.spec, s.status, s.ps[0], "ParameterServerLost", recorded, note)


def _permanent(failure: Failure, recorded: list[Failure]) -> RecoveryDecision:
    message = f"{failure.describe()}; the exit code is in failurePolicy.permanentExitCodes"
    return RecoveryDecision(RecoveryAction.FAIL, "PermanentExitCode", message, failure, recorded=recorded)


def _worker_permanent_exit(s: Situation) -> RecoveryDecision | None:
    """A bug in user code comes back at every restart of the worker: fail, as for the chief, unless
    told only to record it or a PS loss in the same reconcile explains the exit."""
    if s.spec.failure_policy.worker_permanent_exit != "FailJob" or s.ps:
        return None
    codes = s.spec.failure_policy.permanent_exit_codes
    bug = next((f for f in s.tolerated if f.role is Role.WORKER and f.exit_code in codes), None)
    if bug is None:
        return None
    return _permanent(bug, [f for f in s.tolerated if f is not bug])


def _chief_failed(s: Situation) -> RecoveryDecision | None:
    if s.chief is None:
        return None
    job = s.observed.chief_job
    fail_job = job is not None and job.failure_reason == "PodFailurePolicy"
    if s.chief.exit_code in s.spec.failure_policy.permanent_exit_codes or fail_job:
        return _permanent(s.chief, s.tolerated)
    # A PS that was never scheduled never ran: the chief that gave up waiting for it did nothing
    # wrong, and counting it would end a job that only waits for room as RestartsExhausted.
    waiting = [p.name for p in s.observed.role_pods(Role.PS) if p.unscheduled is not None]
    note = f"; {', '.join(waiting)} not scheduled yet" if waiting else ""
    return _restart(s.spec, s.status, s.chief, "ChiefFailed", s.tolerated, note, excused=bool(waiting))


def _record_only(s: Situation) -> RecoveryDecision:
    """Nothing to act on: what failed is told, and the StatefulSets or the kubelet heal it."""
    recorded = s.tolerated + s.ps
    if not recorded:
        return RecoveryDecision(RecoveryAction.NONE)
    message = "; ".join(f.describe() for f in recorded)
    return RecoveryDecision(
        RecoveryAction.RECORD, _record_reason(recorded), message, recorded[0], recorded=recorded
    )


# The first rule that decides wins; the order is the recovery matrix's, read top to bottom.
RULES: tuple[Callable[[Situation], RecoveryDecision | None], ...] = (
    _startup_error,
    _ps_lost,
    _worker_permanent_exit,
    _chief_failed,
)


def decide(
    spec: PSTrainingJobSpec, status: PSTrainingJobStatus, observed: Observed, now: datetime
) -> RecoveryDecision:
    """The recovery decision for a job that is neither finished nor suspended."""
    s = situation(spec, status, observed, now)
    for rule in RULES:
        decision = rule(s)
        if decision is not None:
            return decision
    return _record_only(s)


def _record_reason(recorded: list[Failure]) -> str:
    """What a recording is about: a lost task before a sidecar's restart."""
    if any(f.role is Role.WORKER and not f.sidecar for f in recorded):
        return "WorkerLost"
    if any(f.role is Role.PS and not f.sidecar for f in recorded):
        return "ParameterServerLost"
    if any(f.role is Role.EVALUATOR and not f.sidecar for f in recorded):
        return "EvaluatorFailed"
    return "SidecarRestarted"
