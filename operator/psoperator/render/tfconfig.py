"""TF_CONFIG as TensorFlow's cluster resolver expects it.

StatefulSet pods share one template, so the task index cannot be written into it: the rendered
value references `$(PSOP_TASK_INDEX)`, which the kubelet expands from the pod's own
`apps.kubernetes.io/pod-index` label (downward API) when it starts the container.

A cluster whose TF_CONFIG exceeds contract.TF_CONFIG_ENV_LIMIT goes into one ConfigMap instead,
mounted in every container (PSOP_TF_CONFIG_FILE names the file): the runtime composes TF_CONFIG
from it (contract.tf_config_from_file). The file holds each role's task count and one address
pattern, not the addresses: a few hundred bytes for the largest job the CRD admits.
"""

from __future__ import annotations

import json

from psoperator.api.names import (
    TF_CONFIG_FILE,
    job_labels,
    task_address,
    task_address_pattern,
    tf_config_map_name,
)
from psoperator.contract import CLUSTER_ROLES, ENV_TASK_INDEX, TF_CONFIG_ENV_LIMIT, Role, cluster_file_text
from psoperator.render.pod import Manifest

INDEX_REFERENCE = f"$({ENV_TASK_INDEX})"
# A JSON-safe placeholder swapped for the unquoted $(VAR) reference after serialisation.
_INDEX_PLACEHOLDER = "__psoperator_task_index__"


def cluster_spec(
    job_name: str, namespace: str, replicas: dict[Role, int], port: int, domain: str
) -> dict[str, list[str]]:
    """Addresses of every task of the cluster roles; the evaluator is never part of it."""
    return {
        role.value: [task_address(job_name, namespace, role, i, port, domain) for i in range(replicas[role])]
        for role in CLUSTER_ROLES
    }


def tf_config(cluster: dict[str, list[str]], role: Role, index: int | None) -> str:
    """The TF_CONFIG value for a task; index None means "the pod's own index, expanded by the kubelet".

    The evaluator gets the cluster too (so it can find the chief), but it is not a member of it.
    """
    task_index: int | str = _INDEX_PLACEHOLDER if index is None else index
    text = json.dumps({"cluster": cluster, "task": {"type": role.value, "index": task_index}}, sort_keys=True)
    return text.replace(f'"{_INDEX_PLACEHOLDER}"', INDEX_REFERENCE)


def fits_environment(cluster: dict[str, list[str]]) -> bool:
    """Whether every task's TF_CONFIG can go into its environment (the largest is a worker's)."""
    return len(tf_config(cluster, Role.WORKER, None).encode()) <= TF_CONFIG_ENV_LIMIT


def render_tf_config_map(
    job_name: str, namespace: str, replicas: dict[Role, int], port: int, domain: str
) -> Manifest:
    """The cluster of a job too large for the environment, as the file every task reads."""
    tasks = {role.value: replicas[role] for role in CLUSTER_ROLES}
    pattern = task_address_pattern(job_name, namespace, port, domain)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": tf_config_map_name(job_name),
            "namespace": namespace,
            "labels": job_labels(job_name, "tf-config"),
        },
        "data": {TF_CONFIG_FILE: cluster_file_text(tasks, pattern)},
    }
