"""Kueue on real kubelets, as the operator will use it: installed with its own chart, its webhooks
and visibility API served by its pod in-cluster, a Workload made by hand (as the operator will make
one per job, kueue.x-k8s.io/v1beta2) admitted within a ClusterQueue's quota, one beyond what is
left waiting with Kueue's reason, and one of a higher WorkloadPriorityClass preempting a lower."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client

from e2e.real.kueue import (
    NAMESPACE,
    SERVICE_ACCOUNT,
    KueueObjects,
    cluster_queue,
    local_queue,
    opt_in,
    quota_released,
    resource_flavor,
    workload,
    workload_priority_class,
)
from e2e.util import holds_for, wait_for

# Two workloads of 600m each do not fit in one CPU.
CPU_QUOTA, MEMORY_QUOTA = "1", "1Gi"
REQUESTS = {"cpu": "600m", "memory": "256Mi"}


def _queue(objects: KueueObjects, namespace: str) -> str:
    """A flavor, a ClusterQueue with its quota and a LocalQueue, all named after the test's
    namespace (the first two are cluster-scoped); once the ClusterQueue is Active."""
    name = namespace
    objects.create(resource_flavor(name))
    objects.create(cluster_queue(name, name, CPU_QUOTA, MEMORY_QUOTA))
    objects.create(local_queue(namespace, name, name))
    wait_for(
        lambda: (objects.condition("ClusterQueue", name, None, "Active") or {}).get("status") == "True",
        timeout=30,
        message=lambda: f"ClusterQueue {name} Active: {objects.get('ClusterQueue', name).get('status')}",
    )
    return name


def _condition(
    objects: KueueObjects, namespace: str, name: str, type_: str, status: str
) -> dict[str, Any] | None:
    found = objects.condition("Workload", name, namespace, type_)
    return found if found is not None and found["status"] == status else None


def _wait_condition(
    objects: KueueObjects, namespace: str, name: str, type_: str, status: str
) -> dict[str, Any]:
    """The Workload's condition `type_` once it has `status`."""
    return wait_for(
        lambda: _condition(objects, namespace, name, type_, status),
        timeout=60,
        message=lambda: f"{name} {type_}={status}: {objects.get('Workload', name, namespace).get('status')}",
    )


def test_a_workload_within_the_quota_is_admitted_and_one_beyond_it_waits(
    kubeconfig: Path, kueue_objects: KueueObjects, namespace: str
) -> None:
    opt_in(kubeconfig, namespace)
    queue = _queue(kueue_objects, namespace)

    kueue_objects.create(workload(namespace, "fits", queue, REQUESTS))
    _wait_condition(kueue_objects, namespace, "fits", "QuotaReserved", "True")
    _wait_condition(kueue_objects, namespace, "fits", "Admitted", "True")
    admission = kueue_objects.get("Workload", "fits", namespace)["status"]["admission"]
    assert admission["clusterQueue"] == queue, admission
    [assignment] = admission["podSetAssignments"]
    assert assignment["name"] == "main" and assignment["count"] == 1, assignment
    assert assignment["flavors"] == {"cpu": queue, "memory": queue}, assignment

    kueue_objects.create(workload(namespace, "beyond", queue, REQUESTS))
    pending = _wait_condition(kueue_objects, namespace, "beyond", "QuotaReserved", "False")
    assert pending["reason"] == "Pending", pending
    assert "insufficient unused quota for cpu" in pending["message"], pending
    holds_for(
        lambda: _condition(kueue_objects, namespace, "beyond", "QuotaReserved", "True") is None,
        duration=5,
        message="the workload beyond the quota stays unadmitted",
    )


def test_a_higher_priority_workload_preempts_a_lower_one_whose_controller_gives_its_quota_back(
    kubeconfig: Path, kueue_objects: KueueObjects, namespace: str
) -> None:
    """withinClusterQueue: LowerPriority. Kueue marks the lower one Evicted (Preempted) but keeps
    its quota reserved until its controller (here the test, as the operator will) has stopped its
    pods and released it."""
    opt_in(kubeconfig, namespace)
    queue = _queue(kueue_objects, namespace)
    low, high = (f"{namespace}-low", 100), (f"{namespace}-high", 1000)
    for priority_class in (low, high):
        kueue_objects.create(workload_priority_class(*priority_class))
    kueue_objects.create(workload(namespace, "low", queue, REQUESTS, priority_class=low))
    _wait_condition(kueue_objects, namespace, "low", "Admitted", "True")

    kueue_objects.create(workload(namespace, "high", queue, REQUESTS, priority_class=high))
    evicted = _wait_condition(kueue_objects, namespace, "low", "Evicted", "True")
    assert evicted["reason"] == "Preempted", evicted
    preempted = _wait_condition(kueue_objects, namespace, "low", "Preempted", "True")
    assert preempted["reason"] == "InClusterQueue", preempted
    holds_for(
        lambda: _condition(kueue_objects, namespace, "high", "QuotaReserved", "True") is None,
        duration=3,
        message="the higher one waits while the evicted one holds its quota",
    )

    evicted_low = kueue_objects.get("Workload", "low", namespace)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    kueue_objects.patch_status("Workload", "low", namespace, quota_released(evicted_low, now))
    _wait_condition(kueue_objects, namespace, "high", "Admitted", "True")
    pending = _wait_condition(kueue_objects, namespace, "low", "QuotaReserved", "False")
    assert "insufficient unused quota for cpu" in pending["message"], pending


def test_kueue_may_read_pstrainingjobs_and_nothing_more_of_them(kueue: str, k8s: client.ApiClient) -> None:
    """Its external framework: Kueue reads the jobs that own Workloads; it changes none of them
    (the operator suspends and resumes its own)."""
    user = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"

    def allowed(verb: str) -> bool:
        review = client.V1SubjectAccessReview(
            spec=client.V1SubjectAccessReviewSpec(
                user=user,
                groups=[
                    "system:serviceaccounts",
                    f"system:serviceaccounts:{NAMESPACE}",
                    "system:authenticated",
                ],
                resource_attributes=client.V1ResourceAttributes(
                    group="psoperator.io", resource="pstrainingjobs", verb=verb
                ),
            )
        )
        status = client.AuthorizationV1Api(k8s).create_subject_access_review(review).status
        return status is not None and bool(status.allowed)

    granted = [verb for verb in ("get", "list", "watch", "update", "patch", "delete") if allowed(verb)]
    assert granted == ["get", "list", "watch"], granted
