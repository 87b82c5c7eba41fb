"""What chaos.py imitates on KWOK's simulated nodes, on a real kubelet: a container's own exit code
and termination message reach the API."""

from __future__ import annotations

from kubernetes import client

from e2e.test_cluster import create_pod, only_container, pod_manifest, wait_pod_phase


def test_real_container_exit_code_is_reported(
    k8s: client.ApiClient, namespace: str, images: dict[str, str]
) -> None:
    manifest = pod_manifest("exits")
    container = manifest["spec"]["containers"][0]
    container |= {"image": images["operator"], "imagePullPolicy": "Never"}  # it has sh
    container["command"] = ["sh", "-c", "echo bye >/dev/termination-log; exit 3"]
    pod = wait_pod_phase(k8s, namespace, create_pod(k8s, namespace, manifest), "Failed", timeout=120)
    terminated = only_container(pod)["state"]["terminated"]
    assert (terminated["exitCode"], terminated["message"].strip()) == (3, "bye")
