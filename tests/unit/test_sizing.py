"""PS sizing: quantities, MaxSizePartitioner shards, round-robin placement, plans, admission, CLI."""

from __future__ import annotations

import argparse
import json
import random
from decimal import Decimal
from typing import Any

import pytest
import yaml

from psoperator.api.models import EmbeddingTable, ModelHints, PSTrainingJobSpec
from psoperator.sizing.admission import SizingLevel, check_ps_memory
from psoperator.sizing.cli import add_plan_command, main
from psoperator.sizing.errors import DoesNotFit, SizingError
from psoperator.sizing.oom import suggestion_for_oom
from psoperator.sizing.placement import SLOTS_PER_PARAMETER, ps_state_bytes, shard_count, shard_rows
from psoperator.sizing.planner import DEFAULT_RUNTIME_OVERHEAD_BYTES, plan_ps
from psoperator.sizing.quantity import format_quantity, human_bytes, parse_bytes, parse_quantity

GiB = 2**30
ONE_GIB_SHARDS = 2**30


def table(name: str, rows: int, dim: int) -> EmbeddingTable:
    return EmbeddingTable(name=name, rows=rows, dim=dim)


def hints(*tables: EmbeddingTable, **fields: Any) -> ModelHints:
    return ModelHints.model_validate({"embeddings": [t.model_dump() for t in tables], **fields})


def ps_container(
    name: str = "tensorflow", *, request: str | None = None, limit: str | None = None
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if request is not None:
        resources["requests"] = {"memory": request}
    if limit is not None:
        resources["limits"] = {"memory": limit}
    return {"name": name, "image": "trainer:1", "resources": resources}


def job_spec(
    model: dict[str, Any] | None, *, ps_replicas: int = 1, containers: list[dict[str, Any]] | None = None
) -> PSTrainingJobSpec:
    return PSTrainingJobSpec.model_validate(
        {
            "image": "trainer:1",
            "chief": {},
            "ps": {"replicas": ps_replicas, "template": {"spec": {"containers": containers or []}}},
            "worker": {"replicas": 2},
            "checkpoint": {"dir": "/ckpt"},
            "model": model,
        }
    )


USERS_10M = {"name": "users", "rows": 10_000_000, "dim": 128}
USERS_1B = {"name": "users", "rows": 1_000_000_000, "dim": 128}


# --- quantities ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("16Gi", Decimal(16 * 2**30)),
        ("512M", Decimal(512_000_000)),
        ("1e9", Decimal(10**9)),
        ("1E9", Decimal(10**9)),
        ("1E", Decimal(10**18)),  # E alone is the exa suffix, not an exponent
        ("1.5Gi", Decimal(3 * 2**29)),
        (".5Ki", Decimal(512)),
        ("250m", Decimal("0.25")),
        ("+1k", Decimal(1000)),
        ("1073741824", Decimal(2**30)),
        (2048, Decimal(2048)),
    ],
)
def test_parse_quantity(text: str | int, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "Gi", "1Gx", "1e", "1ki", "1 Gi", "abc", "1.2.3", "NaN", "Infinity"])
def test_parse_quantity_rejects(text: str) -> None:
    with pytest.raises(SizingError):
        parse_quantity(text)


@pytest.mark.parametrize("text", ["16Gi", "512M", "1e9", "1.5Gi", "1E", "250m", "1073741824", "3Ti"])
def test_parse_quantity_agrees_with_the_kubernetes_client(text: str) -> None:
    quantity = pytest.importorskip("kubernetes.utils.quantity")
    assert parse_quantity(text) == quantity.parse_quantity(text)


def test_parse_bytes_rounds_up_and_wants_positive() -> None:
    assert parse_bytes("1.5") == 2
    assert parse_bytes("100m") == 1
    for bad in ("0", "-1Gi", True):
        with pytest.raises(SizingError):
            parse_bytes(bad)


def test_human_bytes() -> None:
    assert human_bytes(5_120_000_000) == "4.77 GiB"
    assert human_bytes(1_066_666_752) == "1017 MiB"
    assert human_bytes(512_000_000_000 * 3) == "1.4 TiB"
    assert human_bytes(400) == "400 B"


def test_format_quantity() -> None:
    assert format_quantity(12 * GiB) == "12Gi"
    assert format_quantity(61952 * 2**20) == "61952Mi"
    assert format_quantity(1536) == "1536"  # 1.5Ki has no exact whole binary unit
    assert format_quantity(3 * 1024) == "3Ki"
    assert format_quantity(1000) == "1000"


# --- shards and placement -----------------------------------------------------------------------


