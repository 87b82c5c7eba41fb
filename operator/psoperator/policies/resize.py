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
from typing import TYPE_CHECKING, Any

from psoperator.api.models import ContainerResources, PSTrainingJobSpec, Shape, Tracking
from psoperator.contract import Role

if TYPE_CHECKING:  # the renderer imports this module, and views.py imports the renderer's names
    from psoperator.observe.views import Observed, PodView

Obj = dict[str, Any]
RESIZABLE = ("requests", "limits")  # of a PS container's resources (the CRD's rules: api/crd.py)


def requested(spec: PSTrainingJobSpec) -> Shape:
    return Shape(ps=spec.ps.replicas, workers=spec.worker.replicas, psResources=ps_resources(spec))


def ps_resources(spec: PSTrainingJobSpec) -> dict[str, ContainerResources]:
    """The requests and limits of the PS containers that set any, by name."""
    found = {str(c.get("name")): _resources_of(c) for c in _containers(spec.ps.template)}
    return {name: resources for name, resources in found.items() if resources is not None}


def _resources_of(container: Obj) -> ContainerResources | None:
    """A container's requests and limits, quantities as strings (a bare number too); None: it sets none."""
    resources = container.get("resources") or {}
    kept = {k: {n: str(q) for n, q in resources[k].items()} for k in RESIZABLE if resources.get(k)}
    return ContainerResources.model_validate(kept) if kept else None


def running(shape: Shape | None, spec: PSTrainingJobSpec) -> Shape:
    """The shape of the running attempt: status.shape, or the spec's where the status says nothing
    (a new job; a job an earlier operator started, whose status has no psResources: until then the
    PS template could not change, so it runs with the spec's)."""
    if shape is None:
        return requested(spec)
    if shape.ps_resources is None:
        return shape.model_copy(update={"ps_resources": ps_resources(spec)})
    return shape


def with_shape(spec: PSTrainingJobSpec, shape: Shape) -> PSTrainingJobSpec:
    """The spec as the attempt of `shape` runs it."""
    if requested(spec) == shape:
        return spec
    template = spec.ps.template
    if shape.ps_resources is not None:
        template = _with_resources(template, shape.ps_resources)
    ps = spec.ps.model_copy(update={"replicas": shape.ps, "template": template})
    worker = spec.worker.model_copy(update={"replicas": shape.workers})
    return spec.model_copy(update={"ps": ps, "worker": worker})


def _containers(template: Obj) -> list[Obj]:
    return list((template.get("spec") or {}).get("containers") or [])


def _with_resources(template: Obj, resources: dict[str, ContainerResources]) -> Obj:
    """A PS template whose containers have these requests and limits (claims are kept)."""
    containers = [_container_with(c, resources.get(str(c.get("name")))) for c in _containers(template)]
    return {**template, "spec": {**template.get("spec", {}), "containers": containers}}


def _container_with(container: Obj, wanted: ContainerResources | None) -> Obj:
    if _resources_of(container) == wanted:  # as written (cpu: 2 stays a number): nothing to patch
        return container
    kept = {k: v for k, v in (container.get("resources") or {}).items() if k not in RESIZABLE}
    resources = {**kept, **(wanted.model_dump(exclude_none=True) if wanted else {})}
    rest = {k: v for k, v in container.items() if k != "resources"}
    return {**rest, "resources": resources} if resources else rest


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
