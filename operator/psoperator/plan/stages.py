"""One reconcile, decided purely: the job and what was observed in, the status and actions out.

The reconcile protocol (control/) reads, calls `plan_reconcile`, writes the status once, then
applies the children and emits the events. Writing the status before acting makes every recovery
exactly-once: the restart counter in the status names the chief attempt that must exist, so an
operator that dies half-way through a restart finishes it after a restart instead of doing it twice.

The decision is a sequence of named stages on one draft (see draft.py), in the spirit of jobset's
reconcile: each reads the job's spec and the draft, writes the draft, and says whether the
reconcile is decided (True: the job has ended or is suspended) or goes on to the next stage.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from psoperator.api.models import (
    FailureRecord,
    PSTrainingJobSpec,
    Shape,
    Tracking,
)
from psoperator.api.shape import requested, running, with_shape
from psoperator.api.vocabulary import FINISHED_PHASES, ConditionType, Phase
from psoperator.contract import ProgressReport, Role
from psoperator.observe.failures import Failure
from psoperator.observe.views import START_ERRORS, Observed, chief_job_of
from psoperator.plan.draft import (
    RECYCLED_PS_GRACE_SECONDS,
    Draft,
    Event,
    PodDeletion,
    ReconcilePlan,
    stops_within_recycled_grace,
)
from psoperator.plan.kueue_admission import finish_workload, wait_for_admission
from psoperator.policies import (
    deadline,
    node_lost,
    planned_stop,
    ps_recycle,
    recovery,
    resize,
    scheduling,
    stall,
    success,
    ttl,
)
from psoperator.policies.planned_stop import CheckpointOutcome, StopCause
from psoperator.policies.recovery import TOLERATED_ROLES, RecoveryAction, RecoveryDecision
from psoperator.render.networkpolicy import policy_names
from psoperator.render.pod import overridden
from psoperator.sizing.admission import SizingLevel, SizingVerdict, check_ps_memory
from psoperator.status import tracking
from psoperator.status.conditions import is_true
from psoperator.status.last_failure import failure_record
from psoperator.status.progress import merge_progress
from psoperator.status.replicas import all_running, ready_of, replica_statuses, running_phase
from psoperator.timeutil import parse_time

__all__ = ["STAGES", "Event", "ReconcilePlan", "plan_reconcile"]

Obj = dict[str, Any]
# A stage: True when the reconcile is decided and the later stages must not run.
Stage = Callable[[PSTrainingJobSpec, Draft], bool]
DECIDED, GO_ON = True, False


def _end(spec: PSTrainingJobSpec, d: Draft, phase: Phase, reason: str, message: str, *, stop: bool) -> bool:
    """The job ends: nothing is created any more; with `stop` the long-running roles are scaled down.

    `stop` is False only when the job never started (nothing to stop, and no children wanted).
    """
    d.end(phase, reason, message)
    finish_workload(d, phase, message)
    d.status.tracking = Tracking()  # in the same write: its pods go away on purpose
    if stop:
        _clean_up(spec, d, phase)
    else:
        d.render, d.create_missing = None, False
    d.requeue_after = ttl.seconds_left(spec, d.status, d.now)
    return DECIDED


def _clean_up(spec: PSTrainingJobSpec, d: Draft, phase: Phase) -> None:
    """An ended job's children, none created any more: scaled down per cleanPodPolicy, a
    still-running chief stopped. After a success the parameter servers do not drain: the chief,
    which saved its last checkpoint, is gone (and a job made again under the name waits for them)."""
    stop_chief = success.stop_chief_after_finish(spec, phase, d.observed, d.status.restarts)
    stopped = success.stop_pods_after_finish(spec)
    d.render, d.create_missing = d.options(stopped=stopped, chief_stopped=stop_chief), False
    if stopped and phase is Phase.SUCCEEDED:
        d.end_ps_drain()


def when_finished(spec: PSTrainingJobSpec, d: Draft) -> bool:
    """A finished job: nothing to decide, only clean-up (per cleanPodPolicy) and the TTL."""
    if d.old.phase not in FINISHED_PHASES:
        return GO_ON
    d.status.tracking = Tracking()  # pods go away on purpose: nothing to track
    finish_workload(d, d.old.phase, f"the job {d.old.phase.lower()}")
    left = ttl.seconds_left(spec, d.status, d.now)
    _clean_up(spec, d, d.old.phase)
    d.delete_job = left is not None and left <= 0
    d.requeue_after = max(left, 0.0) if left is not None else None
    return DECIDED


def admit_sizing(spec: PSTrainingJobSpec, d: Draft) -> bool:
    """Admission-time sizing, before anything starts, so undersized PS do not OOM days later. The
    check runs while it can still change something: until the job has its SizingWarning condition
    (set once, from spec.model) and has left Pending (only a Pending job is refused)."""
    told = any(c.type == ConditionType.SIZING_WARNING for c in d.old.conditions)
    if spec.model is None or (told and d.old.phase != Phase.PENDING):
        return GO_ON
    verdict = check_ps_memory(spec)
    if not told:
        _tell_sizing(d, verdict)
    if verdict.level is SizingLevel.REFUSE and d.old.phase == Phase.PENDING:
        message = f"{verdict.message}; not starting because spec.model.enforce is true"
        return _end(spec, d, Phase.FAILED, "Undersized", message, stop=False)
    return GO_ON


def _tell_sizing(d: Draft, verdict: SizingVerdict) -> None:
    """The SizingWarning condition says what the verdict on the running shape is; an event when it
    turns true."""
    warn = verdict.level is not SizingLevel.OK
    event = Event("Warning", "SizingWarning", verdict.message) if warn else None
    d.condition(ConditionType.SIZING_WARNING, warn, verdict.reason, verdict.message, event=event)


def note_overridden_template(spec: PSTrainingJobSpec, d: Draft) -> bool:
    """A template stored before the CRD refused what the operator sets in every pod (the contract's
    environment, the names of its ports): the operator's own values are used, and the
    TemplateOverridden condition names the template's (an event once: templates do not change)."""
    if is_true(d.old.conditions, ConditionType.TEMPLATE_OVERRIDDEN):
        return GO_ON
    found = overridden(spec)
    if found:
        message = f"the operator sets {', '.join(found)} itself; the template's are not used"
        event = Event("Warning", "TemplateOverridden", message)
        d.condition(ConditionType.TEMPLATE_OVERRIDDEN, True, "SetByOperator", message, event=event)
    return GO_ON


