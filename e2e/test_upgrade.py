"""An operator upgrade restarts no running job, against the real control plane.

The job runs under a previous version of the operator (this repository at PREVIOUS, whose
StatefulSets had no updateStrategy, so RollingUpdate), built to render one pod-template annotation
fewer than this version does: what any upgrade that changes rendering looks like. Then this
version takes over, as `helm upgrade` replaces the Deployment's pod. It patches every child to what
it renders; the StatefulSet controller sees a new template, and must replace no pod.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e import psjobs
from e2e.operator_process import OperatorProcess
from e2e.paths import REPO
from e2e.util import as_json, holds_for, wait_for

# The last released version before StatefulSets updated OnDelete.
PREVIOUS = "115184f"
# Its renderer, without the trainer-container annotation (the first container is the trainer anyway).
RENDERED_ANNOTATION = "ANNOTATION_TRAINER_CONTAINER: trainer}"
Obj = dict[str, Any]

pytestmark = pytest.mark.usefixtures("kwok_only")


def previous_version(directory: Path) -> Path:
    """The package at PREVIOUS, extracted to `directory`, with one annotation fewer; its path."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", PREVIOUS, "operator"], check=True, capture_output=True, timeout=60
    ).stdout
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(directory)], input=archive, check=True, timeout=60)
    pod = directory / "operator" / "psoperator" / "render" / "pod.py"
    source = pod.read_text()
    assert RENDERED_ANNOTATION in source, f"{pod} no longer renders the annotation this test removes"
    pod.write_text(source.replace(RENDERED_ANNOTATION, "}"))
    return directory / "operator"


def statefulsets(k8s: client.ApiClient, namespace: str) -> list[Obj]:
    listed = client.AppsV1Api(k8s).list_namespaced_stateful_set(namespace)
    return [as_json(k8s, s) for s in listed.items]


def pod_uids(k8s: client.ApiClient, namespace: str) -> dict[str, str]:
    roles = ("chief", "ps", "worker")
    pods = [p for role in roles for p in psjobs.live_pods(k8s, namespace, "ctr", role)]
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}


def test_an_upgrade_that_changes_the_pod_template_replaces_no_pod(
    k8s: client.ApiClient, namespace: str, operator_kubeconfig: Path, tmp_path: Path
) -> None:
    old = OperatorProcess(operator_kubeconfig, namespace, tmp_path / "previous.log")
    old.extra_env = {"PYTHONPATH": str(previous_version(tmp_path / "previous"))}
    old.start()
    psjobs.create(k8s, namespace, psjobs.manifest("ctr"))
    psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)
    before = pod_uids(k8s, namespace)
    assert all(s["spec"]["updateStrategy"]["type"] == "RollingUpdate" for s in statefulsets(k8s, namespace))
    old.stop()

    new = OperatorProcess(operator_kubeconfig, namespace, tmp_path / "operator.log")
    new.start()
    try:
        # The StatefulSet controller has seen this version's template: a new revision.
        def rolled_out() -> bool:
            sets = statefulsets(k8s, namespace)
            return len(sets) == 2 and all(
                s["status"].get("observedGeneration") == s["metadata"]["generation"]
                and s["status"].get("updateRevision") != s["status"].get("currentRevision")
                for s in sets
            )

        wait_for(
            rolled_out, timeout=60, message=lambda: str([s["status"] for s in statefulsets(k8s, namespace)])
        )
        # Under RollingUpdate the controller would now be replacing the pods, highest ordinal first.
        holds_for(lambda: pod_uids(k8s, namespace) == before, duration=15,
                  message=lambda: f"pods replaced: {before} -> {pod_uids(k8s, namespace)}")  # fmt: skip
        assert all(s["spec"]["updateStrategy"] == {"type": "OnDelete"} for s in statefulsets(k8s, namespace))
        status = psjobs.status(k8s, namespace, "ctr")
        assert status["phase"] == "Running" and status["restarts"] == 0, status
    finally:
        new.stop()
