"""What the metrics show of one job after a reconcile, computed purely: the job as the reconcile read
it (its status before), the plan (its status after, what happened) and the clock in, a reading out.

registry.py puts readings on the registry; the kopf layer only passes them on.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from psoperator.api.models import PSTrainingJobSpec, PSTrainingJobStatus, ReplicaStatus
from psoperator.api.vocabulary import ConditionType, Phase
from psoperator.plan.draft import ReconcilePlan
from psoperator.status.conditions import is_true
from psoperator.timeutil import parse_time

Obj = dict[str, Any]
# A step that has not moved for this long reads as a rate of 0, not as the last rate seen.
STEP_RATE_IDLE_SECONDS = 60.0


@dataclass(frozen=True)
class JobReading:
    phase: Phase
    replicas: dict[str, ReplicaStatus] = field(default_factory=dict)  # by role
    failures: list[tuple[str, str]] = field(default_factory=list)  # (role, reason) seen this time
    step: int | None = None
    step_rate: float | None = None  # steps per second; None: no news, the last rate stands
    checkpoint_step: int | None = None
    checkpoint_time: float | None = None  # Unix seconds
    checkpoint_interval_steps: int | None = None
    checkpoint_interval_seconds: int | None = None
    counted_restarts: int = 0
    max_restarts: int | None = None
    # What happened in this reconcile, for the counters of the job's namespace.
    created: bool = False
    succeeded: bool = False
    failed_reason: str | None = None
    restarted_reason: str | None = None
    startup_seconds: float | None = None
    recovery_seconds: float | None = None


def read_job(job: Obj, plan: ReconcilePlan, now: datetime) -> JobReading:
    old = PSTrainingJobStatus.model_validate(job.get("status") or {})
    new = PSTrainingJobStatus.model_validate(plan.status)
    try:
        spec: PSTrainingJobSpec | None = PSTrainingJobSpec.model_validate(job.get("spec") or {})
    except ValidationError:  # the plan has failed the job for it; what the status says still reads
        spec = None
    checkpoint_time = parse_time(new.checkpoint.time) if new.checkpoint else None
    return JobReading(
        phase=new.phase,
        replicas=new.replica_statuses,
        failures=plan.failures,
        step=new.step,
        step_rate=step_rate(old, new, now),
        checkpoint_step=new.checkpoint.step if new.checkpoint else None,
        checkpoint_time=checkpoint_time.timestamp() if checkpoint_time else None,
        checkpoint_interval_steps=spec.checkpoint.interval_steps if spec else None,
        checkpoint_interval_seconds=spec.checkpoint.interval_seconds if spec else None,
        counted_restarts=new.counted_restarts,
        max_restarts=spec.failure_policy.max_restarts if spec else None,
        created=_turned_true(old, new, ConditionType.CREATED),
        succeeded=_entered(old, new, Phase.SUCCEEDED),
        failed_reason=_reason(new, ConditionType.FAILED) if _entered(old, new, Phase.FAILED) else None,
        restarted_reason=_reason(new, ConditionType.RESTARTING) if plan.restarted else None,
        startup_seconds=plan.startup_seconds,
        recovery_seconds=plan.recovery_seconds,
    )


# What a reading may have no news of (None): the last reading's value stands, as a gauge set before would.
CARRIED = (
    "step",
    "step_rate",
    "checkpoint_step",
    "checkpoint_interval_steps",
    "checkpoint_interval_seconds",
    "max_restarts",
)


def carried(last: JobReading | None, reading: JobReading) -> JobReading:
    """`reading`, with what it has no news of (a field of CARRIED that is None, a role it lacks) as
    `last` said."""
    if last is None:
        return reading
    kept = {name: getattr(last, name) for name in CARRIED if getattr(reading, name) is None}
    return replace(reading, replicas={**last.replicas, **reading.replicas}, **kept)


def step_rate(old: PSTrainingJobStatus, new: PSTrainingJobStatus, now: datetime) -> float | None:
    """Steps per second from when the previous step was first seen to now, when the step moved on;
    0 once it has not moved for STEP_RATE_IDLE_SECONDS; None when there is nothing new to say (a
    step that went back is a restart from a checkpoint, not a rate)."""
    if new.step is None:
        return None
    since = parse_time(old.step_time)
    if old.step is not None and new.step > old.step and since is not None:
        elapsed = (now - since).total_seconds()
        return (new.step - old.step) / elapsed if elapsed > 0 else None
    moved = parse_time(new.step_time)
    if new.step == old.step and moved is not None and (now - moved).total_seconds() >= STEP_RATE_IDLE_SECONDS:
        return 0.0
    return None


def _entered(old: PSTrainingJobStatus, new: PSTrainingJobStatus, phase: Phase) -> bool:
    return old.phase != phase and new.phase == phase


def _turned_true(old: PSTrainingJobStatus, new: PSTrainingJobStatus, type_: ConditionType) -> bool:
    return not is_true(old.conditions, type_) and is_true(new.conditions, type_)


def _reason(status: PSTrainingJobStatus, type_: ConditionType) -> str:
    return next((c.reason for c in status.conditions if c.type == type_), "Unknown")
