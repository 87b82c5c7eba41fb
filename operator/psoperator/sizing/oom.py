"""What to tell the user when a parameter server was OOMKilled."""

from __future__ import annotations

from psoperator.api.models import PSTrainingJobSpec
from psoperator.sizing.admission import PodMemory, pod_memory
from psoperator.sizing.errors import SizingError
from psoperator.sizing.planner import plan_ps, plan_summary
from psoperator.sizing.quantity import format_quantity, human_bytes, round_up_request


def suggestion_for_oom(spec: PSTrainingJobSpec) -> str:
    """What to tell the user when a PS was OOMKilled, for the recovery event and lastFailure."""
    try:
        memory: PodMemory | None = pod_memory(spec.ps.template)
    except SizingError:
        memory = None
    has = (
        f"{format_quantity(memory.bytes)} ({memory.source})"
        if memory is not None and not memory.unset
        else "no memory limit"
    )
    if spec.model is None:
        return (
            f"PS memory: {has}. Set spec.model (parameters or embeddings, optimizer) so the operator "
            "can size the PS, or run `psoperator plan`"
        )
    try:
        plan = plan_ps(spec.model, num_ps=spec.ps.replicas)
    except SizingError as error:
        return f"PS memory: {has}. spec.model cannot be planned: {error}"
    if memory is not None and not memory.unset and memory.bytes >= plan.per_ps_bytes:
        # The plan said it fits, so the hints or the headroom are too low.
        bigger = format_quantity(round_up_request(memory.bytes * 3 // 2))
        return (
            f"PS memory: {has}, above the planner's {human_bytes(plan.per_ps_bytes)} per PS for "
            f"spec.model; check spec.model (parameters, embeddings, optimizer) and raise the PS "
            f"memory, e.g. to {bigger}"
        )
    return (
        f"PS memory: {has}; the planner estimates {human_bytes(plan.per_ps_bytes)} per PS for "
        f"{spec.ps.replicas} PS ({plan_summary(plan)}): set the PS memory request and limit to "
        f"{plan.memory_request}"
    )
