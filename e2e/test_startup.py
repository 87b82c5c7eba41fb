"""An operator started before its CRD serves jobs once the CRD is applied (kopf alone would not:
it resolves its resources at start and at each CRD event, and the API server may publish a new
CRD's discovery after the last of them)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e import psjobs
from e2e.clusters import apply_crd
from e2e.kubectl import kubectl
from e2e.operator_process import OperatorProcess
from e2e.util import wait_for


@pytest.fixture
def no_crd(crd: str, kubeconfig: Path, k8s: client.ApiClient) -> Iterator[None]:
    """The CRD deleted (and every job with it) for the test, applied again after it."""
    kubectl(kubeconfig, "delete", "crd", crd, "--wait=true", timeout=120)
    try:
        yield
    finally:
        apply_crd(kubeconfig, k8s)


def _served(k8s: client.ApiClient) -> bool:
    try:
        client.CustomObjectsApi(k8s).list_namespaced_custom_object(
            psjobs.GROUP, psjobs.VERSION, "default", psjobs.PLURAL
        )
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


def test_an_operator_started_before_its_crd_serves_jobs_once_it_is_applied(
    k8s: client.ApiClient,
    kubeconfig: Path,
    namespace: str,
    operator_kubeconfig: Path,
    tmp_path: Path,
    no_crd: None,
) -> None:
    operator = OperatorProcess(operator_kubeconfig, namespace, tmp_path / "operator.log")
    operator.launch()
    try:
        wait_for(
            lambda: "waiting for the API server to serve pstrainingjobs" in operator.log_text(),
            timeout=60,
            message=lambda: f"the operator says what it waits for; its log: {operator.log_text()[-3000:]}",
        )
        assert operator.running
        apply_crd(kubeconfig, k8s)
        wait_for(lambda: _served(k8s), timeout=60, message="pstrainingjobs served")
        operator.wait_live()
        psjobs.create(k8s, namespace, psjobs.manifest("ctr"))
        psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)
    finally:
        operator.stop()
