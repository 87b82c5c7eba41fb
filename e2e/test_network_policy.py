"""Each job's NetworkPolicies through the API server: created with the job, owned by it, restored
when deleted by hand, deleted when switched off, and garbage-collected with the job; and no pod of
the job is made while one of them cannot be (a ResourceQuota refuses it, or another owner's object
has its name): the job says why in its NetworkPolicyMissing condition.

KWOK enforces no policy (its pods are not real): that they are enforced is shown on the real-kubelet
cluster with an enforcer, in e2e/real/test_network_policy.py.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e import psjobs
from e2e.accounts import CHART_NAMESPACE
from e2e.operator_process import OperatorProcess
from e2e.util import as_json, condition, holds_for, wait_for

POLICIES = ("ctr-peers", "ctr-chief-progress")


def _policies(k8s: client.ApiClient, namespace: str) -> dict[str, dict[str, Any]]:
    listed = client.NetworkingV1Api(k8s).list_namespaced_network_policy(
        namespace, label_selector=f"{psjobs.LABEL_JOB}=ctr"
    )
    return {p["metadata"]["name"]: p for p in as_json(k8s, listed)["items"]}


# The labels the chart gives the operator's pods (its selector's), and tells the operator.
OPERATOR_PODS = {"app.kubernetes.io/name": "ps-training-operator", "app.kubernetes.io/instance": "psoperator"}


def _restart_as_in_cluster(operator: OperatorProcess) -> None:
    """Out of cluster the operator has no namespace nor pods of its own: give it the chart's, as
    in-cluster."""
    operator.stop()
    labels = ",".join(f"{name}={value}" for name, value in OPERATOR_PODS.items())
    operator.extra_args += ["--operator-namespace", CHART_NAMESPACE, "--resync-seconds", "2"]
    operator.extra_args += ["--operator-pod-labels", labels]
    operator.start()


def test_a_jobs_network_policies_live_and_die_with_it(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    _restart_as_in_cluster(operator)
    uid = psjobs.create(k8s, namespace, psjobs.manifest("ctr", port=2345))["metadata"]["uid"]

    def both() -> dict[str, dict[str, Any]] | None:
        found = _policies(k8s, namespace)
        return found if set(found) == set(POLICIES) else None

    policies = wait_for(
        both,
        timeout=30,
        message=lambda: f"the job's NetworkPolicies, got {sorted(_policies(k8s, namespace))}",
    )
    for policy in policies.values():
        [owner] = policy["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"], owner["controller"]) == ("PSTrainingJob", uid, True)
    peers, progress = policies["ctr-peers"]["spec"], policies["ctr-chief-progress"]["spec"]
    assert peers["podSelector"] == {"matchLabels": {psjobs.LABEL_JOB: "ctr"}}
    assert peers["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 2345}]
    assert progress["podSelector"]["matchLabels"] == {psjobs.LABEL_JOB: "ctr", psjobs.LABEL_ROLE: "chief"}
    [operator_pods] = progress["ingress"][0]["from"]
    assert operator_pods["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": CHART_NAMESPACE
    }
    assert operator_pods["podSelector"]["matchLabels"] == OPERATOR_PODS
    # Every pod of the job is one the peers policy selects.
    psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)
    for role in ("chief", "ps", "worker"):
        for pod in psjobs.pods(k8s, namespace, "ctr", role):
            assert pod["metadata"]["labels"][psjobs.LABEL_JOB] == "ctr"

    networking = client.NetworkingV1Api(k8s)
    old_uid = policies["ctr-peers"]["metadata"]["uid"]
    networking.delete_namespaced_network_policy("ctr-peers", namespace)
    wait_for(
        lambda: (
            _policies(k8s, namespace).get("ctr-peers", {}).get("metadata", {}).get("uid")
            not in (None, old_uid)
        ),
        timeout=30,
        message="ctr-peers recreated after a deletion by hand",
    )

    psjobs.patch_spec(k8s, namespace, "ctr", {"networkPolicy": {"enabled": False}})
    wait_for(
        lambda: not _policies(k8s, namespace), timeout=30, message="the policies deleted when switched off"
    )
    psjobs.patch_spec(k8s, namespace, "ctr", {"networkPolicy": {"enabled": True}})
    wait_for(lambda: set(_policies(k8s, namespace)) == set(POLICIES), timeout=30, message="switched on again")

    client.CustomObjectsApi(k8s).delete_namespaced_custom_object(
        psjobs.GROUP, psjobs.VERSION, namespace, psjobs.PLURAL, "ctr"
    )
    wait_for(lambda: not _policies(k8s, namespace), timeout=60, message="the policies garbage-collected")


def _made_pods(k8s: client.ApiClient, namespace: str) -> list[str]:
    """The job's StatefulSets, Jobs and pods, as "Kind/name"."""
    selector = f"{psjobs.LABEL_JOB}=ctr"
    listings = {
        "StatefulSet": client.AppsV1Api(k8s).list_namespaced_stateful_set,
        "Job": client.BatchV1Api(k8s).list_namespaced_job,
        "Pod": client.CoreV1Api(k8s).list_namespaced_pod,
    }
    return [
        f"{kind}/{obj['metadata']['name']}"
        for kind, listing in listings.items()
        for obj in as_json(k8s, listing(namespace, label_selector=selector))["items"]
    ]


