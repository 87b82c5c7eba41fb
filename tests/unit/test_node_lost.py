"""Pods on a node that stopped reporting: replaced only once the node is fenced (out of service, or
deleted); until then the job waits, saying why in its NodeLost condition."""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

from psoperator.api.models import PSTrainingJobSpec
from psoperator.observe.views import TAINT_OUT_OF_SERVICE, NodeView, Observed, parse_node
from psoperator.plan.stages import plan_reconcile
from psoperator.policies import node_lost
from psoperator.timeutil import format_time
from tests.unit.builders import NOW, chief_job, job, observed, pod, running_cluster, tracking_of, with_status

Obj = dict[str, Any]
BASE = running_cluster()
SPEC = PSTrainingJobSpec.model_validate(job()["spec"])


def _node(ready: str, seconds_ago: float, *, out_of_service: bool = False, name: str = "node-1") -> NodeView:
    since = format_time(NOW - timedelta(seconds=seconds_ago))
    taints = [{"key": TAINT_OUT_OF_SERVICE, "value": "nodeshutdown", "effect": "NoExecute"}]
    return parse_node({
        "metadata": {"name": name},
        "spec": {"taints": taints if out_of_service else []},
        "status": {"conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": since}]},
    })  # fmt: skip


def _on(nodes: dict[str, NodeView | None], seen: Observed) -> Observed:
    return Observed(seen.pods, seen.chief_job, seen.children, seen.departed, nodes=nodes)


def _unreachable(seen: Observed, seconds_ago: float, *, out_of_service: bool = False) -> Observed:
    return _on({"node-1": _node("Unknown", seconds_ago, out_of_service=out_of_service)}, seen)


def _ps_alone_on_node_1() -> list[Obj]:
    """The job's pods on node-2, but for ps-1 on node-1."""
    pods = copy.deepcopy(BASE)
    for p in pods:
        p["spec"]["nodeName"] = "node-1" if p["metadata"]["name"] == "ctr-ps-1" else "node-2"
    return pods


def _running() -> Obj:
    return with_status(job(), phase="Running", tracking=tracking_of(BASE))


def test_the_nodes_of_pods_that_have_not_ended_are_looked_at_ready_or_not() -> None:
    """A lost node's pods may still show Ready (nothing updates them): readiness is no filter."""
    assert node_lost.nodes_of(observed(BASE)) == {"node-1"}
    ended = [pod(role, i, phase="Succeeded") for role, i in (("chief", 0), ("ps", 0), ("ps", 1))]
    assert node_lost.nodes_of(observed(ended)) == set()


def test_a_node_tainted_out_of_service_is_read_from_its_taints() -> None:
    assert _node("Unknown", 5, out_of_service=True).out_of_service
    assert not _node("Unknown", 5).out_of_service


def test_pods_of_an_unfenced_lost_node_are_stranded_after_the_timeout_never_deleted() -> None:
    early = node_lost.lost_pods(SPEC, _unreachable(observed(BASE), 100), NOW)
    assert (early.fenced, early.stranded, early.due) == ([], [], 20)
    late = node_lost.lost_pods(SPEC, _unreachable(observed(BASE), 121), NOW)
    assert late.fenced == [] and late.due is None
    assert [(s.node.name, len(s.pods)) for s in late.stranded] == [("node-1", len(BASE))]
    ready = _on({"node-1": _node("True", 500)}, observed(BASE))
    assert node_lost.lost_pods(SPEC, ready, NOW) == node_lost.NodeLoss([], [], None)


def test_pods_of_a_fenced_node_are_force_deleted_at_once() -> None:
    """A Node deleted, or not Ready and tainted out of service (as the pod garbage collector reads it),
    runs none of its pods any more: no need to wait for the timeout."""
    gone = node_lost.lost_pods(SPEC, _on({"node-1": None}, observed(BASE)), NOW)
    assert len(gone.fenced) == len(BASE) and gone.stranded == []
    tainted = node_lost.lost_pods(SPEC, _unreachable(observed(BASE), 3, out_of_service=True), NOW)
    assert len(tainted.fenced) == len(BASE) and tainted.stranded == []
    assert all("out of service" in (p.node_lost or "") for p in tainted.fenced)


def test_a_ready_node_tainted_out_of_service_is_left_to_kubernetes() -> None:
    """Its kubelet runs: the taint's NoExecute evicts the pods gracefully, and they go for real."""
    ready = _on({"node-1": _node("True", 500, out_of_service=True)}, observed(BASE))
    assert node_lost.lost_pods(SPEC, ready, NOW) == node_lost.NodeLoss([], [], None)


