"""plan_children's isolation: a job's NetworkPolicies first, and nothing that makes pods while one of
them cannot exist; what already runs goes on."""

from __future__ import annotations

import copy
from typing import Any

from psoperator.plan.children import ChildChange, ChildVerb, plan_children
from psoperator.render import render_children
from tests.unit.builders import job

Obj = dict[str, Any]
OWNER = "job-uid"


def _live(manifests: list[Obj]) -> list[Obj]:
    live = copy.deepcopy(manifests)
    for obj in live:
        obj["metadata"]["uid"] = f"{obj['kind']}-{obj['metadata']['name']}-uid"
    return live


def _taken(live: list[Obj], name: str) -> list[Obj]:
    """`live` with the policy `name` replaced by another owner's object of that name."""
    theirs = {
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "uid": "theirs", "ownerReferences": [{"uid": "someone-else"}]},
    }
    return [o for o in live if o["metadata"]["name"] != name] + [theirs]


def _made(changes: list[ChildChange]) -> list[tuple[str, str, str]]:
    return [(c.manifest["kind"], c.manifest["metadata"]["name"], c.verb.value) for c in changes]


def test_a_new_jobs_network_policies_come_before_everything_that_makes_pods() -> None:
    changes, _ = plan_children(OWNER, render_children(job(), operator_namespace="ops"), [])
    kinds = [c.manifest["kind"] for c in changes]
    assert kinds[:2] == ["NetworkPolicy", "NetworkPolicy"] and "NetworkPolicy" not in kinds[2:]
    assert all(c.isolates for c in changes[:2])
    makers = {(kind, name) for kind, name, _ in _made([c for c in changes if c.makes_pods])}
    assert makers == {("StatefulSet", "ctr-ps"), ("StatefulSet", "ctr-worker"), ("Job", "ctr-chief")}


def test_while_another_owners_object_has_a_policys_name_no_pod_is_made() -> None:
    changes, conflicts = plan_children(OWNER, render_children(job()), _taken([], "ctr-peers"))
    assert conflicts == ["NetworkPolicy/ctr-peers"]
    assert {kind for kind, _, _ in _made(changes)} == {"Service"}


def test_a_running_job_whose_policy_is_taken_keeps_its_pods_but_gets_no_new_ones() -> None:
    """A restart's old chief Job goes, its successor waits; more workers wait; the PS get their new
    TF_CONFIG (OnDelete: for their next pods), nothing is scaled down."""
    live = _taken(_live(render_children(job())), "ctr-peers")
    wanted = render_children(job(worker={"replicas": 4}), attempt=1)
    changes, _ = plan_children(OWNER, wanted, live)
    assert _made(changes) == [("StatefulSet", "ctr-ps", "patch"), ("Job", "ctr-chief", "delete-replaced")]


def test_a_job_whose_policy_is_taken_may_still_stop_its_pods() -> None:
    """A suspension scales the StatefulSets down: that makes no pod."""
    live = _taken(_live(render_children(job(evaluator={"template": {}}))), "ctr-peers")
    suspended = render_children(job(evaluator={"template": {}}), suspended=True)
    changes, _ = plan_children(OWNER, suspended, live)
    assert ("StatefulSet", "ctr-worker", "patch") in _made(changes)
    assert ("Job", "ctr-evaluator", "patch") in _made(changes)  # suspended
    assert not any(c.makes_pods for c in changes)


def test_a_job_whose_policy_is_taken_resumes_no_suspended_job() -> None:
    evaluator = job(evaluator={"template": {}})
    live = _taken(_live(render_children(evaluator, suspended=True)), "ctr-peers")
    changes, _ = plan_children(OWNER, render_children(evaluator), live)
    assert not [c for c in changes if c.manifest["kind"] in ("StatefulSet", "Job")]


def test_without_network_policies_nothing_waits_for_them() -> None:
    """spec.networkPolicy.enabled false: an object of the policy's name is nobody's business here."""
    off = job(networkPolicy={"enabled": False})
    changes, conflicts = plan_children(OWNER, render_children(off), _taken([], "ctr-peers"))
    assert conflicts == []
    assert {kind for kind, _, _ in _made(changes)} == {"Service", "StatefulSet", "Job"}
    assert all(c.verb is ChildVerb.CREATE for c in changes)
