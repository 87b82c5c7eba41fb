"""The chaos run (e2e/chaos_run.py) against the local control plane, in CI with about 24 jobs:

    PSOPERATOR_CLUSTER=... pytest e2e/test_chaos_run.py -s                   # CI's short run
    PSOPERATOR_CLUSTER=... pytest e2e/test_chaos_run.py -s --chaos-jobs 100  # the long run

Two operator replicas elect a leader on a Lease; every ~10 s the one that holds it is SIGKILLed and
started again (it comes back as the standby, or wins the Lease back), and kube-apiserver is
restarted twice or more. At the end every job is where its scenario says, with the restarts it
says, no child is left of a deleted job, no job ever had chiefs of two attempts (or two chief Jobs)
running or two chief Jobs for one attempt, twin pods of one chief Job (the Job controller's, after
a create whose response a restart lost: chaos_run.py) lasted at most TWIN_SECONDS, every kill hit
the replica that held the Lease, both replicas led, and the memory of the operator processes stayed
flat. Prints the figures.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kubernetes import client

from e2e import chaos_run, leases
from e2e.controlplane import ControlPlane
from e2e.operator_process import OperatorProcess
from e2e.util import free_port, wait_for

pytestmark = pytest.mark.usefixtures("kwok_only")

KILL_EVERY = 10.0
# A standby takes the Lease over LEASE_SECONDS after it last saw it renewed, noticed within one
# retry (LEASE_SECONDS / 4): with the leader killed every ~10 s, the chart's 8 s would leave the
# jobs without a leader most of the run. 4 s leaves them led most of it, and still gives a leader
# a renew deadline (2/3 of it, 2.7 s) of almost three 1 s retries, so that a slow moment of this
# busy machine does not make it step down; below that, the run would test the machine's latency.
LEASE_SECONDS = 4
LEADER_TIMEOUT = 60.0  # a kill waits for a replica to hold the Lease (the API server may restart)
CREATE_EVERY = 2.5
DRIVERS = 8  # scenarios running at once
ORPHAN_TIMEOUT = 90.0  # the garbage collector removes a deleted job's children
JOB_DEADLINE = 240.0  # create -> terminal state, per job
# The longest the run goes on after its jobs ended, for the disruptions it plans (a kube-apiserver
# restart takes up to LEADER_TIMEOUT, a kill as long).
PLAN_TIMEOUT = 4 * LEADER_TIMEOUT
# The Job controller deletes the one pod too many at its next sync once it sees both (0.5 s after
# KWOK started them, in the run that found them); its informers re-list after the restart first.
TWIN_SECONDS = 15.0


@dataclass(frozen=True)
class Kill:
    replica: str  # "a" or "b"
    holder: str  # the Lease's holder identity read before the kill
    held_after: bool  # the Lease still named it after the kill: the leader died, not a standby


def _name(replica: OperatorProcess) -> str:
    return replica.log_path.stem


@dataclass
class Disruptor:
    """Every `every` seconds SIGKILLs the replica that holds the Lease and starts it again; restarts
    kube-apiserver at the times (seconds from the start) in `apiserver_at`, and any component that
    exited after it; starts again a replica that exited by itself (it lost the Lease), as its
    kubelet would."""

    replicas: list[OperatorProcess]
    lease: str
    control_plane: ControlPlane
    apiserver_at: list[float]
    every: float = KILL_EVERY
    kills: list[Kill] = field(default_factory=list)
    apiserver_restarts: list[float] = field(default_factory=list)
    revived: list[str] = field(default_factory=list)
    exited: list[str] = field(default_factory=list)  # replicas that lost the Lease, and exited
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        started = last_kill = time.monotonic()
        while not self._stop.wait(1.0):
            try:
                if self.apiserver_at and time.monotonic() - started >= self.apiserver_at[0]:
                    self.apiserver_at.pop(0)
                    self.apiserver_restarts.append(self.control_plane.restart_apiserver())
                self.revived += self.control_plane.revive()
                self.restart_exited()
                if time.monotonic() - last_kill >= self.every:
                    self.kill_leader()
                    last_kill = time.monotonic()
            except BaseException as error:  # pytest.fail in start() raises outside Exception
                self.errors.append(f"{type(error).__name__}: {error}")
                return

    def planned_done(self) -> bool:
        """Every planned restart of kube-apiserver made, and both replicas killed while leading."""
        return bool(self.errors) or (not self.apiserver_at and all(_kills_of(self, n) >= 1 for n in "ab"))

    def restart_exited(self) -> None:
        for replica in self.replicas:
            if not replica.running:
                self.exited.append(_name(replica))
                replica.start()

    def kill_leader(self) -> None:
        holder, leader = wait_for(self._leader, timeout=LEADER_TIMEOUT, message="a live replica leads")
        leader.kill()
        after = wait_for(lambda: leases.holder(self.control_plane.api, self.lease), message="the Lease")
        self.kills.append(Kill(_name(leader), holder, held_after=after == holder))
        leader.start()

    def _leader(self) -> tuple[str, OperatorProcess] | None:
        """The Lease's holder identity and the running replica it names, if it names one."""
        holder = leases.holder(self.control_plane.api, self.lease)
        named = [r for r in self.replicas if r.running and r.pid == leases.pid(holder)]
        return (holder, named[0]) if holder and named else None

    def stop(self) -> None:
        self._stop.set()