def test_a_ps_on_an_unreachable_node_is_not_replaced_until_it_is_fenced() -> None:
    """Never two coordinators (nor two of one PS): a node that stopped reporting may still run its
    pods. The job says so, and what an admin does; nothing is deleted and no chief restarts."""
    pods = _ps_alone_on_node_1()
    seen = _on({"node-1": _node("Unknown", 130), "node-2": _node("True", 900)}, observed(pods, chief_job(0)))
    plan = plan_reconcile(_running(), seen, None, NOW)
    assert plan.delete_pods == [] and not plan.restarted
    [lost] = [c for c in plan.status["conditions"] if c["type"] == "NodeLost"]
    assert (lost["status"], lost["reason"]) == ("True", "AwaitingFence")
    assert "node node-1 has been Ready=Unknown since" in lost["message"] and "ctr-ps-1 may" in lost["message"]
    assert f"taint it {TAINT_OUT_OF_SERVICE}=nodeshutdown:NoExecute" in lost["message"]
    assert [(e.type, e.reason) for e in plan.events if e.reason == "NodeLost"] == [("Warning", "NodeLost")]


def test_a_ps_on_a_fenced_node_is_force_deleted_and_the_chief_restarts_uncounted() -> None:
    pods = _ps_alone_on_node_1()
    fenced = _node("Unknown", 130, out_of_service=True)
    seen = _on({"node-1": fenced, "node-2": _node("True", 900)}, observed(pods, chief_job(0)))
    plan = plan_reconcile(_running(), seen, None, NOW)
    assert {(d.pod, d.grace_seconds) for d in plan.delete_pods} >= {("ctr-ps-1", 0)}
    assert plan.restarted and plan.status["lastFailure"]["reason"] == "NodeLost"
    assert plan.status["countedRestarts"] == 0


def test_a_chief_on_an_unreachable_node_gets_no_second_attempt_until_the_node_is_fenced() -> None:
    waiting = plan_reconcile(_running(), _unreachable(observed(BASE, chief_job(0)), 600), None, NOW)
    assert not waiting.restarted and waiting.delete_pods == []
    fenced = _unreachable(observed(BASE, chief_job(0)), 600, out_of_service=True)
    plan = plan_reconcile(_running(), fenced, None, NOW)
    assert plan.restarted and plan.status["lastFailure"]["reason"] == "NodeLost"
    assert ("ctr-chief-0x", 0) in {(d.pod, d.grace_seconds) for d in plan.delete_pods}


def test_a_restart_waits_for_an_old_chief_stranded_on_an_unreachable_node() -> None:
    """Restarted for another cause (here: attempt 1 is due), the new chief Job is not created while
    the old chief's pod is still there: it may still run."""
    restarting = with_status(job(), phase="Restarting", restarts=1, tracking=tracking_of(BASE))
    plan = plan_reconcile(restarting, _unreachable(observed(BASE), 600), None, NOW)
    assert plan.hold_chief and plan.awaits_departure


def test_the_condition_turns_false_once_no_pod_is_stranded() -> None:
    stranded = plan_reconcile(_running(), _unreachable(observed(BASE, chief_job(0)), 130), None, NOW)
    told = with_status(job(), **stranded.status)
    ready = _on({"node-1": _node("True", 1)}, observed(BASE, chief_job(0)))
    plan = plan_reconcile(told, ready, None, NOW)
    [lost] = [c for c in plan.status["conditions"] if c["type"] == "NodeLost"]
    assert (lost["status"], lost["reason"]) == ("False", "NoPodStranded")
    never = plan_reconcile(_running(), ready, None, NOW)
    assert not [c for c in never.status["conditions"] if c["type"] == "NodeLost"]


def test_before_the_timeout_the_operator_only_looks_again_when_it_is_due() -> None:
    plan = plan_reconcile(_running(), _unreachable(observed(BASE, chief_job(0)), 100), None, NOW)
    assert not plan.restarted and plan.delete_pods == [] and plan.requeue_after == 20
    assert not [c for c in plan.status["conditions"] if c["type"] == "NodeLost"]


def test_the_timeout_is_configurable() -> None:
    spec = PSTrainingJobSpec.model_validate(job(failurePolicy={"nodeLostTimeoutSeconds": 30})["spec"])
    assert node_lost.lost_pods(spec, _unreachable(observed(BASE), 31), NOW).stranded
