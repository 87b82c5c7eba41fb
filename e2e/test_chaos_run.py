"""The chaos run (e2e/chaos_run.py) against the local control plane, in CI with about 24 jobs:

    PSOPERATOR_CLUSTER=... pytest e2e/test_chaos_run.py -s                   # CI's short run
    PSOPERATOR_CLUSTER=... pytest e2e/test_chaos_run.py -s --chaos-jobs 100  # the long run

The operator is SIGKILLed every ~10 s and started again, kube-apiserver is restarted twice or more;
at the end every job is where its scenario says, with the restarts it says, no child is left of a
deleted job, no job ever had two chiefs running or two chief Jobs for one attempt, and the
operator's memory stayed flat. Prints the figures.
"""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kubernetes import client

from e2e import chaos_run
from e2e.conftest import OperatorProcess
from e2e.controlplane import ControlPlane
from e2e.util import free_port, wait_for

pytestmark = pytest.mark.usefixtures("kwok_only")

KILL_EVERY = 10.0
CREATE_EVERY = 2.5
DRIVERS = 8  # scenarios running at once
ORPHAN_TIMEOUT = 90.0  # the garbage collector removes a deleted job's children
JOB_DEADLINE = 240.0  # create -> terminal state, per job


@dataclass
class Disruptor:
    """Kills and restarts the operator every `every` seconds; restarts kube-apiserver at the times
    (seconds from the start) in `apiserver_at`, and any component that exited after it."""

    operator: OperatorProcess
    control_plane: ControlPlane
    apiserver_at: list[float]
    every: float = KILL_EVERY
    kills: int = 0
    apiserver_restarts: list[float] = field(default_factory=list)
    revived: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        started = time.monotonic()
        while not self._stop.wait(self.every):
            try:
                if self.apiserver_at and time.monotonic() - started >= self.apiserver_at[0]:
                    self.apiserver_at.pop(0)
                    self.apiserver_restarts.append(self.control_plane.restart_apiserver())
                self.revived += self.control_plane.revive()
                self.operator.kill()
                self.kills += 1
                self.operator.start()
            except BaseException as error:  # pytest.fail in start() raises outside Exception
                self.errors.append(f"{type(error).__name__}: {error}")
                return

    def stop(self) -> None:
        self._stop.set()


@pytest.fixture
def chaos_jobs(request: pytest.FixtureRequest) -> int:
    return int(request.config.getoption("--chaos-jobs"))


def test_chaos_run(
    k8s: client.ApiClient,
    kubeconfig: Path,
    namespace: str,
    operator_kubeconfig: Path,
    tmp_path: Path,
    chaos_jobs: int,
) -> None:
    # A progress port nobody serves: other clusters on this machine reuse the same pod IPs.
    operator = OperatorProcess(
        operator_kubeconfig, namespace, tmp_path / "operator.log", ["--progress-port", str(free_port())]
    )
    plan = chaos_run.scenarios(chaos_jobs)
    creating = len(plan) * CREATE_EVERY
    disruptor = Disruptor(
        operator, ControlPlane(kubeconfig, k8s), apiserver_at=[creating * 0.3, creating * 0.7]
    )
    sampler = chaos_run.Sampler(k8s, namespace, lambda: (operator.starts, operator.pid))
    operator.start()
    try:
        started = time.monotonic()
        outcomes = _drive_all(k8s, namespace, plan, disruptor, sampler)
        elapsed = time.monotonic() - started
        if not operator.running:
            operator.start()
        if any(o.error for o in outcomes):
            print(operator.log_text()[-20000:])
        _check(k8s, namespace, outcomes, disruptor, sampler, elapsed)
    finally:
        operator.stop()


def _drive_all(
    k8s: client.ApiClient,
    namespace: str,
    plan: list[tuple[str, chaos_run.Kind]],
    disruptor: Disruptor,
    sampler: chaos_run.Sampler,
) -> list[chaos_run.Outcome]:
    """Starts a scenario every CREATE_EVERY seconds while the disruptor and the sampler run."""
    threads = [threading.Thread(target=t.run, daemon=True) for t in (disruptor, sampler)]
    for thread in threads:
        thread.start()
    try:
        with ThreadPoolExecutor(DRIVERS) as pool:
            futures = []
            for name, kind in plan:
                futures.append(pool.submit(chaos_run.drive, k8s, namespace, name, kind))
                time.sleep(CREATE_EVERY)
            return [f.result() for f in futures]
    finally:
        disruptor.stop()
        sampler.stop()
        for thread in threads:
            thread.join(timeout=120)
        disruptor.revived += disruptor.control_plane.revive()


def _check(
    k8s: client.ApiClient,
    namespace: str,
    outcomes: list[chaos_run.Outcome],
    disruptor: Disruptor,
    sampler: chaos_run.Sampler,
    elapsed: float,
) -> None:
    peaks = sampler.peaks_mib()
    print(
        "\n"
        + chaos_run.table(
            [
                ("jobs", len(outcomes)),
                *[(f"injected: {k}", v) for k, v in chaos_run.injected(outcomes).items()],
                ("operator kills (SIGKILL)", disruptor.kills),
                ("kube-apiserver restarts", len(disruptor.apiserver_restarts)),
                ("components revived (lost lease)", ", ".join(disruptor.revived) or "none"),
                ("kube-apiserver back after", ", ".join(f"{s:.1f}s" for s in disruptor.apiserver_restarts)),
                ("time to finish (all jobs)", f"{elapsed:.0f}s"),
                ("slowest job", f"{max(o.seconds for o in outcomes):.0f}s"),
                (
                    "operator peak RSS min/max",
                    f"{min(peaks):.0f}/{max(peaks):.0f} MiB ({len(peaks)} processes)",
                ),
                ("samples (two-chief check)", sampler.samples),
            ]
        )
    )
    assert not disruptor.errors, disruptor.errors
    assert disruptor.kills >= 1 and len(disruptor.apiserver_restarts) >= 2
    assert [f"{o.name} ({o.kind}): {o.error}" for o in outcomes if o.error] == []
    assert [o.name for o in outcomes if o.seconds > JOB_DEADLINE] == [], "jobs past their deadline"
    assert chaos_run.wrong_endings(k8s, namespace, outcomes) == []
    # The samples are taken through the API restarts: most of them must have been.
    assert sampler.samples >= elapsed / 5, "too few samples for the two-chief check"
    assert sampler.two_chiefs == [], "two chief pods running at once"
    assert sampler.duplicate_chief_jobs() == []
    wait_for(
        lambda: not chaos_run.orphans(k8s, namespace),
        timeout=ORPHAN_TIMEOUT,
        interval=2,
        message=lambda: f"no orphaned children; left: {chaos_run.orphans(k8s, namespace)}",
    )
    # Every operator process peaks near the others: memory does not pile up with time or jobs.
    assert max(peaks) <= 1.5 * statistics.median(peaks), [f"{p:.0f} MiB" for p in peaks]
