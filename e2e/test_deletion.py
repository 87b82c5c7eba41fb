"""Deleting a job needs no running operator: no finalizer holds it, its children go with it."""

from __future__ import annotations

from kubernetes import client

from e2e import psjobs
from e2e.operator_process import OperatorProcess
from e2e.test_operator import _children
from e2e.util import wait_for

OLD_FINALIZER = f"{psjobs.GROUP}/finalizer"


def test_a_job_is_deleted_with_its_children_while_the_operator_is_stopped(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    psjobs.create(k8s, namespace, psjobs.manifest("ctr"))
    psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)
    job = psjobs.get(k8s, namespace, "ctr")
    assert job is not None and not job["metadata"].get("finalizers")
    operator.stop()
    client.CustomObjectsApi(k8s).delete_namespaced_custom_object(
        psjobs.GROUP, psjobs.VERSION, namespace, psjobs.PLURAL, "ctr"
    )
    wait_for(lambda: psjobs.get(k8s, namespace, "ctr") is None, timeout=30, message="the job deleted")
    wait_for(
        lambda: not _children(k8s, namespace, "ctr"),
        timeout=60,
        message=lambda: f"children garbage-collected, left: {_children(k8s, namespace, 'ctr')}",
    )


def test_the_finalizer_of_an_older_version_is_removed(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """A job left by a version that ran kopf daemons carries its finalizer: the operator takes it off."""
    body = psjobs.manifest("ctr")
    body["metadata"]["finalizers"] = [OLD_FINALIZER]
    psjobs.create(k8s, namespace, body)

    def finalizers() -> list[str]:
        job = psjobs.get(k8s, namespace, "ctr") or {}
        return list(job.get("metadata", {}).get("finalizers") or [])

    wait_for(
        lambda: OLD_FINALIZER not in finalizers(), timeout=30, message=lambda: f"finalizers {finalizers()}"
    )
    psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)
