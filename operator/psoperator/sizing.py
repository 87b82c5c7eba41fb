"""Parameter-server sizing: from model hints to shards, placement and memory per PS.

Pure functions, no I/O. The planner (`plan_ps`) backs both `psoperator plan` and the admission check
(`check_ps_memory`), so the CLI and the operator never disagree about a number.

How TensorFlow lays a model out on the parameter servers, which the planner reproduces:

* `tf.distribute.experimental.partitioners.MaxSizePartitioner(max_shard_bytes)` delegates to
  `variable_axis_size_partitioner` (tensorflow/python/ops/partitioned_variables.py): a table of
  `rows x dim` is split along axis 0 into `ceil(rows / max(1, floor(max_shard_bytes / (dim *
  dtype_size))))` shards. A single row larger than `max_shard_bytes` still makes one shard.
* ParameterServerStrategyV2 (tensorflow/python/distribute/parameter_server_strategy_v2.py) cuts the
  rows "div" style: `rows // shards` each, the first `rows % shards` shards one row more. Every
  variable or shard goes to `/job:ps/task:(count % num_ps)` with one counter across all variables,
  so shards are placed round-robin, continuing where the previous variable stopped. Optimizer slots
  are created colocated with their variable and do not advance the counter.

Assumptions, stated where a number depends on them: embedding tables are created first, in the
order given; the dense parameters are many small variables that round-robin spreads evenly.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any, Literal

from psoperator.api import MAX_REPLICAS, EmbeddingTable, ModelHints, PSTrainingJobSpec

Optimizer = Literal["sgd", "momentum", "adagrad", "adam", "adamw", "ftrl"]
Dtype = Literal["fp32", "bf16", "fp16"]

# Optimizer state per parameter, in copies of the parameter (same shape and dtype). Source: the
# state inputs of TensorFlow's fused update ops (tf.raw_ops.ResourceApply*), which are exactly the
# slot variables the Keras optimizers create for each trainable variable.
SLOTS_PER_PARAMETER: dict[str, int] = {
    "sgd": 0,  # ResourceApplyGradientDescent(var, alpha, delta): stateless.
    "momentum": 1,  # ResourceApplyKerasMomentum(var, accum, ...): Keras SGD(momentum>0) "momentum".
    "adagrad": 1,  # ResourceApplyAdagradV2(var, accum, ...): Keras Adagrad "accumulator".
    "adam": 2,  # ResourceApplyAdam(var, m, v, ...): Keras Adam "m", "v" (amsgrad=True adds "vhat").
    "adamw": 2,  # Adam's m and v; the decoupled weight decay updates the variable, no extra slot.
    "ftrl": 2,  # ResourceApplyFtrlV2(var, accum, linear, ...): Keras Ftrl "accumulator", "linear".
}

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}

# Headroom on parameters + slots: 2 x 1.25. A parameter server that restores a checkpoint (every
# PS after a restart) holds each variable and the value read for it at once, and the allocator
# keeps that peak: measured with tests/trainer's harness (Adagrad, 2 PS, TensorFlow 2.21), a PS
# with 512 MiB of state reached 1.39x its state on top of the runtime when it started the model and
# 2.38x after restoring it, and stayed there over later restarts. The 1.25 covers what comes on top:
# gradients arriving over gRPC (dense ones are full-size, one per worker in flight), checkpoint
# serialization and fragmentation. See tests/trainer/test_ps_memory.py.
DEFAULT_HEADROOM = 2.5
# The TensorFlow server itself (runtime, gRPC, thread stacks) before any variable exists.
DEFAULT_RUNTIME_OVERHEAD_BYTES = 512 * 2**20
# Memory requests are rounded up to this step, so suggestions read as 12Gi, not 11.83Gi.
REQUEST_STEP_BYTES = 256 * 2**20

KiB, MiB, GiB = 2**10, 2**20, 2**30


class SizingError(ValueError):
    """Model hints or inputs the planner cannot work with."""


class DoesNotFit(SizingError):
    """No number of PS of the given memory can hold the model."""


# --- Kubernetes quantities ----------------------------------------------------------------------

# The grammar of k8s.io/apimachinery/pkg/api/resource: a signed decimal number, then a binary SI
# suffix (Ki..Ei), a decimal SI suffix (n, u, m, k, M..E) or a decimal exponent (e3, E-2).
_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:\d+\.?\d*|\.\d+))"
    r"(?:(?P<binary>[KMGTPE]i)|[eE](?P<exponent>[+-]?\d+)|(?P<decimal>[numkMGTPE]))?"
)
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def parse_quantity(quantity: str | int) -> Decimal:
    """Parses a Kubernetes quantity ("16Gi", "512M", "1e9", "250m") into its exact value."""
    if isinstance(quantity, bool):
        raise SizingError(f"not a quantity: {quantity!r}")
    if isinstance(quantity, int):
        return Decimal(quantity)
    match = _QUANTITY.fullmatch(quantity.strip()) if isinstance(quantity, str) else None
    if match is None:
        raise SizingError(
            f"not a Kubernetes quantity: {quantity!r} (expected e.g. 16Gi, 512M, 1e9 or 1073741824)"
        )
    number = Decimal(match["number"])
    if match["binary"]:
        return number * Decimal(1024) ** _BINARY[match["binary"]]
    if match["exponent"]:
        return number.scaleb(int(match["exponent"]))
    if match["decimal"]:
        return number.scaleb(_DECIMAL[match["decimal"]])
    return number


def parse_bytes(quantity: str | int) -> int:
    """A memory quantity in whole bytes, rounded up as Kubernetes does; must be positive."""
    value = parse_quantity(quantity)
    if value <= 0:
        raise SizingError(f"memory must be positive: {quantity!r}")
    return math.ceil(value)


def format_quantity(num_bytes: int) -> str:
    """The shortest exact binary quantity: 12Gi, 768Mi, 1536Ki or plain bytes."""
    for suffix, unit in (("Ti", 2**40), ("Gi", GiB), ("Mi", MiB), ("Ki", KiB)):
        if num_bytes % unit == 0 and num_bytes >= unit:
            return f"{num_bytes // unit}{suffix}"
    return str(num_bytes)


def human_bytes(num_bytes: int) -> str:
    """For people: 4.77 GiB (always binary units, like the requests)."""
    value = float(num_bytes)
    for suffix in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or suffix == "TiB":
            if suffix == "B":
                return f"{num_bytes} B"
            # Three significant digits, without .3g's exponent form between 1000 and 1023.
            return f"{value:.0f} {suffix}" if value >= 100 else f"{value:.3g} {suffix}"
        value /= 1024
    raise AssertionError("unreachable")


def round_up_request(num_bytes: int) -> int:
    return -(-num_bytes // REQUEST_STEP_BYTES) * REQUEST_STEP_BYTES


# --- sharding and placement ---------------------------------------------------------------------


def shard_count(rows: int, row_bytes: int, max_shard_bytes: int | None) -> int:
    """Shards of a `rows`-row table as MaxSizePartitioner(max_shard_bytes) makes them (1 if None)."""
    if rows < 1 or row_bytes < 1:
        raise SizingError("rows and row bytes must be positive")
    if max_shard_bytes is None:
        return 1
    if max_shard_bytes < 1:
        raise SizingError("max shard bytes must be positive")
    rows_per_shard = max(1, max_shard_bytes // row_bytes)
    return -(-rows // rows_per_shard)


def shard_rows(rows: int, shards: int) -> tuple[int, int, int]:
    """(rows of the larger shards, how many of those, rows of the others): TF's "div" split."""
    base, extra = divmod(rows, shards)
    return base + 1, extra, base


