"""One reconcile, decided purely: the job and what was observed in, the status and actions out.

The kopf layer fetches, calls `plan_reconcile`, writes the status once, then applies the children
and emits the events. Writing the status before acting makes every recovery exactly-once: the
restart counter in the status names the chief attempt that must exist, so an operator that dies
half-way through a restart finishes it after a restart instead of doing it twice.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from psoperator.api import CheckpointStatus, FailureRecord, PSTrainingJobSpec, PSTrainingJobStatus, Tracking
from psoperator.conditions import is_true, set_condition
from psoperator.contract import ProgressReport, Role
from psoperator.observe import Observed
from psoperator.policies import deadline, recovery, stall, success, ttl
from psoperator.policies.recovery import Failure, RecoveryAction
from psoperator.render import RenderOptions
from psoperator.sizing import SizingLevel, check_ps_memory, suggestion_for_oom
from psoperator.status import all_running, replica_statuses, running_phase
from psoperator.timeutil import format_time

Obj = dict[str, Any]


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class ReconcilePlan:
    status: Obj
    render: RenderOptions | None  # None: no children wanted (invalid spec)
    events: list[Event] = field(default_factory=list)
    delete_job: bool = False
    requeue_after: float | None = None
    restarted: bool = False
    # (role, reason) of every pod failure seen in this reconcile, for the metrics.
    failures: list[tuple[str, str]] = field(default_factory=list)
    # False once the job has ended: children are still patched (scaled down) but none is created or
    # replaced, so a chief Job deleted after the end does not come back to run against stopped PS.
    create_missing: bool = True


def _merge_progress(status: PSTrainingJobStatus, report: ProgressReport | None, now: str) -> None:
    if report is None:
        return
    if status.step is None or report.step != status.step:
        status.step_time = now
    status.step = report.step
    if report.resumed_from_step is not None:
        status.resumed_from_step = report.resumed_from_step
    if report.checkpoint_step is not None and (
        status.checkpoint is None or report.checkpoint_step >= status.checkpoint.step
    ):
        when = datetime.fromtimestamp(report.checkpoint_time, UTC) if report.checkpoint_time else None
        status.checkpoint = CheckpointStatus(
            step=report.checkpoint_step, path=report.checkpoint_path, time=format_time(when) if when else None
        )


def _record(failure: Failure, now: str, suggestion: str | None = None) -> FailureRecord:
    message = failure.message
    if suggestion and failure.role is Role.PS and failure.reason == "OOMKilled":
        message = f"{message}; {suggestion}".strip("; ")
    return FailureRecord(
        role=failure.role.value,
        index=failure.index,
        pod=failure.pod or None,
        exitCode=failure.exit_code,
        reason=failure.reason,
        message=message,
        time=now,
    )


def _recorded_event(failure: Failure) -> Event:
    """The event of a failure that is recorded but not acted on."""
    if failure.sidecar:
        return Event("Warning", "SidecarRestarted", failure.describe())
    message = failure.describe()
    if failure.role is Role.WORKER:
        message = f"{message}; the StatefulSet replaces it, training goes on"
    return Event("Warning", f"{failure.role.value.capitalize()}Failed", message)


def _finish(
    status: PSTrainingJobStatus, phase: str, reason: str, message: str, now: str, gen: int | None
) -> None:
    status.phase = phase  # type: ignore[assignment]
    status.completion_time = status.completion_time or now
    for type_ in ("Running", "Restarting", "Stalled"):
        status.conditions = set_condition(
            status.conditions, type_, False, reason, message, now=now, generation=gen
        )
    status.conditions = set_condition(
        status.conditions, phase, True, reason, message, now=now, generation=gen
    )


def plan_reconcile(
    job: Obj,
    observed: Observed,
    report: ProgressReport | None,
    now: datetime,
    *,
    cluster_domain: str = "cluster.local",
) -> ReconcilePlan:
    meta = job.get("metadata", {})
    gen = meta.get("generation")
    stamp = format_time(now)
    old = PSTrainingJobStatus.model_validate(job.get("status") or {})
    status = old.model_copy(deep=True)
    status.observed_generation = gen
    events: list[Event] = []

    try:
        spec = PSTrainingJobSpec.model_validate(job.get("spec") or {})
    except ValidationError as error:
        message = "; ".join(f"spec.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())[:1024]
        if old.phase != "Failed":
            _finish(status, "Failed", "InvalidSpec", message, stamp, gen)
            events.append(Event("Warning", "InvalidSpec", message))
        return ReconcilePlan(status.model_dump(by_alias=True, exclude_none=True), None, events)

    _merge_progress(status, report, stamp)
    options = RenderOptions(cluster_domain=cluster_domain, attempt=status.restarts)
    # Finished: the long-running roles stop (per cleanPodPolicy); the chief Job stays as it ended.
    finished_options = RenderOptions(
        cluster_domain=cluster_domain, attempt=status.restarts, stopped=success.stop_pods_after_finish(spec)
    )

    failures: list[tuple[str, str]] = []

    def done(render: RenderOptions | None, **extra: Any) -> ReconcilePlan:
        return ReconcilePlan(
            status.model_dump(by_alias=True, exclude_none=True), render, events, failures=failures, **extra
        )

    def finish(phase: str, reason: str, message: str, render: RenderOptions | None) -> ReconcilePlan:
        _finish(status, phase, reason, message, stamp, gen)
        events.append(
            Event(
                "Normal" if phase == "Succeeded" else "Warning",
                phase if phase == "Succeeded" else reason,
                message,
            )
        )
        return done(render, requeue_after=ttl.seconds_left(spec, status, now), create_missing=False)

    # Finished: nothing to decide, only clean-up and the TTL.
    if old.phase in ttl.FINISHED_PHASES:
        status.tracking = Tracking()  # pods go away on purpose: nothing to track
        left = ttl.seconds_left(spec, status, now)
        return done(
            finished_options,
            delete_job=left is not None and left <= 0,
            requeue_after=max(left, 0.0) if left is not None else None,
            create_missing=False,
        )

    def condition(type_: str, value: bool, reason: str, message: str = "") -> None:
        status.conditions = set_condition(
            status.conditions, type_, value, reason, message, now=stamp, generation=gen
        )

    # Admission-time sizing: before anything starts, so undersized PS do not OOM days later.
    verdict = check_ps_memory(spec)
    if spec.model is not None and not any(c.type == "SizingWarning" for c in old.conditions):
        warn = verdict.level is not SizingLevel.OK
        condition("SizingWarning", warn, verdict.reason, verdict.message)
        if warn:
            events.append(Event("Warning", "SizingWarning", verdict.message))
    if verdict.level is SizingLevel.REFUSE and old.phase in ("Pending", "Failed"):
        message = f"{verdict.message}; not starting because spec.model.enforce is true"
        return finish("Failed", "Undersized", message, None)

    if spec.run_policy.suspend:
        if old.phase != "Suspended":
            events.append(
                Event("Normal", "Suspended", "runPolicy.suspend is true: the job's pods are deleted")
            )
        status.phase = "Suspended"
        status.start_time = None
        status.tracking = Tracking()  # pods go away on purpose: nothing to track
        condition("Suspended", True, "Suspended", "runPolicy.suspend is true")
        condition("Running", False, "Suspended", "runPolicy.suspend is true")
        return done(RenderOptions(cluster_domain=cluster_domain, attempt=status.restarts, suspended=True))
    if old.phase == "Suspended":
        events.append(Event("Normal", "Resumed", "resuming from the latest checkpoint"))
        condition("Suspended", False, "Resumed", "runPolicy.suspend is false")
    status.start_time = status.start_time or stamp

    left = deadline.seconds_left(spec, status, now)
    if left is not None and left <= 0:
        limit = spec.run_policy.active_deadline_seconds
        message = f"the job ran for longer than runPolicy.activeDeadlineSeconds ({limit}s)"
        status.last_failure = FailureRecord(
            role="job", reason="DeadlineExceeded", message=message, time=stamp
        )
        return finish("Failed", "DeadlineExceeded", message, finished_options)

    if success.chief_succeeded(observed, status.restarts):
        step = f" at step {status.step}" if status.step is not None else ""
        return finish("Succeeded", "ChiefCompleted", f"the chief completed{step}", finished_options)

    # With this reconcile's progress merged in: a chief that wrote a checkpoint and then failed made progress.
    decision = recovery.decide(spec, status, observed, now)
    seen = list(decision.recorded)
    if decision.failure is not None and decision.failure not in seen:
        seen.append(decision.failure)
    failures.extend((f.role.value, f.reason) for f in seen)
    new_failures = Counter(f.role for f in seen)
    events.extend(_recorded_event(failure) for failure in decision.recorded)
    if decision.failure is not None:
        status.last_failure = _record(decision.failure, stamp, suggestion_for_oom(spec))

    restarted = decision.action is RecoveryAction.RESTART_FROM_CHECKPOINT
    if decision.action is RecoveryAction.FAIL:
        return finish("Failed", decision.reason, decision.message, finished_options)
    if restarted:
        progressed = recovery.made_progress(status)
        status.counted_restarts = (0 if progressed else old.counted_restarts) + (1 if decision.counted else 0)
        status.restarts = old.restarts + 1
        status.restart_checkpoint_step = status.checkpoint.step if status.checkpoint else None
        options = RenderOptions(cluster_domain=cluster_domain, attempt=status.restarts)
        events.append(Event("Warning", decision.reason, decision.message))
        condition("Restarting", True, decision.reason, decision.message)

    status.tracking = recovery.next_tracking(old, observed, spec.ps.replicas, restarted)
    status.replica_statuses = replica_statuses(
        spec, observed, old.replica_statuses, new_failures, status.restarts
    )
    ps, workers = status.replica_statuses["ps"], status.replica_statuses["worker"]
    status.ps_ready, status.workers_ready = f"{ps.ready}/{ps.desired}", f"{workers.ready}/{workers.desired}"

    restarting = restarted or (status.restarts > 0 and is_true(old.conditions, "Restarting"))
    phase = running_phase(spec, observed, status.restarts, restarting) if not restarted else "Restarting"
    if observed.children:
        condition("Created", True, "ChildrenCreated", "Services, StatefulSets and the chief Job exist")
    if phase == "Running":
        if old.phase != "Running":
            events.append(Event("Normal", "Running", "the chief and every parameter server are running"))
        condition("Running", True, "AllRolesRunning", "the chief and every parameter server are running")
        if is_true(old.conditions, "Restarting"):
            condition(
                "Restarting",
                False,
                "Recovered",
                f"resumed from step {status.resumed_from_step}"
                if status.resumed_from_step is not None
                else "the chief runs again",
            )
    elif phase == "Restarting":
        condition("Running", False, "Restarting", "the chief is restarting from the latest checkpoint")
    status.phase = phase  # type: ignore[assignment]

    everything_runs = all_running(spec, observed, status.restarts)
    if status.step_time is None and everything_runs:
        status.step_time = stamp
    stalled = stall.is_stalled(spec, status.step_time, everything_runs, now)
    if (
        stalled != is_true(old.conditions, "Stalled")
        and spec.failure_policy.stall_timeout_seconds is not None
    ):
        message = (
            (
                f"the step has stayed at {status.step} for {spec.failure_policy.stall_timeout_seconds}s "
                "while every pod runs"
            )
            if stalled
            else "the step advances"
        )
        condition("Stalled", stalled, "NoProgress" if stalled else "Progressing", message)
        if stalled:
            events.append(Event("Warning", "Stalled", message))

    return done(options, requeue_after=deadline.seconds_left(spec, status, now), restarted=restarted)
