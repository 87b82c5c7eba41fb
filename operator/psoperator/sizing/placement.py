"""How TensorFlow lays a model out on the parameter servers, which the planner reproduces:

* `tf.distribute.experimental.partitioners.MaxSizePartitioner(max_shard_bytes)` delegates to
  `variable_axis_size_partitioner` (tensorflow/python/ops/partitioned_variables.py): a table of
  `rows x dim` is split along axis 0 into `ceil(rows / max(1, floor(max_shard_bytes / (dim *
  dtype_size))))` shards. A single row larger than `max_shard_bytes` still makes one shard.
* ParameterServerStrategyV2 (tensorflow/python/distribute/parameter_server_strategy_v2.py) cuts the
  rows "div" style: `rows // shards` each, the first `rows % shards` shards one row more. Every
  variable or shard goes to `/job:ps/task:(count % num_ps)` with one counter across all variables,
  so shards are placed round-robin, continuing where the previous variable stopped. Optimizer slots
  are created colocated with their variable and do not advance the counter.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from psoperator.api.models import EmbeddingTable
from psoperator.sizing.errors import SizingError

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


def plan_tables(
    tables: Sequence[EmbeddingTable], bytes_per_parameter: int, max_shard_bytes: int | None
) -> tuple[TablePlan, ...]:
    """Each table's shards as MaxSizePartitioner cuts them; where they go is `with_first_ps`'s."""
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


def with_first_ps(tables: tuple[TablePlan, ...], num_ps: int) -> tuple[TablePlan, ...]:
    """The tables with the PS of their first shard, round-robin over `num_ps` in table order."""
    placed = []
    counter = 0
    for table in tables:
        placed.append(dataclasses.replace(table, first_ps=counter % num_ps))
        counter += table.shards
    return tuple(placed)
