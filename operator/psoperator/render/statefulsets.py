"""StatefulSets for the parameter servers and the workers: stable names and ordinals."""

from __future__ import annotations

from psoperator.api.names import child_labels, child_name, selector_labels
from psoperator.contract import Role
from psoperator.render.pod import Manifest


def render_statefulset(
    job_name: str, namespace: str, role: Role, replicas: int, pod_template: Manifest
) -> Manifest:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": child_name(job_name, role),
            "namespace": namespace,
            "labels": child_labels(job_name, role),
        },
        "spec": {
            "serviceName": child_name(job_name, role),
            "replicas": replicas,
            # Tasks start together: TF waits for its peers, so ordered start-up only delays it.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector_labels(job_name, role)},
            # A changed template (an operator upgrade, a resize's new TF_CONFIG) must not roll running
            # parameter servers: each one lost restarts the chief. Pods get the new template when
            # they are recreated: every coordinated restart replaces every PS, a lost worker is
            # replaced by the StatefulSet.
            "updateStrategy": {"type": "OnDelete"},
            "template": pod_template,
        },
    }
