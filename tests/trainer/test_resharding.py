"""A checkpoint saved with 2 parameter servers restores exactly into 3 and into 1 (live resize).

Real TensorFlow processes in private networks, as in test_training.py, but each cluster here is
this module's own: 2 PS (and one worker) train and save, then 3 PS and 1 PS restore. The
partitioner is fixed with one shard per PS (--num-shards=0), so the shard count changes with the
PS count. The probe (tfcluster/restore_probe.py) restores through the chief's own code and reads
every variable back from the parameter servers; the test compares each with the checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tfcluster.jobs import ctr_job
from tfcluster.launcher import LocalCluster, tf_config_of, wait_exit
from tfcluster.netns import PrivateNetwork

import pstrainer
from psoperator.contract import ExitCode

pytestmark = pytest.mark.tensorflow

Networks = Callable[[str], PrivateNetwork]

STEPS = 40
VOCAB = 600
MODEL = [
    f"--vocab-size={VOCAB}",
    "--embedding-dim=4",
    "--hidden-units=8",
    "--batch-size=32",
    "--partitioner=fixed",
    "--num-shards=0",
]
# The model's parameters in the order of the optimizer's accumulators (optimizer/accumulators/<i>).
PARAMETERS = ("embedding", "hidden_kernel", "hidden_bias", "output_kernel", "output_bias")
VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"
# tf.train.Checkpoint's own bookkeeping, not training state.
NOT_STATE = {"_CHECKPOINTABLE_OBJECT_GRAPH", f"save_counter{VALUE}"}
PROBE = Path(__file__).parent / "tfcluster" / "restore_probe.py"
# Makes ParameterServerStrategy log where it creates each variable (shard).
PLACEMENT_LOG = "TF_PSS_VERBOSE_VARIABLE_PLACEMENT"
# Up to five TensorFlow processes starting at once on two shared cores.
STARTUP_SECONDS = 180.0


def job(checkpoint_dir: Path, ps: int, steps: int = STEPS, model: Sequence[str] = MODEL) -> dict[str, Any]:
    manifest: dict[str, Any] = ctr_job(
        checkpoint_dir,
        [f"--steps={steps}", "--steps-per-dispatch=10"],
        interval_steps=STEPS,
        model=model,
        ps=ps,
        workers=1,
    )
    return manifest


@contextlib.contextmanager
def running(networks: Networks, workdir: Path, ps: int) -> Iterator[LocalCluster]:
    """`ps` parameter servers and one worker running in a network of their own; chief-0 ready."""
    cluster = LocalCluster(job(workdir / "unused", ps), workdir, networks(f"{ps}ps"))
    try:
        for key in [*(f"ps-{i}" for i in range(ps)), "worker-0"]:
            cluster.start(key)
        yield cluster
    finally:
        cluster.stop_all()


def device(task: int) -> str:
    return f"/job:ps/replica:0/task:{task}/device:CPU:0"


def placed_on(log: str, shard: str) -> set[int]:
    """The PS tasks a chief's log (with PLACEMENT_LOG) says it created the variable shard on."""
    pattern = rf"Creating variable \(name:{re.escape(shard)}:0, .*?\) on /job:ps/task:(\d+)/"
    return {int(task) for task in re.findall(pattern, log)}


def checkpoint_values(path: Path) -> dict[str, Any]:
    """Every tensor of a checkpoint, read from its files (no TensorFlow server involved)."""
    tf = pytest.importorskip("tensorflow")
    reader = tf.train.load_checkpoint(str(path))
    return {key: reader.get_tensor(key) for key in reader.get_variable_to_shape_map()}


