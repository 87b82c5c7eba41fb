"""Kueue in the real-kubelet cluster, installed for real: its manager built here from the Go module
(`e2e/cluster/build.sh kueue`), its image on the local base (images/kueue), its own Helm chart from
the same module, its webhooks and visibility API served by its pod in-cluster.

  install(kubeconfig)             builds (or reuses) and loads the image, `helm upgrade --install`s
                                  the chart, lets Kueue read PSTrainingJobs; returns each step's
                                  seconds once Kueue answers (ready)
  opt_in(kubeconfig, namespace)   labels a namespace so that Kueue manages its jobs; Kueue's pod and
                                  job webhooks act nowhere else
  resource_flavor, cluster_queue, local_queue, workload_priority_class
                                  pure builders of Kueue's objects (kueue.x-k8s.io/v1beta2)
  KueueObjects                    creates them, deletes them all at the end

The release is left installed at the end of a session (the cluster usually goes with it): the next
session with a kept cluster reuses it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.kubectl import kubectl
from e2e.paths import CACHE
from e2e.real.commands import BUILD_IMAGES, LOGS, helm, load, run
from e2e.util import wait_for

KUEUE_VERSION = os.environ.get("KUEUE_VERSION", "v0.17.0")
# images/build.sh and e2e/cluster/build.sh read the same variables.
KUEUE_IMAGE = os.environ.get("PSOPERATOR_KUEUE_IMAGE", f"ps-training-operator/kueue:{KUEUE_VERSION}")
CHART = CACHE / "charts" / f"kueue-{KUEUE_VERSION}"
RELEASE, NAMESPACE = "kueue", "kueue-system"
SERVICE_ACCOUNT = "kueue-controller-manager"
GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
API_VERSION = f"{GROUP}/{VERSION}"
# Kind.version.group: the operator creates and owns the Workload of each job itself.
EXTERNAL_FRAMEWORK = "PSTrainingJob.v1alpha1.psoperator.io"
MANAGED_LABEL, MANAGED = "psoperator.io/kueue", "managed"
READER = "kueue-pstrainingjob-reader"
# The GPUs kind's GPU-pool node advertises (kind.sh's GPUS_PER_NODE).
GPU, NODE_GPUS = "nvidia.com/gpu", "4"
PROBE_FLAVOR = "psop-kueue-webhook-probe"
VISIBILITY_API = f"v1beta2.visibility.{GROUP}"

PLURALS = {
    "ResourceFlavor": "resourceflavors",
    "ClusterQueue": "clusterqueues",
    "LocalQueue": "localqueues",
    "WorkloadPriorityClass": "workloadpriorityclasses",
    "Workload": "workloads",
}


def manager_config() -> dict[str, Any]:
    """Kueue's Configuration: the chart's own defaults, then jobs managed only in opted-in
    namespaces, batch Jobs and PSTrainingJobs as the only integrations (no other CRD is installed)."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "health": {"healthProbeBindAddress": ":8081"},
        "metrics": {"bindAddress": ":8443"},
        "webhook": {"port": 9443},
        "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
        "managedJobsNamespaceSelector": {"matchLabels": {MANAGED_LABEL: MANAGED}},
        "integrations": {"frameworks": ["batch/job"], "externalFrameworks": [EXTERNAL_FRAMEWORK]},
    }


def chart_values() -> dict[str, Any]:
    """The chart's values: the image loaded into the node (no registry), small requests on a 2-core
    node, PriorityBoost (alpha in 0.17) on; cert-manager, Prometheus and KueueViz stay off (the
    chart's defaults): Kueue makes its own webhook certificates."""
    repository, tag = KUEUE_IMAGE.rsplit(":", 1)
    return {
        "enableCertManager": False,
        "enablePrometheus": False,
        "enableKueueViz": False,
        "controllerManager": {
            "featureGates": [{"name": "PriorityBoost", "enabled": True}],
            "manager": {
                "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
                "resources": {
                    "requests": {"cpu": "100m", "memory": "256Mi"},
                    "limits": {"cpu": "1", "memory": "512Mi"},
                },
            },
        },
        "managerConfig": {"controllerManagerConfigYaml": json.dumps(manager_config(), indent=2)},
    }