def require_network_policies(spec: PSTrainingJobSpec, d: Draft) -> bool:
    """No pod is made before the job's NetworkPolicies exist (plan/children.py). A job acted on
    whose policies still do not (the API server refused one, another owner's object has its name,
    one was deleted) gets the NetworkPolicyMissing condition with why; its running pods go on."""
    wanted = policy_names(d.name, d.operator_namespace) if spec.network_policy.enabled else []
    missing = [f"NetworkPolicy/{n}" for n in wanted if ("NetworkPolicy", n) not in d.observed.children]
    if missing and d.old.observed_generation is not None:
        refused = [d.unmade[ref] for ref in missing if ref in d.unmade]
        why = "; ".join(refused) if refused else f"{', '.join(missing)} does not exist"
        message = f"{why}: no pod of the job is created or added until its NetworkPolicies exist"
        reason = "NetworkPolicyRefused" if refused else "NetworkPolicyNotCreated"
        event = Event("Warning", "NetworkPolicyMissing", message)
        d.condition(ConditionType.NETWORK_POLICY_MISSING, True, reason, message, event=event)
    elif is_true(d.status.conditions, ConditionType.NETWORK_POLICY_MISSING):
        said = "the job's NetworkPolicies exist" if wanted else "spec.networkPolicy.enabled is false"
        reason = "NetworkPoliciesCreated" if wanted else "NetworkPolicyDisabled"
        d.condition(ConditionType.NETWORK_POLICY_MISSING, False, reason, said)
    return GO_ON


