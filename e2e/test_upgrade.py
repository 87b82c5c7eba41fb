"""An operator upgrade restarts no running job, against the real control plane.

The job runs under a previous version of the operator (this repository at PREVIOUS, whose
StatefulSets had no updateStrategy, so RollingUpdate), built to render one pod-template annotation
fewer than this version does: what any upgrade that changes rendering looks like. Then this
version takes over, as `helm upgrade` replaces the Deployment's pod. It patches every child to what
it renders; the StatefulSet controller sees a new template, and must replace no pod.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e import psjobs
from e2e.bench.measure import operator_writes
from e2e.operator_process import OperatorProcess
from e2e.paths import REPO
from e2e.util import as_json, free_port, holds_for, wait_for
from psoperator.managed_fields import LEGACY_MANAGER

# The last released version before StatefulSets updated OnDelete.
PREVIOUS = "115184f"
# Its renderer, without the trainer-container annotation (the first container is the trainer anyway).
RENDERED_ANNOTATION = "ANNOTATION_TRAINER_CONTAINER: trainer}"
Obj = dict[str, Any]

pytestmark = pytest.mark.usefixtures("kwok_only")


def previous_version(directory: Path, commit: str, module: str, old: str, new: str) -> Path:
    """The package at `commit`, extracted to `directory`, with `old` replaced by `new` in `module`
    (under psoperator/); its path."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit, "operator"], check=True, capture_output=True, timeout=60
    ).stdout
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(directory)], input=archive, check=True, timeout=60)
    path = directory / "operator" / "psoperator" / module
    source = path.read_text()
    assert old in source, f"{path} no longer has what this test replaces"
    path.write_text(source.replace(old, new))
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
    previous = previous_version(tmp_path / "previous", PREVIOUS, "render/pod.py", RENDERED_ANNOTATION, "}")
    old.extra_env = {"PYTHONPATH": str(previous)}
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


# The last version that created children without a fieldManager: the API server named its writes
# after the client's User-Agent (LEGACY_MANAGER), and an apply could not take away what they made.
BEFORE_FOLDING = "8425faf"
DROPPED = "e2e.psoperator.io/dropped"
# Its renderer, rendering more than this version does: a label on every child, and an env var, a pod
# annotation and a volume in the pods of every StatefulSet.
FINISH = """def _finish(manifest: Manifest, owner: Manifest) -> Manifest:
    meta = manifest["metadata"]
"""
RENDERS_MORE = f"""{FINISH}    meta["labels"] = {{**meta.get("labels", {{}}), "{DROPPED}": "x"}}
    if manifest["kind"] == "StatefulSet":
        pod = manifest["spec"]["template"]
        pod["metadata"]["annotations"] = {{**pod["metadata"].get("annotations", {{}}), "{DROPPED}": "x"}}
        pod["spec"]["volumes"] = [*pod["spec"].get("volumes", []), {{"name": "dropped", "emptyDir": {{}}}}]
        for container in pod["spec"]["containers"]:
            container["env"] = [*container.get("env", []), {{"name": "DROPPED", "value": "x"}}]
"""
# The children the operator applies (a Job is merge-patched: its template cannot change), by the
# resource its requests name.
APPLIED = {"services": "Service", "statefulsets": "StatefulSet", "networkpolicies": "NetworkPolicy"}


def applied_children(k8s: client.ApiClient, namespace: str) -> list[Obj]:
    selector = psjobs.LABEL_JOB
    lists = {
        "Service": client.CoreV1Api(k8s).list_namespaced_service,
        "StatefulSet": client.AppsV1Api(k8s).list_namespaced_stateful_set,
        "NetworkPolicy": client.NetworkingV1Api(k8s).list_namespaced_network_policy,
    }
    listed = {kind: as_json(k8s, read(namespace, label_selector=selector)) for kind, read in lists.items()}
    return [{**item, "kind": kind} for kind, items in listed.items() for item in items["items"]]


def dropped_fields(child: Obj) -> list[str]:
    """What the child still has of what only the earlier version renders."""
    found = ["label"] if DROPPED in (child["metadata"].get("labels") or {}) else []
    pod = child.get("spec", {}).get("template")
    if pod is not None:
        found += ["pod annotation"] if DROPPED in (pod["metadata"].get("annotations") or {}) else []
        found += ["volume"] if "dropped" in [v["name"] for v in pod["spec"].get("volumes") or []] else []
        env = [e["name"] for c in pod["spec"]["containers"] for e in c.get("env") or []]
        found += ["env"] if "DROPPED" in env else []
    return found


def test_an_upgrade_that_renders_fewer_fields_takes_them_from_the_children(
    k8s: client.ApiClient, namespace: str, operator_kubeconfig: Path, tmp_path: Path
) -> None:
    """This version folds the earlier version's Update entries into its Apply entry before its first
    apply to each child, so the apply takes away what it no longer renders: at one write more per
    child (the fold), and none at all for a child it does not patch."""
    old = OperatorProcess(operator_kubeconfig, namespace, tmp_path / "previous.log")
    previous = previous_version(
        tmp_path / "previous", BEFORE_FOLDING, "render/__init__.py", FINISH, RENDERS_MORE
    )
    old.extra_env = {"PYTHONPATH": str(previous)}
    old.start()
    psjobs.create(k8s, namespace, psjobs.manifest("ctr"))
    psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)
    made = applied_children(k8s, namespace)
    everything = ["label", "pod annotation", "volume", "env"]
    assert {f"{c['kind']}/{c['metadata']['name']}": dropped_fields(c) for c in made} == {
        **{f"Service/ctr-{role}": ["label"] for role in ("chief", "ps", "worker")},
        "StatefulSet/ctr-ps": everything,
        "StatefulSet/ctr-worker": everything,
        "NetworkPolicy/ctr-peers": ["label"],
    }
    # How the API server recorded the earlier version's creates: what this version folds.
    updates = {(e["manager"], e["operation"]) for c in made for e in c["metadata"]["managedFields"]
               if not e.get("subresource")}  # fmt: skip
    assert updates == {(LEGACY_MANAGER, "Update")}
    old.stop()

    metrics_port = free_port()
    new = OperatorProcess(operator_kubeconfig, namespace, tmp_path / "operator.log")
    new.extra_args = ["--metrics-port", str(metrics_port)]
    new.start()
    try:

        def left() -> dict[str, list[str]]:
            now = applied_children(k8s, namespace)
            return {f"{c['kind']}/{c['metadata']['name']}": dropped_fields(c) for c in now}

        wait_for(lambda: not any(left().values()), timeout=60, message=lambda: f"fields left: {left()}")
        writes = operator_writes(metrics_port)
        counts = Counter(c["kind"] for c in made)
        assert {r: writes.get(f"PATCH {r}") for r in APPLIED} == {
            r: 2 * counts[k] for r, k in APPLIED.items()
        }
        assert not [line for line in psjobs.told(k8s, namespace, "ctr") if line.startswith("ChildRejected")]
    finally:
        new.stop()
