"""A field a later render drops leaves the child, against the real control plane.

A resize renders the children anew: past the environment's limit, TF_CONFIG moves from every
container's environment into a ConfigMap mounted in every pod, and back when the job shrinks; a PS
resize can drop a limit. What the render no longer has must go from the StatefulSets: an inline
TF_CONFIG beside the file makes the runtime read the stale environment (new workers exit 2, a
permanent code), a volume of the deleted ConfigMap holds new pods in ContainerCreating, and a
limit below the new request is refused. (An operator upgrade that drops a field: test_upgrade.py.)
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from e2e import psjobs
from e2e.operator_process import OperatorProcess
from e2e.util import as_json, wait_for
from psoperator.contract import ENV_TF_CONFIG, ENV_TF_CONFIG_FILE, Role
from psoperator.render.tfconfig import cluster_spec, fits_environment

Obj = dict[str, Any]
VOLUME = "psoperator-tf-config"
# A resize restarts the job: a checkpoint asked of the chief first, then the new attempt's children.
RESIZED_WITHIN = 90

# Failure-free resizes need KWOK's simulated nodes (a pause container never checkpoints).
pytestmark = pytest.mark.usefixtures("kwok_only")


def _workers_past_the_limit(namespace: str) -> int:
    """The fewest workers whose TF_CONFIG no longer fits the environment, in this namespace."""
    workers = 2
    while fits_environment(cluster_spec("ctr", namespace, _replicas(workers), 2222, "cluster.local")):
        workers += 16
    return workers


def _replicas(workers: int) -> dict[Role, int]:
    return {Role.CHIEF: 1, Role.PS: 2, Role.WORKER: workers}


def _templates(k8s: client.ApiClient, namespace: str) -> dict[str, Obj]:
    """The pod template of each StatefulSet, by name."""
    listed = as_json(k8s, client.AppsV1Api(k8s).list_namespaced_stateful_set(namespace))
    return {s["metadata"]["name"]: s["spec"]["template"] for s in listed["items"]}


def _env(template: Obj) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in template["spec"]["containers"][0].get("env", [])}


def _start(k8s: client.ApiClient, namespace: str, **spec: Any) -> None:
    psjobs.create(k8s, namespace, psjobs.manifest("ctr", **spec))
    psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=120)


def _resize_workers(k8s: client.ApiClient, namespace: str, workers: int) -> None:
    spec = psjobs.get(k8s, namespace, "ctr")["spec"]  # type: ignore[index]
    psjobs.patch_spec(k8s, namespace, "ctr", {"worker": {**spec["worker"], "replicas": workers}})


def _no_rejection(k8s: client.ApiClient, namespace: str) -> None:
    rejected = [line for line in psjobs.told(k8s, namespace, "ctr") if line.startswith("ChildRejected")]
    assert rejected == []


def test_a_resize_past_the_environment_limit_takes_the_inline_tf_config_away(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    _start(k8s, namespace)
    assert all(ENV_TF_CONFIG in _env(t) for t in _templates(k8s, namespace).values())
    _resize_workers(k8s, namespace, _workers_past_the_limit(namespace))

    def from_the_file() -> dict[str, Obj] | None:
        templates = _templates(k8s, namespace)
        return templates if all(ENV_TF_CONFIG_FILE in _env(t) for t in templates.values()) else None

    templates = wait_for(
        from_the_file, timeout=RESIZED_WITHIN, message="the StatefulSets read TF_CONFIG's file"
    )
    assert {name: ENV_TF_CONFIG in _env(t) for name, t in templates.items()} == {
        "ctr-ps": False,
        "ctr-worker": False,
    }
    _no_rejection(k8s, namespace)


def test_a_resize_back_into_the_environment_takes_the_config_maps_volume_away(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    _start(k8s, namespace, worker={"replicas": _workers_past_the_limit(namespace)})
    assert all(VOLUME in str(t["spec"]["volumes"]) for t in _templates(k8s, namespace).values())
    _resize_workers(k8s, namespace, 2)
    core = client.CoreV1Api(k8s)

    def inline() -> dict[str, Obj] | None:
        templates = _templates(k8s, namespace)
        maps = core.list_namespaced_config_map(namespace, label_selector=psjobs.LABEL_JOB).items
        return templates if not maps and all(ENV_TF_CONFIG in _env(t) for t in templates.values()) else None

    templates = wait_for(inline, timeout=RESIZED_WITHIN, message="TF_CONFIG inline and its ConfigMap gone")
    for name, template in templates.items():
        volumes = [v["name"] for v in template["spec"].get("volumes", [])]
        mounts = [m["name"] for m in template["spec"]["containers"][0].get("volumeMounts", [])]
        assert (VOLUME in volumes, VOLUME in mounts, ENV_TF_CONFIG_FILE in _env(template)) == (
            False,
            False,
            False,
        ), name
    _no_rejection(k8s, namespace)


def _ps(resources: Obj) -> Obj:
    return {
        "replicas": 2,
        "template": {"spec": {"containers": [{"name": "trainer", "resources": resources}]}},
    }


def test_a_ps_resize_that_drops_the_memory_limit_takes_it_away(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """A limit left behind is below the new request: the API server refuses the template."""
    _start(k8s, namespace, ps=_ps({"requests": {"memory": "1Gi"}, "limits": {"memory": "1Gi"}}))
    psjobs.patch_spec(k8s, namespace, "ctr", {"ps": _ps({"requests": {"memory": "2Gi"}})})

    def resources() -> Obj:
        return dict(_templates(k8s, namespace)["ctr-ps"]["spec"]["containers"][0]["resources"])

    wait_for(
        lambda: resources().get("requests") == {"memory": "2Gi"},
        timeout=RESIZED_WITHIN,
        message=lambda: (
            f"the PS template requests 2Gi; it has {resources()}; {psjobs.told(k8s, namespace, 'ctr')}"
        ),
    )
    assert resources() == {"requests": {"memory": "2Gi"}}
    _no_rejection(k8s, namespace)
