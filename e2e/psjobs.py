"""PSTrainingJob helpers for e2e tests: manifests that read like the user's, and typed reads."""

from __future__ import annotations

import copy
import os
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.util import as_json, wait_for
from psoperator.api.models import TrackedPod, Tracking

GROUP, VERSION, PLURAL = "psoperator.io", "v1alpha1", "pstrainingjobs"
LABEL_JOB, LABEL_ROLE, LABEL_ATTEMPT = "psoperator.io/job-name", "psoperator.io/role", "psoperator.io/attempt"
# Any image that runs until stopped: KWOK ignores it; on kind (e2e/cluster/kind.sh) the node image has it.
IMAGE = os.environ.get("PSOPERATOR_E2E_IMAGE", "registry.k8s.io/pause:3.10")
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}

Obj = dict[str, Any]


def manifest(name: str, **spec: Any) -> Obj:
    """A small job: 2 PS on CPU nodes, 2 GPU workers, a chief; `spec` entries are merged in."""
    body: Obj = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PSTrainingJob",
        "metadata": {"name": name},
        "spec": {
            "image": IMAGE,
            "chief": {"template": {"spec": {"containers": [{"name": "trainer"}]}}},
            "ps": {"replicas": 2, "template": {"spec": {"containers": [{"name": "trainer"}]}}},
            "worker": {
                "replicas": 2,
                "template": {
                    "spec": {
                        "tolerations": [GPU_TOLERATION],
                        "containers": [{"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
                    }
                },
            },
            "checkpoint": {"dir": "/checkpoints"},
        },
    }
    for key, value in spec.items():
        current = body["spec"].get(key)
        body["spec"][key] = (
            {**current, **value} if isinstance(current, dict) and isinstance(value, dict) else value
        )
    return body


def create(api: client.ApiClient, namespace: str, body: Obj) -> Obj:
    result = client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, copy.deepcopy(body)
    )
    return result if isinstance(result, dict) else {}


def get(api: client.ApiClient, namespace: str, name: str) -> Obj | None:
    try:
        result = client.CustomObjectsApi(api).get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name
        )
        return result if isinstance(result, dict) else None
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def status(api: client.ApiClient, namespace: str, name: str) -> Obj:
    job = get(api, namespace, name)
    return (job or {}).get("status") or {}


def tracked(status: Obj) -> dict[str, TrackedPod]:
    """The pods a status tracks, by name, as the operator reads status.tracking."""
    return Tracking.model_validate(status.get("tracking") or {}).pods


def patch_spec(api: client.ApiClient, namespace: str, name: str, spec: Obj) -> None:
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name, {"spec": spec}
    )


def wait_phase(api: client.ApiClient, namespace: str, name: str, phase: str, timeout: float = 60.0) -> Obj:
    def reached() -> Obj | None:
        current = status(api, namespace, name)
        return current if current.get("phase") == phase else None

    result: Obj = wait_for(
        reached,
        timeout=timeout,
        message=lambda: f"{name} phase {phase}; status is {status(api, namespace, name)}",
    )
    return result


def pods(api: client.ApiClient, namespace: str, name: str, role: str) -> list[Obj]:
    listed = client.CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector=f"{LABEL_JOB}={name},{LABEL_ROLE}={role}"
    )
    return [as_json(api, p) for p in listed.items]


def live_pods(api: client.ApiClient, namespace: str, name: str, role: str) -> list[Obj]:
    return [
        p
        for p in pods(api, namespace, name, role)
        if not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") in ("Pending", "Running")
    ]


def running_pod(api: client.ApiClient, namespace: str, name: str, role: str, index: int = 0) -> Obj:
    """The Running pod of a role's task (for the chief: of any attempt), waited for."""

    def find() -> Obj | None:
        for p in live_pods(api, namespace, name, role):
            ordinal = p["metadata"]["labels"].get("apps.kubernetes.io/pod-index", "0")
            if p["status"].get("phase") == "Running" and (role == "chief" or ordinal == str(index)):
                return p
        return None

    return wait_for(find, timeout=60, message=f"a running {role} {index} pod of {name}")


def events(api: client.ApiClient, namespace: str, name: str) -> list[Any]:
    """The job's events (V1Event), oldest first."""
    selector = f"involvedObject.name={name}"
    listed = client.CoreV1Api(api).list_namespaced_event(namespace, field_selector=selector)
    return sorted(listed.items, key=lambda e: str(e.last_timestamp or e.event_time or ""))


def told(api: client.ApiClient, namespace: str, name: str) -> list[str]:
    """The job's events, oldest first, as "reason: message": what explains a wrong ending."""
    return [f"{e.reason}: {e.message}" for e in events(api, namespace, name)]
