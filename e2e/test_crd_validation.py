"""Server-side validation of PSTrainingJobs by a real apiserver: schema, defaults and CEL rules.

Rejections are asked for with dryRun, so nothing is stored; every rejection must name the field.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.util import wait_for

pytestmark = pytest.mark.cluster

GROUP, VERSION, PLURAL = "psoperator.io", "v1alpha1", "pstrainingjobs"
CACHE = Path(os.environ.get("PSOPERATOR_CACHE", Path.home() / ".cache" / "psoperator"))
CONTAINER = {"name": "trainer", "image": "example.com/ctr-trainer:1.0"}


def manifest(name: str = "ctr", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PSTrainingJob",
        "metadata": {"name": name},
        "spec": {
            "chief": {"template": {"spec": {"containers": [dict(CONTAINER)]}}},
            "ps": {"replicas": 2, "template": {"spec": {"containers": [dict(CONTAINER)]}}},
            "worker": {
                "replicas": 4,
                "template": {
                    "spec": {
                        "containers": [
                            {
                                **CONTAINER,
                                "ports": [{"containerPort": 2222}],
                                "resources": {"limits": {"nvidia.com/gpu": 1, "memory": "4Gi"}},
                            }
                        ]
                    }
                },
            },
            "checkpoint": {"dir": "/checkpoints"},
        },
    }
    body["spec"].update(copy.deepcopy(spec))
    return body


def with_change(body: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    changed = copy.deepcopy(body)
    change(changed["spec"])
    return changed


def create(k8s: client.ApiClient, namespace: str, body: dict[str, Any], *, dry_run: bool) -> Any:
    return client.CustomObjectsApi(k8s).create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        body,
        dry_run="All" if dry_run else None,
        field_validation="Strict",
    )


def update(k8s: client.ApiClient, namespace: str, name: str, change: Callable[[dict[str, Any]], None]) -> Any:
    """Read the stored job, change its spec, and write it back (what `kubectl edit` does)."""
    api = client.CustomObjectsApi(k8s)
    stored = cast(dict[str, Any], api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name))
    return api.replace_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name, with_change(stored, change), field_validation="Strict"
    )


def rejection(call: Callable[[], Any]) -> str:
    """The apiserver's message for a request that must be rejected as invalid."""
    with pytest.raises(ApiException) as caught:
        call()
    assert caught.value.status in (400, 422), caught.value.body
    message: str = json.loads(caught.value.body or "{}")["message"]
    return message


def test_the_crd_is_structural_and_established(k8s: client.ApiClient, crd: str) -> None:
    obj = client.ApiextensionsV1Api(k8s).read_custom_resource_definition(crd)
    assert obj.status is not None
    conditions = {c.type: c.status for c in obj.status.conditions or []}
    assert conditions.get("Established") == "True"
    assert conditions.get("NonStructuralSchema", "False") == "False"


def test_a_valid_job_is_accepted_and_defaulted(k8s: client.ApiClient, crd: str, namespace: str) -> None:
    created = create(k8s, namespace, manifest(), dry_run=False)
    spec = created["spec"]
    assert spec["port"] == 2222
    assert spec["failurePolicy"]["maxRestarts"] == 5
    assert spec["failurePolicy"]["permanentExitCodes"] == [1, 2]
    assert spec["failurePolicy"]["connectTimeoutSeconds"] == 600
    assert spec["runPolicy"] == {"suspend": False, "cleanPodPolicy": "All"}
    assert spec["scheduling"] == {}
    assert spec["chief"]["replicas"] == 1
    worker = spec["worker"]["template"]["spec"]["containers"][0]
    assert worker["ports"] == [{"containerPort": 2222, "protocol": "TCP"}]  # upstream's default
    assert worker["resources"]["limits"] == {"nvidia.com/gpu": 1, "memory": "4Gi"}
    assert "evaluator" not in spec and "image" not in spec


def _typo(spec: dict[str, Any]) -> None:
    spec["chief"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"


def _bad_quantity(spec: dict[str, Any]) -> None:
    spec["ps"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"memory": "4Gx"}}


def _duplicate_container(spec: dict[str, Any]) -> None:
    spec["ps"]["template"]["spec"]["containers"].append(dict(CONTAINER))


INVALID: list[tuple[str, Callable[[dict[str, Any]], None], list[str]]] = [
    ("container-typo", _typo, ['unknown field "spec.chief.template.spec.containers[0].imagePullPolicyy"']),
    ("bad-quantity", _bad_quantity, ["spec.ps.template.spec.containers[0].resources.limits.memory"]),
    ("duplicate-container", _duplicate_container, ["spec.ps.template.spec.containers[1]", "Duplicate"]),
    ("port-0", lambda s: s.update(port=0), ["spec.port", "1 to 65535"]),
    ("port-70000", lambda s: s.update(port=70000), ["spec.port", "1 to 65535"]),
    (
        "ps-replicas-0",
        lambda s: s["ps"].update(replicas=0),
        ["spec.ps.replicas", "at least one parameter server"],
    ),
    (
        "worker-replicas-0",
        lambda s: s["worker"].update(replicas=0),
        ["spec.worker.replicas", "at least one worker"],
    ),
    (
        "chief-replicas-2",
        lambda s: s["chief"].update(replicas=2),
        ["spec.chief.replicas", "exactly one chief"],
    ),
    ("relative-dir", lambda s: s["checkpoint"].update(dir="ckpt"), ["spec.checkpoint.dir", "absolute path"]),
    (
        "volume-with-uri",
        lambda s: s.update(checkpoint={"dir": "gs://bucket/ckpt", "volume": {"emptyDir": {}}}),
        ["spec.checkpoint.volume", "absolute path"],
    ),
    (
        "exit-code-300",
        lambda s: s.update(failurePolicy={"permanentExitCodes": [2, 300]}),
        ["spec.failurePolicy.permanentExitCodes[1]", "1 to 255"],
    ),
    (
        "duplicate-exit-code",
        lambda s: s.update(failurePolicy={"permanentExitCodes": [2, 2]}),
        ["spec.failurePolicy.permanentExitCodes[1]", "Duplicate value"],
    ),
    (
        "clean-pod-policy",
        lambda s: s.update(runPolicy={"cleanPodPolicy": "Some"}),
        ["spec.runPolicy.cleanPodPolicy"],
    ),
    ("unknown-spec-field", lambda s: s.update(replicas=3), ['unknown field "spec.replicas"']),
]