def test_slots_per_optimizer() -> None:
    assert SLOTS_PER_PARAMETER == {"sgd": 0, "momentum": 1, "adagrad": 1, "adam": 2, "adamw": 2, "ftrl": 2}


def test_shard_count_as_max_size_partitioner() -> None:
    row = 128 * 4  # 512 bytes: 2**21 rows fit 1 GiB
    assert shard_count(10_000_000, row, ONE_GIB_SHARDS) == 5  # ceil(10M / 2,097,152)
    assert shard_count(1_000_000_000, row, ONE_GIB_SHARDS) == 477  # ceil(1B / 2,097,152)
    assert shard_count(2 * 2**21, row, ONE_GIB_SHARDS) == 2  # exactly full shards
    assert shard_count(2 * 2**21 + 1, row, ONE_GIB_SHARDS) == 3
    assert shard_count(10, row, 100) == 10  # a row above the max still makes one shard per row
    assert shard_count(10_000_000, row, None) == 1
    # Rows per shard round down: 7-byte shards hold two 3-byte rows, so 10 rows make 5 shards.
    assert shard_count(10, 3, 7) == 5
    # TF's docstring examples for MaxSizePartitioner on a [6, 1] float32 variable.
    assert shard_count(6, 4, 4) == 6
    assert shard_count(6, 4, 1024) == 1


def test_shard_rows_is_tf_div_split() -> None:
    # TF's own example: 10 rows in 4 partitions are [3, 3, 2, 2].
    assert shard_rows(10, 4) == (3, 2, 2)
    assert shard_rows(10_000_000, 5) == (2_000_001, 0, 2_000_000)


def test_placement_round_robin_by_hand() -> None:
    # 10M x 128 fp32 at 1 GiB: 5 shards of 2M rows (1.024 GB); on 2 PS, ps-0 gets shards 0, 2, 4.
    tables = plan_ps(hints(table("users", 10_000_000, 128), max_shard_bytes=ONE_GIB_SHARDS)).tables
    loads = ps_state_bytes(tables, bytes_per_parameter=4, state_copies=3, dense_parameters=0, num_ps=2)
    assert loads == [3 * 1_024_000_000 * 3, 2 * 1_024_000_000 * 3]


def test_placement_continues_the_counter_across_tables() -> None:
    # a: 3 shards of 1 row -> ps 0, 1, 0; b: 2 shards of 1 row -> ps 1, 0. Rows are 4 bytes.
    plan = plan_ps(hints(table("a", 3, 1), table("b", 2, 1), optimizer="sgd", max_shard_bytes=4), num_ps=2)
    assert [(t.shards, t.first_ps) for t in plan.tables] == [(3, 0), (2, 1)]
    loads = ps_state_bytes(plan.tables, bytes_per_parameter=4, state_copies=1, dense_parameters=0, num_ps=2)
    assert loads == [3 * 4, 2 * 4]