@pytest.fixture
def chaos_jobs(request: pytest.FixtureRequest) -> int:
    return int(request.config.getoption("--chaos-jobs"))


@pytest.fixture
def replicas(
    k8s: client.ApiClient, namespace: str, operator_kubeconfig: Path, tmp_path: Path
) -> Iterator[tuple[list[OperatorProcess], str]]:
    """The two replicas and their Lease. A progress port nobody serves: other clusters on this
    machine reuse the same pod IPs."""
    progress = ("--progress-port", str(free_port()))
    with leases.replicas(k8s, operator_kubeconfig, namespace, tmp_path, LEASE_SECONDS, progress) as both:
        yield both


def test_chaos_run(
    k8s: client.ApiClient,
    kubeconfig: Path,
    namespace: str,
    replicas: tuple[list[OperatorProcess], str],
    chaos_jobs: int,
) -> None:
    both, lease = replicas
    plan = chaos_run.scenarios(chaos_jobs)
    creating = len(plan) * CREATE_EVERY
    disruptor = Disruptor(
        both, lease, ControlPlane(kubeconfig, k8s), apiserver_at=[creating * 0.3, creating * 0.7]
    )
    sampler = chaos_run.Sampler(k8s, namespace, lambda: _processes(both), lambda: leases.read(k8s, lease))
    started = time.monotonic()
    outcomes = _drive_all(k8s, namespace, plan, disruptor, sampler)
    elapsed = time.monotonic() - started
    for replica in both:
        if not replica.running:
            replica.start()
    troubled = {o.name for o in outcomes if o.error} | {s.split(":")[0] for s in sampler.two_chiefs}
    for replica in both if troubled else []:
        lines = [line for line in replica.log_text().splitlines() if any(j in line for j in troubled)]
        print(f"--- replica {_name(replica)}, of {sorted(troubled)} ---", *lines[-400:], sep="\n")
    _check(k8s, namespace, outcomes, disruptor, sampler, elapsed)


def _processes(replicas: list[OperatorProcess]) -> dict[str, int | None]:
    """Each replica's current process, named by its start ("b3": the third of replica b)."""
    return {f"{_name(r)}{r.starts}": r.pid for r in replicas}


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
            outcomes = [f.result() for f in futures]
        # However fast the jobs ended, the run lasts until the disruptions it plans have happened.
        wait_for(disruptor.planned_done, timeout=PLAN_TIMEOUT, interval=1, message="the planned disruptions")
        return outcomes
    finally:
        disruptor.stop()
        sampler.stop()
        for thread in threads:
            thread.join(timeout=120)
        disruptor.revived += disruptor.control_plane.revive()


