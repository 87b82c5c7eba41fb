"""The admission check: can each PS's containers hold its share of the model in spec.model?"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from psoperator.api.models import ModelHints, PSTrainingJobSpec
from psoperator.sizing.errors import SizingError
from psoperator.sizing.planner import SizingPlan, plan_ps, plan_summary
from psoperator.sizing.quantity import format_quantity, human_bytes, parse_bytes


@dataclass(frozen=True)
class PodMemory:
    """The memory a pod template's containers may use: each container's limit, else its request."""

    bytes: int  # sum over the containers that set either
    unset: tuple[str, ...]  # containers that set neither
    source: str  # "limit", "request" or "limit/request" (mixed), for messages


def pod_memory(template: Mapping[str, Any]) -> PodMemory:
    """Reads the containers' memory from a pod template; raises SizingError on a bad quantity."""
    containers = (template.get("spec") or {}).get("containers") or []
    total = 0
    unset: list[str] = []
    sources: set[str] = set()
    for index, container in enumerate(containers):
        resources = container.get("resources") or {}
        limit = (resources.get("limits") or {}).get("memory")
        request = (resources.get("requests") or {}).get("memory")
        if limit is not None:
            total += parse_bytes(limit)
            sources.add("limit")
        elif request is not None:
            total += parse_bytes(request)
            sources.add("request")
        else:
            unset.append(str(container.get("name") or f"#{index}"))
    if not containers:
        unset.append("(no containers in the template)")
    return PodMemory(bytes=total, unset=tuple(unset), source="/".join(sorted(sources)) or "none")


class SizingLevel(enum.StrEnum):
    OK = "ok"
    WARNING = "warning"
    REFUSE = "refuse"


@dataclass(frozen=True)
class SizingVerdict:
    level: SizingLevel
    reason: str  # CamelCase, for the SizingWarning condition and the event
    message: str
    suggested_request: str | None = None
    plan: SizingPlan | None = None


def check_ps_memory(spec: PSTrainingJobSpec) -> SizingVerdict:
    """Whether each PS's containers can hold its share of the model in spec.model.

    The containers' limits bind (a request alone is what the scheduler reserves). Undersized PS
    are a warning, or a refusal with model.enforce; an unset memory is always only a warning,
    since there is nothing to compare against.
    """
    hints = spec.model
    if hints is None:
        return SizingVerdict(SizingLevel.OK, "NoModelHints", "spec.model is not set; PS sizing not checked")
    replicas = spec.ps.replicas
    try:
        plan = plan_ps(hints, num_ps=replicas)
        memory = pod_memory(spec.ps.template)
    except SizingError as error:
        return SizingVerdict(SizingLevel.WARNING, "InvalidSizingInput", f"cannot check PS sizing: {error}")

    needs = f"each of the {replicas} PS needs {human_bytes(plan.per_ps_bytes)} ({plan_summary(plan)})"
    if memory.unset:
        return SizingVerdict(
            SizingLevel.WARNING,
            "PSMemoryNotSet",
            f"PS container(s) {', '.join(memory.unset)} set no memory request or limit, so their "
            f"size cannot be checked: {needs}; set resources.requests.memory and "
            f"resources.limits.memory to {plan.memory_request}",
            suggested_request=plan.memory_request,
            plan=plan,
        )
    if memory.bytes >= plan.per_ps_bytes:
        return SizingVerdict(
            SizingLevel.OK,
            "PSMemorySufficient",
            f"{needs}; it has {format_quantity(memory.bytes)} ({memory.source})",
            plan=plan,
        )
    alternative = _alternative_ps_count(hints, memory.bytes, replicas)
    message = (
        f"{needs}, but its memory {memory.source} is {format_quantity(memory.bytes)}: "
        f"set the PS memory request and limit to {plan.memory_request}{alternative}"
    )
    if hints.enforce:
        return SizingVerdict(
            SizingLevel.REFUSE,
            "PSMemoryUndersized",
            f"refusing to start (spec.model.enforce): {message}",
            suggested_request=plan.memory_request,
            plan=plan,
        )
    return SizingVerdict(
        SizingLevel.WARNING,
        "PSMemoryUndersized",
        message,
        suggested_request=plan.memory_request,
        plan=plan,
    )


def _alternative_ps_count(hints: ModelHints, memory_bytes: int, replicas: int) -> str:
    try:
        plan = plan_ps(hints, ps_memory_bytes=memory_bytes)
    except SizingError:
        return ""
    if plan.num_ps <= replicas:
        return ""
    return f", or use {plan.num_ps} PS of {format_quantity(memory_bytes)}"
