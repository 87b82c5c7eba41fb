"""Admission-time PS sizing against the real control plane."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from e2e import psjobs
from e2e.operator_process import OperatorProcess
from e2e.util import condition, holds_for, wait_for

# 8 GB of fp32 parameters, 24 GB with Adam: each of 2 PS needs 28.5 GiB. (The simulated CPU nodes have
# 64Gi, so a well-sized PS asks for less than a whole node.)
MODEL = {"parameters": 2_000_000_000, "optimizer": "adam"}


def _ps(memory: str) -> dict[str, Any]:
    resources = {"requests": {"memory": memory}, "limits": {"memory": memory}}
    return {
        "replicas": 2,
        "template": {"spec": {"containers": [{"name": "trainer", "resources": resources}]}},
    }


def _warning_events(k8s: client.ApiClient, namespace: str) -> list[str]:
    return [f"{e.reason}: {e.message}" for e in psjobs.events(k8s, namespace, "ctr") if e.type == "Warning"]


def test_undersized_ps_get_a_warning_and_still_start(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    psjobs.create(k8s, namespace, psjobs.manifest("ctr", model=MODEL, ps=_ps("4Gi")))
    status = psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)
    warning = condition(status, "SizingWarning")
    assert warning is not None and warning["status"] == "True" and warning["reason"] == "PSMemoryUndersized"
    assert "4Gi" in warning["message"]
    wait_for(
        lambda: any(e.startswith("SizingWarning:") for e in _warning_events(k8s, namespace)),
        timeout=20,
        message="a SizingWarning event",
    )


def test_undersized_ps_with_enforce_do_not_start(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    psjobs.create(k8s, namespace, psjobs.manifest("ctr", model={**MODEL, "enforce": True}, ps=_ps("4Gi")))
    status = psjobs.wait_phase(k8s, namespace, "ctr", "Failed", timeout=30)
    failed = condition(status, "Failed")
    assert failed is not None and failed["reason"] == "Undersized" and "enforce" in failed["message"]
    holds_for(lambda: not psjobs.pods(k8s, namespace, "ctr", "ps"), duration=3, message="no PS pod")
    assert any(e.startswith("Undersized:") for e in _warning_events(k8s, namespace))


def test_well_sized_ps_start_clean(k8s: client.ApiClient, namespace: str, operator: OperatorProcess) -> None:
    psjobs.create(k8s, namespace, psjobs.manifest("ctr", model={**MODEL, "enforce": True}, ps=_ps("32Gi")))
    status = psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)
    assert condition(status, "SizingWarning")["status"] == "False"  # type: ignore[index]
    assert not any(e.startswith("SizingWarning") for e in _warning_events(k8s, namespace))