def _figures(
    k8s: client.ApiClient,
    outcomes: list[chaos_run.Outcome],
    disruptor: Disruptor,
    sampler: chaos_run.Sampler,
    elapsed: float,
) -> list[tuple[str, object]]:
    peaks = sampler.peaks_mib()
    lease = leases.read(k8s, disruptor.lease)
    return [
        ("jobs", len(outcomes)),
        *[(f"injected: {k}", v) for k, v in chaos_run.injected(outcomes).items()],
        ("leader kills (SIGKILL)", len(disruptor.kills)),
        ("  of replica a / b", " / ".join(str(_kills_of(disruptor, n)) for n in "ab")),
        ("  of a standby", sum(not k.held_after for k in disruptor.kills)),
        ("leader changes (Lease transitions)", lease.transitions if lease else "no Lease"),
        ("holders seen (sampled)", len(sampler.handovers.holders)),
        ("longest handover (no leader)", f"{sampler.handovers.longest:.1f}s"),
        ("kube-apiserver restarts", len(disruptor.apiserver_restarts)),
        ("components revived (lost lease)", ", ".join(disruptor.revived) or "none"),
        ("replicas that exited (lost the Lease)", ", ".join(disruptor.exited) or "none"),
        ("kube-apiserver back after", ", ".join(f"{s:.1f}s" for s in disruptor.apiserver_restarts)),
        ("time to finish (all jobs)", f"{elapsed:.0f}s"),
        ("slowest job", f"{max(o.seconds for o in outcomes):.0f}s"),
        ("operator peak RSS min/max", f"{min(peaks):.0f}/{max(peaks):.0f} MiB ({len(peaks)} processes)"),
        ("samples (two-chief check)", sampler.samples),
        ("chief Jobs with twin pods, longest", _twins(sampler)),
    ]


def _twins(sampler: chaos_run.Sampler) -> str:
    seconds = sampler.twins_seconds()
    return f"{len(seconds)}, {max(seconds.values()):.1f}s" if seconds else "none"


def _kills_of(disruptor: Disruptor, replica: str) -> int:
    return sum(k.replica == replica for k in disruptor.kills)


def _check(
    k8s: client.ApiClient,
    namespace: str,
    outcomes: list[chaos_run.Outcome],
    disruptor: Disruptor,
    sampler: chaos_run.Sampler,
    elapsed: float,
) -> None:
    print("\n" + chaos_run.table(_figures(k8s, outcomes, disruptor, sampler, elapsed)))
    assert not disruptor.errors, disruptor.errors
    assert len(disruptor.apiserver_restarts) >= 2
    assert [k for k in disruptor.kills if not k.held_after] == [], "a kill of a standby"
    assert all(_kills_of(disruptor, n) >= 1 for n in "ab"), "both replicas led, and were killed leading"
    assert [f"{o.name} ({o.kind}): {o.error}" for o in outcomes if o.error] == []
    assert [o.name for o in outcomes if o.seconds > JOB_DEADLINE] == [], "jobs past their deadline"
    assert chaos_run.wrong_endings(k8s, namespace, outcomes) == []
    # The samples are taken through the API restarts: most of them must have been.
    assert sampler.samples >= elapsed / 5, "too few samples for the two-chief check"
    assert sampler.two_chiefs == [], "two chief pods running at once"
    assert {j: s for j, s in sampler.twins_seconds().items() if s > TWIN_SECONDS} == {}, "twins kept"
    assert sampler.duplicate_chief_jobs(outcomes) == []
    wait_for(
        lambda: not chaos_run.orphans(k8s, namespace),
        timeout=ORPHAN_TIMEOUT,
        interval=2,
        message=lambda: f"no orphaned children; left: {chaos_run.orphans(k8s, namespace)}",
    )
    # Every operator process peaks near the others: memory does not pile up with time or jobs.
    peaks = sampler.peaks_mib()
    assert max(peaks) <= 1.5 * statistics.median(peaks), [f"{p:.0f} MiB" for p in peaks]
