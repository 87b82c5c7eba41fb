"""Kueue on real kubelets, installed with its own chart (e2e/real/kueue.py): what it may do to the
operator's jobs. What it does with them (admission, quota, preemption) is e2e/real/test_kueue.py."""

from __future__ import annotations

from kubernetes import client

from e2e.real.kueue import NAMESPACE, SERVICE_ACCOUNT


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
