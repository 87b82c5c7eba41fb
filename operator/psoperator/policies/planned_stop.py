"""Planned stops: a checkpoint asked of the chief before a stop the cluster plans, so that the stop
costs no step.

    stop                                  what the operator asks, when
    runPolicy.suspend                     a checkpoint, then the pods are deleted (the job waits
                                          for the answer up to checkpointBeforeStopSeconds)
    a PS pod going away (deletion with    a checkpoint at once, while the PS still serves (its
    grace, DisruptionTarget: eviction,    runtime drains on SIGTERM); the restart after it is
    kubectl drain, preemption)            gone resumes from that checkpoint
    a worker or evaluator going away      nothing: no state of the job lives there (the
                                          coordinator re-dispatches a worker's steps)
    the chief pod going away              nothing: the chief saves on its own SIGTERM
    Kueue evicting the job's Workload     a checkpoint, then the pods are deleted (queueing.py)

The chief is asked only while the current attempt's chief pod runs and has an address. A chief
that does not serve POST /checkpoint (a plain TensorFlow image) is not waited for: the stop goes on
as without the request, and status.lastPlannedStop says why there was no checkpoint.

Each ask names the stop it is for (`cause`, and the uids of the pods whose stop it is); its outcome
is kept in status.lastPlannedStop, so a stop is asked for once, across operator restarts too.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from psoperator.api.models import PlannedStop, PSTrainingJobSpec
from psoperator.contract import CheckpointAnswer, CheckpointStatus, Role
from psoperator.observe.views import Observed, PodView
from psoperator.timeutil import format_time


class StopCause(enum.StrEnum):
    SUSPEND = "Suspend"
    DRAIN = "Drain"  # a parameter server pod being deleted or disrupted
    RESIZE = "Resize"  # spec.ps.replicas or spec.worker.replicas changed
    EVICT = "Evicted"  # Kueue took the job's admission back (queueing.py)


@dataclass(frozen=True)
class CheckpointAsk:
    """A checkpoint request to send to the chief before a stop; `uids` and `cause` name the stop."""

    cause: StopCause
    pods: tuple[str, ...]  # the pods whose stop it is, by name (the chief's own for a suspend)
    uids: tuple[str, ...]  # and by uid, sorted
    chief_uid: str
    chief_ip: str
    deadline_seconds: float
    # No step is scheduled for this long after the save: the steps would be lost with the stop.
    hold_seconds: float


@dataclass(frozen=True)
class CheckpointOutcome:
    """What the chief answered to an ask (status None: no HTTP answer at all)."""

    ask: CheckpointAsk
    status: CheckpointStatus | int | None
    answer: CheckpointAnswer
    at: datetime

    @property
    def saved(self) -> bool:
        return self.status == CheckpointStatus.SAVED and self.answer.checkpoint_step is not None


def draining_ps(observed: Observed) -> list[PodView]:
    """Parameter server pods that are being stopped (a deletion with grace or a DisruptionTarget)
    while they still serve. A pod of a lost node is no longer reachable: nothing to save from it."""
    return [
        p
        for p in observed.role_pods(Role.PS)
        if (p.deleting or p.disruption) and p.phase == "Running" and p.terminated is None and not p.node_lost
    ]


def ask_for(
    spec: PSTrainingJobSpec,
    observed: Observed,
    attempt: int,
    cause: StopCause,
    stopping: list[PodView] | None = None,
) -> CheckpointAsk | None:
    """The ask before this stop of the pods `stopping` (the chief's for a suspend); None when no
    chief can be asked (none runs, it has no address) or checkpointBeforeStopSeconds is 0."""
    seconds = spec.failure_policy.checkpoint_before_stop_seconds
    chief = observed.chief_pod(attempt)
    if seconds == 0 or chief is None or not chief.running or not chief.ip:
        return None
    pods = sorted(stopping if stopping is not None else [chief], key=lambda p: p.uid)
    return CheckpointAsk(
        cause=cause,
        pods=tuple(p.name for p in pods),
        uids=tuple(p.uid for p in pods),
        chief_uid=chief.uid,
        chief_ip=chief.ip,
        deadline_seconds=float(seconds),
        hold_seconds=float(seconds),
    )


def covered(record: PlannedStop | None, ask: CheckpointAsk) -> bool:
    """The stop was asked for already (and answered): every pod of this stop is in the record's."""
    return record is not None and record.cause == ask.cause and set(ask.uids) <= set(record.uids)


def answered(outcome: CheckpointOutcome | None, ask: CheckpointAsk) -> bool:
    return outcome is not None and outcome.ask.cause == ask.cause and set(ask.uids) <= set(outcome.ask.uids)


def record(outcome: CheckpointOutcome) -> PlannedStop:
    """The outcome as status.lastPlannedStop keeps it."""
    answer = outcome.answer
    return PlannedStop(
        cause=outcome.ask.cause.value,
        pods=list(outcome.ask.pods),
        uids=list(outcome.ask.uids),
        time=format_time(outcome.at),
        checkpointStep=answer.checkpoint_step if outcome.saved else None,
        checkpointPath=answer.checkpoint_path if outcome.saved else None,
        saved=answer.saved if outcome.saved else None,
        reason=None if outcome.saved else (answer.reason or f"the chief answered HTTP {outcome.status}"),
    )


def describe(stop: PlannedStop) -> str:
    """Which checkpoint the stop was taken after, for its condition and event."""
    if stop.checkpoint_step is None:
        return f"without a new checkpoint ({stop.reason})"
    return f"after the checkpoint at step {stop.checkpoint_step}{_where(stop)}"


def describe_drain(stop: PlannedStop) -> str:
    """The event of a checkpoint asked for because parameter servers are being stopped."""
    pods = ", ".join(stop.pods)
    if stop.checkpoint_step is None:
        return (
            f"{pods} being stopped, no checkpoint before ({stop.reason}): the restart resumes from the latest"
        )
    step = stop.checkpoint_step
    return f"{pods} being stopped: checkpoint at step {step}{_where(stop)}, which the restart resumes from"


def _where(stop: PlannedStop) -> str:
    return f" ({stop.checkpoint_path})" if stop.checkpoint_path else ""
