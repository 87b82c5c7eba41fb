"""Live resize (policies/resize.py): a change of spec.ps.replicas or spec.worker.replicas is a
checkpoint, then a restart with the new shape that counts nothing."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from psoperator.contract import CheckpointAnswer
from psoperator.plan.draft import ReconcilePlan
from psoperator.plan.stages import plan_reconcile
from psoperator.policies.planned_stop import CheckpointOutcome, StopCause
from psoperator.render import render_children
from tests.unit.builders import NOW, came_up, chief_job, job, observed, pod, running_cluster, tracking_of

BASE = running_cluster()
SAVED = CheckpointAnswer(checkpointStep=340, checkpointPath="/ckpt/ckpt-4", saved=True)
Obj = dict[str, Any]


def _running(ps: int = 2, workers: int = 2, shape: Obj | None = None, pods: list[Obj] = BASE) -> Obj:
    """A job running with `shape` (2 PS, 2 workers) whose spec now asks for `ps` and `workers`."""
    status = came_up(phase="Running", tracking=tracking_of(pods), startTime="x", checkpoint={"step": 300})
    status["shape"] = shape or {"ps": 2, "workers": 2}
    spec = job()["spec"]
    return {
        **job(ps={**spec["ps"], "replicas": ps}, worker={**spec["worker"], "replicas": workers}),
        "status": status,
    }


def _reconcile(
    obj: Obj, pods: list[Obj] = BASE, outcome: CheckpointOutcome | None = None, **kw: Any
) -> ReconcilePlan:
    return plan_reconcile(
        obj, observed(pods, kw.get("chief", chief_job())), None, NOW, checkpoint_outcome=outcome
    )


def _answered(plan: ReconcilePlan) -> CheckpointOutcome:
    assert plan.ask_checkpoint is not None
    return CheckpointOutcome(plan.ask_checkpoint, 200, SAVED, NOW + timedelta(seconds=2))


def _statefulset_replicas(obj: Obj, plan: ReconcilePlan) -> dict[str, int]:
    assert plan.render is not None
    return {
        c["metadata"]["name"]: c["spec"]["replicas"]
        for c in render_children(obj, plan.render)
        if c["kind"] == "StatefulSet"
    }


def test_a_job_without_a_shape_takes_the_spec_s_and_nothing_resizes() -> None:
    obj = _running()
    del obj["status"]["shape"]
    plan = _reconcile(obj)
    assert (
        plan.status["shape"] == {"ps": 2, "workers": 2} and not plan.restarted and plan.ask_checkpoint is None
    )


def test_a_resize_of_a_running_job_asks_for_a_checkpoint_and_keeps_the_old_shape_meanwhile() -> None:
    obj = _running(ps=3)
    plan = _reconcile(obj)
    assert plan.ask_checkpoint is not None and plan.ask_checkpoint.cause is StopCause.RESIZE
    assert not plan.restarted and plan.status["shape"] == {"ps": 2, "workers": 2}
    assert _statefulset_replicas(obj, plan) == {"ctr-ps": 2, "ctr-worker": 2}
    resized = next(c for c in plan.status["conditions"] if c["type"] == "Resized")
    assert (resized["status"], resized["reason"]) == ("False", "Checkpointing")


def test_after_the_checkpoint_the_resize_restarts_with_the_new_shape_and_counts_nothing() -> None:
    obj = _running(ps=3, workers=4)
    plan = _reconcile(obj, outcome=_answered(_reconcile(obj)))
    status = plan.status
    assert plan.restarted and status["restarts"] == 1 and status.get("countedRestarts", 0) == 0
    assert "lastFailure" not in status and not plan.failures
    assert status["shape"] == {"ps": 3, "workers": 4} and status["restartCheckpointStep"] == 300
    assert _statefulset_replicas(obj, plan) == {"ctr-ps": 3, "ctr-worker": 4}
    assert plan.render is not None and plan.render.attempt == 1
    event = next(e for e in plan.events if e.reason == "Resized")
    assert (
        event.message
        == "from 2 PS, 2 workers to 3 PS, 4 workers, after the checkpoint at step 340 (/ckpt/ckpt-4)"
    )
    assert "RecyclingParameterServers" in [e.reason for e in plan.events]
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conditions["Resized"] == ("True", "Resized") and conditions["Restarting"] == ("True", "Resized")


def test_the_new_attempt_s_tf_config_lists_the_new_cluster() -> None:
    obj = _running(ps=3)
    plan = _reconcile(obj, outcome=_answered(_reconcile(obj)))
    assert plan.render is not None
    chief = next(
        c
        for c in render_children(obj, plan.render)
        if c["kind"] == "Job" and "chief" in c["metadata"]["name"]
    )
    env = chief["spec"]["template"]["spec"]["containers"][0]["env"]
    tf_config = next(e["value"] for e in env if e["name"] == "TF_CONFIG")
    assert tf_config.count("-ps-") == 3


def test_workers_beyond_the_new_shape_going_away_are_no_failures() -> None:
    """After 4 → 2 workers, the StatefulSet removes workers 2 and 3: leftovers, not WorkerFailed."""
    four = [*BASE, pod("worker", 2), pod("worker", 3)]
    obj = _running(workers=2, shape={"ps": 2, "workers": 2}, pods=four)
    going = [*BASE, pod("worker", 2, deleting=True)]
    plan = _reconcile(obj, going)
    assert not plan.failures and not plan.restarted
    assert set(plan.status["tracking"]["pods"]) == {"ctr-ps-0", "ctr-ps-1", "ctr-worker-0", "ctr-worker-1"}


def test_a_resize_before_the_chief_job_exists_applies_to_the_next_attempt_at_once() -> None:
    """A suspended job resuming, or a restart waiting for its old PS: no checkpoint, no restart."""
    obj = _running(ps=3)
    plan = plan_reconcile(obj, observed([p for p in BASE if "chief" not in p["metadata"]["name"]]), None, NOW)
    assert not plan.restarted and plan.ask_checkpoint is None
    assert plan.status["shape"] == {"ps": 3, "workers": 2}
    assert "Resized" in [e.reason for e in plan.events]


def test_a_resize_while_suspended_applies_at_resume() -> None:
    obj = _running(ps=3)
    obj["spec"]["runPolicy"] = {"suspend": True}
    obj["status"]["phase"] = "Suspended"
    suspended = plan_reconcile(obj, observed([]), None, NOW)
    assert suspended.status["shape"] == {"ps": 2, "workers": 2} and not suspended.restarted
    obj["spec"]["runPolicy"] = {"suspend": False}
    resumed = plan_reconcile({**obj, "status": suspended.status}, observed([]), None, NOW)
    assert resumed.status["shape"] == {"ps": 3, "workers": 2} and not resumed.restarted


def test_a_second_resize_before_the_first_restart_wins_once() -> None:
    """The spec changed again while the checkpoint was asked for: the restart takes the last shape."""
    asked = _reconcile(_running(ps=3))
    plan = _reconcile(_running(ps=4), outcome=_answered(asked))
    assert plan.restarted and plan.status["shape"] == {"ps": 4, "workers": 2} and plan.status["restarts"] == 1


def test_an_undersized_shape_is_refused_when_the_model_enforces_sizing_and_the_job_runs_on() -> None:
    obj = _running(ps=1)
    obj["spec"]["model"] = {"parameters": 4_000_000_000, "enforce": True}
    obj["spec"]["ps"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"memory": "8Gi"}}
    plan = _reconcile(obj)
    assert not plan.restarted and plan.ask_checkpoint is None
    assert plan.status["shape"] == {"ps": 2, "workers": 2}
    resized = next(c for c in plan.status["conditions"] if c["type"] == "Resized")
    assert (resized["status"], resized["reason"]) == ("False", "Undersized") and "1 PS" in resized["message"]
    assert [e.reason for e in plan.events].count("ResizeRefused") == 1
    again = _reconcile({**obj, "status": plan.status})
    assert "ResizeRefused" not in [e.reason for e in again.events]
