"""Server-side validation of PSTrainingJobs by a real apiserver: schema, defaults and CEL rules.

Rejections are asked for with dryRun, so nothing is stored; every rejection must name the field.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.bad_input import CREATE, UPDATE, BadInput, Obj, manifest
from e2e.paths import CACHE
from e2e.util import wait_for

pytestmark = pytest.mark.cluster

GROUP, VERSION, PLURAL = "psoperator.io", "v1alpha1", "pstrainingjobs"


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


def update(k8s: client.ApiClient, namespace: str, name: str, change: Callable[[Obj], Obj]) -> Any:
    """Read the stored job, change it, and write it back (what `kubectl edit` does)."""
    api = client.CustomObjectsApi(k8s)
    stored = cast(Obj, api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name))
    return api.replace_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name, change(stored), field_validation="Strict"
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


@pytest.mark.parametrize("case", CREATE, ids=[c.id for c in CREATE])
def test_a_bad_job_is_rejected_naming_the_field(
    k8s: client.ApiClient, crd: str, namespace: str, case: BadInput
) -> None:
    message = rejection(lambda: create(k8s, namespace, case.apply(manifest()), dry_run=True))
    for words in case.expected:
        assert words in message, f"{words!r} not in the API server's message: {message}"


@pytest.fixture
def stored_job(k8s: client.ApiClient, crd: str, namespace: str) -> str:
    create(k8s, namespace, manifest(), dry_run=False)
    return "ctr"


@pytest.mark.parametrize("case", UPDATE, ids=[c.id for c in UPDATE])
def test_an_immutable_field_cannot_change_after_creation(
    k8s: client.ApiClient, namespace: str, stored_job: str, case: BadInput
) -> None:
    message = rejection(lambda: update(k8s, namespace, stored_job, case.apply))
    for words in case.expected:
        assert words in message, f"{words!r} not in the API server's message: {message}"


def _run_policy_and_restarts(job: Obj) -> Obj:
    spec = job["spec"]
    spec["runPolicy"].update(suspend=True, ttlSecondsAfterFinished=600, activeDeadlineSeconds=3600)
    spec["failurePolicy"].update(maxRestarts=9, permanentExitCodes=[2])
    return job


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


def _resized(job: Obj) -> Obj:
    spec = job["spec"]
    spec["ps"]["replicas"], spec["worker"]["replicas"] = 3, 1
    spec["ps"]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"memory": "8Gi", "cpu": "2"},
        "limits": {"memory": "12Gi"},
    }
    return job


def test_the_replicas_and_the_ps_containers_resources_can_change(
    k8s: client.ApiClient, namespace: str, stored_job: str
) -> None:
    """A resize (policies/resize.py): through the transition rules inside the PS template."""
    spec = update(k8s, namespace, stored_job, _resized)["spec"]
    assert (spec["ps"]["replicas"], spec["worker"]["replicas"]) == (3, 1)
    resources = spec["ps"]["template"]["spec"]["containers"][0]["resources"]
    assert resources == {"requests": {"memory": "8Gi", "cpu": "2"}, "limits": {"memory": "12Gi"}}


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
    assert "gs:// or s3:// URI" in checkpoint
    resources = wait_for(
        lambda: explain("psjob.spec.worker.template.spec.containers.resources"), timeout=30, message="explain"
    )
    assert "limits" in resources
