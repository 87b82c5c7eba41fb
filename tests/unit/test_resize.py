"""Live resize (policies/resize.py): a change of spec.ps.replicas, spec.worker.replicas or the PS
containers' resources is a checkpoint, then a restart with the new shape that counts nothing."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from psoperator.api.models import PSTrainingJobSpec, Shape
from psoperator.api.shape import requested, running, with_shape
from psoperator.contract import CheckpointAnswer
from psoperator.plan.draft import ReconcilePlan
from psoperator.plan.stages import plan_reconcile
from psoperator.policies.planned_stop import CheckpointOutcome, StopCause
from psoperator.render import render_children
from tests.unit.builders import (
    NOW,
    came_up,
    chief_job,
    job,
    observed,
    pod,
    running_cluster,
    tracked_in,
    tracking_of,
)

BASE = running_cluster()
SAVED = CheckpointAnswer(checkpoint_step=340, checkpoint_path="/ckpt/ckpt-4", saved=True)
Obj = dict[str, Any]


def _shape(ps: int = 2, workers: int = 2, memory: str | None = None) -> Obj:
    """status.shape: the PS trainer container's memory limit, if any."""
    resources = {"trainer": {"limits": {"memory": memory}}} if memory else {}
    return {"ps": ps, "workers": workers, "psResources": resources}


def _running(
    ps: int = 2,
    workers: int = 2,
    shape: Obj | None = None,
    pods: list[Obj] = BASE,
    memory: str | None = None,
) -> Obj:
    """A job running with `shape` (2 PS, 2 workers) whose spec now asks for `ps` and `workers`, and
    `memory` as the PS limit."""
    status = came_up(phase="Running", tracking=tracking_of(pods), startTime="x", checkpoint={"step": 300})
    status["shape"] = shape or _shape()
    obj = job()
    obj["spec"]["ps"]["replicas"], obj["spec"]["worker"]["replicas"] = ps, workers
    if memory:
        obj["spec"]["ps"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"memory": memory}}
    return {**obj, "status": status}


def _reconcile(
    obj: Obj, pods: list[Obj] = BASE, outcome: CheckpointOutcome | None = None, **kw: Any
) -> ReconcilePlan:
    return plan_reconcile(
        obj, observed(pods, kw.get("chief", chief_job())), None, NOW, checkpoint_outcome=outcome
    )


def _answered(plan: ReconcilePlan) -> CheckpointOutcome:
    assert plan.ask_checkpoint is not None
    return CheckpointOutcome(plan.ask_checkpoint, 200, SAVED, NOW + timedelta(seconds=2))


def _statefulsets(obj: Obj, plan: ReconcilePlan) -> dict[str, Obj]:
    assert plan.render is not None
    return {c["metadata"]["name"]: c for c in render_children(obj, plan.render) if c["kind"] == "StatefulSet"}


def _statefulset_replicas(obj: Obj, plan: ReconcilePlan) -> dict[str, int]:
    return {name: s["spec"]["replicas"] for name, s in _statefulsets(obj, plan).items()}


def _ps_resources(obj: Obj, plan: ReconcilePlan) -> Obj | None:
    """The resources of the trainer container of the PS StatefulSet's pod template."""
    [trainer] = _statefulsets(obj, plan)["ctr-ps"]["spec"]["template"]["spec"]["containers"][:1]
    resources: Obj | None = trainer.get("resources")
    return resources


def test_a_job_without_a_shape_takes_the_spec_s_and_nothing_resizes() -> None:
    obj = _running()
    del obj["status"]["shape"]
    plan = _reconcile(obj)
    assert plan.status["shape"] == _shape() and not plan.restarted and plan.ask_checkpoint is None


