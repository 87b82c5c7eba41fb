"""The training contract, proven with real TensorFlow processes.

chief, 2 ps and 2 workers (and the evaluator) run as separate processes, each in its own network
namespace, with the env the operator's renderer gives their pods. The ps and workers are shared
by the module (conftest.py); every test runs its own chief with its own checkpoint directory and
leaves the servers running when it ends. Figures worth reporting are printed as MEASURE lines
(`pytest -s`).
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest
from tfcluster.jobs import PS_DRAIN_SECONDS, ctr_job
from tfcluster.launcher import LocalCluster, Process, progress_where, wait_exit

from psoperator.contract import CheckpointStatus, ExitCode, ProgressReport

pytestmark = pytest.mark.tensorflow

# Five TensorFlow processes starting at once on two cores take a while to import TensorFlow.
STARTUP_SECONDS = 120.0
# A step interval no test reaches: the chief then saves only when asked (and at the last step).
NO_CADENCE = 10**9


def measure(name: str, value: float, unit: str) -> None:
    print(f"MEASURE {name}={value:.2f} {unit}")


def test_full_run_serves_progress_finishes_and_is_idempotent(cluster: LocalCluster, tmp_path: Path) -> None:
    cluster.ensure_servers()
    job = ctr_job(tmp_path / "ckpt", ["--steps=400"])
    chief = cluster.start_chief(job)
    evaluator = cluster.start("evaluator-0")

    running = progress_where(cluster, chief, "the first steps", lambda r: r.state == "running" and r.step > 0)
    measure("first_step_after_chief_start", time.monotonic() - chief.started, "s")
    assert running.total_steps == 400
    assert running.resumed_from_step is None
    status, metrics = cluster.get("chief-0", "/metrics")
    assert status == 200
    scraped = re.search(rb"^pstrainer_global_step (\S+)$", metrics, re.MULTILINE)
    assert scraped is not None and float(scraped.group(1)) >= running.step
    assert b"pstrainer_examples_per_second" in metrics and b"pstrainer_loss" in metrics
    for key, process in cluster.processes.items():
        if process.poll() is None:
            measure(f"rss_{key}", process.rss_mib(), "MiB")

    began, began_step = time.monotonic(), running.step
    assert wait_exit(chief, 120) == ExitCode.SUCCEEDED, chief.log()[-4000:]
    measure("steps_per_second", (400 - began_step) / (time.monotonic() - began), "steps/s")
    final = chief.termination_message()
    assert final is not None
    assert (final.state, final.step, final.exit_code) == ("succeeded", 400, 0)
    assert (
        final.checkpoint_step == 400 and final.checkpoint_path and final.checkpoint_path.endswith("ckpt-400")
    )
    assert final.resumed_from_step is None and final.loss is not None
    assert (tmp_path / "ckpt" / "checkpoint").exists()

    assert wait_exit(evaluator, 60) == ExitCode.SUCCEEDED, evaluator.log()[-4000:]
    evaluations = re.findall(r'"event": "evaluation", "logLoss": [0-9.]+, "step": (\d+)', evaluator.log())
    assert evaluations and int(evaluations[-1]) == 400, evaluator.log()[-4000:]

    # Restarted by mistake after success: done at once, without touching the cluster.
    again = cluster.start_chief(job, attempt=1)
    assert wait_exit(again, 60) == ExitCode.SUCCEEDED, again.log()[-4000:]
    repeat = again.termination_message()
    assert repeat is not None and (repeat.state, repeat.step, repeat.resumed_from_step) == (
        "succeeded",
        400,
        400,
    )
    assert "already finished" in again.log() and "cluster connected" not in again.log()


def test_lost_ps_restarts_chief_from_latest_checkpoint(cluster: LocalCluster, tmp_path: Path) -> None:
    cluster.ensure_servers()
    interval, total = 100, 1200
    job = ctr_job(tmp_path / "ckpt", [f"--steps={total}"], interval_steps=interval)
    chief = cluster.start_chief(job)
    progress_where(
        cluster,
        chief,
        "a checkpoint at step 200 or later, and steps beyond it",
        lambda r: (
            r.checkpoint_step is not None and r.checkpoint_step >= 200 and r.step >= r.checkpoint_step + 20
        ),
    )

    ps = cluster.processes["ps-1"]
    ps.signal(signal.SIGKILL)
    killed = time.monotonic()
    wait_exit(ps, 10)
    assert wait_exit(chief, 30) == ExitCode.RETRYABLE, chief.log()[-4000:]
    measure("ps_kill_to_chief_exit", time.monotonic() - killed, "s")
    assert time.monotonic() - killed < 15
    failed = chief.termination_message()
    assert failed is not None and failed.state == "failed" and failed.exit_code == ExitCode.RETRYABLE
    assert failed.checkpoint_step is not None and failed.checkpoint_step >= 200
    lost = failed.step - failed.checkpoint_step
    measure("steps_lost", lost, "steps")
    assert 0 <= lost <= interval

    # The operator replaces the chief at once, before the PS is back: the chief waits for it, and
    # its connect watchdog ends the wait when it lasts too long.
    impatient = cluster.start_chief(
        ctr_job(tmp_path / "ckpt", [f"--steps={total}"], connect_timeout_seconds=4), 1
    )
    assert wait_exit(impatient, 90) == ExitCode.RETRYABLE, impatient.log()[-4000:]
    gave_up = impatient.termination_message()
    assert gave_up is not None and gave_up.exit_code == ExitCode.RETRYABLE
    assert gave_up.message is not None and "did not answer within 4 s" in gave_up.message

    cluster.start("ps-1")
    resumed_chief = cluster.start_chief(job, attempt=2)
    resumed = progress_where(
        cluster, resumed_chief, "the resumed step", lambda r: r.resumed_from_step is not None
    )
    assert resumed.resumed_from_step == failed.checkpoint_step
    assert f"resumed from step {failed.checkpoint_step}" in resumed_chief.log()

    assert wait_exit(resumed_chief, 180) == ExitCode.SUCCEEDED, resumed_chief.log()[-4000:]
    final = resumed_chief.termination_message()
    assert final is not None
    assert (final.state, final.step, final.resumed_from_step) == ("succeeded", total, failed.checkpoint_step)


def test_bug_in_model_exits_permanent(cluster: LocalCluster, tmp_path: Path) -> None:
    cluster.ensure_servers()
    args = ["--steps=1000", "--inject-fault=model-bug", "--fault-at-step=50"]
    chief = cluster.start_chief(ctr_job(tmp_path / "ckpt", args))
    assert wait_exit(chief, STARTUP_SECONDS) == ExitCode.PERMANENT, chief.log()[-4000:]
    report = chief.termination_message()
    assert report is not None and report.exit_code == ExitCode.PERMANENT and report.state == "failed"
    assert report.message is not None and report.message.startswith("InvalidArgumentError")
    assert report.step < 1000


def chief_training(
    cluster: LocalCluster, tmp_path: Path
) -> tuple[Process, dict[str, object], ProgressReport]:
    """Every server up and a chief past its first steps, which saves only when asked."""
    cluster.ensure_servers()
    job = ctr_job(tmp_path / "ckpt", ["--steps=1000000"], interval_steps=NO_CADENCE)
    chief = cluster.start_chief(job)
    return chief, job, progress_where(cluster, chief, "the first steps", lambda r: r.step > 0)


def latest_checkpoint_name(directory: Path) -> str:
    """The latest checkpoint's name in the directory's `checkpoint` state file, read without TF."""
    found = re.search(
        r'^model_checkpoint_path: "(.+)"$', (directory / "checkpoint").read_text(), re.MULTILINE
    )
    assert found is not None
    return Path(found.group(1)).name


def test_sigterm_saves_at_the_step_it_stops_at_then_exits_terminated(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    chief, _, before = chief_training(cluster, tmp_path)
    chief.signal(signal.SIGTERM)
    sent = time.monotonic()
    assert wait_exit(chief, 30) == ExitCode.TERMINATED, chief.log()[-4000:]
    measure("sigterm_to_chief_exit", time.monotonic() - sent, "s")
    report = chief.termination_message()
    assert report is not None and report.exit_code == ExitCode.TERMINATED
    assert report.message == "terminated by SIGTERM"
    # The steps in flight were finished and saved, and none scheduled after.
    assert report.checkpoint_step == report.step and report.step >= before.step
    assert latest_checkpoint_name(tmp_path / "ckpt") == f"ckpt-{report.step}"

    # A worker blocked in server.join() stops just as promptly, without a drain: it holds no state.
    worker = cluster.processes["worker-1"]
    worker.signal(signal.SIGTERM)
    assert wait_exit(worker, 15) == ExitCode.TERMINATED, worker.log()[-4000:]
    cluster.start("worker-1")


def test_checkpoint_request_saves_now_holds_and_a_new_chief_resumes_there(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    chief, job, _ = chief_training(cluster, tmp_path)

    asked = time.monotonic()
    status, answer = cluster.checkpoint(30, deadlineSeconds=20, holdSeconds=60)
    measure("checkpoint_request", time.monotonic() - asked, "s")
    assert status == CheckpointStatus.SAVED and answer.saved, answer
    assert answer.checkpoint_step is not None and answer.checkpoint_step > 0
    assert answer.checkpoint_path == str(tmp_path / "ckpt" / f"ckpt-{answer.checkpoint_step}")
    assert Path(answer.checkpoint_path + ".index").exists()
    state = tmp_path / "ckpt" / "checkpoint"
    written = state.stat().st_mtime_ns

    # Held: the step stays, and asking again answers the same checkpoint without writing another.
    status, again = cluster.checkpoint(30, deadlineSeconds=20)
    assert status == CheckpointStatus.SAVED and not again.saved
    assert (again.checkpoint_step, again.checkpoint_path) == (answer.checkpoint_step, answer.checkpoint_path)
    assert state.stat().st_mtime_ns == written
    held = cluster.progress()
    assert held is not None and held.step == answer.checkpoint_step
    chief.signal(signal.SIGKILL)
    wait_exit(chief, 10)

    resumed_chief = cluster.start_chief(job, attempt=1)
    resumed = progress_where(
        cluster, resumed_chief, "the resumed step", lambda r: r.resumed_from_step is not None
    )
    assert resumed.resumed_from_step == answer.checkpoint_step
    resumed_chief.signal(signal.SIGKILL)
    wait_exit(resumed_chief, 10)


def test_checkpoint_request_is_refused_once_a_ps_is_gone(cluster: LocalCluster, tmp_path: Path) -> None:
    chief, _, _ = chief_training(cluster, tmp_path)
    ps = cluster.processes["ps-1"]
    ps.signal(signal.SIGKILL)
    killed = time.monotonic()
    status, answer = cluster.checkpoint(30, deadlineSeconds=20)
    measure("ps_kill_to_checkpoint_refusal", time.monotonic() - killed, "s")
    assert status == CheckpointStatus.REFUSED, answer
    # Refused by the loop's probe, or by the coordinator's error when the join noticed first.
    assert answer.reason is not None and answer.checkpoint_path is None
    assert answer.reason.startswith(("a parameter server is gone: ctr-ps-1.", "training failed: ")), answer
    assert wait_exit(chief, 30) == ExitCode.RETRYABLE, chief.log()[-4000:]
    wait_exit(ps, 10)


def test_a_ps_given_sigterm_serves_its_drain_time_so_the_chief_can_checkpoint(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    chief, _, _ = chief_training(cluster, tmp_path)
    ps = cluster.processes["ps-1"]
    ps.signal(signal.SIGTERM)
    sent = time.monotonic()

    status, answer = cluster.checkpoint(30, deadlineSeconds=PS_DRAIN_SECONDS, holdSeconds=60)
    assert status == CheckpointStatus.SAVED and answer.saved, answer
    assert ps.poll() is None, "the PS left before its drain time"
    assert wait_exit(ps, PS_DRAIN_SECONDS + 10) == ExitCode.TERMINATED, ps.log()[-4000:]
    drained = time.monotonic() - sent
    measure("ps_sigterm_to_exit", drained, "s")
    assert drained >= PS_DRAIN_SECONDS - 0.5

    # Still held at the checkpoint's step: the chief's own SIGTERM answers it again and exits.
    chief.signal(signal.SIGTERM)
    assert wait_exit(chief, 30) == ExitCode.TERMINATED, chief.log()[-4000:]
    report = chief.termination_message()
    assert report is not None and report.checkpoint_step == answer.checkpoint_step == report.step
