"""Prometheus metrics and liveness of the operator process."""

from __future__ import annotations

import urllib.request

import pytest
from kubernetes import client

from e2e import chaos, psjobs
from e2e.conftest import OperatorProcess
from e2e.util import free_port, wait_for

# Failure injection and loopback pod IPs need KWOK's simulated nodes.
pytestmark = pytest.mark.usefixtures("kwok_only")


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text: str = response.read().decode()
        return text


def test_metrics_tell_phase_restarts_and_recovery_time(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    port = free_port()
    operator.stop()
    operator.extra_args += ["--metrics-port", str(port)]
    operator.start()

    psjobs.create(k8s, namespace, psjobs.manifest("ctr"))
    psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)
    running = f'psoperator_job_phase{{job="ctr",namespace="{namespace}",phase="Running"}} 1.0'
    wait_for(lambda: running in _scrape(port), timeout=20, message="the Running phase gauge")

    wait_for(
        lambda: psjobs.status(k8s, namespace, "ctr")["tracking"]["psEstablished"],
        timeout=30,
        message="PS established",
    )
    chaos.fail_container(
        k8s, namespace, psjobs.running_pod(k8s, namespace, "ctr", "ps", 0)["metadata"]["name"], 1
    )
    restarted = f'psoperator_restarts_total{{job="ctr",namespace="{namespace}",reason="Error"}} 1.0'
    wait_for(
        lambda: restarted in _scrape(port), timeout=20, message=lambda: f"{restarted} in\n{_scrape(port)}"
    )
    text = _scrape(port)
    assert "psoperator_recovery_seconds_count 1.0" in text
    assert 'psoperator_reconciles_total{result="ok"}' in text
    assert 'psoperator_reconciles_total{result="error"}' not in text