def suspend_or_resume(spec: PSTrainingJobSpec, d: Draft) -> bool:
    """runPolicy.suspend deletes every pod, after a checkpoint asked of the chief (planned_stop);
    clearing it resumes from the latest checkpoint."""
    if spec.run_policy.suspend:
        return _suspend(spec, d)
    if d.old.phase == Phase.SUSPENDED:
        event = Event("Normal", "Resumed", "resuming from the latest checkpoint")
        d.condition(ConditionType.SUSPENDED, False, "Resumed", "runPolicy.suspend is false", event=event)
    d.status.start_time = d.status.start_time or d.stamp
    return GO_ON


def _suspend(spec: PSTrainingJobSpec, d: Draft) -> bool:
    entering = d.old.phase != Phase.SUSPENDED
    ask = planned_stop.ask_for(spec, d.observed, d.status.restarts, StopCause.SUSPEND) if entering else None
    if ask is not None and d.awaiting_checkpoint(ask):
        message = f"asking the chief for a checkpoint first (up to {ask.deadline_seconds:g}s)"
        d.condition(ConditionType.SUSPENDED, False, "Checkpointing", message)
        return DECIDED
    why = "runPolicy.suspend is true"
    if ask is not None and d.status.last_planned_stop is not None:
        why = f"{why}; stopped {planned_stop.describe(d.status.last_planned_stop)}"
    elif not entering:  # as it was said when the job was suspended
        why = next((c.message for c in d.old.conditions if c.type == ConditionType.SUSPENDED), why)
    d.enter(Phase.SUSPENDED, event=Event("Normal", "Suspended", f"{why}: the job's pods are deleted"))
    d.condition(ConditionType.SUSPENDED, True, "Suspended", why)
    d.workload_wanted = False  # a queued job gives its quota back: resumed, it is queued again
    d.stop_pods("Suspended", why)
    if ask is not None:
        d.cut_ps_drain(ask)
    return DECIDED


def enforce_deadline(spec: PSTrainingJobSpec, d: Draft) -> bool:
    """Past activeDeadlineSeconds the job fails, unless its chief completed before the deadline
    (first seen after it: the operator was down), which detect_success then tells."""
    left = deadline.seconds_left(spec, d.status, d.now)
    if left is None or left > 0:
        return GO_ON
    completed = success.chief_completed_at(d.observed, d.status.restarts)
    if completed is not None and (deadline.seconds_left(spec, d.status, completed) or 0) > 0:
        return GO_ON
    limit = spec.run_policy.active_deadline_seconds
    message = f"the job ran for longer than runPolicy.activeDeadlineSeconds ({limit}s)"
    d.status.last_failure = FailureRecord(
        role="job", reason="DeadlineExceeded", message=message, time=d.stamp, summary="job DeadlineExceeded"
    )
    return _end(spec, d, Phase.FAILED, "DeadlineExceeded", message, stop=True)


def detect_success(spec: PSTrainingJobSpec, d: Draft) -> bool:
    if not success.chief_succeeded(d.observed, d.status.restarts):
        return GO_ON
    step = f" at step {d.status.step}" if d.status.step is not None else ""
    return _end(spec, d, Phase.SUCCEEDED, "ChiefCompleted", f"the chief completed{step}", stop=True)


def force_delete_lost_pods(spec: PSTrainingJobSpec, d: Draft) -> bool:
    """Pods on a fenced node (gone, or out of service) are force-deleted, and marked so that
    recovery records NodeLost and restarts per the matrix; pods on a node lost for
    nodeLostTimeoutSeconds that is not fenced stay, told in the NodeLost condition."""
    loss = node_lost.lost_pods(spec, d.observed, d.now)
    d.wake_in(loss.due)
    if loss.fenced:
        by_uid = {p.uid: p for p in loss.fenced}
        d.observed = replace(d.observed, pods=[by_uid.get(p.uid, p) for p in d.observed.pods])
        d.delete_pods += [PodDeletion(p.name, p.uid, 0) for p in loss.fenced]
    if loss.stranded:
        message = node_lost.describe(loss.stranded)
        event = Event("Warning", "NodeLost", message)
        d.condition(ConditionType.NODE_LOST, True, "AwaitingFence", message, event=event)
    elif is_true(d.status.conditions, ConditionType.NODE_LOST):
        d.condition(ConditionType.NODE_LOST, False, "NoPodStranded", "no pod of the job is on a lost node")
    return GO_ON


