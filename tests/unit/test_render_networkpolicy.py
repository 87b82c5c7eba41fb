"""The NetworkPolicies: which pods they isolate, and who may still connect to which port."""

from __future__ import annotations

from typing import Any

from psoperator import contract
from psoperator.render import RenderOptions, render_children
from tests.unit.builders import job

Obj = dict[str, Any]
EVALUATOR = {"template": {"spec": {"containers": [{"name": "trainer"}]}}}
OPERATOR_PODS = (("app.kubernetes.io/instance", "psop"), ("app.kubernetes.io/name", "ps-training-operator"))
OPTIONS = RenderOptions(operator_namespace="psoperator-system", operator_pod_labels=OPERATOR_PODS)


def _policies(children: list[Obj]) -> dict[str, Obj]:
    return {m["metadata"]["name"]: m for m in children if m["kind"] == "NetworkPolicy"}


def _pod_templates(children: list[Obj]) -> dict[str, Obj]:
    """Each role's pod template, by role."""
    return {
        m["spec"]["template"]["metadata"]["labels"]["psoperator.io/role"]: m["spec"]["template"]
        for m in children
        if m["kind"] in ("StatefulSet", "Job")
    }


def _selects(policy: Obj, template: Obj) -> bool:
    wanted = policy["spec"]["podSelector"]["matchLabels"].items()
    return bool(wanted <= template["metadata"]["labels"].items())


def test_every_pod_of_the_job_takes_the_grpc_port_from_the_jobs_pods_only() -> None:
    children = render_children(job(evaluator=EVALUATOR, port=5000), OPTIONS)
    peers = _policies(children)["ctr-peers"]
    templates = _pod_templates(children)
    assert sorted(templates) == ["chief", "evaluator", "ps", "worker"]
    assert all(_selects(peers, t) for t in templates.values())
    assert peers["spec"]["policyTypes"] == ["Ingress"]  # egress (storage, DNS) is left alone
    [rule] = peers["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 5000}]
    [source] = rule["from"]
    assert source == {"podSelector": {"matchLabels": {"psoperator.io/job-name": "ctr"}}}  # this namespace
    assert all(
        source["podSelector"]["matchLabels"].items() <= t["metadata"]["labels"].items()
        for t in templates.values()
    )


def test_the_chiefs_progress_port_takes_connections_from_the_operators_pods_only() -> None:
    children = render_children(job(evaluator=EVALUATOR), OPTIONS)
    progress = _policies(children)["ctr-chief-progress"]
    templates = _pod_templates(children)
    assert [role for role, t in templates.items() if _selects(progress, t)] == ["chief"]
    [rule] = progress["spec"]["ingress"]
    # One peer with both selectors: the operator's pods in its namespace, not every pod there.
    operator = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "psoperator-system"}},
        "podSelector": {"matchLabels": dict(OPERATOR_PODS)},
    }
    assert rule["from"] == [operator]
    chief = templates["chief"]["spec"]["containers"][0]
    served = {p["name"]: p["containerPort"] for p in chief["ports"]}["progress"]
    env = {e["name"]: e.get("value") for e in chief["env"]}
    assert rule["ports"] == [{"protocol": "TCP", "port": served}]
    assert env[contract.ENV_PROGRESS_PORT] == str(served)


def test_told_no_labels_of_its_pods_the_operators_whole_namespace_may_read_progress() -> None:
    options = RenderOptions(operator_namespace="psoperator-system")
    [rule] = _policies(render_children(job(), options))["ctr-chief-progress"]["spec"]["ingress"]
    assert rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "psoperator-system"}}}
    ]


def test_without_the_operators_namespace_no_namespace_may_read_progress() -> None:
    assert sorted(_policies(render_children(job()))) == ["ctr-peers"]


def test_switched_off_there_is_no_policy() -> None:
    assert _policies(render_children(job(networkPolicy={"enabled": False}), OPTIONS)) == {}


def test_policies_are_owned_and_labelled_like_every_child() -> None:
    for policy in _policies(render_children(job(), OPTIONS)).values():
        meta = policy["metadata"]
        assert meta["namespace"] == "team-a"
        assert meta["ownerReferences"][0]["uid"] == "job-uid"
        assert meta["labels"]["psoperator.io/job-name"] == "ctr"  # how the operator lists its children
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "ps-training-operator"