@pytest.mark.parametrize(("change", "expected"), [case[1:] for case in INVALID], ids=[c[0] for c in INVALID])
def test_an_invalid_job_is_rejected_with_the_field(
    k8s: client.ApiClient,
    crd: str,
    namespace: str,
    change: Callable[[dict[str, Any]], None],
    expected: list[str],
) -> None:
    body = with_change(manifest(), change)
    message = rejection(lambda: create(k8s, namespace, body, dry_run=True))
    for words in expected:
        assert words in message


def test_a_job_name_that_cannot_prefix_service_names_is_rejected(
    k8s: client.ApiClient, crd: str, namespace: str
) -> None:
    message = rejection(lambda: create(k8s, namespace, manifest(name="1-ctr"), dry_run=True))
    assert "metadata.name must be at most" in message


def _set_chief_image(spec: dict[str, Any]) -> None:
    spec["chief"]["template"]["spec"]["containers"][0]["image"] = "example.com/other:2"


IMMUTABLE: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("ps-replicas", lambda s: s["ps"].update(replicas=3), "spec.ps.replicas is immutable"),
    ("worker-replicas", lambda s: s["worker"].update(replicas=8), "spec.worker.replicas is immutable"),
    ("port", lambda s: s.update(port=2223), "spec.port is immutable"),
    ("chief-template", _set_chief_image, "spec.chief.template is immutable"),
    ("checkpoint-dir", lambda s: s["checkpoint"].update(dir="/elsewhere"), "spec.checkpoint is immutable"),
    ("image", lambda s: s.update(image="example.com/other:2"), "spec.image is immutable"),
    ("evaluator", lambda s: s.update(evaluator={"template": {}}), "spec.evaluator cannot be added"),
    ("scheduling", lambda s: s["scheduling"].update(schedulerName="volcano"), "spec.scheduling is immutable"),
]


@pytest.fixture
def stored_job(k8s: client.ApiClient, crd: str, namespace: str) -> str:
    create(k8s, namespace, manifest(), dry_run=False)
    return "ctr"


@pytest.mark.parametrize(("change", "expected"), [c[1:] for c in IMMUTABLE], ids=[c[0] for c in IMMUTABLE])
def test_immutable_fields_cannot_change_after_creation(
    k8s: client.ApiClient,
    namespace: str,
    stored_job: str,
    change: Callable[[dict[str, Any]], None],
    expected: str,
) -> None:
    message = rejection(lambda: update(k8s, namespace, stored_job, change))
    assert expected in message


def _run_policy_and_restarts(spec: dict[str, Any]) -> None:
    spec["runPolicy"].update(suspend=True, ttlSecondsAfterFinished=600, activeDeadlineSeconds=3600)
    spec["failurePolicy"].update(maxRestarts=9, permanentExitCodes=[2])


def test_suspend_deadlines_and_max_restarts_can_change(
    k8s: client.ApiClient, namespace: str, stored_job: str
) -> None:
    spec = update(k8s, namespace, stored_job, _run_policy_and_restarts)["spec"]
    assert spec["runPolicy"] == {
        "suspend": True,
        "ttlSecondsAfterFinished": 600,
        "activeDeadlineSeconds": 3600,
        "cleanPodPolicy": "All",
    }
    assert spec["failurePolicy"]["maxRestarts"] == 9
    assert spec["failurePolicy"]["permanentExitCodes"] == [2]


def test_status_is_a_subresource(k8s: client.ApiClient, namespace: str, stored_job: str) -> None:
    api = client.CustomObjectsApi(k8s)
    stored = cast(
        dict[str, Any], api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, stored_job)
    )
    stored["status"] = {"phase": "Running", "psReady": "1/2", "restarts": 0}
    stored["spec"]["port"] = 9999  # ignored: the status endpoint writes status only
    api.replace_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, stored_job, stored)
    after = cast(
        dict[str, Any], api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, stored_job)
    )
    assert after["status"] == {"phase": "Running", "psReady": "1/2", "restarts": 0}
    assert after["spec"]["port"] == 2222


def _kubectl() -> str:
    ours = CACHE / "bin" / "kubectl"
    return str(ours) if ours.exists() else "kubectl"


def test_kubectl_explain_reaches_into_the_template(kubeconfig: Path, crd: str) -> None:
    def explain(field: str) -> str | None:
        result = subprocess.run(
            [_kubectl(), "--kubeconfig", str(kubeconfig), "explain", field],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        return result.stdout if result.returncode == 0 else None

    checkpoint = wait_for(lambda: explain("psjob.spec.checkpoint"), timeout=60, message="kubectl explain")
    assert "gs://, s3:// or hdfs://" in checkpoint
    resources = wait_for(
        lambda: explain("psjob.spec.worker.template.spec.containers.resources"), timeout=30, message="explain"
    )
    assert "limits" in resources