def test_a_resize_of_a_running_job_asks_for_a_checkpoint_and_keeps_the_old_shape_meanwhile() -> None:
    obj = _running(ps=3)
    plan = _reconcile(obj)
    assert plan.ask_checkpoint is not None and plan.ask_checkpoint.cause is StopCause.RESIZE
    assert not plan.restarted and plan.status["shape"] == _shape()
    assert _statefulset_replicas(obj, plan) == {"ctr-ps": 2, "ctr-worker": 2}
    resized = next(c for c in plan.status["conditions"] if c["type"] == "Resized")
    assert (resized["status"], resized["reason"]) == ("False", "Checkpointing")


def test_after_the_checkpoint_the_resize_restarts_with_the_new_shape_and_counts_nothing() -> None:
    obj = _running(ps=3, workers=4)
    plan = _reconcile(obj, outcome=_answered(_reconcile(obj)))
    status = plan.status
    assert plan.restarted and status["restarts"] == 1 and status.get("countedRestarts", 0) == 0
    assert "lastFailure" not in status and not plan.failures
    assert status["shape"] == _shape(3, 4) and status["restartCheckpointStep"] == 300
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
    obj = _running(workers=2, shape=_shape(), pods=four)
    going = [*BASE, pod("worker", 2, deleting=True)]
    plan = _reconcile(obj, going)
    assert not plan.failures and not plan.restarted
    assert set(tracked_in(plan.status)) == {"ctr-ps-0", "ctr-ps-1", "ctr-worker-0", "ctr-worker-1"}


def test_a_resize_before_the_chief_job_exists_applies_to_the_next_attempt_at_once() -> None:
    """A suspended job resuming, or a restart waiting for its old PS: no checkpoint, no restart."""
    obj = _running(ps=3)
    plan = plan_reconcile(obj, observed([p for p in BASE if "chief" not in p["metadata"]["name"]]), None, NOW)
    assert not plan.restarted and plan.ask_checkpoint is None
    assert plan.status["shape"] == _shape(3)
    assert "Resized" in [e.reason for e in plan.events]


def test_a_resize_while_suspended_applies_at_resume() -> None:
    obj = _running(ps=3)
    obj["spec"]["runPolicy"] = {"suspend": True}
    obj["status"]["phase"] = "Suspended"
    suspended = plan_reconcile(obj, observed([]), None, NOW)
    assert suspended.status["shape"] == _shape() and not suspended.restarted
    obj["spec"]["runPolicy"] = {"suspend": False}
    resumed = plan_reconcile({**obj, "status": suspended.status}, observed([]), None, NOW)
    assert resumed.status["shape"] == _shape(3) and not resumed.restarted


def test_a_second_resize_before_the_first_restart_wins_once() -> None:
    """The spec changed again while the checkpoint was asked for: the restart takes the last shape."""
    asked = _reconcile(_running(ps=3))
    plan = _reconcile(_running(ps=4), outcome=_answered(asked))
    assert plan.restarted and plan.status["shape"] == _shape(4) and plan.status["restarts"] == 1


def test_an_undersized_shape_is_refused_when_the_model_enforces_sizing_and_the_job_runs_on() -> None:
    obj = _running(ps=1, shape=_shape(memory="8Gi"), memory="8Gi")
    obj["spec"]["model"] = {"parameters": 4_000_000_000, "enforce": True}
    plan = _reconcile(obj)
    assert not plan.restarted and plan.ask_checkpoint is None
    assert plan.status["shape"] == _shape(memory="8Gi")
    resized = next(c for c in plan.status["conditions"] if c["type"] == "Resized")
    assert (resized["status"], resized["reason"]) == ("False", "Undersized") and "1 PS" in resized["message"]
    assert [e.reason for e in plan.events].count("ResizeRefused") == 1
    again = _reconcile({**obj, "status": plan.status})
    assert "ResizeRefused" not in [e.reason for e in again.events]


# --- the PS containers' resources ---------------------------------------------------------------


def _spec(obj: Obj) -> PSTrainingJobSpec:
    return PSTrainingJobSpec.model_validate(obj["spec"])