def watch_scheduling(spec: PSTrainingJobSpec, d: Draft) -> bool:
    """Pods the scheduler cannot place: the Unschedulable condition, then the scheduling timeout."""
    waiting = scheduling.unscheduled(d.observed, d.status.restarts)
    if not waiting:
        if is_true(d.status.conditions, ConditionType.UNSCHEDULABLE):
            d.condition(ConditionType.UNSCHEDULABLE, False, "Scheduled", "every pod is scheduled")
        return GO_ON
    message = scheduling.describe(waiting)
    event = Event("Warning", "Unschedulable", message)
    d.condition(ConditionType.UNSCHEDULABLE, True, "Unschedulable", message, event=event)
    late = scheduling.timed_out(spec, waiting, d.now)
    if late is None:
        d.wake_in(min(scheduling.seconds_left(spec, waiting, d.now).values(), default=None))
        return GO_ON
    cause = scheduling.as_failure(late)
    d.status.last_failure = failure_record(replace(cause, reason="Unschedulable"), d.stamp)
    timeout = spec.failure_policy.scheduling_timeout_seconds
    why = f"{cause.describe()}; not scheduled within failurePolicy.schedulingTimeoutSeconds ({timeout}s)"
    return _end(spec, d, Phase.FAILED, "Unschedulable", why, stop=True)


def resize_job(spec: PSTrainingJobSpec, d: Draft) -> bool:
    """spec.ps.replicas, spec.worker.replicas or the PS containers' resources changed (resize.py):
    a checkpoint first if the chief runs, then a restart with the new shape that counts nothing."""
    wanted, current = d.requested, d.status.shape
    if wanted is None or current is None or wanted == current or d.ask_checkpoint is not None:
        return GO_ON
    change = f"from {current.describe()} to {wanted.describe()}"
    sizing = check_ps_memory(with_shape(spec, wanted)) if spec.model is not None else None
    if sizing is not None and _resize_refused(d, sizing, change):
        return GO_ON
    if d.observed.current_chief_job(d.status.restarts) is None:  # the next attempt has the new shape
        _resized(d, wanted, change, sizing)
        return GO_ON
    ask = planned_stop.ask_for(spec, d.observed, d.status.restarts, StopCause.RESIZE)
    if ask is not None and d.awaiting_checkpoint(ask):
        message = f"resizing {change}: asking the chief for a checkpoint first"
        d.condition(ConditionType.RESIZED, False, "Checkpointing", message)
        return GO_ON
    if ask is not None and d.status.last_planned_stop is not None:
        change = f"{change}, {planned_stop.describe(d.status.last_planned_stop)}"
    _resized(d, wanted, change, sizing)
    _start_new_attempt(d)
    d.condition(ConditionType.RESTARTING, True, "Resized", f"a new chief attempt with {wanted.describe()}")
    return GO_ON


def _resize_refused(d: Draft, verdict: SizingVerdict, change: str) -> bool:
    """spec.model.enforce refuses a shape whose parameter servers would not hold their shards."""
    if verdict.level is not SizingLevel.REFUSE:
        return False
    message = f"not resized {change}: {verdict.message}; spec.model.enforce is true"
    told = any(c.type == ConditionType.RESIZED and c.reason == "Undersized" for c in d.old.conditions)
    d.condition(ConditionType.RESIZED, False, "Undersized", message)
    if not told:
        d.events.append(Event("Warning", "ResizeRefused", message))
    return True


def _resized(d: Draft, wanted: Shape, change: str, sizing: SizingVerdict | None) -> None:
    d.status.shape = wanted
    d.condition(ConditionType.RESIZED, True, "Resized", change)
    d.events.append(Event("Normal", "Resized", change))
    if sizing is not None:  # the verdict on the new shape, which runs now
        _tell_sizing(d, sizing)


def recover(spec: PSTrainingJobSpec, d: Draft) -> bool:
    """The recovery policy's decision, carried out on the draft (progress already merged in, so a
    chief that wrote a checkpoint and then failed made progress)."""
    if d.restarted or d.ask_checkpoint is not None:  # a resize restarted, or a checkpoint comes first
        return GO_ON
    decision = recovery.decide(spec, d.status, d.observed, d.now)
    _record_failures(d, decision)
    if decision.action is RecoveryAction.FAIL:
        return _end(spec, d, Phase.FAILED, decision.reason, decision.message, stop=True)
    if decision.action is RecoveryAction.RESTART_FROM_CHECKPOINT:
        _start_new_attempt(d)
        d.status.counted_restarts = decision.counted_restarts
        # Every restart is told, not only the first of a series: no flip needed.
        d.events.append(Event("Warning", decision.reason, decision.message))
        d.condition(ConditionType.RESTARTING, True, decision.reason, decision.message)
    return GO_ON


def checkpoint_before_drain(spec: PSTrainingJobSpec, d: Draft) -> bool:
    """A parameter server being stopped by the cluster (evicted, drained, preempted) while it still
    serves: a checkpoint first, and the recovery from its loss only once the chief answered, so the
    restart resumes from the step it was stopped at."""
    recycling = set((d.old.tracking.recycling or {}).values())
    stopping = [p for p in planned_stop.draining_ps(d.observed) if p.uid not in recycling]
    ask = planned_stop.ask_for(spec, d.observed, d.status.restarts, StopCause.DRAIN, stopping)
    if not stopping or ask is None:
        return GO_ON
    before = d.status.last_planned_stop
    if d.awaiting_checkpoint(ask):
        return GO_ON  # recover waits for the answer (the ask is bounded by its deadline)
    stop = d.status.last_planned_stop
    if stop is not None and stop is not before:
        if stop.checkpoint_step is None:
            d.events.append(Event("Warning", "NoCheckpointBeforeStop", planned_stop.describe_drain(stop)))
        else:
            d.events.append(Event("Normal", "CheckpointedBeforeStop", planned_stop.describe_drain(stop)))
    return GO_ON


def _start_new_attempt(d: Draft) -> None:
    """A coordinated restart: the next chief attempt, from the checkpoint there is now."""
    d.restarted = True
    d.status.restarts = d.old.restarts + 1
    d.status.restart_checkpoint_step = d.status.checkpoint.step if d.status.checkpoint else None


def _record_failures(d: Draft, decision: RecoveryDecision) -> None:
    """Every failure seen goes to the metrics; tolerated ones get an event; the cause goes to lastFailure."""
    seen = list(decision.recorded)
    if decision.failure is not None and decision.failure not in seen:
        seen.append(decision.failure)
    d.failures.extend((f.role.value, f.reason) for f in seen)
    d.events.extend(_recorded_event(failure) for failure in decision.recorded)
    if decision.failure is not None:
        d.status.last_failure = failure_record(decision.failure, d.stamp)


def count_replicas(spec: PSTrainingJobSpec, d: Draft) -> bool:
    """What to watch next time, and the per-role counts `kubectl get` shows."""
    kept = d.status.tracking.pods  # as found (within the running shape)
    d.status.tracking = tracking.next_tracking(d.old, d.observed, spec.ps.replicas, d.restarted)
    if d.ask_checkpoint is not None:  # recover waits for the answer: what it will judge stays tracked
        d.status.tracking.pods = {**kept, **d.status.tracking.pods}
    d.write_now = tracking.ps_tracking_changed(d.old.tracking, d.status.tracking, d.observed)
    grace = spec.failure_policy.startup_error_grace_seconds
    stuck = tracking.next_start_errors(d.old.tracking, d.observed, d.status.restarts, d.now, grace)
    d.status.tracking.start_errors = stuck or None  # none: the field goes away
    d.wake_in(tracking.grace_left(stuck, d.now, grace))  # when the first one not told is overdue
    new_failures = Counter(Role(role) for role, _ in d.failures)
    d.status.replica_statuses = replica_statuses(
        spec, d.observed, d.old.replica_statuses, new_failures, d.status.restarts
    )
    counts = d.status.replica_statuses
    d.status.ps_ready, d.status.workers_ready = ready_of(counts["ps"]), ready_of(counts["worker"])
    return GO_ON


def set_phase(spec: PSTrainingJobSpec, d: Draft) -> bool:
    """The phase of a job that runs, and the conditions that follow from it."""
    old, status = d.old, d.status
    restarting = d.restarted or (status.restarts > 0 and is_true(old.conditions, ConditionType.RESTARTING))
    phase = Phase.RESTARTING if d.restarted else running_phase(spec, d.observed, status.restarts, restarting)
    held = is_true(d.status.conditions, ConditionType.NETWORK_POLICY_MISSING) or d.observed.former
    if d.observed.children and not held:
        message = "Services, StatefulSets and the chief Job exist"
        event = Event("Normal", "Created", f"{message}: {_roles(spec)}")
        d.condition(ConditionType.CREATED, True, "ChildrenCreated", message, event=event)
    if phase is Phase.RUNNING:
        message = "the chief and every parameter server are running"
        d.condition(ConditionType.RUNNING, True, "AllRolesRunning", message)
        if is_true(old.conditions, ConditionType.RESTARTING):
            d.enter(phase)
            _recovered(d)
        else:
            d.enter(phase, event=Event("Normal", "Running", message))
        return GO_ON
    if phase is Phase.RESTARTING:
        message = "the chief is restarting from the latest checkpoint"
        d.condition(ConditionType.RUNNING, False, "Restarting", message)
    d.enter(phase)
    return GO_ON


def _roles(spec: PSTrainingJobSpec) -> str:
    evaluator = ", an evaluator" if spec.evaluator is not None else ""
    return f"a chief, {spec.ps.replicas} PS, {spec.worker.replicas} workers{evaluator}"


def _recovered(d: Draft) -> None:
    """Training runs again after a restart: how long the failure cost, from when it happened (a
    resize is no failure: not measured)."""
    failure = d.status.last_failure
    resized = any(c.type == ConditionType.RESTARTING and c.reason == "Resized" for c in d.old.conditions)
    d.recovery_seconds = None if resized else d.seconds_since(parse_time(failure.time) if failure else None)
    resumed = d.status.resumed_from_step
    back = f"resumed from step {resumed}" if resumed is not None else "the chief runs again"
    took = f", {d.recovery_seconds:.0f}s after the failure" if d.recovery_seconds is not None else ""
    event = Event("Normal", "Recovered", f"{back}{took}")
    d.condition(ConditionType.RESTARTING, False, "Recovered", back, event=event)


def note_all_running(spec: PSTrainingJobSpec, d: Draft) -> bool:
    """The first time every pod runs at once: how long the job took to come up."""
    if d.status.all_running_time is None and all_running(spec, d.observed, d.status.restarts):
        d.status.all_running_time = d.stamp
        d.startup_seconds = d.seconds_since(d.created)
        took = f", {d.startup_seconds:.0f}s after its creation" if d.startup_seconds is not None else ""
        d.events.append(Event("Normal", "AllRunning", f"every pod runs: {_roles(spec)}{took}"))
    return GO_ON


def detect_stall(spec: PSTrainingJobSpec, d: Draft) -> bool:
    """Stalled: the step has not moved for stallTimeoutSeconds while every pod runs (off when unset)."""
    timeout = spec.failure_policy.stall_timeout_seconds
    everything_runs = all_running(spec, d.observed, d.status.restarts)
    if d.status.step_time is None and everything_runs:
        d.status.step_time = d.stamp
    left = stall.seconds_left(spec, d.status.step_time, everything_runs, d.now)
    stalled = left is not None and left <= 0
    if not stalled:
        d.wake_in(left)  # when it would count as stalled, if the step has not moved by then
    # Set only when it changes: a job that never stalled carries no Stalled condition.
    if timeout is None or stalled == is_true(d.status.conditions, ConditionType.STALLED):
        return GO_ON
    if stalled:
        message = f"the step has stayed at {d.status.step} for {timeout}s while every pod runs"
        event = Event("Warning", "Stalled", message)
        d.condition(ConditionType.STALLED, True, "NoProgress", message, event=event)
    else:
        d.condition(ConditionType.STALLED, False, "Progressing", "the step advances")
    return GO_ON


# Grace of an old attempt's chief pod: long enough for a SIGTERM, short enough to restart quickly.
OLD_CHIEF_GRACE_SECONDS = 5
# How soon to look again while an old chief pod is stopping: the common case is well under a second.
OLD_CHIEF_POLL_SECONDS = 0.5


def retire_old_chiefs(spec: PSTrainingJobSpec, d: Draft) -> bool:
    """Never two coordinators: while a chief pod that the current attempt's chief Job does not own
    runs (of an older attempt, or left by a deleted Job of this one; asked to stop with a grace
    period, or its node is gone), the current attempt's chief Job is not created."""
    attempt = d.status.restarts
    former = d.observed.former_chiefs(attempt)
    d.hold_chief = d.hold_chief or bool(former)
    # A pod of a lost node is force-deleted already (force_delete_lost_pods).
    asked = [p for p in former if not (p.deleting or p.node_lost)]
    d.delete_pods += [
        # Of this attempt, it is former only because its Job was not seen: deleted once that is gone.
        PodDeletion(p.name, p.uid, OLD_CHIEF_GRACE_SECONDS, chief_job_of(p) if p.attempt == attempt else None)
        for p in asked
    ]
    if former:
        d.awaits_departure = True
        d.wake_in(OLD_CHIEF_POLL_SECONDS)
    return GO_ON


def await_former_job(spec: PSTrainingJobSpec, d: Draft) -> bool:
    """A job made again under the name of one just deleted: that job's parameter servers and workers
    may still be there (stopping, or orphaned), at the addresses of this job's (Observed.former).
    The chief is not created until they are gone: it would train with them, and fail when they
    exit. A job not created yet says so in its Created condition, and once in an event."""
    former = sorted(p.name for p in d.observed.former)
    if not former:
        return GO_ON
    d.hold_chief = d.awaits_departure = True
    d.wake_in(OLD_CHIEF_POLL_SECONDS)
    if not is_true(d.old.conditions, ConditionType.CREATED):
        message = (
            f"pods of an earlier job named {d.name} are still there ({', '.join(former)}): they "
            "answer at this job's addresses, so its chief is created once they are gone"
        )
        said = next((c.reason for c in d.old.conditions if c.type == ConditionType.CREATED), None)
        if said != "FormerPodsRemain":
            d.events.append(Event("Normal", "FormerPodsRemain", message))
        d.condition(ConditionType.CREATED, False, "FormerPodsRemain", message)
    return GO_ON


def recycle_parameter_servers(spec: PSTrainingJobSpec, d: Draft) -> bool:
    """A restart restarts the PS that served the old chief, and the new chief waits until they are
    gone (a PS keeps a gone chief's variables, and a new chief would add a second copy) and their
    replacements run. They are remembered for the whole attempt, never tracked (ps_recycle.py)."""
    if d.restarted:
        recycling = ps_recycle.serving_previous_chief(d.old.tracking, d.observed)
        if recycling:
            d.events.append(Event("Normal", "RecyclingParameterServers", ps_recycle.describe(recycling)))
    else:
        recycling = d.old.tracking.recycling or {}
    d.status.tracking.recycling = recycling or None
    d.status.tracking.pods = ps_recycle.untracked(d.status.tracking.pods, recycling)
    present = ps_recycle.still_there(recycling, d.observed)
    stopping = {p.uid for p in d.observed.role_pods(Role.PS) if stops_within_recycled_grace(p)}
    d.delete_pods += [
        PodDeletion(name, uid, RECYCLED_PS_GRACE_SECONDS)
        for name, uid in sorted(present.items())
        if uid not in stopping
    ]
    # A PS still stopping (recycled, or scaled away by a suspension: it serves out its drain) keeps
    # its name's address: a new chief would connect to it, and fail when it exits.
    if present or any(p.deleting and not p.node_lost for p in d.observed.role_pods(Role.PS)):
        d.hold_chief = d.awaits_departure = True
        d.wake_in(OLD_CHIEF_POLL_SECONDS)
    # Nor before their replacements run (ps_recycle.py); the pods' watch brings that.
    if d.status.restarts and ps_recycle.not_running(spec.ps.replicas, d.observed):
        d.hold_chief = True
    return GO_ON


STAGES: tuple[Stage, ...] = (
    when_finished,
    admit_sizing,
    note_overridden_template,
    require_network_policies,
    suspend_or_resume,
    wait_for_admission,
    enforce_deadline,
    detect_success,
    force_delete_lost_pods,
    watch_scheduling,
    checkpoint_before_drain,
    resize_job,
    recover,
    count_replicas,
    set_phase,
    note_all_running,
    detect_stall,
    recycle_parameter_servers,
    retire_old_chiefs,
    await_former_job,
)


def plan_reconcile(
    job: Obj,
    observed: Observed,
    report: ProgressReport | None,
    now: datetime,
    *,
    cluster_domain: str = "cluster.local",
    operator_namespace: str | None = None,
    operator_pod_labels: tuple[tuple[str, str], ...] = (),
    checkpoint_outcome: CheckpointOutcome | None = None,
    unmade: Mapping[str, str] | None = None,
) -> ReconcilePlan:
    """The decision of one reconcile; `unmade`: the children the last changes could not make
    ("Kind/name" -> why)."""
    d = Draft.start(
        job, observed, now, cluster_domain, operator_namespace, checkpoint_outcome, operator_pod_labels
    )
    d.unmade = unmade or {}
    try:
        spec = PSTrainingJobSpec.model_validate(job.get("spec") or {})
    except ValidationError as error:
        refuse_invalid_spec(d, error)
        return d.plan()
    merge_progress(d.status, report, d.stamp)
    spec = _running_shape(spec, d)
    for stage in STAGES:
        if stage(spec, d) is DECIDED:
            break
    else:  # the job runs on: the children of the current attempt, and a wake-up for the deadline
        d.render = d.options()
        d.wake_in(deadline.seconds_left(spec, d.status, d.now))
    return d.plan()


def _running_shape(spec: PSTrainingJobSpec, d: Draft) -> PSTrainingJobSpec:
    """The spec as the running attempt has it (api/shape.py, policies/resize.py): its shape, its
    pods. The shape is the spec's until a job has one (a new job, or one an older operator started:
    its replicas could not change), and so are the PS resources of a shape an older operator wrote."""
    d.requested = requested(spec)
    d.status.shape = running(d.status.shape, spec)
    d.observed, d.status.tracking = resize.within(d.observed, d.status.tracking, d.name, d.status.shape)
    return with_shape(spec, d.status.shape)


def refuse_invalid_spec(d: Draft, error: ValidationError) -> None:
    """A spec the models refuse (the CRD schema should have): Failed once, and no children."""
    message = "; ".join(f"spec.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())[:1024]
    if d.old.phase != Phase.FAILED:
        d.end(Phase.FAILED, "InvalidSpec", message)


def _recorded_event(failure: Failure) -> Event:
    """The event of a failure that is recorded but not acted on."""
    if failure.sidecar:
        return Event("Warning", "SidecarRestarted", failure.describe())
    message = failure.describe()
    if failure.role in TOLERATED_ROLES and failure.reason in START_ERRORS:
        message = f"{message}; it cannot start, training goes on without it"
    elif failure.role is Role.WORKER:
        message = f"{message}; the StatefulSet replaces it, training goes on"
    elif failure.role is Role.EVALUATOR:
        message = f"{message}; its Job restarts it (up to failurePolicy.maxRestarts), training goes on"
    return Event("Warning", f"{failure.role.value.capitalize()}Failed", message)
