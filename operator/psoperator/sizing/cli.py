"""`psoperator plan`: size the parameter servers for a model before submitting a job.

psoperator/cli.py registers the command with `sizing.cli.add_plan_command(sub)`; the parsed arguments carry
their handler in `args.func`, which returns the exit code. `main` runs the command on its own.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from collections.abc import Sequence
from typing import IO, Any

import yaml
from pydantic import ValidationError

from psoperator.api.models import MAX_REPLICAS, EmbeddingTable, ModelHints
from psoperator.sizing.errors import DoesNotFit, SizingError
from psoperator.sizing.placement import DTYPE_BYTES, SLOTS_PER_PARAMETER
from psoperator.sizing.planner import SizingPlan, plan_ps
from psoperator.sizing.quantity import format_quantity, human_bytes, parse_bytes

# The container whose resources the `ps:` block sets: the trainer, as in examples/ctr-job.yaml.
PS_CONTAINER_NAME = "trainer"

EXIT_DOES_NOT_FIT = 1
EXIT_USAGE = 2

_EMBEDDING = re.compile(r"(?P<name>[^=]+)=(?P<rows>[^xX*]+)[xX*](?P<dim>[^xX*]+)")


def _count(text: str) -> int:
    """A positive count; accepts 10_000_000, 10,000,000 and 1e7."""
    cleaned = text.replace("_", "").replace(",", "")
    try:
        value = float(cleaned) if re.fullmatch(r"\d+(\.\d+)?[eE]\d+", cleaned) else int(cleaned)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: {text!r}") from None
    if value != int(value) or int(value) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive whole number: {text!r}")
    return int(value)


def _quantity(text: str) -> int:
    try:
        return parse_bytes(text)
    except SizingError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _embedding(text: str) -> EmbeddingTable:
    match = _EMBEDDING.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"expected NAME=ROWSxDIM, e.g. users=10000000x128: {text!r}")
    return EmbeddingTable(name=match["name"], rows=_count(match["rows"]), dim=_count(match["dim"]))


def _replicas(text: str) -> int:
    value = _count(text)
    if value > MAX_REPLICAS:
        raise argparse.ArgumentTypeError(f"at most {MAX_REPLICAS} PS: {text!r}")
    return value


def add_plan_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Adds `plan` to a subparsers object; the parsed args' `func` runs it and returns an exit code."""
    parser = subparsers.add_parser(
        "plan",
        help="size the parameter servers for a model",
        description=(
            "Plan the parameter servers of a PSTrainingJob: bytes of parameters and optimizer "
            "slots, shards per embedding table (as MaxSizePartitioner makes them), their "
            "round-robin placement, the number of PS and the memory request of each."
        ),
        epilog=(
            "Example: psoperator plan --embedding users=1000000000x128 --dense 5e6 "
            "--optimizer adam --max-shard-bytes 1Gi --ps-memory 64Gi"
        ),
    )
    model = parser.add_argument_group("model")
    model.add_argument(
        "--parameters",
        type=_count,
        metavar="N",
        help="all trainable parameters (embeddings included, like spec.model.parameters)",
    )
    model.add_argument(
        "--embedding",
        type=_embedding,
        action="append",
        default=[],
        metavar="NAME=ROWSxDIM",
        help="an embedding table, partitioned over the PS (repeatable)",
    )
    model.add_argument(
        "--dense", type=_count, metavar="N", help="dense parameters besides the embedding tables"
    )
    model.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default="fp32", help="default: fp32")
    model.add_argument("--optimizer", choices=list(SLOTS_PER_PARAMETER), default="adam", help="default: adam")
    model.add_argument(
        "--max-shard-bytes",
        type=_quantity,
        metavar="QUANTITY",
        help="max shard size of MaxSizePartitioner, e.g. 1Gi (default: tables are not partitioned)",
    )
    ps = parser.add_argument_group("parameter servers (default: one PS)")
    fit = ps.add_mutually_exclusive_group()
    fit.add_argument(
        "--ps-memory",
        type=_quantity,
        metavar="QUANTITY",
        help="memory one PS pod may use, e.g. 64Gi: plan the fewest PS that fit",
    )
    fit.add_argument("--ps-replicas", type=_replicas, metavar="N", help="plan this many PS")
    parser.add_argument(
        "-o",
        "--output",
        choices=("table", "json", "yaml"),
        default="table",
        help="table (default), json (the whole plan) or yaml (ps: and model: blocks for the manifest)",
    )
    parser.set_defaults(func=run_plan)
    return parser