def _missing_policy(k8s: client.ApiClient, namespace: str) -> dict[str, Any] | None:
    found = condition(psjobs.status(k8s, namespace, "ctr"), "NetworkPolicyMissing")
    return found if found is not None and found["status"] == "True" else None


def _services(k8s: client.ApiClient, namespace: str) -> set[str]:
    selector = f"{psjobs.LABEL_JOB}=ctr"
    listed = client.CoreV1Api(k8s).list_namespaced_service(namespace, label_selector=selector)
    return {s["metadata"]["name"] for s in as_json(k8s, listed)["items"]}


def test_a_job_whose_network_policy_a_quota_refuses_makes_no_pod_until_it_can(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """Fail closed: the pods would run unisolated. Once the quota allows it (and the job is read
    again: here the operator's restart), the policy comes first, then the pods."""
    core = client.CoreV1Api(k8s)
    hard = {"count/networkpolicies.networking.k8s.io": "0"}
    quota = client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="no-policies"), spec=client.V1ResourceQuotaSpec(hard=hard)
    )
    core.create_namespaced_resource_quota(namespace, quota)
    wait_for(
        lambda: core.read_namespaced_resource_quota("no-policies", namespace).status or {},
        timeout=30,
        message="the quota controller counts the namespace",
    )
    psjobs.create(k8s, namespace, psjobs.manifest("ctr"))
    missing = wait_for(
        lambda: _missing_policy(k8s, namespace),
        timeout=30,
        message=lambda: f"NetworkPolicyMissing; status {psjobs.status(k8s, namespace, 'ctr')}",
    )
    assert missing["reason"] == "NetworkPolicyRefused"
    assert "NetworkPolicy/ctr-peers" in missing["message"] and "exceeded quota" in missing["message"]
    assert _services(k8s, namespace) == {"ctr-chief", "ctr-ps", "ctr-worker"}
    holds_for(
        lambda: not _made_pods(k8s, namespace),
        duration=5,
        message=lambda: f"the job made {_made_pods(k8s, namespace)} without its NetworkPolicy",
    )
    reasons = {e.reason for e in psjobs.events(k8s, namespace, "ctr") if e.type == "Warning"}
    assert {"ChildRejected", "NetworkPolicyMissing"} <= reasons
    assert psjobs.status(k8s, namespace, "ctr").get("phase") != "Running"

    core.delete_namespaced_resource_quota("no-policies", namespace)
    operator.stop()
    operator.start()
    psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)
    assert set(_policies(k8s, namespace)) == {"ctr-peers"}
    wait_for(
        lambda: (
            (condition(psjobs.status(k8s, namespace, "ctr"), "NetworkPolicyMissing") or {}).get("reason")
            == "NetworkPoliciesCreated"
        ),
        timeout=30,
        message=lambda: f"NetworkPolicyMissing cleared; status {psjobs.status(k8s, namespace, 'ctr')}",
    )


def test_a_policy_of_the_same_name_it_does_not_own_is_left_alone_and_no_pod_is_made(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    theirs = client.V1NetworkPolicy(
        metadata=client.V1ObjectMeta(name="ctr-peers", labels={"team": "someone-else"}),
        spec=client.V1NetworkPolicySpec(pod_selector=client.V1LabelSelector(), policy_types=["Ingress"]),
    )
    client.NetworkingV1Api(k8s).create_namespaced_network_policy(namespace, theirs)
    psjobs.create(k8s, namespace, psjobs.manifest("ctr"))
    missing = wait_for(lambda: _missing_policy(k8s, namespace), timeout=30, message="NetworkPolicyMissing")
    assert "NetworkPolicy/ctr-peers exists and is not owned by this job" in missing["message"]
    events = client.CoreV1Api(k8s).list_namespaced_event(namespace, field_selector="involvedObject.name=ctr")
    assert any(
        e.reason == "NameConflict" and "NetworkPolicy/ctr-peers" in (e.message or "") for e in events.items
    )
    holds_for(
        lambda: not _made_pods(k8s, namespace),
        duration=5,
        message=lambda: f"the job made {_made_pods(k8s, namespace)} beside another owner's policy",
    )
    try:
        kept = as_json(
            k8s, client.NetworkingV1Api(k8s).read_namespaced_network_policy("ctr-peers", namespace)
        )
    except ApiException as error:  # pragma: no cover - the assertion message is the point
        raise AssertionError(f"the operator deleted a policy it does not own: {error}") from error
    assert (
        kept["metadata"]["labels"] == {"team": "someone-else"} and "ownerReferences" not in kept["metadata"]
    )