def _brute_force_loads(
    tables: list[tuple[int, int, int]], bpp: int, copies: int, dense: int, num_ps: int
) -> list[int]:
    loads = [0] * num_ps
    counter = 0
    for rows, dim, shards in tables:
        sizes = [rows // shards + (1 if i < rows % shards else 0) for i in range(shards)]
        for size in sizes:
            loads[counter % num_ps] += size * dim * bpp * copies
            counter += 1
    return [load + -(-dense * bpp * copies // num_ps) for load in loads]


def test_placement_matches_shard_by_shard_simulation() -> None:
    rng = random.Random(6)
    for _ in range(300):
        specs = [(rng.randint(1, 5000), rng.randint(1, 64)) for _ in range(rng.randint(1, 5))]
        max_shard = rng.randint(1, 20_000)
        num_ps = rng.randint(1, 40)
        dense = rng.choice([0, rng.randint(1, 10_000)])
        plan = plan_ps(
            hints(
                *(table(f"t{i}", rows, dim) for i, (rows, dim) in enumerate(specs)),
                parameters=sum(r * d for r, d in specs) + dense if dense else None,
                max_shard_bytes=max_shard,
                optimizer="adagrad",
            ),
            num_ps=num_ps,
        )
        expected = _brute_force_loads([(t.rows, t.dim, t.shards) for t in plan.tables], 4, 2, dense, num_ps)
        assert (
            ps_state_bytes(
                plan.tables, bytes_per_parameter=4, state_copies=2, dense_parameters=dense, num_ps=num_ps
            )
            == expected
        )
        assert plan.max_ps_state_bytes == max(expected)


# --- plans --------------------------------------------------------------------------------------


def test_seed_example_10m_by_128_fp32() -> None:
    sgd = plan_ps(hints(table("users", 10_000_000, 128), optimizer="sgd"))
    assert sgd.parameter_bytes == 5_120_000_000  # 5.12 GB
    assert sgd.slot_bytes == 0
    adam = plan_ps(hints(table("users", 10_000_000, 128), optimizer="adam", max_shard_bytes=ONE_GIB_SHARDS))
    assert adam.slot_bytes == 10_240_000_000
    assert adam.state_bytes == 15_360_000_000  # Adam triples it
    assert adam.total_bytes == 38_400_000_000  # x2.5: two copies while restoring, x1.25
    assert adam.tables[0].shards == 5
    assert adam.largest_shard_bytes == 1_024_000_000


def test_seed_example_1b_by_128_fp32() -> None:
    plan = plan_ps(hints(table("users", 1_000_000_000, 128), max_shard_bytes=ONE_GIB_SHARDS))
    assert plan.parameter_bytes == 512_000_000_000  # ~512 GB
    assert plan.state_bytes == 3 * 512_000_000_000  # Adam
    (users,) = plan.tables
    # 477 shards: 1e9 = 477 * 2,096,436 + 28, so 28 shards of 2,096,437 rows, all below 1 GiB.
    assert (users.shards, users.largest_shard_rows) == (477, 2_096_437)
    assert users.largest_shard_bytes == 2_096_437 * 512 <= 2**30


def test_fewest_ps_accounts_for_round_robin_hot_spots() -> None:
    plan = plan_ps(
        hints(table("users", 1_000_000_000, 128), max_shard_bytes=ONE_GIB_SHARDS), ps_memory_bytes=64 * GiB
    )
    # 59 PS: ps-0 holds 9 shards (one of them large): (9 * 2,096,436 + 1) rows * 512 B * 3
    # = 28,981,132,800 B; x2.5 + 512Mi = 72,989,702,912 B > 64Gi. An even split would have fit.
    assert plan.num_ps == 60
    # 60 PS: the fullest hold 8 shards, one of them large.
    assert plan.max_ps_state_bytes == (8 * 2_096_436 + 1) * 512 * 3 == 25_761_007_104
    assert plan.max_ps_state_bytes > plan.even_share_bytes
    assert plan.per_ps_bytes == 64_402_517_760 + DEFAULT_RUNTIME_OVERHEAD_BYTES
    assert plan.memory_request == "61952Mi"  # rounded up to 256Mi, within 64Gi
    at_59 = plan_ps(hints(table("users", 1_000_000_000, 128), max_shard_bytes=ONE_GIB_SHARDS), num_ps=59)
    assert at_59.max_ps_state_bytes == 28_981_132_800
    assert at_59.memory_request_bytes > 64 * GiB


def test_dense_only_model_spreads_evenly() -> None:
    plan = plan_ps(ModelHints(parameters=100_000_000, optimizer="momentum"), num_ps=4)
    assert plan.dense_parameters == 100_000_000
    assert plan.max_ps_state_bytes == 100_000_000 * 4 * 2 // 4
    assert plan.largest_shard_table is None


def test_parameters_count_embeddings_too() -> None:
    plan = plan_ps(hints(table("users", 1000, 10), parameters=15_000, bytes_per_parameter=2, optimizer="sgd"))
    assert (plan.parameters, plan.dense_parameters, plan.parameter_bytes) == (15_000, 5_000, 30_000)
    with pytest.raises(SizingError, match="less than the embedding"):
        plan_ps(hints(table("users", 1000, 10), parameters=9_999))


def test_unpartitioned_table_is_one_hot_shard() -> None:
    plan = plan_ps(hints(table("users", 10_000_000, 128), table("items", 1000, 128)), num_ps=4)
    assert [t.shards for t in plan.tables] == [1, 1]
    assert plan.max_ps_state_bytes == 5_120_000_000 * 3  # all of users on ps-0
    assert any("no max shard size" in note for note in plan.notes)


def test_does_not_fit() -> None:
    with pytest.raises(DoesNotFit, match="largest shard"):
        plan_ps(
            hints(table("users", 1_000_000_000, 128), max_shard_bytes=ONE_GIB_SHARDS), ps_memory_bytes=2 * GiB
        )
    with pytest.raises(DoesNotFit, match="1000 PS"):
        plan_ps(hints(table("users", 10**10, 128), max_shard_bytes=2**20), ps_memory_bytes=2 * GiB)
    with pytest.raises(DoesNotFit, match="runtime"):
        plan_ps(ModelHints(parameters=10), ps_memory_bytes=2**20)
    # Exactly the runtime's own memory leaves nothing for the parameters (found on a real cluster:
    # a PS of 512Mi divided by zero and crashed every reconcile of the job).
    with pytest.raises(DoesNotFit, match="runtime"):
        plan_ps(ModelHints(parameters=10), ps_memory_bytes=512 * 2**20)


def test_a_ps_with_only_the_runtimes_memory_is_a_warning_not_a_crash() -> None:
    example_model = {"parameters": 1_600_000, "bytesPerParameter": 4, "optimizer": "adam"}
    verdict = check_ps_memory(
        job_spec(example_model, ps_replicas=2, containers=[ps_container(request="512Mi")])
    )
    assert verdict.level is SizingLevel.WARNING and verdict.reason == "PSMemoryUndersized", verdict


def test_plan_rejects_bad_input() -> None:
    with pytest.raises(SizingError, match="neither"):
        plan_ps(ModelHints())
    with pytest.raises(SizingError, match="unique"):
        plan_ps(hints(table("a", 1, 1), table("a", 2, 1)))
    with pytest.raises(SizingError, match="between 1 and 1000"):
        plan_ps(ModelHints(parameters=10), num_ps=0)
    with pytest.raises(SizingError, match="headroom"):
        plan_ps(ModelHints(parameters=10), headroom=0.5)


# --- admission ----------------------------------------------------------------------------------

# 10M x 128, Adam, 1 GiB shards, 2 PS: ps-0 holds 3 shards, 9.216 GB of state; x2.5 + 512Mi
# = 23,576,870,912 B (22 GiB), request 22Gi.
MODEL_10M = {"embeddings": [USERS_10M], "maxShardBytes": ONE_GIB_SHARDS}


def test_well_sized_ps_are_ok() -> None:
    verdict = check_ps_memory(job_spec(MODEL_10M, ps_replicas=2, containers=[ps_container(limit="22Gi")]))
    assert verdict.level is SizingLevel.OK
    assert verdict.reason == "PSMemorySufficient"
    assert verdict.plan is not None and verdict.plan.per_ps_bytes == 23_576_870_912


def test_undersized_ps_warn_with_numbers_and_suggestion() -> None:
    verdict = check_ps_memory(job_spec(MODEL_10M, ps_replicas=2, containers=[ps_container(limit="8Gi")]))
    assert verdict.level is SizingLevel.WARNING
    assert verdict.reason == "PSMemoryUndersized"
    assert verdict.suggested_request == "22Gi"
    assert "22 GiB" in verdict.message and "8Gi" in verdict.message and "22Gi" in verdict.message
    assert "or use 5 PS of 8Gi" in verdict.message


def test_undersized_ps_with_enforce_are_refused() -> None:
    verdict = check_ps_memory(
        job_spec({**MODEL_10M, "enforce": True}, ps_replicas=2, containers=[ps_container(limit="8Gi")])
    )
    assert verdict.level is SizingLevel.REFUSE
    assert verdict.reason == "PSMemoryUndersized"
    assert verdict.message.startswith("refusing to start")


def test_unset_memory_is_only_a_warning_even_with_enforce() -> None:
    for containers in ([ps_container()], [], [ps_container(limit="64Gi"), ps_container("sidecar")]):
        verdict = check_ps_memory(
            job_spec({**MODEL_10M, "enforce": True}, ps_replicas=2, containers=containers)
        )
        assert verdict.level is SizingLevel.WARNING
        assert verdict.reason == "PSMemoryNotSet"
        assert "no memory request or limit" in verdict.message
        assert verdict.suggested_request == "22Gi"


def test_limit_binds_and_request_counts_without_limit() -> None:
    limited = check_ps_memory(
        job_spec(MODEL_10M, ps_replicas=2, containers=[ps_container(request="64Gi", limit="8Gi")])
    )
    assert limited.level is SizingLevel.WARNING
    requested = check_ps_memory(job_spec(MODEL_10M, ps_replicas=2, containers=[ps_container(request="22Gi")]))
    assert requested.level is SizingLevel.OK
    assert "(request)" in requested.message


def test_memory_is_summed_over_containers() -> None:
    containers = [ps_container(limit="11Gi"), ps_container("sidecar", limit="11Gi")]
    verdict = check_ps_memory(job_spec(MODEL_10M, ps_replicas=2, containers=containers))
    assert verdict.level is SizingLevel.OK
    assert "22Gi" in verdict.message


def test_no_model_and_bad_input() -> None:
    assert check_ps_memory(job_spec(None, containers=[ps_container()])).reason == "NoModelHints"
    bad_memory = check_ps_memory(job_spec(MODEL_10M, containers=[ps_container(limit="lots")]))
    assert (bad_memory.level, bad_memory.reason) == (SizingLevel.WARNING, "InvalidSizingInput")
    bad_model = check_ps_memory(job_spec({"parameters": 5, "embeddings": [USERS_10M], "enforce": True}))
    assert (bad_model.level, bad_model.reason) == (SizingLevel.WARNING, "InvalidSizingInput")


def test_suggestion_for_oom() -> None:
    undersized = suggestion_for_oom(
        job_spec(MODEL_10M, ps_replicas=2, containers=[ps_container(limit="8Gi")])
    )
    assert "8Gi (limit)" in undersized and "22Gi" in undersized
    no_model = suggestion_for_oom(job_spec(None, containers=[ps_container(limit="8Gi")]))
    assert "spec.model" in no_model and "psoperator plan" in no_model
    # The plan said it fits, yet the PS ran out: the hints or headroom are off; suggest 1.5x.
    fits = suggestion_for_oom(job_spec(MODEL_10M, ps_replicas=2, containers=[ps_container(limit="32Gi")]))
    assert "check spec.model" in fits and "48Gi" in fits


# --- CLI ----------------------------------------------------------------------------------------


def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "plan",
        "--embedding",
        "users=1e9x128",
        "--max-shard-bytes",
        "1Gi",
        "--ps-memory",
        "64Gi",
        "-o",
        "json",
    ]
    assert main(argv) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["num_ps"] == 60
    assert plan["parameter_bytes"] == 512_000_000_000
    assert plan["tables"][0]["shards"] == 477
    assert plan["memory_request"] == "61952Mi"


def test_cli_table_is_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            ["plan", "--embedding", "users=10_000_000x128", "--max-shard-bytes", "1Gi", "--ps-replicas", "2"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "5,120,000,000 bytes" in out
    assert "Memory per PS    22Gi" in out
    assert "users  10,000,000  128  4.77 GiB  5" in out


def test_cli_yaml_is_a_ready_to_paste_ps_block(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "plan",
        "--embedding",
        "users=10000000x128",
        "--dense",
        "1e6",
        "--dtype",
        "bf16",
        "--optimizer",
        "ftrl",
        "--max-shard-bytes",
        "512Mi",
        "--ps-memory",
        "8Gi",
        "-o",
        "yaml",
    ]
    assert main(argv) == 0
    blocks = yaml.safe_load(capsys.readouterr().out)
    (container,) = blocks["ps"]["template"]["spec"]["containers"]
    assert container["name"] == "trainer"
    memory = container["resources"]["requests"]["memory"]
    assert container["resources"]["limits"]["memory"] == memory
    assert parse_bytes(memory) <= 8 * GiB
    # The model block gives the operator the same plan the CLI made.
    again = plan_ps(ModelHints.model_validate(blocks["model"]), num_ps=blocks["ps"]["replicas"])
    assert again.memory_request == memory
    assert again.bytes_per_parameter == 2 and again.optimizer == "ftrl"
    assert again.dense_parameters == 1_000_000


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "--ps-memory", "64Gx", "--parameters", "10"], "not a Kubernetes quantity"),
        (["plan", "--embedding", "users=10x"], "NAME=ROWSxDIM"),
        (["plan", "--parameters", "0"], "positive whole number"),
        (["plan", "--parameters", "10", "--ps-replicas", "1001"], "at most 1000"),
        (["plan", "--parameters", "10", "--ps-replicas", "2", "--ps-memory", "1Gi"], "not allowed with"),
        (["plan", "--parameters", "10", "--optimizer", "lamb"], "invalid choice"),
    ],
)
def test_cli_rejects_bad_arguments(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["plan"], 2, "give --parameters N, or --embedding"),
        (["plan", "--parameters", "10", "--dense", "5"], 2, "not both"),
        (["plan", "--embedding", "a=1x1", "--embedding", "a=2x1"], 2, "unique"),
        (["plan", "--parameters", "1e12", "--ps-memory", "1Gi"], 1, "does not fit on 1000 PS"),
    ],
)
def test_cli_reports_unplannable_input(
    argv: list[str], code: int, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == code
    captured = capsys.readouterr()
    assert message in captured.err
    assert captured.out == ""


def test_add_plan_command_is_all_a_cli_needs(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="psoperator")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("other")
    add_plan_command(sub)
    args = parser.parse_args(["plan", "--parameters", "1e6", "--optimizer", "sgd", "-o", "json"])
    assert args.func(args) == 0
    assert json.loads(capsys.readouterr().out)["parameter_bytes"] == 4_000_000
