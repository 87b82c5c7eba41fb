"""Live resize: spec.ps.replicas, spec.worker.replicas or the PS containers' resources changed on
a running job: more PS memory for a job that keeps OOMing, without losing its history.

A resize is a planned stop, not a failure: the chief is asked for a checkpoint (planned_stop.py),
then the operator makes the coordinated restart it makes for a lost parameter server, with the
new shape: a new chief attempt whose TF_CONFIG lists the new cluster, the parameter servers
restarted with it (they always are: ps_recycle.py), so the new PS pods get the new resources, the
StatefulSets scaled. The new chief restores the checkpoint into the new number of shards. Nothing
is counted against maxRestarts and lastFailure is untouched.

    the job                                   the resize
    has no chief Job of its current attempt   applies at once: the next attempt has the new
    (not started yet, suspended, a restart    shape (a suspended job's, when it resumes)
    waiting for its old PS to go)
    a chief Job that is not running yet       a restart at once (nothing to save)
    a running chief                           a checkpoint first, then the restart
    spec.model.enforce refuses the new shape  not resized; the Resized condition says why

Until the restart, everything runs with the shape of the attempt that runs (status.shape): the
spec's new replicas are not rendered, counted or tracked, and the PS StatefulSet keeps the old
resources (a PS replaced meanwhile, after a failure, gets those of the PS it replaces). Pods beyond
that shape (a StatefulSet scaling down after a resize) are leftovers of the old one, not failures.
"""

from __future__ import annotations

from dataclasses import replace

from psoperator.api.models import Shape, Tracking
from psoperator.contract import Role
from psoperator.observe.views import Observed, PodView


def _counts(shape: Shape) -> dict[Role, int]:
    return {Role.PS: shape.ps, Role.WORKER: shape.workers}


def beyond(pod: PodView, shape: Shape) -> bool:
    """A parameter server or worker whose index the shape has no room for."""
    count = _counts(shape).get(pod.role) if pod.role is not None else None
    return count is not None and pod.index is not None and pod.index >= count


def _name_beyond(job: str, name: str, shape: Shape) -> bool:
    for role, count in _counts(shape).items():
        index = name.removeprefix(f"{job}-{role.value}-")
        if index != name and index.isdigit() and int(index) >= count:
            return True
    return False


def within(observed: Observed, tracking: Tracking, job: str, shape: Shape) -> tuple[Observed, Tracking]:
    """What is observed and tracked of the shape's pods only."""
    pods = [p for p in observed.pods if not beyond(p, shape)]
    kept = {name: entry for name, entry in tracking.pods.items() if not _name_beyond(job, name, shape)}
    return replace(observed, pods=pods), tracking.model_copy(update={"pods": kept})