def run_plan(args: argparse.Namespace, out: IO[str] | None = None, err: IO[str] | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        hints = _hints(args)
        plan = plan_ps(hints, num_ps=args.ps_replicas, ps_memory_bytes=args.ps_memory)
    except DoesNotFit as error:
        print(f"psoperator plan: {error}", file=err)
        return EXIT_DOES_NOT_FIT
    except SizingError as error:
        print(f"psoperator plan: error: {error}", file=err)
        return EXIT_USAGE
    if args.output == "json":
        out.write(json.dumps(plan_as_dict(plan), indent=2) + "\n")
    elif args.output == "yaml":
        out.write(render_manifest_blocks(plan, hints))
    else:
        out.write(render_table(plan))
    return 0


def _hints(args: argparse.Namespace) -> ModelHints:
    tables: list[EmbeddingTable] = args.embedding
    if args.parameters is not None and args.dense is not None:
        raise SizingError("give --parameters (all parameters) or --dense (besides embeddings), not both")
    if args.parameters is None and args.dense is None and not tables:
        raise SizingError("give --parameters N, or --embedding NAME=ROWSxDIM (and --dense N)")
    parameters = args.parameters
    if args.dense is not None:
        parameters = args.dense + sum(t.rows * t.dim for t in tables)
    try:
        return ModelHints(
            parameters=parameters,
            embeddings=tables,
            bytes_per_parameter=DTYPE_BYTES[args.dtype],
            optimizer=args.optimizer,
            max_shard_bytes=args.max_shard_bytes,
        )
    except ValidationError as error:
        raise SizingError(str(error)) from None


def plan_as_dict(plan: SizingPlan) -> dict[str, Any]:
    return dataclasses.asdict(plan)


def render_manifest_blocks(plan: SizingPlan, hints: ModelHints) -> str:
    """The `ps:` block (replicas, memory request = limit) and the `model:` block for spec."""
    memory = {"memory": plan.memory_request}
    ps = {
        "replicas": plan.num_ps,
        "template": {
            "spec": {
                "containers": [
                    {"name": PS_CONTAINER_NAME, "resources": {"requests": memory, "limits": dict(memory)}}
                ]
            }
        },
    }
    model = hints.model_dump(by_alias=True, exclude_defaults=True)
    model.setdefault("optimizer", hints.optimizer)
    header = (
        f"# psoperator plan: {plan.num_ps} PS of {plan.memory_request} "
        f"({human_bytes(plan.state_bytes)} of parameters and {plan.optimizer} slots)\n"
    )
    return header + yaml.safe_dump({"ps": ps, "model": model}, sort_keys=False)


def render_table(plan: SizingPlan) -> str:
    lines: list[tuple[str, str]] = []
    dtype = next((k for k, v in DTYPE_BYTES.items() if v == plan.bytes_per_parameter), "")
    lines.append(
        (
            "Parameters",
            f"{plan.parameters:,} ({plan.parameters - plan.dense_parameters:,} in "
            f"{len(plan.tables)} table(s), {plan.dense_parameters:,} dense), "
            f"{plan.bytes_per_parameter} bytes each{f' ({dtype})' if dtype else ''}: "
            f"{plan.parameter_bytes:,} bytes = {human_bytes(plan.parameter_bytes)}",
        )
    )
    lines.append(
        (
            "Optimizer slots",
            f"{plan.optimizer}, {plan.slots_per_parameter} per parameter: {human_bytes(plan.slot_bytes)}",
        )
    )
    lines.append(
        (
            "Total",
            f"{human_bytes(plan.state_bytes)} x{plan.headroom:g} headroom = "
            f"{human_bytes(plan.total_bytes)}, + {human_bytes(plan.runtime_overhead_bytes)} runtime per PS",
        )
    )
    fitted = f" (fewest that fit {format_quantity(plan.ps_memory_bytes)})" if plan.ps_memory_bytes else ""
    lines.append(("PS", f"{plan.num_ps}{fitted}"))
    lines.append(
        (
            "Fullest PS",
            f"ps-{plan.fullest_ps}: {human_bytes(plan.max_ps_state_bytes)} of state "
            f"(even split: {human_bytes(plan.even_share_bytes)}), needs {human_bytes(plan.per_ps_bytes)}",
        )
    )
    lines.append(("Memory per PS", f"{plan.memory_request} (request = limit)"))
    if plan.largest_shard_table is not None:
        lines.append(
            (
                "Largest shard",
                f"{plan.largest_shard_table}: {human_bytes(plan.largest_shard_bytes)}, "
                f"{human_bytes(plan.largest_shard_bytes * (1 + plan.slots_per_parameter))} with slots",
            )
        )
    width = max(len(label) for label, _ in lines)
    text = "".join(f"{label:<{width}}  {value}\n" for label, value in lines)
    if plan.tables:
        text += "\n" + _tables(plan)
    if plan.notes:
        text += "\n" + "".join(f"note: {note}\n" for note in plan.notes)
    return text


def _tables(plan: SizingPlan) -> str:
    header = ("TABLE", "ROWS", "DIM", "SIZE", "SHARDS", "LARGEST SHARD", "FIRST PS")
    rows = [
        (
            t.name,
            f"{t.rows:,}",
            str(t.dim),
            human_bytes(t.bytes),
            str(t.shards),
            human_bytes(t.largest_shard_bytes),
            f"ps-{t.first_ps}",
        )
        for t in plan.tables
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n"
        for row in [header, *rows]
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Runs `plan` alone (as `psoperator plan ...` would), for tests and `python -m`."""
    parser = argparse.ArgumentParser(prog="psoperator")
    add_plan_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