@pytest.fixture(scope="module")
def saved(networks: Networks, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoints of a job trained to STEPS with 2 parameter servers, which are then gone."""
    workdir = tmp_path_factory.mktemp("two-ps")
    with running(networks, workdir, 2) as cluster:
        cluster.rerender(job(workdir / "ckpt", 2))
        cluster.pods["chief-0"].env[PLACEMENT_LOG] = "1"
        chief = cluster.start("chief-0")
        assert wait_exit(chief, STARTUP_SECONDS) == ExitCode.SUCCEEDED, chief.log()[-4000:]
    # Saved from 2 shards: embedding/part_1 was on ps-1, and there was no part_2.
    assert placed_on(chief.log(), "embedding/part_1") == {1}
    assert "embedding/part_2" not in chief.log()
    return workdir / "ckpt"


@pytest.fixture(scope="module")
def three_ps(networks: Networks, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running(networks, tmp_path_factory.mktemp("three-ps"), 3) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def one_ps(networks: Networks, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running(networks, tmp_path_factory.mktemp("one-ps"), 1) as cluster:
        yield cluster


def restore_exactly(cluster: LocalCluster, saved: Path, ps: int, tmp_path: Path) -> dict[str, Any]:
    """Restore a copy of the saved checkpoints with the probe in the chief's pod; assert that every
    variable and slot the checkpoint holds came back bit for bit. The probe's arrays."""
    checkpoints = shutil.copytree(saved, tmp_path / "ckpt")
    cluster.rerender(job(checkpoints, ps))
    output = tmp_path / "restored.npz"
    probe = cluster.start("chief-0", entrypoint=[sys.executable, str(PROBE), str(output)])
    assert wait_exit(probe, STARTUP_SECONDS) == 0, probe.log()[-4000:]
    with np.load(output) as loaded:
        restored = dict(loaded)
    assert str(restored["pstrainer:file"]) == pstrainer.__file__, "the probe ran another trainer"

    expected = checkpoint_values(checkpoints / f"ckpt-{STEPS}")
    state = set(expected) - NOT_STATE
    assert {key.removeprefix("value:") for key in restored if key.startswith("value:")} == state
    for key in sorted(state):
        value = restored[f"value:{key}"]
        assert value.dtype == expected[key].dtype and value.shape == expected[key].shape, key
        assert np.array_equal(value, expected[key]), key
    assert expected[f"step{VALUE}"] == STEPS
    # Trained state, not initial values: the embedding's accumulators started at 0.1.
    assert expected[f"optimizer/accumulators/0{VALUE}"].max() > 0.1
    return restored


def assert_layout(restored: dict[str, Any], ps: int) -> None:
    """The embedding in one shard per PS, and every accumulator shard next to its parameter shard."""
    embedding = list(restored[f"devices:model/embedding{VALUE}"])
    assert embedding == [device(task) for task in range(ps)], embedding
    for index, name in enumerate(PARAMETERS):
        accumulator = restored[f"devices:optimizer/accumulators/{index}{VALUE}"]
        assert list(accumulator) == list(restored[f"devices:model/{name}{VALUE}"]), name


def test_a_checkpoint_of_2_ps_restores_exactly_into_3(
    three_ps: LocalCluster, saved: Path, tmp_path: Path
) -> None:
    assert_layout(restore_exactly(three_ps, saved, 3, tmp_path), ps=3)


def test_a_checkpoint_of_2_ps_restores_exactly_into_1(
    one_ps: LocalCluster, saved: Path, tmp_path: Path
) -> None:
    assert_layout(restore_exactly(one_ps, saved, 1, tmp_path), ps=1)


def test_another_vocabulary_is_refused_with_exit_2_and_the_reason(
    one_ps: LocalCluster, saved: Path, tmp_path: Path
) -> None:
    checkpoints = shutil.copytree(saved, tmp_path / "ckpt")
    bigger = [*MODEL, f"--vocab-size={VOCAB + 100}"]  # the last flag wins
    one_ps.rerender(job(checkpoints, 1, steps=2 * STEPS, model=bigger))
    chief = one_ps.start("chief-0")
    assert wait_exit(chief, STARTUP_SECONDS) == ExitCode.BAD_CONFIG, chief.log()[-4000:]
    report = chief.termination_message()
    assert report is not None and report.exit_code == ExitCode.BAD_CONFIG and report.state == "failed"
    assert report.message is not None and report.message.startswith("ConfigError: checkpoint "), report
    assert f"model/embedding of shape [{VOCAB}, 4], the model's is [{VOCAB + 100}, 4]" in report.message
    assert not (checkpoints / f"ckpt-{2 * STEPS}.index").exists()


def test_a_worker_told_of_2_ps_runs_the_steps_of_a_chief_of_3(
    three_ps: LocalCluster, saved: Path, tmp_path: Path
) -> None:
    """The coordinator's cluster definition wins over the worker's own TF_CONFIG."""
    checkpoints = shutil.copytree(saved, tmp_path / "ckpt")
    more = STEPS + 20
    three_ps.rerender(job(checkpoints, 3, steps=more))
    worker = three_ps.pods["worker-0"]
    told = json.loads(worker.env["TF_CONFIG"])
    told["cluster"]["ps"] = told["cluster"]["ps"][:2]
    worker.env["TF_CONFIG"] = json.dumps(told)
    three_ps.processes["worker-0"].stop()
    three_ps.start("worker-0")
    assert len(tf_config_of(worker)["cluster"]["ps"]) == 2
    assert len(tf_config_of(three_ps.pods["chief-0"])["cluster"]["ps"]) == 3

    three_ps.pods["chief-0"].env[PLACEMENT_LOG] = "1"
    chief = three_ps.start("chief-0")
    assert wait_exit(chief, STARTUP_SECONDS) == ExitCode.SUCCEEDED, chief.log()[-4000:]
    final = chief.termination_message()
    assert final is not None and (final.step, final.resumed_from_step) == (more, STEPS), final
    # The rows of embedding/part_2 live on ps-2, which the worker was not told of; its steps
    # updated them (and their accumulators) there.
    assert placed_on(chief.log(), "embedding/part_2") == {2}
    before = checkpoint_values(checkpoints / f"ckpt-{STEPS}")
    after = checkpoint_values(checkpoints / f"ckpt-{more}")
    part_2 = slice(2 * VOCAB // 3, VOCAB)
    for key in (f"model/embedding{VALUE}", f"optimizer/accumulators/0{VALUE}"):
        assert not np.array_equal(before[key][part_2], after[key][part_2]), key
