"""The chart on real kubelets: `helm install` runs the operator from its image, in-cluster, under
Pod Security `restricted`; its liveness and metrics answer on the pod IP; `helm upgrade` keeps the
chiefs' key; `helm uninstall` leaves nothing of it behind but the CRD (Helm never deletes CRDs from
crds/) and that key, which a new install takes up: the chiefs still running hold tokens of it."""

from __future__ import annotations

from pathlib import Path

from kubernetes import client

from e2e.kubectl import kubectl
from e2e.real.commands import get_from_node, helm
from e2e.real.conftest import CHART, OPERATOR_IMAGE, install, operator_pod
from e2e.util import as_json, wait_for

RELEASE = "psop-chart"
NAMESPACE = "psop-chart-system"
CRD = "pstrainingjobs.psoperator.io"


def _left_behind(kubeconfig: Path) -> str:
    selector = f"app.kubernetes.io/instance={RELEASE}"
    namespaced = kubectl(
        kubeconfig, "get", "deployments,replicasets,pods,services,serviceaccounts", "-n", NAMESPACE,
        "-l", selector, "-o", "name",
    )  # fmt: skip
    cluster = kubectl(kubeconfig, "get", "clusterroles,clusterrolebindings", "-l", selector, "-o", "name")
    return (namespaced + cluster).strip()


def test_the_chart_runs_the_operator_in_cluster_and_uninstalls_cleanly(
    kubeconfig: Path, k8s: client.ApiClient, images: dict[str, str]
) -> None:
    install(kubeconfig, RELEASE, NAMESPACE)
    apps = client.AppsV1Api(k8s)
    deployment = as_json(k8s, apps.list_namespaced_deployment(NAMESPACE).items[0])
    available = [c for c in deployment["status"]["conditions"] if c["type"] == "Available"]
    assert available and available[0]["status"] == "True", deployment["status"]

    pod = wait_for(lambda: operator_pod(k8s, NAMESPACE), timeout=60, message="the operator pod")
    container = pod["status"]["containerStatuses"][0]
    assert container["image"].endswith(OPERATOR_IMAGE) and container["ready"], container
    assert pod["spec"]["serviceAccountName"] == RELEASE + "-ps-training-operator"
    ip, node = pod["status"]["podIP"], pod["spec"]["nodeName"]
    # The kubelet's own liveness probe goes to this endpoint; so does this test, from the node.
    get_from_node(node, f"http://{ip}:8080/healthz")
    metrics = get_from_node(node, f"http://{ip}:9090/metrics")
    assert "# HELP psoperator_reconcile_duration_seconds" in metrics, metrics[:2000]

    key = _chief_key(k8s)
    helm(kubeconfig, "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--reuse-values", "--wait")
    assert _chief_key(k8s) == key

    helm(kubeconfig, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")
    wait_for(lambda: not _left_behind(kubeconfig), timeout=90, message=lambda: _left_behind(kubeconfig))
    assert kubectl(kubeconfig, "get", "crd", CRD, "-o", "name").strip().endswith(f"/{CRD}")
    assert _chief_key(k8s) == key
    repository, tag = OPERATOR_IMAGE.rsplit(":", 1)
    helm(
        kubeconfig, "install", RELEASE, str(CHART), "--namespace", NAMESPACE,
        "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
        "--set", "image.pullPolicy=Never", "--wait", "--timeout", "3m",
    )  # fmt: skip
    assert _chief_key(k8s) == key
    helm(kubeconfig, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")
    kubectl(kubeconfig, "delete", "namespace", NAMESPACE, "--wait=false")


def _chief_key(k8s: client.ApiClient) -> str:
    secret = client.CoreV1Api(k8s).read_namespaced_secret(
        f"{RELEASE}-ps-training-operator-chief-key", NAMESPACE
    )
    return str(as_json(k8s, secret)["data"]["key"])
