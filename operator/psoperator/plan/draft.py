"""The decision of one reconcile as its stages build it: one small mutable draft, then the plan.

The stages in stages.py read what the job's status was (`old`) and what was observed, and write
what it will be (`status`), the events to emit and the children to want. Events of a condition are
queued by `condition` only when the condition flips, and by `enter` only when the phase changes,
so no stage checks "was it already so?".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from psoperator.api.models import PSTrainingJobStatus, Shape, Tracking
from psoperator.api.vocabulary import ConditionType, Phase
from psoperator.contract import Role
from psoperator.observe.views import Observed, PodView
from psoperator.policies import planned_stop, queueing
from psoperator.policies.planned_stop import CheckpointAsk, CheckpointOutcome
from psoperator.policies.queueing import WorkloadPatch
from psoperator.render import RenderOptions
from psoperator.status.conditions import is_true, set_condition
from psoperator.timeutil import format_time, parse_time

Obj = dict[str, Any]
# Grace of a parameter server whose variables nobody will read: one restarted with the chief (they
# are discarded), or one stopped after the stop's checkpoint was written. The runtime's drain on
# SIGTERM (serving a last checkpoint before a planned stop, 20 s by default) has nothing to serve.
RECYCLED_PS_GRACE_SECONDS = 1


def stops_within_recycled_grace(pod: PodView) -> bool:
    """Deleted already, with no more grace than RECYCLED_PS_GRACE_SECONDS: a deletion with it would
    not cut the pod's stop shorter (a drained PS's longer grace would be)."""
    return pod.deleting and (pod.deletion_grace or 0) <= RECYCLED_PS_GRACE_SECONDS


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class PodDeletion:
    """A pod to delete, if it is still the one with this uid, with this grace (0: force).

    With `orphan_of`, the (name, uid) of the pod's Job, which the reconcile did not see: the pod is
    deleted only if no Job of that uid exists. A Job created while the reconcile read may be
    missing from what it read while its new pod is there; a uid never comes back, so a Job of
    that uid absent after the pod was seen is gone for good.
    """

    pod: str
    uid: str
    grace_seconds: int | None  # None: the pod's own terminationGracePeriodSeconds
    orphan_of: tuple[str, str] | None = None
    # Deleted before the children change: a cut of a stopping pod's drain must come before a
    # StatefulSet's scale-down deletes it with its own grace, since a kubelet does not shorten a
    # stop already under way.
    first: bool = False


@dataclass(kw_only=True)
class Actions:
    """What a reconcile does besides writing the status; the stages set it on the draft."""

    render: RenderOptions | None = None  # None: no children wanted (invalid spec)
    events: list[Event] = field(default_factory=list)
    delete_job: bool = False
    requeue_after: float | None = None
    restarted: bool = False
    # (role, reason) of every pod failure seen in this reconcile, for the metrics.
    failures: list[tuple[str, str]] = field(default_factory=list)
    # From the job's creation to every pod running, the first time they all do.
    startup_seconds: float | None = None
    # From the failure that restarted the chief to training running again, when it does.
    recovery_seconds: float | None = None
    # False once the job has ended: children are still patched (scaled down) but none is created or
    # replaced, so a chief Job deleted after the end does not come back to run against stopped PS.
    create_missing: bool = True
    # A chief pod of an older attempt still runs: the current attempt's Job is not created yet, so
    # two coordinators never write the same checkpoints.
    hold_chief: bool = False
    # The plan waits for pods to go (a former chief, a recycled or draining PS). A watch that
    # re-listed sends no DELETED for a pod gone meanwhile, so the reconcile checks the wait against
    # a fresh read now and then (control/reconciler.py) instead of trusting the watch alone.
    awaits_departure: bool = False
    delete_pods: list[PodDeletion] = field(default_factory=list)
    # A parameter server's tracking changed: the status is written at once, not spaced with the
    # other status-only changes, so that a PS that fails right after it appeared is judged against it.
    write_now: bool = False
    # A checkpoint to ask the chief for (before a planned stop), after the status write; the answer
    # comes back to the next reconcile as Draft.checkpoint_outcome.
    ask_checkpoint: CheckpointAsk | None = None
    # A queued job's Workload status to write (queueing.py): the quota given back, PodsReady, Finished.
    workload_patch: WorkloadPatch | None = None


@dataclass
class ReconcilePlan(Actions):
    """The decision of one reconcile: the status to write (as JSON) and the actions."""

    status: Obj


@dataclass
class Draft(Actions):
    old: PSTrainingJobStatus  # as the reconcile found it
    status: PSTrainingJobStatus  # as it will be written
    observed: Observed
    now: datetime
    created: datetime | None = None  # the job's creationTimestamp
    cluster_domain: str = "cluster.local"
    operator_namespace: str | None = None
    # The chief's answer to the job's latest checkpoint ask (the protocol keeps it in the JobState).
    checkpoint_outcome: CheckpointOutcome | None = None
    operator_pod_labels: tuple[tuple[str, str], ...] = ()  # RenderOptions.operator_pod_labels
    requested: Shape | None = None  # the parameter servers, workers and PS resources the spec asks for
    name: str = ""
    queue: str | None = None  # the Kueue LocalQueue the job's label names (queueing.py)
    # The children the last changes could not make, "Kind/name" -> why, as its Warning said.
    unmade: Mapping[str, str] = field(default_factory=dict)
    workload_wanted: bool = True  # False: a queued job's Workload is deleted (its shape is old)

    @classmethod
    def start(
        cls,
        job: Obj,
        observed: Observed,
        now: datetime,
        cluster_domain: str,
        operator_namespace: str | None = None,
        checkpoint_outcome: CheckpointOutcome | None = None,
        operator_pod_labels: tuple[tuple[str, str], ...] = (),
    ) -> Draft:
        raw = job.get("status") or {}
        # Two validations of the same dict: an independent copy at a tenth of a deep copy's cost.
        old, status = PSTrainingJobStatus.model_validate(raw), PSTrainingJobStatus.model_validate(raw)
        meta = job.get("metadata", {})
        status.observed_generation = meta.get("generation")
        created = parse_time(meta.get("creationTimestamp"))
        draft = cls(
            old,
            status,
            observed,
            now,
            created,
            cluster_domain,
            operator_namespace,
            checkpoint_outcome,
            operator_pod_labels,
        )
        draft.name, draft.queue = meta.get("name", ""), queueing.queue_of(meta.get("labels"))
        return draft

    def wake_in(self, seconds: float | None) -> None:
        """Reconcile again in `seconds` at the latest (None: no need), keeping the soonest asked."""
        if seconds is not None:
            self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)

    @property
    def stamp(self) -> str:
        return format_time(self.now)

    def seconds_since(self, moment: datetime | None) -> float | None:
        """Seconds from `moment` to now, never negative (timestamps have whole seconds)."""
        return None if moment is None else max((self.now - moment).total_seconds(), 0.0)

    def options(
        self, *, suspended: bool = False, stopped: bool = False, chief_stopped: bool = False
    ) -> RenderOptions:
        """The children of the attempt the status names (after this reconcile's restart, if any)."""
        return RenderOptions(
            cluster_domain=self.cluster_domain,
            operator_namespace=self.operator_namespace,
            operator_pod_labels=self.operator_pod_labels,
            attempt=self.status.restarts,
            suspended=suspended,
            stopped=stopped,
            chief_stopped=chief_stopped,
            shape=self.status.shape,
            **self._queueing(),
        )

    def _queueing(self) -> dict[str, Any]:
        """A queued job's Workload (where Kueue is served) and admission, for the render options."""
        kueue = self.observed.kueue
        if self.queue is None or kueue is None or not kueue.served or not self.workload_wanted:
            return {"admission": self.status.admission}
        return {"queue": self.queue, "priority": kueue.priority, "admission": self.status.admission}

    def cut_ps_drain(self, ask: CheckpointAsk) -> None:
        """The pods stop after this stop's checkpoint was written: the parameter servers have
        nothing left to serve, so they go in a second instead of draining (a queued job's
        preemptor waits for them). Without that checkpoint they drain: the chief saves on its
        SIGTERM while they answer."""
        stop = self.status.last_planned_stop
        if stop is not None and stop.checkpoint_step is not None and planned_stop.covered(stop, ask):
            self.end_ps_drain()

    def end_ps_drain(self) -> None:
        """The parameter servers go in a second, not serving out their drain: nothing needs them.
        Deleted before the StatefulSet is scaled down (PodDeletion.first)."""
        self.delete_pods += [
            PodDeletion(p.name, p.uid, RECYCLED_PS_GRACE_SECONDS, first=True)
            for p in self.observed.role_pods(Role.PS)
            if not stops_within_recycled_grace(p)
        ]

    def stop_pods(self, reason: str, message: str) -> None:
        """Nothing of the job runs (suspended, or waiting for its queue): its pods go on purpose, so
        nothing is tracked, and the deadline, which counts running time only, does not run. The
        chief Job is deleted, and its pod with it, with the pod's own grace: left to the garbage
        collector, which lags after an API server restart, the chief would train on."""
        self.status.start_time = None
        self.status.tracking = Tracking()
        self.condition(ConditionType.RUNNING, False, reason, message)
        self.render = self.options(suspended=True)
        self.delete_pods += [
            PodDeletion(p.name, p.uid, None)
            for p in self.observed.role_pods(Role.CHIEF)
            if not p.deleting and p.phase not in ("Succeeded", "Failed")
        ]

    def awaiting_checkpoint(self, ask: CheckpointAsk) -> bool:
        """Whether the stop waits for the chief's answer to `ask`: asked now, unless it was answered
        (then kept in status.lastPlannedStop, so that a stop is asked for once)."""
        if planned_stop.covered(self.old.last_planned_stop, ask):
            return False
        if self.checkpoint_outcome is not None and planned_stop.answered(self.checkpoint_outcome, ask):
            self.status.last_planned_stop = planned_stop.record(self.checkpoint_outcome)
            return False
        self.ask_checkpoint = ask
        self.wake_in(0)  # the answer decides the next reconcile
        return True

    def condition(
        self, type_: ConditionType, value: bool, reason: str, message: str = "", *, event: Event | None = None
    ) -> None:
        """Set a condition; queue `event` only if this flips it (a condition not set yet counts as False)."""
        flips = is_true(self.status.conditions, type_) != value
        self.status.conditions = set_condition(
            self.status.conditions,
            type_,
            value,
            reason,
            message,
            now=self.stamp,
            generation=self.status.observed_generation,
        )
        if flips and event is not None:
            self.events.append(event)

    def enter(self, phase: Phase, *, event: Event | None = None) -> None:
        """Set the phase; queue `event` only if the job was in another phase before this reconcile.

        Running is entered again from Creating (the chief's pod came back) with its condition
        still True, so its event follows the phase, not the condition.
        """
        if self.old.phase != phase and event is not None:
            self.events.append(event)
        self.status.phase = phase

    def end(self, phase: Phase, reason: str, message: str) -> None:
        """Succeeded or Failed: the phase, its condition and event; whatever ran is no longer running."""
        self.status.phase = phase
        self.status.completion_time = self.status.completion_time or self.stamp
        for type_ in (ConditionType.RUNNING, ConditionType.RESTARTING, ConditionType.STALLED):
            self.condition(type_, False, reason, message)
        succeeded = phase is Phase.SUCCEEDED
        event = Event("Normal", phase, message) if succeeded else Event("Warning", reason, message)
        self.condition(ConditionType(phase), True, reason, message, event=event)

    def plan(self) -> ReconcilePlan:
        actions = {f.name: getattr(self, f.name) for f in fields(Actions)}
        return ReconcilePlan(
            status=self.status.model_dump(by_alias=True, exclude_none=True, mode="json"), **actions
        )