@dataclass(frozen=True)
class TablePlan:
    name: str
    rows: int
    dim: int
    bytes: int  # parameters only
    shards: int
    largest_shard_rows: int
    largest_shard_bytes: int  # parameters only
    first_ps: int  # the PS that holds shard 0 (round-robin continues from the previous table)


def _plan_tables(
    tables: Sequence[EmbeddingTable], bytes_per_parameter: int, max_shard_bytes: int | None
) -> tuple[TablePlan, ...]:
    plans = []
    for table in tables:
        row_bytes = table.dim * bytes_per_parameter
        shards = shard_count(table.rows, row_bytes, max_shard_bytes)
        big_rows, extra, base_rows = shard_rows(table.rows, shards)
        largest_rows = big_rows if extra else base_rows
        plans.append(
            TablePlan(
                name=table.name,
                rows=table.rows,
                dim=table.dim,
                bytes=table.rows * row_bytes,
                shards=shards,
                largest_shard_rows=largest_rows,
                largest_shard_bytes=largest_rows * row_bytes,
                first_ps=0,  # set for the chosen PS count by _with_first_ps
            )
        )
    return tuple(plans)


def ps_state_bytes(
    tables: Sequence[TablePlan],
    *,
    bytes_per_parameter: int,
    state_copies: int,
    dense_parameters: int,
    num_ps: int,
) -> list[int]:
    """Bytes of variables and slots on each PS, from the round-robin placement of every shard.

    A table's shards are two sizes (div split), so each PS gets every full round of both plus one
    more of those falling on a cyclic run of PS; that makes this O(tables + num_ps), not O(shards).
    """
    if num_ps < 1:
        raise SizingError("the number of PS must be at least 1")
    base = 0
    diff = [0] * (num_ps + 1)

    def add_run(start: int, length: int, amount: int) -> None:
        start %= num_ps
        end = start + length
        diff[start] += amount
        if end <= num_ps:
            diff[end] -= amount
        else:
            diff[num_ps] -= amount
            diff[0] += amount
            diff[end - num_ps] -= amount

    counter = 0
    for table in tables:
        row_state = table.dim * bytes_per_parameter * state_copies
        big_rows, n_big, small_rows = shard_rows(table.rows, table.shards)
        n_small = table.shards - n_big
        for first, count, shard_state in (
            (counter, n_big, big_rows * row_state),
            (counter + n_big, n_small, small_rows * row_state),
        ):
            base += (count // num_ps) * shard_state
            if count % num_ps:
                add_run(first, count % num_ps, shard_state)
        counter += table.shards

    dense_share = -(-dense_parameters * bytes_per_parameter * state_copies // num_ps)
    loads = []
    running = 0
    for ps in range(num_ps):
        running += diff[ps]
        loads.append(base + running + dense_share)
    return loads


# --- the plan -----------------------------------------------------------------------------------


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
    tables = _plan_tables(hints.embeddings, bpp, hints.max_shard_bytes)
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
        tables=_with_first_ps(tables, num_ps),
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


def _with_first_ps(tables: tuple[TablePlan, ...], num_ps: int) -> tuple[TablePlan, ...]:
    placed = []
    counter = 0
    for table in tables:
        placed.append(dataclasses.replace(table, first_ps=counter % num_ps))
        counter += table.shards
    return tuple(placed)


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


# --- admission ----------------------------------------------------------------------------------


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

    needs = f"each of the {replicas} PS needs {human_bytes(plan.per_ps_bytes)} ({_plan_summary(plan)})"
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
        f"{spec.ps.replicas} PS ({_plan_summary(plan)}): set the PS memory request and limit to "
        f"{plan.memory_request}"
    )


def _plan_summary(plan: SizingPlan) -> str:
    slots = f"{plan.slots_per_parameter} {plan.optimizer} slot(s)"
    return (
        f"{human_bytes(plan.max_ps_state_bytes)} of parameters and {slots} on the fullest PS, "
        f"x{plan.headroom:g} headroom, + {human_bytes(plan.runtime_overhead_bytes)} runtime"
    )


def _alternative_ps_count(hints: ModelHints, memory_bytes: int, replicas: int) -> str:
    try:
        plan = plan_ps(hints, ps_memory_bytes=memory_bytes)
    except SizingError:
        return ""
    if plan.num_ps <= replicas:
        return ""
    return f", or use {plan.num_ps} PS of {format_quantity(memory_bytes)}"
