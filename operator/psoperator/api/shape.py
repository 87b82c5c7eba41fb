"""A job's shape (api/models.py Shape): its replica counts and PS containers' resources as its spec
asks for them, and the spec as an attempt of a given shape runs it. Renderers, policies and stages
share it; live resize (policies/resize.py) is what changes it."""

from __future__ import annotations

from typing import Any

from psoperator.api.models import ContainerResources, PSTrainingJobSpec, Shape

Obj = dict[str, Any]
RESIZABLE = ("requests", "limits")  # of a PS container's resources (the CRD's rules: api/crd_rules.py)


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
