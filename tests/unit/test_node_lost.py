"""A pod on a node that stopped reporting: force-deleted after failurePolicy.nodeLostTimeoutSeconds."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from psoperator.api.models import PSTrainingJobSpec
from psoperator.observe.views import NodeView, Observed, parse_node
from psoperator.plan.stages import plan_reconcile
from psoperator.policies import node_lost
from psoperator.timeutil import format_time
from tests.unit.builders import NOW, chief_job, job, observed, pod, running_cluster, tracking_of, with_status

BASE = running_cluster()


def _node(ready: str, seconds_ago: float) -> dict[str, Any]:
    since = format_time(NOW - timedelta(seconds=seconds_ago))
    return {"metadata": {"name": "node-1"}, "status": {"conditions": [
        {"type": "Ready", "status": ready, "lastTransitionTime": since}]}}  # fmt: skip


def _on(nodes: dict[str, NodeView | None], seen: Observed) -> Observed:
    return Observed(seen.pods, seen.chief_job, seen.children, seen.departed, nodes=nodes)


def _not_ready(seen: Observed, seconds_ago: float) -> Observed:
    return _on({"node-1": parse_node(_node("Unknown", seconds_ago))}, seen)


def test_the_nodes_of_pods_that_have_not_ended_are_looked_at_ready_or_not() -> None:
    """A lost node's pods may still show Ready (nothing updates them): readiness is no filter."""
    assert node_lost.nodes_of(observed(BASE)) == {"node-1"}
    ended = [pod(role, i, phase="Succeeded") for role, i in (("chief", 0), ("ps", 0), ("ps", 1))]
    assert node_lost.nodes_of(observed(ended)) == set()


def test_pods_are_lost_after_the_timeout_only() -> None:
    spec = PSTrainingJobSpec.model_validate(job()["spec"])
    early, wait = node_lost.lost_pods(spec, _not_ready(observed(BASE), 100), NOW)
    assert early == [] and wait == 20
    late, _ = node_lost.lost_pods(spec, _not_ready(observed(BASE), 121), NOW)
    assert len(late) == len(BASE)
    ready = _on({"node-1": parse_node(_node("True", 500))}, observed(BASE))
    assert node_lost.lost_pods(spec, ready, NOW) == ([], None)


def test_a_node_object_that_is_gone_loses_its_pods_at_once() -> None:
    spec = PSTrainingJobSpec.model_validate(job()["spec"])
    lost, _ = node_lost.lost_pods(spec, _on({"node-1": None}, observed(BASE)), NOW)
    assert len(lost) == len(BASE)


def test_a_ps_on_a_lost_node_is_force_deleted_and_the_chief_restarts_uncounted() -> None:
    running = with_status(job(), phase="Running", tracking=tracking_of(BASE))
    ps_only = [pod("ps", 1, ready=False) if p["metadata"]["name"] == "ctr-ps-1" else p for p in BASE]
    seen = _on({"node-1": parse_node(_node("Unknown", 130))}, observed(ps_only, chief_job(0)))
    plan = plan_reconcile(running, seen, None, NOW)
    forced = {d.pod for d in plan.delete_pods if d.grace_seconds == 0}
    assert "ctr-ps-1" in forced
    assert plan.restarted and plan.status["lastFailure"]["reason"] == "NodeLost"
    assert plan.status["countedRestarts"] == 0


def test_a_chief_on_a_lost_node_is_force_deleted_and_restarted() -> None:
    running = with_status(job(), phase="Running", tracking=tracking_of(BASE))
    plan = plan_reconcile(running, _not_ready(observed(BASE, chief_job(0)), 130), None, NOW)
    assert plan.restarted and plan.status["lastFailure"]["reason"] == "NodeLost"
    assert ("ctr-chief-0x", 0) in {(d.pod, d.grace_seconds) for d in plan.delete_pods}


def test_before_the_timeout_the_operator_only_looks_again_when_it_is_due() -> None:
    running = with_status(job(), phase="Running", tracking=tracking_of(BASE))
    plan = plan_reconcile(running, _not_ready(observed(BASE, chief_job(0)), 100), None, NOW)
    assert not plan.restarted and plan.delete_pods == [] and plan.requeue_after == 20


def test_the_timeout_is_configurable() -> None:
    spec = PSTrainingJobSpec.model_validate(job(failurePolicy={"nodeLostTimeoutSeconds": 30})["spec"])
    lost, _ = node_lost.lost_pods(spec, _not_ready(observed(BASE), 31), NOW)
    assert lost
