"""kube-router, the kind node image's CNI and NetworkPolicy enforcer (e2e/cluster/kind/kube-router.yaml:
iptables and ipset on each node), as the tests see it: whether it runs, and what it wrote on the
nodes, read through its pods (host network: the node's iptables and ipsets)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.kubectl import kubectl
from e2e.util import as_json, wait_for

ENFORCER_NS, ENFORCER = "kube-system", "kube-router"
ENFORCER_PODS = "app.kubernetes.io/name=kube-router"
Obj = dict[str, Any]


class Enforcer:
    """kube-router's pods, one per node: whether all are ready, and what they wrote on the nodes."""

    def __init__(self, kubeconfig: Path, k8s: client.ApiClient) -> None:
        self.kubeconfig, self.k8s = kubeconfig, k8s

    def pods(self) -> list[Obj]:
        listed = client.CoreV1Api(self.k8s).list_namespaced_pod(ENFORCER_NS, label_selector=ENFORCER_PODS)
        return [as_json(self.k8s, p) for p in listed.items]

    def not_ready(self) -> str:
        """Why the enforcer is not ready on every node ("" when it is)."""
        found = client.AppsV1Api(self.k8s).read_namespaced_daemon_set(ENFORCER, ENFORCER_NS)
        status = as_json(self.k8s, found)["status"]
        ready, wanted = status.get("numberReady", 0), status.get("desiredNumberScheduled", 0)
        return "" if ready == wanted > 0 else f"{ready} of {wanted} kube-router pods ready"

    def restarts(self) -> dict[str, int]:
        return {
            p["metadata"]["name"]: sum(c["restartCount"] for c in p["status"].get("containerStatuses", []))
            for p in self.pods()
        }

    def on_nodes(self, *command: str) -> str:
        """A command's output from every node, in kube-router's container (it has the tools)."""
        exec_in = ("exec", "-n", ENFORCER_NS, "-c", ENFORCER)
        return "\n".join(
            kubectl(self.kubeconfig, *exec_in, p["metadata"]["name"], "--", *command) for p in self.pods()
        )

    def rules(self, namespace: str) -> list[str]:
        """The filter rules kube-router wrote for the namespace's pods and policies (their comments
        name it: "... namespace: NS" for a pod, "... namespace NS" for a policy)."""
        named = re.compile(rf'namespace:? {re.escape(namespace)}[" ]')
        saved = self.on_nodes("iptables-save", "-t", "filter")
        return [line for line in saved.splitlines() if named.search(line)]

    def sets(self) -> set[str]:
        return set(self.on_nodes("ipset", "list", "-n").split())

    def enforces(self, namespace: str, name: str) -> bool:
        """The job's two policies are on the nodes."""
        rules = "\n".join(self.rules(namespace))
        policies = (f"{name}-peers", f"{name}-chief-progress")
        return all(f"policy name {policy} namespace" in rules for policy in policies)


def find(kubeconfig: Path, k8s: client.ApiClient) -> Enforcer | None:
    """kube-router, once ready on every node; None on a cluster whose CNI is another (kind's stock
    kindnetd enforces no NetworkPolicy)."""
    found = Enforcer(kubeconfig, k8s)
    try:
        found.not_ready()
    except ApiException as e:
        if e.status != 404:
            raise
        return None
    wait_for(lambda: not found.not_ready(), timeout=120, message=found.not_ready)
    return found