def reader_rbac() -> list[dict[str, Any]]:
    """Kueue's controller reads the PSTrainingJobs that own Workloads (its external framework)."""
    meta = {"name": READER, "labels": {"app.kubernetes.io/part-of": "psoperator-e2e"}}
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": meta,
            "rules": [
                {
                    "apiGroups": ["psoperator.io"],
                    "resources": ["pstrainingjobs"],
                    "verbs": ["get", "list", "watch"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": READER},
            "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}],
        },
    ]


def _seconds(step: Callable[[], object]) -> float:
    started = time.monotonic()
    step()
    return time.monotonic() - started


def install(kubeconfig: Path) -> dict[str, float]:
    """Kueue installed and answering; the seconds of each step, by name."""
    return {
        "kueue image built (images/build.sh kueue)": _seconds(
            lambda: run("bash", BUILD_IMAGES, "kueue", timeout=2400, log="kueue-build.log")
        ),
        "kueue image loaded into the nodes": _seconds(lambda: load(KUEUE_IMAGE, log="kueue-load.log")),
        "kueue helm install until it answers": _seconds(lambda: _helm_install(kubeconfig)),
    }


def _helm_install(kubeconfig: Path) -> None:
    LOGS.mkdir(parents=True, exist_ok=True)
    values = LOGS / "kueue-values.json"
    values.write_text(json.dumps(chart_values(), indent=2))
    rbac = {"apiVersion": "v1", "kind": "List", "items": reader_rbac()}
    kubectl(kubeconfig, "apply", "-f", "-", stdin=json.dumps(rbac))
    helm(
        kubeconfig, "upgrade", "--install", RELEASE, str(CHART), "--namespace", NAMESPACE,
        "--create-namespace", "--values", str(values), "--wait", "--timeout", "5m",
        timeout=360,
    )  # fmt: skip
    wait_for(lambda: answers(kubeconfig), timeout=120, interval=1, message="Kueue's webhooks and APIs answer")


def answers(kubeconfig: Path) -> bool:
    """Whether the API server reaches Kueue: a ResourceFlavor passes its webhooks (a server-side
    dry run), and its visibility API is Available (else every namespace deletion stalls on
    discovery). Raises, saying why, while it does not."""
    probe = json.dumps(resource_flavor(PROBE_FLAVOR))
    kubectl(kubeconfig, "create", "--dry-run=server", "-f", "-", stdin=probe)
    available = kubectl(
        kubeconfig,
        "get",
        "apiservice",
        VISIBILITY_API,
        "-o",
        "jsonpath={.status.conditions[?(@.type=='Available')]}",
    )
    status = json.loads(available or "{}")
    if status.get("status") != "True":
        raise AssertionError(f"APIService {VISIBILITY_API}: {status}")
    return True


def opt_in(kubeconfig: Path, namespace: str) -> None:
    """Kueue manages the jobs (and pods) of this namespace: its webhooks' namespaceSelector."""
    kubectl(kubeconfig, "label", "namespace", namespace, f"{MANAGED_LABEL}={MANAGED}", "--overwrite")


def _object(kind: str, name: str, spec: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
    metadata = {"name": name} if namespace is None else {"name": name, "namespace": namespace}
    return {"apiVersion": API_VERSION, "kind": kind, "metadata": metadata, "spec": spec}


def resource_flavor(name: str) -> dict[str, Any]:
    """A flavor with no node labels: any node."""
    return _object("ResourceFlavor", name, {})


def cluster_queue(name: str, flavor: str, cpu: str, memory: str, gpus: str = NODE_GPUS) -> dict[str, Any]:
    """A ClusterQueue for the opted-in namespaces with a cpu, memory and GPU quota in one flavor
    (Kueue admits no workload asking for a resource its queue does not cover, and the example's
    workers ask for GPUs); a pending workload preempts admitted ones of lower priority in the same
    queue."""
    quotas = {"cpu": cpu, "memory": memory, GPU: gpus}
    resources = [{"name": resource, "nominalQuota": quota} for resource, quota in quotas.items()]
    return _object(
        "ClusterQueue",
        name,
        {
            "namespaceSelector": {"matchLabels": {MANAGED_LABEL: MANAGED}},
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": [
                {"coveredResources": list(quotas), "flavors": [{"name": flavor, "resources": resources}]}
            ],
            "preemption": {"withinClusterQueue": "LowerPriority"},
        },
    )


def local_queue(namespace: str, name: str, cluster_queue: str) -> dict[str, Any]:
    return _object("LocalQueue", name, {"clusterQueue": cluster_queue}, namespace)


def workload_priority_class(name: str, value: int) -> dict[str, Any]:
    """WorkloadPriorityClass has no spec: its value is top-level."""
    return {
        "apiVersion": API_VERSION,
        "kind": "WorkloadPriorityClass",
        "metadata": {"name": name},
        "value": value,
    }


class KueueObjects:
    """Kueue objects created through the API, deleted together (newest first) by `delete_all`; a
    namespace of None means a cluster-scoped kind."""

    def __init__(self, api: client.ApiClient) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.created: list[tuple[str, str, str | None]] = []

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        kind, name, namespace = obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace")
        if namespace is None:
            created = self.custom.create_cluster_custom_object(GROUP, VERSION, PLURALS[kind], obj)
        else:
            created = self.custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURALS[kind], obj
            )
        self.created.append((kind, name, namespace))
        return cast(dict[str, Any], created)

    def _gone(self, kind: str, name: str, namespace: str | None) -> bool:
        """Deletes it unless it is gone already; whether it is."""
        try:
            if namespace is None:
                self.custom.delete_cluster_custom_object(GROUP, VERSION, PLURALS[kind], name)
            else:
                self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURALS[kind], name)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False

    def delete_all(self, timeout: float = 60) -> None:
        """Newest first: the Workloads before their queues (a ClusterQueue in use keeps its
        finalizer), until every one is gone, so that the next test can reuse the names."""
        remaining = list(reversed(self.created))
        wait_for(
            lambda: all([self._gone(*key) for key in remaining]),
            timeout=timeout,
            interval=0.5,
            message=lambda: f"Kueue objects deleted: {remaining}",
        )
        self.created.clear()
