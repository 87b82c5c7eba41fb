"""Two operator replicas, one leader (a coordination.k8s.io Lease): the active one SIGKILLed during a
parameter server failure, the other takes over; the restart happens once, and is counted once.

    python -m pytest e2e/test_ha.py -s    # prints the failure → new chief pod time
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from e2e import chaos, leases, psjobs
from e2e.operator_process import OperatorProcess
from e2e.util import holds_for, wait_for
from psoperator.control.leader import EXIT_LEASE_LOST

pytestmark = pytest.mark.usefixtures("kwok_only")
LEASE_SECONDS = 8
TAKEOVER_BUDGET_SECONDS = 15.0  # the target: failure → new chief pod, the leader killed with it


def _leader_and_standby(
    k8s: client.ApiClient, both: list[OperatorProcess], lease: str
) -> tuple[OperatorProcess, OperatorProcess]:
    """Which replica holds the Lease, once one does, and which waits."""
    leader_pid = wait_for(lambda: leases.holder_pid(k8s, lease), timeout=30, message="a leader")
    [leader] = [r for r in both if r.pid == leader_pid]
    [standby] = [r for r in both if r is not leader]
    return leader, standby


@pytest.fixture
def replicas(
    k8s: client.ApiClient, namespace: str, operator_kubeconfig: Path, tmp_path: Path
) -> Iterator[tuple[list[OperatorProcess], str]]:
    """Two operators as the chart's account, competing for a Lease of this test's own."""
    with leases.replicas(k8s, operator_kubeconfig, namespace, tmp_path, LEASE_SECONDS) as (both, lease):
        yield both, lease


def test_the_other_replica_takes_over_a_ps_failure_when_the_leader_is_killed(
    k8s: client.ApiClient, namespace: str, replicas: tuple[list[OperatorProcess], str]
) -> None:
    leader, standby = _leader_and_standby(k8s, *replicas)
    lease = replicas[1]

    psjobs.create(k8s, namespace, psjobs.manifest("ctr"))
    psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)
    wait_for(lambda: psjobs.status(k8s, namespace, "ctr")["tracking"]["psEstablished"], timeout=30)
    chief = psjobs.running_pod(k8s, namespace, "ctr", "chief")
    ps = psjobs.running_pod(k8s, namespace, "ctr", "ps", 0)

    started = time.monotonic()
    leader.kill()
    chaos.fail_container(k8s, namespace, ps["metadata"]["name"], exit_code=137, reason="OOMKilled")

    def new_chief() -> bool:
        return any(
            p["metadata"]["uid"] != chief["metadata"]["uid"]
            and p["metadata"]["labels"].get(psjobs.LABEL_ATTEMPT) == "1"
            for p in psjobs.live_pods(k8s, namespace, "ctr", "chief")
        )

    wait_for(new_chief, timeout=TAKEOVER_BUDGET_SECONDS * 2, message="a chief pod of attempt 1")
    elapsed = time.monotonic() - started
    print(f"leader SIGKILLed with a PS failure -> new chief pod: {elapsed:.2f}s (Lease {LEASE_SECONDS}s)")
    assert elapsed <= TAKEOVER_BUDGET_SECONDS
    assert leases.holder_pid(k8s, lease) == standby.pid

    psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=60)
    status = psjobs.status(k8s, namespace, "ctr")
    assert (status["restarts"], status["countedRestarts"]) == (1, 1)
    # The job's events, in the message, tell which failure wrote any other reason.
    told = psjobs.told(k8s, namespace, "ctr")
    assert status["lastFailure"]["reason"] == "OOMKilled", f"{status['lastFailure']}; events: {told}"
    holds_for(lambda: psjobs.status(k8s, namespace, "ctr")["restarts"] == 1, duration=5)
    assert standby.running


def test_a_stopped_leader_hands_over_at_once(
    k8s: client.ApiClient, namespace: str, replicas: tuple[list[OperatorProcess], str]
) -> None:
    """A clean stop (a rolling update, a drain) frees the Lease: no wait for it to expire."""
    leader, standby = _leader_and_standby(k8s, *replicas)
    lease = replicas[1]
    leader.stop()
    started = time.monotonic()
    wait_for(
        lambda: leases.holder_pid(k8s, lease) == standby.pid,
        timeout=LEASE_SECONDS,
        message="the standby leads",
    )
    print(f"clean stop -> the standby holds the Lease: {time.monotonic() - started:.2f}s")
    psjobs.create(k8s, namespace, psjobs.manifest("ctr"))
    psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)


def test_a_leader_paused_past_its_lease_exits_when_it_resumes(
    k8s: client.ApiClient, namespace: str, replicas: tuple[list[OperatorProcess], str]
) -> None:
    """A leader frozen (SIGSTOP: as a long pause or a throttled container leaves it) while the standby
    takes the Lease over finds, once it runs again, that it lost the Lease: it exits instead of
    acting on, and its container would start it again as a standby."""
    leader, standby = _leader_and_standby(k8s, *replicas)
    lease = replicas[1]
    assert leader.pid is not None
    os.kill(leader.pid, signal.SIGSTOP)
    try:
        wait_for(
            lambda: leases.holder_pid(k8s, lease) == standby.pid,
            timeout=LEASE_SECONDS * 3,
            message="the standby leads",
        )
    finally:
        os.kill(leader.pid, signal.SIGCONT)
    wait_for(lambda: not leader.running, timeout=LEASE_SECONDS, message="the paused leader exits")
    assert leader.stop() == EXIT_LEASE_LOST
    assert "leader election lost" in leader.log_text()
    assert standby.running and leases.holder_pid(k8s, lease) == standby.pid


def test_a_disruption_seen_by_the_leader_is_never_counted_by_the_replica_that_takes_over(
    k8s: client.ApiClient, namespace: str, replicas: tuple[list[OperatorProcess], str]
) -> None:
    """The leader sees a PS marked for preemption (DisruptionTarget) and is SIGKILLed; the PS is then
    replaced while no replica leads. The new leader never saw it go: its status record says it was
    a disruption, and the restart is not counted."""
    leader, standby = _leader_and_standby(k8s, *replicas)
    psjobs.create(k8s, namespace, psjobs.manifest("ctr"))
    psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)
    wait_for(lambda: psjobs.status(k8s, namespace, "ctr")["tracking"]["psEstablished"], timeout=30)
    ps = psjobs.running_pod(k8s, namespace, "ctr", "ps", 0)
    name, uid = ps["metadata"]["name"], ps["metadata"]["uid"]
    chaos.mark_disruption(k8s, namespace, name)
    wait_for(
        lambda: psjobs.tracked(psjobs.status(k8s, namespace, "ctr"))[name].disruption,
        timeout=30,
        message="the disruption recorded in status.tracking",
    )
    leader.kill()
    client.CoreV1Api(k8s).delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    wait_for(
        lambda: psjobs.running_pod(k8s, namespace, "ctr", "ps", 0)["metadata"]["uid"] != uid,
        timeout=60,
        message=f"{name} replaced while no replica leads",
    )
    status = wait_for(
        lambda: (s := psjobs.status(k8s, namespace, "ctr")).get("restarts") == 1 and s,
        timeout=TAKEOVER_BUDGET_SECONDS * 2,
        message="the restart, by the replica that took over",
    )
    assert status["countedRestarts"] == 0 and status["lastFailure"]["reason"] == "Preempted", status
    holds_for(lambda: psjobs.status(k8s, namespace, "ctr")["countedRestarts"] == 0, duration=5)
    assert standby.running
