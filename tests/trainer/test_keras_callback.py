"""A user's own Keras program with the library (examples/own-code/train.py), in real TensorFlow.

Every task of the job runs the example's file, with the environment and arguments the operator's
renderer gives its pod, as tests/trainer/test_training.py runs the bundled runtime: the parameter
servers and workers are `pstrainer.main` serving, the chief runs `fit` with `ContractCallback`.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tfcluster.jobs import ctr_job
from tfcluster.launcher import LocalCluster, Process, progress_where, wait_exit
from tfcluster.netns import PrivateNetwork

from psoperator.contract import CheckpointStatus, ExitCode

pytestmark = pytest.mark.tensorflow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own-code" / "train.py"
ENTRYPOINT = [sys.executable, str(EXAMPLE)]
# A step interval no test reaches: the chief then saves only when asked (and at the end of fit).
NO_CADENCE = 10**9
# Epochs no test waits out: the chief trains until the test stops it.
FOREVER = ["--epochs=100000", "--steps-per-epoch=20"]


@pytest.fixture(scope="module")
def cluster(network: PrivateNetwork, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The example's parameter servers and workers running; its chief ready to start."""
    workdir = tmp_path_factory.mktemp("keras")
    local = LocalCluster(ctr_job(workdir / "unused", [], model=[]), workdir, network)
    local.ensure_servers(ENTRYPOINT)
    try:
        yield local
    finally:
        local.stop_all()


def start_chief(
    cluster: LocalCluster, checkpoint_dir: Path, args: list[str], interval_steps: int, attempt: int = 0
) -> Process:
    job = ctr_job(checkpoint_dir, args, model=[], interval_steps=interval_steps)
    return cluster.start_chief(job, attempt, ENTRYPOINT)


def checkpoints(directory: Path) -> set[str]:
    return {index.name.removesuffix(".index") for index in directory.glob("ckpt-*.index")}


def test_fit_reports_progress_saves_on_the_cadence_and_finishes(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    cluster.ensure_servers(ENTRYPOINT)
    ckpt = tmp_path / "ckpt"
    chief = start_chief(cluster, ckpt, ["--epochs=3", "--steps-per-epoch=20"], interval_steps=25)

    running = progress_where(
        cluster, chief, "a step and its loss", lambda r: r.step > 0 and r.loss is not None
    )
    assert (running.state, running.total_steps, running.resumed_from_step) == ("running", 60, None)
    assert running.examples_per_second is not None and running.examples_per_second > 0

    assert wait_exit(chief, 180) == ExitCode.SUCCEEDED, chief.log()[-4000:]
    final = chief.termination_message()
    assert final is not None
    assert (final.state, final.step, final.checkpoint_step, final.exit_code) == ("succeeded", 60, 60, 0)
    assert final.checkpoint_path == str(ckpt / "ckpt-60")
    # On the cadence at steps 25 and 50, and the final one.
    assert checkpoints(ckpt) == {"ckpt-25", "ckpt-50", "ckpt-60"}

    # Restarted after success: done at once, from the final checkpoint.
    again = start_chief(cluster, ckpt, ["--epochs=3", "--steps-per-epoch=20"], interval_steps=25, attempt=1)
    assert wait_exit(again, 120) == ExitCode.SUCCEEDED, again.log()[-4000:]
    repeat = again.termination_message()
    assert repeat is not None and (repeat.state, repeat.step) == ("succeeded", 60)
    assert checkpoints(ckpt) == {"ckpt-25", "ckpt-50", "ckpt-60"}


def test_a_checkpoint_request_and_sigterm_save_between_steps_and_fit_resumes_there(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    cluster.ensure_servers(ENTRYPOINT)
    ckpt = tmp_path / "ckpt"
    chief = start_chief(cluster, ckpt, FOREVER, interval_steps=NO_CADENCE)
    before = progress_where(cluster, chief, "the first steps", lambda r: r.step >= 5)

    status, answer = cluster.checkpoint(60, deadlineSeconds=50)
    assert status == CheckpointStatus.SAVED and answer.saved, answer
    assert answer.checkpoint_step is not None and answer.checkpoint_step >= before.step
    assert answer.checkpoint_path == str(ckpt / f"ckpt-{answer.checkpoint_step}")
    assert checkpoints(ckpt) == {f"ckpt-{answer.checkpoint_step}"}
    # No hold asked: training goes on.
    progress_where(cluster, chief, "steps after the checkpoint", lambda r: r.step > answer.checkpoint_step)

    chief.signal(signal.SIGTERM)
    assert wait_exit(chief, 30) == ExitCode.TERMINATED, chief.log()[-4000:]
    stopped = chief.termination_message()
    assert stopped is not None and stopped.exit_code == ExitCode.TERMINATED
    # The steps in flight were finished and saved, and none scheduled after.
    assert stopped.checkpoint_step == stopped.step and stopped.step > answer.checkpoint_step
    assert f"ckpt-{stopped.step}" in checkpoints(ckpt)

    resumed_chief = start_chief(cluster, ckpt, FOREVER, interval_steps=NO_CADENCE, attempt=1)
    resumed = progress_where(
        cluster, resumed_chief, "steps after the resumed one", lambda r: r.step > stopped.step
    )
    assert resumed.resumed_from_step == stopped.step
    resumed_chief.signal(signal.SIGKILL)
    wait_exit(resumed_chief, 10)


def test_a_lost_parameter_server_exits_retryable(cluster: LocalCluster, tmp_path: Path) -> None:
    cluster.ensure_servers(ENTRYPOINT)
    chief = start_chief(cluster, tmp_path / "ckpt", FOREVER, interval_steps=NO_CADENCE)
    progress_where(cluster, chief, "the first steps", lambda r: r.step > 0)
    ps = cluster.processes["ps-1"]
    ps.signal(signal.SIGKILL)
    wait_exit(ps, 10)
    assert wait_exit(chief, 120) == ExitCode.RETRYABLE, chief.log()[-4000:]
    report = chief.termination_message()
    assert report is not None and report.exit_code == ExitCode.RETRYABLE
    cluster.ensure_servers(ENTRYPOINT)
