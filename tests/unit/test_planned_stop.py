"""Planned stops (policies/planned_stop.py): a checkpoint asked of the chief before a suspend or a
parameter server's drain, one reconcile asking and the next one acting on the answer."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from psoperator.contract import CheckpointAnswer
from psoperator.plan.draft import ReconcilePlan
from psoperator.plan.stages import plan_reconcile
from psoperator.policies.planned_stop import CheckpointAsk, CheckpointOutcome, StopCause
from tests.unit.builders import NOW, came_up, chief_job, job, observed, pod, running_cluster, tracking_of

BASE = running_cluster()
SAVED = CheckpointAnswer(checkpoint_step=340, checkpoint_path="/ckpt/ckpt-4", saved=True)
Obj = dict[str, Any]


def _running(pods: list[Obj] = BASE, **spec: Any) -> Obj:
    return {**job(**spec), "status": came_up(phase="Running", tracking=tracking_of(pods), startTime="x")}


def _reconcile(obj: Obj, pods: list[Obj], outcome: CheckpointOutcome | None = None) -> ReconcilePlan:
    return plan_reconcile(obj, observed(pods, chief_job()), None, NOW, checkpoint_outcome=outcome)


def _answered(
    plan: ReconcilePlan, status: int | None = 200, answer: CheckpointAnswer = SAVED
) -> CheckpointOutcome:
    assert plan.ask_checkpoint is not None
    return CheckpointOutcome(plan.ask_checkpoint, status, answer, NOW + timedelta(seconds=2))


def _conditions(status: Obj) -> dict[str, tuple[str, str, str]]:
    return {c["type"]: (c["status"], c["reason"], c.get("message", "")) for c in status["conditions"]}


def test_a_suspend_first_asks_the_running_chief_for_a_checkpoint_and_stops_nothing_meanwhile() -> None:
    plan = _reconcile(
        _running(runPolicy={"suspend": True}, failurePolicy={"checkpointBeforeStopSeconds": 90}), BASE
    )
    ask = plan.ask_checkpoint
    assert ask is not None and ask.cause is StopCause.SUSPEND
    assert (ask.chief_ip, ask.deadline_seconds, ask.hold_seconds) == ("10.0.0.1", 90.0, 90.0)
    assert plan.render is None and not plan.delete_pods  # nothing is changed or deleted yet
    assert plan.status["phase"] == "Running" and plan.requeue_after == 0
    assert _conditions(plan.status)["Suspended"][:2] == ("False", "Checkpointing")


def test_the_answer_lets_the_suspend_go_on_and_says_which_checkpoint_it_was_taken_after() -> None:
    obj = _running(runPolicy={"suspend": True})
    plan = _reconcile(obj, BASE, _answered(_reconcile(obj, BASE)))
    assert plan.status["phase"] == "Suspended" and plan.render is not None and plan.render.suspended
    status, reason, message = _conditions(plan.status)["Suspended"]
    assert (status, reason) == ("True", "Suspended")
    assert "after the checkpoint at step 340 (/ckpt/ckpt-4)" in message
    suspended = next(e for e in plan.events if e.reason == "Suspended")
    assert "step 340" in suspended.message
    stop = plan.status["lastPlannedStop"]
    assert stop["cause"] == "Suspend" and stop["checkpointStep"] == 340 and stop["saved"] is True
    assert stop["pods"] == ["ctr-chief-0x"]


def test_after_the_suspends_checkpoint_the_parameter_servers_stop_at_once_instead_of_draining() -> None:
    obj = _running(runPolicy={"suspend": True})
    plan = _reconcile(obj, BASE, _answered(_reconcile(obj, BASE)))
    # The chief with its own grace (Draft.stop_pods).
    chief = ("ctr-chief-0x", None)
    assert {(d.pod, d.grace_seconds) for d in plan.delete_pods} == {("ctr-ps-0", 1), ("ctr-ps-1", 1), chief}
    refused = _reconcile(obj, BASE, _answered(_reconcile(obj, BASE), 503, CheckpointAnswer(reason="PS gone")))
    # No checkpoint: they drain while the chief saves on its SIGTERM.
    assert [(d.pod, d.grace_seconds) for d in refused.delete_pods] == [chief]


def test_a_suspend_asked_for_once_is_not_asked_again_after_an_operator_restart() -> None:
    """The answer is kept in the status: a reconcile without the in-memory outcome goes on."""
    obj = _running(runPolicy={"suspend": True})
    first = _reconcile(obj, BASE, _answered(_reconcile(obj, BASE)))
    keeps = {**obj, "status": {**obj["status"], "lastPlannedStop": first.status["lastPlannedStop"]}}
    again = _reconcile(keeps, BASE)
    assert again.ask_checkpoint is None and again.status["phase"] == "Suspended"


def test_a_chief_that_cannot_save_does_not_hold_the_suspend_and_the_condition_says_why() -> None:
    obj = _running(runPolicy={"suspend": True})
    refused = CheckpointAnswer(reason="ps-1 does not answer")
    plan = _reconcile(obj, BASE, _answered(_reconcile(obj, BASE), 503, refused))
    assert plan.status["phase"] == "Suspended"
    assert "without a new checkpoint (ps-1 does not answer)" in _conditions(plan.status)["Suspended"][2]
    stop = plan.status["lastPlannedStop"]
    assert stop["reason"] == "ps-1 does not answer" and "checkpointStep" not in stop


def test_a_suspend_without_a_running_chief_or_with_asking_off_stops_at_once() -> None:
    no_chief = [p for p in BASE if p["metadata"]["labels"]["psoperator.io/role"] != "chief"]
    for obj, pods in (
        (_running(runPolicy={"suspend": True}), no_chief),
        (_running(runPolicy={"suspend": True}, failurePolicy={"checkpointBeforeStopSeconds": 0}), BASE),
    ):
        plan = _reconcile(obj, pods)
        assert plan.ask_checkpoint is None and plan.status["phase"] == "Suspended"


def test_a_suspended_job_keeps_the_message_of_its_suspension() -> None:
    obj = _running(runPolicy={"suspend": True})
    suspended = _reconcile(obj, BASE, _answered(_reconcile(obj, BASE)))
    later = _reconcile({**obj, "status": suspended.status}, [])
    assert later.ask_checkpoint is None
    assert _conditions(later.status)["Suspended"] == _conditions(suspended.status)["Suspended"]
    assert "Suspended" not in [e.reason for e in later.events]


def _draining(index: int = 1, **kind: Any) -> list[Obj]:
    """The running cluster with one parameter server being stopped (by default: deleted with grace)."""
    stopping = pod("ps", index, **(kind or {"deleting": True}))
    return [stopping if p["metadata"]["name"] == stopping["metadata"]["name"] else p for p in BASE]


def test_a_parameter_server_being_stopped_makes_the_operator_ask_for_a_checkpoint_at_once() -> None:
    for pods in (_draining(), _draining(disruption="EvictionByEvictionAPI")):
        plan = _reconcile(_running(), pods)
        ask = plan.ask_checkpoint
        assert ask is not None and ask.cause is StopCause.DRAIN and ask.pods == ("ctr-ps-1",)
        # Nothing changes until the answer: no restart for the PS's loss yet.
        assert not plan.restarted and not plan.delete_pods and not plan.failures
        assert plan.requeue_after == 0


def test_the_drain_checkpoint_is_told_once_and_a_second_drained_ps_asks_again() -> None:
    obj = _running()
    pods = _draining()
    asking = _reconcile(obj, pods)
    plan = _reconcile({**obj, "status": asking.status}, pods, _answered(asking))
    assert plan.ask_checkpoint is None and plan.restarted  # then the PS's loss restarts the chief
    told = [e for e in plan.events if e.reason == "CheckpointedBeforeStop"]
    assert len(told) == 1 and "ctr-ps-1" in told[0].message and "step 340" in told[0].message
    assert plan.status["lastPlannedStop"]["cause"] == "Drain"
    recorded = {**obj, "status": {**obj["status"], "lastPlannedStop": plan.status["lastPlannedStop"]}}
    assert _reconcile(recorded, pods).ask_checkpoint is None
    both = [pod("ps", 0, deleting=True) if p["metadata"]["name"] == "ctr-ps-0" else p for p in pods]
    second = _reconcile(recorded, both).ask_checkpoint
    assert second is not None and second.pods == ("ctr-ps-0", "ctr-ps-1")


def test_no_checkpoint_before_a_drain_is_a_warning_naming_why() -> None:
    obj, pods = _running(), _draining()
    refused = CheckpointAnswer(reason="the chief is not training yet")
    plan = _reconcile(obj, pods, _answered(_reconcile(obj, pods), 503, refused))
    warned = [e for e in plan.events if e.reason == "NoCheckpointBeforeStop"]
    assert len(warned) == 1 and "not training yet" in warned[0].message


def test_stops_with_nothing_to_save_ask_nothing() -> None:
    """A worker's stop loses no state; a PS of the operator's own restart is recycled on purpose;
    a PS that already ended has nothing to serve."""
    worker = [pod("worker", 0, deleting=True) if p["metadata"]["name"] == "ctr-worker-0" else p for p in BASE]
    assert _reconcile(_running(), worker).ask_checkpoint is None
    ended = _draining(phase="Failed", deleting=True)
    assert _reconcile(_running(), ended).ask_checkpoint is None
    recycled = _running(_draining())
    recycled["status"]["tracking"]["recycling"] = {"ctr-ps-1": "ctr-ps-1-uid"}
    assert _reconcile(recycled, _draining()).ask_checkpoint is None


def test_an_answer_to_another_stop_is_not_taken_for_this_one() -> None:
    obj = _running(runPolicy={"suspend": True})
    other = CheckpointAsk(StopCause.DRAIN, ("ctr-ps-1",), ("ctr-ps-1-uid",), "c", "10.0.0.1", 60.0, 60.0)
    plan = _reconcile(obj, BASE, CheckpointOutcome(other, 200, SAVED, NOW))
    assert plan.ask_checkpoint is not None and plan.status["phase"] == "Running"


def test_after_the_drain_checkpoint_the_restart_cuts_the_drained_ps_grace_and_waits_for_it() -> None:
    """Its drain served the checkpoint; the new chief must not connect to it, nor wait out its grace."""
    pods = _draining()
    pods[2]["metadata"]["deletionGracePeriodSeconds"] = 30
    obj = _running()
    asking = _reconcile(obj, pods)
    plan = _reconcile({**obj, "status": asking.status}, pods, _answered(asking))
    assert plan.restarted and plan.hold_chief
    assert plan.status["tracking"]["recycling"] == {"ctr-ps-0": "ctr-ps-0-uid", "ctr-ps-1": "ctr-ps-1-uid"}
    assert {(d.pod, d.grace_seconds) for d in plan.delete_pods} >= {("ctr-ps-0", 1), ("ctr-ps-1", 1)}


def test_a_job_resumed_while_its_ps_still_drain_holds_its_chief_until_they_are_gone() -> None:
    """A suspension scales the PS away and each serves out its drain: a new chief created then would
    connect to a PS that is about to exit."""
    obj = _running(runPolicy={"suspend": True})
    suspended = _reconcile(obj, BASE, _answered(_reconcile(obj, BASE)))
    draining = [pod("ps", 0, deleting=True), pod("ps", 1, deleting=True)]
    resumed = {**job(), "status": suspended.status}
    plan = plan_reconcile(resumed, observed(draining), None, NOW)
    assert plan.hold_chief and plan.requeue_after is not None and plan.requeue_after <= 0.5
    assert not plan_reconcile(resumed, observed([]), None, NOW).hold_chief
