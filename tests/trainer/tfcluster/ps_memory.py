"""Parameter server memory across coordinated restarts, measured with real TensorFlow processes.

Chiefs run one after the other against the same job: each trains to its next checkpoint and is
SIGKILLed, and the next resumes from that checkpoint. Between two chiefs the parameter servers are
either restarted, as the operator does (policies/ps_recycle.py), or kept, as a restart that only
replaces the chief would. The RSS of every PS and worker is read after each chief's checkpoint.

    python tests/trainer/tfcluster/ps_memory.py [--restarts 5]    # both ways, one after the other
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the harness is the directory above
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from psoperator.api.models import ModelHints
from psoperator.contract import ProgressReport
from psoperator.sizing.planner import SizingPlan, plan_ps
from tfcluster.jobs import ctr_job
from tfcluster.launcher import LocalCluster, wait_for
from tfcluster.netns import PrivateNetwork, remove_stale

# 8,000,000 x 16 fp32 with Adagrad's accumulator: 1 GiB of state, 512 MiB on each of 2 PS, in
# 64 MiB shards. Big enough that a second copy of the model would stand out from the runtime.
VOCAB, DIM, SHARD_BYTES = 8_000_000, 16, 64 * 2**20
MODEL = [
    f"--vocab-size={VOCAB}",
    f"--embedding-dim={DIM}",
    "--batch-size=64",
    "--partitioner=max-size",
    f"--max-shard-bytes={SHARD_BYTES}",
]
CHECKPOINT_STEPS = 40
SERVERS = ("ps-0", "ps-1", "worker-0", "worker-1")
CHIEF_TIMEOUT = 600.0
MiB = 2**20


@dataclass(frozen=True)
class Round:
    """One chief: where it resumed, how long to its first step and to its checkpoint, the servers' RSS."""

    attempt: int
    resumed_from: int | None
    checkpoint_step: int
    first_step_seconds: float
    seconds: float
    rss_mib: dict[str, float]

    def line(self) -> str:
        rss = " ".join(f"{key}={mib:.0f}" for key, mib in self.rss_mib.items())
        return (
            f"chief {self.attempt}: resumed from {self.resumed_from}, first step after "
            f"{self.first_step_seconds:.1f} s, checkpoint {self.checkpoint_step} after {self.seconds:.1f} s; "
            f"RSS MiB {rss}"
        )


def planned(num_ps: int = 2) -> SizingPlan:
    """What the sizing planner says each PS of this model needs."""
    table = {"name": "embedding", "rows": VOCAB, "dim": DIM}
    hints = ModelHints.model_validate(
        {"embeddings": [table], "optimizer": "adagrad", "maxShardBytes": SHARD_BYTES}
    )
    return plan_ps(hints, num_ps=num_ps)


def one_chief(cluster: LocalCluster, job: dict[str, object], attempt: int, after_step: int) -> Round:
    """Start the chief of `attempt`, wait for a checkpoint past `after_step`, read RSS, SIGKILL it."""
    cluster.rerender(job, attempt=attempt)
    chief = cluster.start("chief-0")

    def report_where(what: str, predicate: Callable[[ProgressReport], bool]) -> tuple[ProgressReport, float]:
        def check() -> ProgressReport | None:
            if chief.poll() is not None:
                raise AssertionError(f"chief {attempt} exited with {chief.poll()}:\n{chief.log()[-4000:]}")
            report = cluster.progress()
            return report if report is not None and predicate(report) else None

        report: ProgressReport = wait_for(f"chief {attempt}'s {what}", check, CHIEF_TIMEOUT, 0.2)
        return report, time.monotonic() - chief.started

    try:
        _, first_step = report_where("first step", lambda r: r.step > (r.resumed_from_step or 0))
        saved, seconds = report_where(
            "checkpoint", lambda r: r.checkpoint_step is not None and r.checkpoint_step > after_step
        )
        rss = {key: cluster.processes[key].rss_mib() for key in SERVERS}
    finally:
        chief.stop()
    assert saved.checkpoint_step is not None
    return Round(attempt, saved.resumed_from_step, saved.checkpoint_step, first_step, seconds, rss)


def restart_chiefs(
    cluster: LocalCluster, checkpoint_dir: Path, chiefs: int, *, recycle_ps: bool = True
) -> list[Round]:
    """`chiefs` chiefs in a row; with `recycle_ps` every PS restarts before each new chief."""
    job = ctr_job(checkpoint_dir, ["--steps=1000000"], interval_steps=CHECKPOINT_STEPS, model=MODEL)
    for key in SERVERS:
        if key not in cluster.processes or cluster.processes[key].poll() is not None:
            cluster.start(key)
    rounds: list[Round] = []
    for attempt in range(chiefs):
        if attempt and recycle_ps:
            for key in ("ps-0", "ps-1"):
                cluster.processes[key].stop()
                cluster.start(key)
        rounds.append(one_chief(cluster, job, attempt, rounds[-1].checkpoint_step if rounds else -1))
    return rounds


def measure(recycle_ps: bool, restarts: int) -> list[Round]:
    """One job on its own private network and fresh servers: `restarts` + 1 chiefs."""
    with tempfile.TemporaryDirectory() as work, PrivateNetwork(f"psm{os.getpid()}") as network:
        workdir = Path(work)
        cluster = LocalCluster(ctr_job(workdir / "unused", []), workdir, network)
        try:
            return restart_chiefs(cluster, workdir / "ckpt", restarts + 1, recycle_ps=recycle_ps)
        finally:
            cluster.stop_all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--restarts", type=int, default=5, help="chiefs after the first")
    args = parser.parse_args()
    remove_stale("psm")
    # Both ways in one run, so the machine's load is the same for the ratio.
    results = {name: measure(name == "restarted", args.restarts) for name in ("kept", "restarted")}
    for name, rounds in results.items():
        print(f"PS {name} between chiefs:")
        for one in rounds:
            print(f"  {one.line()}")
    first_steps = {
        name: statistics.median(r.first_step_seconds for r in rounds[1:]) for name, rounds in results.items()
    }
    peak = {name: max(r.rss_mib["ps-0"] for r in rounds) for name, rounds in results.items()}
    print(f"planner: {planned().per_ps_bytes / MiB:.0f} MiB per PS")
    print(
        f"restarted chief -> first step, median: PS kept {first_steps['kept']:.1f} s, PS restarted "
        f"{first_steps['restarted']:.1f} s (x{first_steps['restarted'] / first_steps['kept']:.2f}); "
        f"ps-0 peak RSS: {peak['kept']:.0f} vs {peak['restarted']:.0f} MiB"
    )


if __name__ == "__main__":
    main()
