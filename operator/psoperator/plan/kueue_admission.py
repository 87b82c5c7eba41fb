"""The reconcile stages of a job queued with Kueue (policies/queueing.py): it runs only while its
Workload is admitted; the Workload is finished with the job."""

from __future__ import annotations

from psoperator.api.models import PSTrainingJobSpec
from psoperator.api.vocabulary import ConditionType, Phase
from psoperator.plan.draft import Draft, Event
from psoperator.policies import planned_stop, queueing
from psoperator.policies.planned_stop import StopCause
from psoperator.render.workload import workload_name
from psoperator.status.replicas import all_running

DECIDED, GO_ON = True, False
# How often a job labelled for a queue looks again for Kueue's API while it is not served.
KUEUE_ABSENT_RESYNC_SECONDS = 60.0
NOT_SERVED = (
    "Kueue's Workload API (kueue.x-k8s.io/v1beta2) is not served: install Kueue, or remove the "
    "label kueue.x-k8s.io/queue-name to run the job unqueued"
)


def wait_for_admission(spec: PSTrainingJobSpec, d: Draft) -> bool:
    """A job labelled with a queue runs only while its Workload (of the shape the spec asks for) is
    admitted; otherwise its pods stop, after a checkpoint if the chief runs, and it waits."""
    if d.queue is None:
        if d.status.admission is not None or d.old.phase == Phase.QUEUED:
            d.status.admission = None
            d.condition(
                ConditionType.QUEUED, False, "Unqueued", "the label kueue.x-k8s.io/queue-name is gone"
            )
        return GO_ON
    kueue, workload = d.observed.kueue, d.observed.workload
    if kueue is None or not kueue.served:
        d.wake_in(KUEUE_ABSENT_RESYNC_SECONDS)
        return _wait(d, "KueueNotInstalled", NOT_SERVED)
    shape = d.requested or d.status.shape
    wanted = workload_name(d.name, shape) if shape else None
    if workload is not None and workload.name == wanted and workload.admitted:
        _admitted(spec, d)
        return GO_ON
    cause = StopCause.RESIZE if workload is not None and workload.name != wanted else StopCause.EVICT
    ask = planned_stop.ask_for(spec, d.observed, d.status.restarts, cause)
    if ask is not None and d.awaiting_checkpoint(ask):
        d.condition(ConditionType.QUEUED, False, "Checkpointing", "asking the chief for a checkpoint first")
        d.render = d.options()
        return DECIDED
    d.workload_wanted = workload is None or workload.name == wanted
    d.status.shape = shape  # nothing runs: the next attempt has the shape the spec asks for
    reason, message = queueing.waiting_reason(d.queue, workload)
    if ask is not None and d.status.last_planned_stop is not None:
        message = f"{message}; stopped {planned_stop.describe(d.status.last_planned_stop)}"
        d.cut_ps_drain(ask)
    if (
        workload is not None
        and workload.true("Evicted")
        and workload.true("QuotaReserved")
        and not d.observed.pods
    ):
        d.workload_patch = queueing.give_back(workload, d.now)
    return _wait(d, reason, message)


def _wait(d: Draft, reason: str, message: str) -> bool:
    """Nothing of the job runs while it waits (its Services and empty StatefulSets stay)."""
    d.status.admission = None
    d.condition(ConditionType.QUEUED, True, reason, message, event=Event("Normal", "Queued", message))
    d.enter(Phase.QUEUED)
    d.stop_pods("Queued", message)
    return DECIDED


def _admitted(spec: PSTrainingJobSpec, d: Draft) -> None:
    """The job runs as admitted; the first time, status.admission records how; every pod running
    is PodsReady on the Workload."""
    workload, kueue = d.observed.workload, d.observed.kueue
    assert workload is not None and kueue is not None
    if d.status.admission is None or d.status.admission.workload != workload.name:
        d.status.admission = queueing.admission_of(workload, kueue.flavors)
        said = queueing.describe(d.status.admission)
        d.condition(ConditionType.QUEUED, False, "Admitted", said)
        d.events.append(Event("Normal", "Admitted", said))  # once per admission: it is recorded now
        d.status.start_time = d.status.start_time or d.stamp
    if not workload.true("PodsReady") and all_running(spec, d.observed, d.status.restarts):
        d.workload_patch = queueing.pods_ready(workload, d.now)


def finish_workload(d: Draft, phase: Phase, message: str) -> None:
    """An ended job's Workload is finished, so that Kueue frees its quota."""
    workload = d.observed.workload
    if workload is not None and not workload.finished:
        d.workload_patch = queueing.finish(workload, phase is Phase.SUCCEEDED, message, d.now)