def test_the_requested_shape_has_the_ps_containers_requests_and_limits_as_strings() -> None:
    obj = _running()
    containers = obj["spec"]["ps"]["template"]["spec"]["containers"]
    containers[0]["resources"] = {"requests": {"memory": "8Gi", "cpu": 2}, "claims": [{"name": "gpu"}]}
    containers.append({"name": "proxy"})  # sets none: not in the shape
    shape = requested(_spec(obj))
    assert shape.model_dump(by_alias=True, exclude_none=True) == {
        "ps": 2,
        "workers": 2,
        "psResources": {"trainer": {"requests": {"memory": "8Gi", "cpu": "2"}}},
    }


def test_with_shape_gives_the_ps_template_the_shape_s_resources_and_keeps_the_rest() -> None:
    obj = _running(memory="16Gi")
    obj["spec"]["ps"]["template"]["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    obj["spec"]["ps"]["template"]["spec"]["containers"][0]["args"] = ["--ps"]
    as_run = with_shape(_spec(obj), Shape.model_validate(_shape(memory="8Gi")))
    [trainer] = as_run.ps.template["spec"]["containers"]
    assert trainer == {
        "name": "trainer",
        "args": ["--ps"],
        "resources": {"claims": [{"name": "gpu"}], "limits": {"memory": "8Gi"}},
    }
    assert obj["spec"]["ps"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {
        "memory": "16Gi"
    }  # the job's spec is not changed


def test_with_shape_removes_resources_the_running_shape_did_not_have() -> None:
    as_run = with_shape(_spec(_running(memory="16Gi")), Shape.model_validate(_shape()))
    assert as_run.ps.template["spec"]["containers"] == [{"name": "trainer"}]


def test_a_shape_an_earlier_operator_wrote_takes_the_spec_s_resources() -> None:
    """Its status has no psResources: until then the PS template could not change."""
    old = Shape.model_validate({"ps": 2, "workers": 2})
    assert old.ps_resources is None
    spec = _spec(_running(memory="8Gi"))
    assert running(old, spec) == requested(spec)
    assert running(None, spec) == requested(spec)


def test_a_shape_says_the_ps_memory() -> None:
    def described(resources: Obj) -> str:
        return Shape.model_validate({"ps": 2, "workers": 3, "psResources": resources}).describe()

    assert described({}) == "2 PS, 3 workers"
    assert described({"trainer": {"limits": {"memory": "8Gi"}}}) == "2 PS (8Gi), 3 workers"
    both = {"requests": {"memory": "4Gi", "cpu": "2"}, "limits": {"memory": "8Gi", "cpu": "2"}}
    assert described({"trainer": both}) == "2 PS (4Gi/8Gi, 2 cpu), 3 workers"
    two = {"trainer": {"limits": {"memory": "8Gi"}}, "proxy": {"requests": {"cpu": "100m"}}}
    assert described(two) == "2 PS (trainer: 8Gi; proxy: 100m cpu), 3 workers"


def test_more_ps_memory_asks_for_a_checkpoint_and_the_ps_keep_the_old_memory_meanwhile() -> None:
    obj = _running(shape=_shape(memory="8Gi"), memory="16Gi")
    plan = _reconcile(obj)
    assert plan.ask_checkpoint is not None and plan.ask_checkpoint.cause is StopCause.RESIZE
    assert not plan.restarted and plan.status["shape"] == _shape(memory="8Gi")
    assert _ps_resources(obj, plan) == {"limits": {"memory": "8Gi"}}


def test_after_the_checkpoint_more_ps_memory_restarts_the_ps_with_it_and_counts_nothing() -> None:
    obj = _running(shape=_shape(memory="8Gi"), memory="16Gi")
    plan = _reconcile(obj, outcome=_answered(_reconcile(obj)))
    status = plan.status
    assert plan.restarted and status["restarts"] == 1 and status.get("countedRestarts", 0) == 0
    assert "lastFailure" not in status and not plan.failures
    assert status["shape"] == _shape(memory="16Gi")
    assert _ps_resources(obj, plan) == {"limits": {"memory": "16Gi"}}
    assert _statefulset_replicas(obj, plan) == {"ctr-ps": 2, "ctr-worker": 2}
    event = next(e for e in plan.events if e.reason == "Resized")
    assert event.message == (
        "from 2 PS (8Gi), 2 workers to 2 PS (16Gi), 2 workers, "
        "after the checkpoint at step 340 (/ckpt/ckpt-4)"
    )
    recycled = next(e for e in plan.events if e.reason == "RecyclingParameterServers")
    assert "ctr-ps-0" in recycled.message and "ctr-ps-1" in recycled.message


def test_a_job_an_earlier_operator_started_is_not_resized_by_the_upgrade() -> None:
    obj = _running(shape={"ps": 2, "workers": 2}, memory="8Gi")
    plan = _reconcile(obj)
    assert not plan.restarted and plan.ask_checkpoint is None
    assert plan.status["shape"] == _shape(memory="8Gi")
    assert "Resized" not in [e.reason for e in plan.events]


def test_less_ps_memory_than_the_model_needs_is_refused_when_sizing_is_enforced() -> None:
    obj = _running(shape=_shape(memory="64Gi"), memory="8Gi")
    obj["spec"]["model"] = {"parameters": 4_000_000_000, "enforce": True}
    plan = _reconcile(obj)
    assert not plan.restarted and plan.ask_checkpoint is None
    assert plan.status["shape"] == _shape(memory="64Gi")
    assert _ps_resources(obj, plan) == {"limits": {"memory": "64Gi"}}
    resized = next(c for c in plan.status["conditions"] if c["type"] == "Resized")
    assert (resized["status"], resized["reason"]) == ("False", "Undersized")
    assert resized["message"].startswith("not resized from 2 PS (64Gi), 2 workers to 2 PS (8Gi), 2 workers")


def test_the_sizing_warning_follows_the_resize_to_enough_ps_memory() -> None:
    """A job warned that its PS are undersized (it keeps OOMing) is given more: the warning clears."""
    obj = _running(shape=_shape(memory="8Gi"), memory="64Gi")
    obj["spec"]["model"] = {"parameters": 4_000_000_000}
    warned = {"type": "SizingWarning", "status": "True", "reason": "PSMemoryUndersized"}
    obj["status"]["conditions"].append({**warned, "message": "...", "lastTransitionTime": "x"})
    plan = _reconcile(obj, outcome=_answered(_reconcile(obj)))
    assert plan.restarted
    sizing = next(c for c in plan.status["conditions"] if c["type"] == "SizingWarning")
    assert (sizing["status"], sizing["reason"]) == ("False", "PSMemorySufficient")
    assert "SizingWarning" not in [e.reason for e in plan.events]


def test_a_resize_to_too_little_ps_memory_turns_the_sizing_warning_on() -> None:
    obj = _running(shape=_shape(memory="64Gi"), memory="8Gi")
    obj["spec"]["model"] = {"parameters": 4_000_000_000}
    plan = _reconcile(obj, outcome=_answered(_reconcile(obj)))
    assert plan.restarted
    sizing = next(c for c in plan.status["conditions"] if c["type"] == "SizingWarning")
    assert (sizing["status"], sizing["reason"]) == ("True", "PSMemoryUndersized")
    assert "SizingWarning" in [e.reason for e in plan.events]


def test_a_replica_resize_renders_the_ps_resources_as_written_so_nothing_is_patched_for_them() -> None:
    obj = _running(ps=3)
    resources = {"requests": {"cpu": 2, "memory": "8Gi"}}
    obj["spec"]["ps"]["template"]["spec"]["containers"][0]["resources"] = resources
    obj["status"]["shape"] = {
        **_shape(),
        "psResources": {"trainer": {"requests": {"cpu": "2", "memory": "8Gi"}}},
    }
    plan = _reconcile(obj)
    assert plan.ask_checkpoint is not None  # waiting: the running shape is rendered
    assert _ps_resources(obj, plan) == resources
