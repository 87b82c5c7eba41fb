"""The planner: from model hints to the number of parameter servers and the memory each needs.

Assumptions, stated where a number depends on them: embedding tables are created first, in the
order given; the dense parameters are many small variables that round-robin spreads evenly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from psoperator.api.models import MAX_REPLICAS, ModelHints
from psoperator.sizing.errors import DoesNotFit, SizingError
from psoperator.sizing.placement import (
    SLOTS_PER_PARAMETER,
    TablePlan,
    plan_tables,
    ps_state_bytes,
    with_first_ps,
)
from psoperator.sizing.quantity import format_quantity, human_bytes, round_up_request

# Headroom on parameters + slots: 2 x 1.25. A parameter server that restores a checkpoint (every
# PS after a restart) holds each variable and the value read for it at once, and the allocator
# keeps that peak: after a restore a PS holds about 2.4x its state on top of the runtime, and no
# more over later restarts (tests/trainer/tfcluster/ps_memory.py). The 1.25 covers what comes on top:
# gradients arriving over gRPC (dense ones are full-size, one per worker in flight), checkpoint
# serialization and fragmentation. See docs/performance.md (the figures) and
# e2e/real/test_training.py (five chiefs on a real kubelet, checked against the plan).
DEFAULT_HEADROOM = 2.5
# The TensorFlow server itself (runtime, gRPC, thread stacks) before any variable exists.
DEFAULT_RUNTIME_OVERHEAD_BYTES = 512 * 2**20


@dataclass(frozen=True)
class SizingPlan:
    optimizer: str
    bytes_per_parameter: int
    slots_per_parameter: int
    headroom: float
    runtime_overhead_bytes: int  # per PS
    max_shard_bytes: int | None
    tables: tuple[TablePlan, ...]
    parameters: int
    dense_parameters: int
    parameter_bytes: int
    slot_bytes: int
    state_bytes: int  # parameters + slots
    total_bytes: int  # state with headroom, over all PS (runtime overhead not included)
    num_ps: int
    ps_memory_bytes: int | None  # the instance memory the PS count was fitted to, if given
    even_share_bytes: int  # state_bytes / num_ps: what a perfectly even placement would give
    max_ps_state_bytes: int  # state on the fullest PS under round-robin placement
    fullest_ps: int
    per_ps_bytes: int  # need of the fullest PS: its state with headroom, plus the runtime
    memory_request_bytes: int  # per_ps_bytes rounded up to REQUEST_STEP_BYTES
    memory_request: str
    largest_shard_table: str | None
    largest_shard_bytes: int  # parameters only; with slots it is (1 + slots) times that
    notes: tuple[str, ...]


def _dense_parameters(hints: ModelHints, embedding_parameters: int) -> int:
    if hints.parameters is None:
        if not hints.embeddings:
            raise SizingError("model hints name neither parameters nor embeddings")
        return 0
    if hints.parameters < embedding_parameters:
        raise SizingError(
            f"model.parameters ({hints.parameters:,}) is less than the embedding tables' "
            f"{embedding_parameters:,} parameters; it counts all trainable parameters, "
            "embeddings included"
        )
    return hints.parameters - embedding_parameters


def plan_ps(
    hints: ModelHints,
    *,
    num_ps: int | None = None,
    ps_memory_bytes: int | None = None,
    headroom: float = DEFAULT_HEADROOM,
    runtime_overhead_bytes: int = DEFAULT_RUNTIME_OVERHEAD_BYTES,
) -> SizingPlan:
    """Plans the parameter servers for a model.

    With `num_ps`, sizes each of that many PS; otherwise with `ps_memory_bytes` (what one PS pod
    may use), finds the fewest PS whose rounded request fits it; with neither, plans a single PS.
    `hints.parameters` counts all parameters; what the embedding tables do not account for is dense.
    Raises DoesNotFit when no PS count up to the API's maximum fits `ps_memory_bytes`.
    """
    if headroom < 1:
        raise SizingError(f"headroom must be at least 1, got {headroom}")
    if runtime_overhead_bytes < 0:
        raise SizingError("runtime overhead cannot be negative")
    if num_ps is not None and not 1 <= num_ps <= MAX_REPLICAS:
        raise SizingError(f"the number of PS must be between 1 and {MAX_REPLICAS}, got {num_ps}")
    if len({t.name for t in hints.embeddings}) != len(hints.embeddings):
        raise SizingError("embedding table names must be unique")

    bpp = hints.bytes_per_parameter
    slots = SLOTS_PER_PARAMETER[hints.optimizer]
    tables = plan_tables(hints.embeddings, bpp, hints.max_shard_bytes)
    embedding_parameters = sum(t.rows * t.dim for t in tables)
    dense = _dense_parameters(hints, embedding_parameters)
    parameters = embedding_parameters + dense
    parameter_bytes = parameters * bpp
    state_copies = 1 + slots
    factor = Fraction(str(headroom))

    layout = _Layout(tables, bpp, state_copies, dense, factor, runtime_overhead_bytes)
    if num_ps is None:
        num_ps = 1 if ps_memory_bytes is None else layout.fewest_ps(ps_memory_bytes)
    max_state, fullest_ps = layout.fullest(num_ps)
    per_ps = layout.need(max_state)

    largest = max(tables, key=lambda t: t.largest_shard_bytes, default=None)
    notes = _notes(hints, tables, dense, num_ps, max_state, parameter_bytes * state_copies)
    return SizingPlan(
        optimizer=hints.optimizer,
        bytes_per_parameter=bpp,
        slots_per_parameter=slots,
        headroom=headroom,
        runtime_overhead_bytes=runtime_overhead_bytes,
        max_shard_bytes=hints.max_shard_bytes,
        tables=with_first_ps(tables, num_ps),
        parameters=parameters,
        dense_parameters=dense,
        parameter_bytes=parameter_bytes,
        slot_bytes=parameter_bytes * slots,
        state_bytes=parameter_bytes * state_copies,
        total_bytes=math.ceil(parameter_bytes * state_copies * factor),
        num_ps=num_ps,
        ps_memory_bytes=ps_memory_bytes,
        even_share_bytes=-(-parameter_bytes * state_copies // num_ps),
        max_ps_state_bytes=max_state,
        fullest_ps=fullest_ps,
        per_ps_bytes=per_ps,
        memory_request_bytes=round_up_request(per_ps),
        memory_request=format_quantity(round_up_request(per_ps)),
        largest_shard_table=largest.name if largest else None,
        largest_shard_bytes=largest.largest_shard_bytes if largest else 0,
        notes=notes,
    )


@dataclass(frozen=True)
class _Layout:
    """A model's shards with what a PS needs for them, to evaluate PS counts against."""

    tables: tuple[TablePlan, ...]
    bytes_per_parameter: int
    state_copies: int
    dense_parameters: int
    headroom: Fraction
    runtime_overhead_bytes: int

    def need(self, state_bytes: int) -> int:
        return math.ceil(state_bytes * self.headroom) + self.runtime_overhead_bytes

    def fullest(self, num_ps: int) -> tuple[int, int]:
        """State bytes on the fullest PS, and its index."""
        loads = ps_state_bytes(
            self.tables,
            bytes_per_parameter=self.bytes_per_parameter,
            state_copies=self.state_copies,
            dense_parameters=self.dense_parameters,
            num_ps=num_ps,
        )
        top = max(loads)
        return top, loads.index(top)

    def fewest_ps(self, ps_memory_bytes: int) -> int:
        """The fewest PS whose rounded memory request fits ps_memory_bytes."""
        memory = format_quantity(ps_memory_bytes)
        # Memory that only just holds the runtime holds no parameters either.
        if round_up_request(self.need(0)) >= ps_memory_bytes:
            raise DoesNotFit(
                f"a PS needs {human_bytes(self.runtime_overhead_bytes)} for the TensorFlow runtime "
                f"alone, more than {memory}"
            )
        if self.tables:
            table = max(self.tables, key=lambda t: t.largest_shard_bytes)
            shard_state = table.largest_shard_bytes * self.state_copies
            shard_need = round_up_request(self.need(shard_state))
            if shard_need > ps_memory_bytes:
                raise DoesNotFit(
                    f"the largest shard (table {table.name}, {human_bytes(shard_state)} with "
                    f"optimizer slots) needs {format_quantity(shard_need)} on one PS, more than "
                    f"{memory}; set a smaller max shard size"
                )
        # Fewer PS than the state over the usable memory cannot fit: start there and take the first
        # count that does. The fullest PS does not always shrink as PS are added, so no bisection.
        state = (
            sum(t.bytes for t in self.tables) + self.dense_parameters * self.bytes_per_parameter
        ) * self.state_copies
        usable = ps_memory_bytes - self.runtime_overhead_bytes
        for num_ps in range(max(1, -(-state // usable)), MAX_REPLICAS + 1):
            if round_up_request(self.need(self.fullest(num_ps)[0])) <= ps_memory_bytes:
                return num_ps
        raise DoesNotFit(f"the model does not fit on {MAX_REPLICAS} PS of {memory}; use PS with more memory")


def _notes(
    hints: ModelHints,
    tables: Sequence[TablePlan],
    dense: int,
    num_ps: int,
    max_state: int,
    state_bytes: int,
) -> tuple[str, ...]:
    notes = []
    if tables and hints.max_shard_bytes is None:
        notes.append(
            "no max shard size: every table is one variable on one PS; partition large tables with "
            "MaxSizePartitioner"
        )
    shards = sum(t.shards for t in tables)
    if tables and num_ps > 1 and shards % num_ps:
        notes.append(
            f"{shards} shards do not divide evenly over {num_ps} PS; the fullest PS holds "
            f"{human_bytes(max_state)} of state, an even split {human_bytes(-(-state_bytes // num_ps))}"
        )
    if dense and tables:
        notes.append("dense parameters are assumed spread evenly over the PS")
    if hints.optimizer in ("adam", "adamw"):
        notes.append("Adam with amsgrad=True keeps a third slot (vhat); plan it as 3 slots")
    return tuple(notes)


def plan_summary(plan: SizingPlan) -> str:
    """The plan in one line, for messages."""
    slots = f"{plan.slots_per_parameter} {plan.optimizer} slot(s)"
    return (
        f"{human_bytes(plan.max_ps_state_bytes)} of parameters and {slots} on the fullest PS, "
        f"x{plan.headroom:g} headroom, + {human_bytes(plan.runtime_overhead_bytes)} runtime"
    )
