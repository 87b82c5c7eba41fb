"""Headless Services: one per role, so every task has a stable DNS name."""

from __future__ import annotations

from psoperator.api.names import child_labels, child_name, selector_labels
from psoperator.contract import Role
from psoperator.render.pod import Manifest


def render_service(job_name: str, namespace: str, role: Role, port: int) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": child_name(job_name, role),
            "namespace": namespace,
            "labels": child_labels(job_name, role),
        },
        "spec": {
            "clusterIP": "None",
            # TensorFlow resolves its peers while they start, before any of them is Ready.
            "publishNotReadyAddresses": True,
            "selector": selector_labels(job_name, role),
            "ports": [{"name": "tf", "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }
