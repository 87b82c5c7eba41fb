"""Deleting a job needs no running operator: no finalizer holds it, its children go with it."""

from __future__ import annotations

from kubernetes import client

from e2e import psjobs
from e2e.operator_process import OperatorProcess
from e2e.test_operator import _children
from e2e.util import as_json, condition, holds_for, wait_for

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


def test_a_job_made_again_under_its_name_waits_for_the_earlier_jobs_pods(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """A job deleted and made again under its name while the earlier one's parameter servers and
    workers are still there (here: deleted with --cascade=orphan, its chief Job removed by hand;
    on a real cluster: a parameter server serving out its drain). They answer at the new job's
    addresses: its chief Job waits, the job saying why, until they are gone. Without NetworkPolicies,
    whose names, taken too, would hold every pod back for a reason of their own."""
    batch, body = client.BatchV1Api(k8s), psjobs.manifest("ctr", networkPolicy={"enabled": False})
    psjobs.create(k8s, namespace, body)
    psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)
    client.CustomObjectsApi(k8s).delete_namespaced_custom_object(
        psjobs.GROUP, psjobs.VERSION, namespace, psjobs.PLURAL, "ctr", propagation_policy="Orphan"
    )
    wait_for(lambda: psjobs.get(k8s, namespace, "ctr") is None, timeout=30, message="the job deleted")
    batch.delete_namespaced_job("ctr-chief", namespace, propagation_policy="Foreground")
    wait_for(
        lambda: (
            not psjobs.pods(k8s, namespace, "ctr", "chief")
            and ("Job", "ctr-chief") not in _children(k8s, namespace, "ctr")
        ),
        timeout=30,
        message="the earlier chief Job and its pod gone",
    )
    psjobs.create(k8s, namespace, body)

    def waiting() -> dict[str, str] | None:
        created = condition(psjobs.status(k8s, namespace, "ctr"), "Created")
        return created if created and created["reason"] == "FormerPodsRemain" else None

    told = lambda: f"the wait, told: {psjobs.told(k8s, namespace, 'ctr')}"  # noqa: E731
    said = wait_for(waiting, timeout=30, message=told)
    assert said["status"] == "False" and "ctr-ps-0, ctr-ps-1, ctr-worker-0" in said["message"], said
    holds_for(
        lambda: ("Job", "ctr-chief") not in _children(k8s, namespace, "ctr"),
        duration=3,
        message="no chief Job while the earlier job's pods are there",
    )
    _delete_orphans(k8s, namespace, "ctr")
    running = psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=60)
    assert condition(running, "Created")["reason"] == "ChildrenCreated", running  # type: ignore[index]
    assert running["restarts"] == 0, running


def _delete_orphans(api: client.ApiClient, namespace: str, name: str) -> None:
    """Delete the StatefulSets, Services and NetworkPolicies with the job's labels that no job owns."""
    selector = f"{psjobs.LABEL_JOB}={name}"
    apps, core, net = client.AppsV1Api(api), client.CoreV1Api(api), client.NetworkingV1Api(api)
    kinds = [
        (apps.list_namespaced_stateful_set, apps.delete_namespaced_stateful_set),
        (core.list_namespaced_service, core.delete_namespaced_service),
        (net.list_namespaced_network_policy, net.delete_namespaced_network_policy),
    ]
    for listing, delete in kinds:
        for item in as_json(api, listing(namespace, label_selector=selector))["items"]:
            if not item["metadata"].get("ownerReferences"):
                delete(item["metadata"]["name"], namespace, propagation_policy="Background")
