"""One reconcile's decision end to end (plan/stages.py, plan_reconcile), without a cluster: status,
render options and events."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from psoperator.api.labels import LABEL_ATTEMPT
from psoperator.contract import CheckpointAnswer, ProgressReport
from psoperator.observe.views import Observed
from psoperator.plan.children import ChildVerb, plan_children
from psoperator.plan.draft import PodDeletion
from psoperator.plan.stages import plan_reconcile
from psoperator.policies.planned_stop import CheckpointOutcome
from psoperator.render import render_children
from psoperator.timeutil import format_time
from tests.unit.builders import (
    NOW,
    came_up,
    chief_job,
    chief_job_uid,
    job,
    observed,
    pod,
    running_cluster,
    tracked_in,
    tracking_of,
    with_status,
)

BASE = running_cluster()


def _conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status.get("conditions", [])}


def test_new_job_starts_creating_children() -> None:
    plan = plan_reconcile(job(), Observed(), None, NOW)
    assert plan.status["phase"] == "Pending"
    assert plan.render is not None and plan.render.attempt == 0 and not plan.render.suspended
    assert plan.status["startTime"] == format_time(NOW)
    assert plan.status["observedGeneration"] == 1


def test_running_job_reports_counts_and_running_condition() -> None:
    plan = plan_reconcile(with_status(job(), phase="Creating"), observed(BASE, chief_job()), None, NOW)
    assert plan.status["phase"] == "Running"
    assert plan.status["replicaStatuses"]["ps"] == {
        "desired": 2,
        "ready": 2,
        "running": 2,
        "succeeded": 0,
        "failed": 0,
        "restarts": 0,
    }
    assert (plan.status["psReady"], plan.status["workersReady"]) == ("2/2", "2/2")
    assert _conditions(plan.status)["Running"] == ("True", "AllRolesRunning")
    # The start of the story: children made, training runs, every pod runs (all at once here).
    assert [e.reason for e in plan.events] == ["Created", "Running", "AllRunning"]
    assert "a chief, 2 PS, 2 workers" in plan.events[0].message
    assert plan.status["allRunningTime"] == format_time(NOW)
    assert plan.status["tracking"]["psEstablished"] is True


def test_ps_loss_restarts_the_chief_once_and_writes_it_first() -> None:
    running = with_status(
        job(), **came_up(phase="Running", tracking=tracking_of(BASE), checkpoint={"step": 40})
    )
    lost = [
        p if p["metadata"]["name"] != "ctr-ps-1" else pod("ps", 1, uid="fresh", phase="Pending") for p in BASE
    ]
    plan = plan_reconcile(running, observed(lost, chief_job(0)), None, NOW)
    assert plan.restarted and plan.render is not None and plan.render.attempt == 1
    assert (plan.status["phase"], plan.status["restarts"], plan.status["countedRestarts"]) == (
        "Restarting",
        1,
        0,
    )
    assert plan.status["restartCheckpointStep"] == 40
    assert plan.status["lastFailure"]["role"] == "ps" and plan.status["lastFailure"]["index"] == 1
    assert _conditions(plan.status)["Restarting"] == ("True", "ParameterServerLost")
    # ps-0 served the old chief: it restarts too (ps_recycle.py); ps-1 is new already.
    assert [e.reason for e in plan.events] == ["ParameterServerLost", "RecyclingParameterServers"]
    assert plan.status["tracking"]["recycling"] == {"ctr-ps-0": "ctr-ps-0-uid"}
    assert "restarting the chief from the latest checkpoint, step 40" in plan.events[0].message

    # The next reconcile sees the status it wrote and the old chief still there: no second restart.
    again = plan_reconcile({**running, "status": plan.status}, observed(lost, chief_job(0)), None, NOW)
    assert not again.restarted and again.status["restarts"] == 1 and again.render is not None
    assert again.render.attempt == 1


def test_restarting_ends_when_the_new_chief_runs() -> None:
    status = {
        "phase": "Restarting",
        "restarts": 1,
        "tracking": {"psEstablished": False, "pods": {}},
        "conditions": [
            {
                "type": "Restarting",
                "status": "True",
                "reason": "ParameterServerLost",
                "lastTransitionTime": format_time(NOW),
            }
        ],
    }
    plan = plan_reconcile(
        with_status(job(), **status),
        observed(running_cluster(attempt=1), chief_job(1)),
        ProgressReport(state="running", step=45, resumed_from_step=40),
        NOW,
    )
    assert plan.status["phase"] == "Running"
    assert _conditions(plan.status)["Restarting"] == ("False", "Recovered")
    assert plan.status["resumedFromStep"] == 40


def _completed_chief() -> dict[str, Any]:
    report = '{"state":"succeeded","step":100,"checkpointStep":100}'
    terminated = {"exitCode": 0, "reason": "Completed", "message": report}
    return pod("chief", 0, attempt=0, phase="Succeeded", terminated=terminated)


def test_a_chief_pod_that_completed_keeps_the_job_running_until_its_job_says_so() -> None:
    plan = plan_reconcile(
        with_status(job(), **came_up(phase="Running")),
        observed([_completed_chief(), *BASE[1:]], chief_job()),  # the Job not marked Complete yet
        ProgressReport(state="succeeded", step=100, checkpoint_step=100),
        NOW,
    )
    assert plan.status["phase"] == "Running"


def test_chief_success_finishes_and_stops_the_other_roles() -> None:
    done = [_completed_chief(), *BASE[1:]]
    plan = plan_reconcile(
        with_status(job(), phase="Running", tracking=tracking_of(BASE)),
        observed(done, chief_job(complete=True)),
        ProgressReport(state="succeeded", step=100, checkpoint_step=100),
        NOW,
    )
    assert plan.status["phase"] == "Succeeded"
    assert plan.status["completionTime"] == format_time(NOW)
    # Nothing is tracked from the write that ends the job on: no later write as its pods go.
    assert plan.status["tracking"] == {"psEstablished": False, "pods": {}}
    assert plan.status["checkpoint"]["step"] == 100
    assert plan.render is not None and plan.render.stopped
    assert _conditions(plan.status)["Succeeded"] == ("True", "ChiefCompleted")
    # The parameter servers go at once: the chief that needed them is gone.
    assert plan.delete_pods == [PodDeletion(f"ctr-ps-{i}", f"ctr-ps-{i}-uid", 1, first=True) for i in (0, 1)]
    stopping = [_completed_chief(), pod("ps", 0, deleting=True), *BASE[2:]]
    later = plan_reconcile(
        {**job(), "status": plan.status}, observed(stopping, chief_job(complete=True)), None, NOW
    )
    assert later.delete_pods == [PodDeletion("ctr-ps-1", "ctr-ps-1-uid", 1, first=True)]


def test_clean_pod_policy_none_keeps_pods() -> None:
    plan = plan_reconcile(
        with_status(
            job(runPolicy={"cleanPodPolicy": "None"}),
            phase="Succeeded",
            completionTime=format_time(NOW),
            tracking=tracking_of(BASE),
        ),
        observed(BASE),
        None,
        NOW,
    )
    assert plan.render is not None and not plan.render.stopped and plan.delete_pods == []
    # A finished job's pods are no longer watched for failures.
    assert plan.status["tracking"] == {"psEstablished": False, "pods": {}}


def test_permanent_exit_code_fails_the_job_with_reason() -> None:
    failed = [
        pod(
            "chief",
            0,
            attempt=0,
            phase="Failed",
            terminated={"exitCode": 1, "reason": "Error", "message": "ZeroDivisionError"},
        ),
        *BASE[1:],
    ]
    plan = plan_reconcile(
        with_status(job(), phase="Running", tracking=tracking_of(BASE)),
        observed(failed, chief_job(failed="PodFailurePolicy")),
        None,
        NOW,
    )
    assert plan.status["phase"] == "Failed"
    assert _conditions(plan.status)["Failed"] == ("True", "PermanentExitCode")
    assert plan.status["lastFailure"]["exitCode"] == 1
    assert plan.render is not None and plan.render.stopped


def test_oom_killed_ps_carries_the_planners_suggestion() -> None:
    oom = {"exitCode": 137, "reason": "OOMKilled"}
    pods = [
        p if p["metadata"]["name"] != "ctr-ps-0" else pod("ps", 0, restarts=1, last_terminated=oom)
        for p in BASE
    ]
    plan = plan_reconcile(
        with_status(job(), phase="Running", tracking=tracking_of(BASE)),
        observed(pods, chief_job()),
        None,
        NOW,
    )
    assert plan.status["lastFailure"]["reason"] == "OOMKilled"
    assert "memory" in plan.status["lastFailure"]["message"]


def test_suspend_and_resume() -> None:
    """The suspend waits for the checkpoint asked of the running chief (test_planned_stop.py has the
    rest); the chief's answer, given to the next reconcile, lets it go on."""
    running = with_status(
        job(runPolicy={"suspend": True}), phase="Running", tracking=tracking_of(BASE), startTime="x"
    )
    asking = plan_reconcile(running, observed(BASE, chief_job()), None, NOW)
    assert asking.status["phase"] == "Running" and asking.ask_checkpoint is not None
    outcome = CheckpointOutcome(
        asking.ask_checkpoint, 200, CheckpointAnswer(checkpoint_step=340, checkpoint_path="/ckpt/c-4"), NOW
    )
    suspended = plan_reconcile(running, observed(BASE, chief_job()), None, NOW, checkpoint_outcome=outcome)
    assert suspended.status["phase"] == "Suspended"
    assert suspended.render is not None and suspended.render.suspended
    assert suspended.status["tracking"] == {"psEstablished": False, "pods": {}}
    assert "startTime" not in suspended.status
    resumed = plan_reconcile({**job(), "status": suspended.status}, observed([]), None, NOW)
    assert resumed.render is not None and not resumed.render.suspended
    assert _conditions(resumed.status)["Suspended"] == ("False", "Resumed")
    assert "Resumed" in [e.reason for e in resumed.events]


@pytest.mark.parametrize(("resumed_seconds_ago", "failed"), [(0, False), (60, True)])
def test_a_pod_the_suspension_deleted_is_no_failure_when_seen_deleted_after_the_resume(
    resumed_seconds_ago: int, failed: bool
) -> None:
    """The resume's reconcile may see a pod the suspension stopped as still running (its watch
    lags), and track it; its deletion, asked before the resume, is the suspension's doing, not a
    failure. One asked after the resume is one."""
    resumed = {
        "type": "Suspended",
        "status": "False",
        "reason": "Resumed",
        "lastTransitionTime": format_time(NOW - timedelta(seconds=resumed_seconds_ago)),
    }
    status = came_up(phase="Running", tracking=tracking_of(BASE))
    status["conditions"].append(resumed)
    sigterm = {"exitCode": 143, "reason": "Error"}
    stopped = pod("worker", 0, phase="Failed", terminated=sigterm, deleting=True)
    pods = [stopped if p["metadata"]["name"] == "ctr-worker-0" else p for p in BASE]
    plan = plan_reconcile(with_status(job(), **status), observed(pods, chief_job()), None, NOW)
    assert ("lastFailure" in plan.status) == failed, plan.status.get("lastFailure")
    assert plan.failures == ([("worker", "Error")] if failed else [])


def test_a_job_resumed_before_its_chief_pod_stopped_waits_for_it_and_restarts_nothing() -> None:
    """Suspension deleted the chief Job; its pod (same attempt) is still stopping at the resume:
    the new chief Job waits for it, and its ending is no failure."""
    suspended = plan_reconcile(
        with_status(job(runPolicy={"suspend": True}), phase="Running", tracking=tracking_of(BASE)),
        observed(BASE, chief_job(0)),
        None,
        NOW,
    )
    stopping = [pod("chief", 0, attempt=0, deleting=True)]
    resumed = plan_reconcile({**job(), "status": suspended.status}, observed(stopping), None, NOW)
    assert resumed.hold_chief and resumed.delete_pods == [] and resumed.requeue_after == 0.5
    stopped = [pod("chief", 0, attempt=0, phase="Failed", terminated={"exitCode": 143, "reason": "Error"})]
    later = plan_reconcile({**job(), "status": resumed.status}, observed(stopped), None, NOW)
    assert not later.hold_chief and not later.restarted and later.status["restarts"] == 0


def _chief_job_changes(plan: Any, live: list[dict[str, Any]]) -> list[tuple[ChildVerb, str]]:
    """What the plan's children changes do to the chief Job (its verb and attempt), `live` existing."""
    assert plan.render is not None
    desired = render_children(job(), plan.render)
    changes, _ = plan_children("job-uid", desired, live, hold_chief=plan.hold_chief)
    return [
        (c.verb, c.manifest["metadata"]["labels"][LABEL_ATTEMPT])
        for c in changes
        if c.manifest["kind"] == "Job" and c.manifest["metadata"]["name"] == "ctr-chief"
    ]


def test_a_job_resumed_while_its_deleted_chief_jobs_pod_still_runs_waits_for_it() -> None:
    """Suspension deletes the chief Job and its pod; when the pod's deletion did not happen (the
    API server restarted; the garbage collector lags after that) the pod still runs, not being
    deleted, of the attempt the resumed job runs. The new chief Job waits until it is gone, and the
    pod is deleted once its Job is known gone."""
    no_ask = {"checkpointBeforeStopSeconds": 0}  # test_suspend_and_resume has the checkpoint first
    suspending = with_status(
        job(runPolicy={"suspend": True}, failurePolicy=no_ask), phase="Running", tracking=tracking_of(BASE)
    )
    suspended = plan_reconcile(suspending, observed(BASE, chief_job(0)), None, NOW)
    ours = chief_job(0)
    ours["metadata"]["ownerReferences"] = [{"kind": "PSTrainingJob", "name": "ctr", "uid": "job-uid"}]
    assert _chief_job_changes(suspended, [ours]) == [(ChildVerb.DELETE, "0")]
    # Its pod is deleted too, with its own grace, not left to the garbage collector...
    assert suspended.delete_pods == [PodDeletion("ctr-chief-0x", "ctr-chief-0x-uid", None)]
    # ... but that deletion may fail (the API server restarts) before the job is resumed.
    left = observed([pod("chief", 0, attempt=0)])  # its Job gone; the pod neither deleted nor stopped
    resumed = plan_reconcile({**job(), "status": suspended.status}, left, None, NOW)
    assert resumed.hold_chief and resumed.awaits_departure and _chief_job_changes(resumed, []) == []
    orphan = PodDeletion("ctr-chief-0x", "ctr-chief-0x-uid", 5, orphan_of=("ctr-chief", chief_job_uid(0)))
    assert resumed.delete_pods == [orphan]
    stopping = observed([pod("chief", 0, attempt=0, deleting=True)])
    again = plan_reconcile({**job(), "status": resumed.status}, stopping, None, NOW)
    assert again.hold_chief and again.delete_pods == [] and _chief_job_changes(again, []) == []
    gone = plan_reconcile({**job(), "status": again.status}, observed([]), None, NOW)
    assert not gone.hold_chief and _chief_job_changes(gone, []) == [(ChildVerb.CREATE, "0")]
    # The new Job's pod is its chief: nothing held, nothing deleted, no restart.
    new = observed([pod("chief", 0, attempt=0, job_uid="new")], chief_job(0, uid="new"))
    resumed_chief = plan_reconcile({**job(), "status": gone.status}, new, None, NOW)
    assert not resumed_chief.hold_chief and resumed_chief.delete_pods == []
    assert resumed_chief.status["restarts"] == 0


def test_a_job_made_again_under_a_deleted_ones_name_waits_for_its_draining_pods() -> None:
    """A job deleted and made again at once: the old one's parameter servers still drain (their
    StatefulSet is gone, they answer at the new job's addresses). The new chief waits until they
    are gone, and the job says why; then the chief Job is created and the job counts as created."""
    draining = []
    for index in (0, 1):
        old = pod("ps", index, uid=f"old-ps-{index}", deleting=True)
        old["metadata"]["ownerReferences"] = [{"kind": "StatefulSet", "name": "ctr-ps", "uid": "old-sts"}]
        draining.append(old)
    children = observed([]).children  # made at the first reconcile
    first = plan_reconcile(job(), Observed(former=observed(draining).pods, children=children), None, NOW)
    assert first.hold_chief and first.awaits_departure and first.requeue_after == 0.5
    assert _chief_job_changes(first, []) == []
    said = "pods of an earlier job named ctr are still there (ctr-ps-0, ctr-ps-1)"
    assert _conditions(first.status)["Created"] == ("False", "FormerPodsRemain")
    assert [(e.reason, e.message.startswith(said)) for e in first.events] == [("FormerPodsRemain", True)]
    one_left = Observed(former=observed(draining[1:]).pods, children=children)
    again = plan_reconcile({**job(), "status": first.status}, one_left, None, NOW)
    assert again.hold_chief and again.events == []  # told once
    gone = plan_reconcile({**job(), "status": again.status}, Observed(children=children), None, NOW)
    assert not gone.hold_chief and _chief_job_changes(gone, []) == [(ChildVerb.CREATE, "0")]
    assert _conditions(gone.status)["Created"] == ("True", "ChildrenCreated")


def test_deadline_fails_the_job() -> None:
    started = format_time(NOW - timedelta(seconds=61))
    plan = plan_reconcile(
        with_status(job(runPolicy={"activeDeadlineSeconds": 60}), phase="Running", startTime=started),
        observed(BASE, chief_job()),
        None,
        NOW,
    )
    assert (plan.status["phase"], _conditions(plan.status)["Failed"][1]) == ("Failed", "DeadlineExceeded")


@pytest.mark.parametrize(("completed_after", "phase"), [(50, "Succeeded"), (70, "Failed")])
def test_a_chief_that_completed_before_the_deadline_but_is_seen_after_it_succeeded(
    completed_after: int, phase: str
) -> None:
    """The operator was down when the chief completed: first seen past activeDeadlineSeconds, the
    job succeeded if the chief Job's completionTime is within the deadline, and failed if not."""
    started = NOW - timedelta(seconds=120)
    done = chief_job(complete=True, completed=started + timedelta(seconds=completed_after))
    plan = plan_reconcile(
        with_status(
            job(runPolicy={"activeDeadlineSeconds": 60}), phase="Running", startTime=format_time(started)
        ),
        observed(BASE, done),
        None,
        NOW,
    )
    assert plan.status["phase"] == phase


def test_a_chief_pod_that_finished_before_the_deadline_is_enough_without_a_completion_time() -> None:
    started = NOW - timedelta(seconds=120)
    finished = {
        "exitCode": 0,
        "reason": "Completed",
        "finishedAt": format_time(started + timedelta(seconds=50)),
    }
    pods = [pod("chief", 0, attempt=0, phase="Succeeded", terminated=finished), *BASE[1:]]
    plan = plan_reconcile(
        with_status(
            job(runPolicy={"activeDeadlineSeconds": 60}), phase="Running", startTime=format_time(started)
        ),
        observed(pods, chief_job(complete=True)),
        None,
        NOW,
    )
    assert plan.status["phase"] == "Succeeded"


def test_deadline_schedules_the_next_reconcile() -> None:
    started = format_time(NOW - timedelta(seconds=50))
    plan = plan_reconcile(
        with_status(job(runPolicy={"activeDeadlineSeconds": 60}), phase="Running", startTime=started),
        observed(BASE, chief_job()),
        None,
        NOW,
    )
    assert plan.requeue_after == 10


def test_ttl_deletes_a_finished_job_when_due() -> None:
    finished = format_time(NOW - timedelta(seconds=30))
    early = plan_reconcile(
        with_status(
            job(runPolicy={"ttlSecondsAfterFinished": 60}), phase="Succeeded", completionTime=finished
        ),
        observed([]),
        None,
        NOW,
    )
    assert not early.delete_job and early.requeue_after == 30
    due = plan_reconcile(
        with_status(job(runPolicy={"ttlSecondsAfterFinished": 10}), phase="Failed", completionTime=finished),
        observed([]),
        None,
        NOW,
    )
    assert due.delete_job


def test_stalled_when_the_step_does_not_move() -> None:
    since = format_time(NOW - timedelta(seconds=120))
    status = {"phase": "Running", "step": 7, "stepTime": since, "tracking": tracking_of(BASE)}
    plan = plan_reconcile(
        with_status(job(failurePolicy={"stallTimeoutSeconds": 60}), **status),
        observed(BASE, chief_job()),
        ProgressReport(state="running", step=7),
        NOW,
    )
    assert _conditions(plan.status)["Stalled"] == ("True", "NoProgress")
    moving = plan_reconcile(
        with_status(job(failurePolicy={"stallTimeoutSeconds": 60}), **status),
        observed(BASE, chief_job()),
        ProgressReport(state="running", step=8),
        NOW,
    )
    assert "Stalled" not in _conditions(moving.status)


def test_invalid_spec_fails_without_children() -> None:
    plan = plan_reconcile({**job(), "spec": {"chief": {}}}, observed([]), None, NOW)
    assert plan.render is None
    assert _conditions(plan.status)["Failed"][1] == "InvalidSpec"


def test_a_field_of_a_newer_crd_is_ignored_not_a_failure() -> None:
    """CRDs are applied before the operator is upgraded: until then, fields it does not know are
    the API server's to validate, and the job runs."""
    newer = job(ps={"replicas": 2, "fieldOfANewerVersion": {"enabled": True}}, aNewerSwitch=True)
    plan = plan_reconcile(with_status(newer, phase="Creating"), observed(BASE, chief_job()), None, NOW)
    assert plan.status["phase"] == "Running" and plan.render is not None


def test_undersized_ps_with_enforce_does_not_start() -> None:
    model = {"parameters": 4_000_000_000, "optimizer": "adam", "enforce": True}
    ps = {
        "replicas": 2,
        "template": {"spec": {"containers": [{"name": "t", "resources": {"limits": {"memory": "1Gi"}}}]}},
    }
    plan = plan_reconcile(job(model=model, ps=ps), observed([]), None, NOW)
    assert plan.render is None and plan.status["phase"] == "Failed"
    assert _conditions(plan.status)["SizingWarning"][0] == "True"
    assert {"SizingWarning", "Undersized"} <= {e.reason for e in plan.events}


def test_undersized_ps_without_enforce_warns_and_starts() -> None:
    model = {"parameters": 4_000_000_000, "optimizer": "adam"}
    ps = {
        "replicas": 2,
        "template": {"spec": {"containers": [{"name": "t", "resources": {"limits": {"memory": "1Gi"}}}]}},
    }
    plan = plan_reconcile(job(model=model, ps=ps), Observed(), None, NOW)
    assert plan.render is not None and plan.status["phase"] == "Pending"
    assert _conditions(plan.status)["SizingWarning"] == ("True", "PSMemoryUndersized")


def test_garbled_progress_is_ignored() -> None:
    assert ProgressReport.parse(b"\xff not json") is None
    assert ProgressReport.parse("[1, 2]") is None
    assert ProgressReport.parse('{"step": -3}') is None
    plan = plan_reconcile(with_status(job(), phase="Running", step=5), observed(BASE, chief_job()), None, NOW)
    assert plan.status["step"] == 5


def test_a_chief_that_checkpointed_before_failing_made_progress() -> None:
    message = '{"state":"failed","step":250,"checkpointStep":200,"exitCode":138}'
    failed = [
        pod(
            "chief",
            0,
            attempt=1,
            phase="Failed",
            terminated={"exitCode": 138, "reason": "Error", "message": message},
        ),
        *BASE[1:],
    ]
    status = {
        "phase": "Running",
        "restarts": 1,
        "countedRestarts": 1,
        "restartCheckpointStep": 100,
        "checkpoint": {"step": 100},
        "tracking": tracking_of(BASE),
    }
    plan = plan_reconcile(
        with_status(job(failurePolicy={"maxRestarts": 1}), **status),
        observed(failed, chief_job(1, failed="BackoffLimitExceeded")),
        ProgressReport.parse(message),
        NOW,
    )
    assert plan.restarted
    assert (plan.status["restarts"], plan.status["countedRestarts"]) == (2, 0)
    assert plan.status["checkpoint"]["step"] == 200 and plan.status["restartCheckpointStep"] == 200


def test_every_failure_seen_is_reported_for_the_metrics() -> None:
    oom = {"exitCode": 137, "reason": "OOMKilled"}
    pods = [
        p if p["metadata"]["name"] != "ctr-ps-0" else pod("ps", 0, restarts=1, last_terminated=oom)
        for p in BASE
    ]
    pods = [p for p in pods if p["metadata"]["name"] != "ctr-worker-1"]
    plan = plan_reconcile(
        with_status(job(), phase="Running", tracking=tracking_of(BASE)),
        observed(pods, chief_job()),
        None,
        NOW,
    )
    assert sorted(plan.failures) == [("ps", "OOMKilled"), ("worker", "Deleted")]


def test_a_sidecar_restart_is_an_event_not_a_restart() -> None:
    quiet = [
        p if p["metadata"]["name"] != "ctr-ps-0" else pod("ps", 0, sidecar={"restartCount": 0}) for p in BASE
    ]
    restarted = [
        p if p["metadata"]["name"] != "ctr-ps-0" else pod("ps", 0, sidecar={"restartCount": 1}) for p in BASE
    ]
    plan = plan_reconcile(
        with_status(job(), **came_up(phase="Running", tracking=tracking_of(quiet))),
        observed(restarted, chief_job()),
        None,
        NOW,
    )
    assert not plan.restarted and plan.status["phase"] == "Running" and plan.status["restarts"] == 0
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "SidecarRestarted")]
    assert "fluent-bit" in plan.events[0].message
    assert plan.status["lastFailure"]["reason"] == "SidecarRestarted"
    assert plan.failures == [("ps", "SidecarRestarted")]


def test_a_running_job_creates_what_is_missing() -> None:
    plan = plan_reconcile(with_status(job(), phase="Running"), observed(BASE), None, NOW)
    assert plan.render is not None and plan.create_missing


def test_after_the_end_nothing_is_recreated() -> None:
    """The chief Job deleted after the job succeeded must not come back to run against stopped PS."""
    ps_and_workers = BASE[1:]
    for phase in ("Succeeded", "Failed"):
        plan = plan_reconcile(
            with_status(job(), phase=phase, completionTime=format_time(NOW)),
            observed(ps_and_workers),
            None,
            NOW,
        )
        assert plan.render is not None and plan.render.stopped  # the PS and workers are still scaled down
        assert not plan.create_missing, phase


def test_the_reconcile_that_ends_the_job_recreates_nothing_either() -> None:
    started = format_time(NOW - timedelta(seconds=120))
    plan = plan_reconcile(
        with_status(job(runPolicy={"activeDeadlineSeconds": 60}), phase="Running", startTime=started),
        observed(BASE[1:]),
        None,
        NOW,
    )
    assert plan.status["phase"] == "Failed" and not plan.create_missing


def test_a_chief_that_exits_1_because_its_ps_was_oom_killed_restarts_with_the_ps_as_the_cause() -> None:
    chief = pod("chief", 0, attempt=0, phase="Failed", terminated={"exitCode": 1, "reason": "Error"})
    oom = {"exitCode": 137, "reason": "OOMKilled"}
    pods = [chief, pod("ps", 0, restarts=1, last_terminated=oom), *BASE[2:]]
    plan = plan_reconcile(
        with_status(job(), **came_up(phase="Running", tracking=tracking_of(BASE))),
        observed(pods, chief_job(failed="PodFailurePolicy")),
        None,
        NOW,
    )
    assert plan.restarted and plan.status["phase"] == "Restarting"
    assert (plan.status["lastFailure"]["role"], plan.status["lastFailure"]["reason"]) == ("ps", "OOMKilled")
    # kubectl get -o wide's LAST FAILURE; no termination time in this pod's status: when it was seen.
    assert (plan.status["lastFailure"]["summary"], plan.status["lastFailure"]["time"]) == (
        "ps-0 OOMKilled",
        format_time(NOW),
    )
    reasons = [e.reason for e in plan.events]
    assert reasons == ["ChiefFailed", "ParameterServerLost", "RecyclingParameterServers"]
    assert sorted(plan.failures) == [("chief", "Error"), ("ps", "OOMKilled")]


def test_the_planners_figure_for_an_oom_killed_ps_reaches_the_status_and_the_event() -> None:
    model = {"parameters": 4_000_000_000, "optimizer": "adam"}
    small_ps = {
        "replicas": 2,
        "template": {
            "spec": {"containers": [{"name": "trainer", "resources": {"limits": {"memory": "1Gi"}}}]}
        },
    }
    oom = {"exitCode": 137, "reason": "OOMKilled"}
    pods = [
        p if p["metadata"]["name"] != "ctr-ps-0" else pod("ps", 0, restarts=1, last_terminated=oom)
        for p in BASE
    ]
    plan = plan_reconcile(
        with_status(job(model=model, ps=small_ps), phase="Running", tracking=tracking_of(BASE)),
        observed(pods, chief_job()),
        None,
        NOW,
    )
    figure = "the planner estimates 56.4 GiB per PS for 2 PS"
    assert figure in plan.status["lastFailure"]["message"]
    [restart] = [e for e in plan.events if e.reason == "ParameterServerLost"]
    assert figure in restart.message


def test_a_worker_whose_image_stops_pulling_after_a_restart_is_recorded_once_and_training_goes_on() -> None:
    restarted = [p if p["metadata"]["name"] != "ctr-worker-1" else pod("worker", 1, restarts=2) for p in BASE]
    stuck = [
        p if p["metadata"]["name"] != "ctr-worker-1" else pod("worker", 1, restarts=2, waiting="ErrImagePull")
        for p in BASE
    ]
    status: dict[str, Any] = came_up(phase="Running", tracking=tracking_of(restarted))
    told: list[str] = []
    for seconds, events in ((0, []), (299, []), (300, ["WorkerFailed"]), (600, [])):
        plan = plan_reconcile(
            with_status(job(), **status), observed(stuck, chief_job()), None, NOW + timedelta(seconds=seconds)
        )
        assert plan.status["phase"] == "Running", seconds
        assert [e.reason for e in plan.events] == events, seconds
        told += [e.message for e in plan.events]
        status = plan.status
    assert status["lastFailure"]["reason"] == "ErrImagePull" and status["lastFailure"]["role"] == "worker"
    assert "cannot start, training goes on without it" in told[0]


def test_an_evaluator_failure_is_an_event_and_nothing_restarts() -> None:
    evaluator = {"template": {"spec": {"containers": [{"name": "trainer"}]}}}
    healthy = [*BASE, pod("evaluator", 0)]
    crashed = [*BASE, pod("evaluator", 0, restarts=1, last_terminated={"exitCode": 1, "reason": "Error"})]
    plan = plan_reconcile(
        with_status(job(evaluator=evaluator), **came_up(phase="Running", tracking=tracking_of(healthy))),
        observed(crashed, chief_job()),
        None,
        NOW,
    )
    assert not plan.restarted and plan.status["phase"] == "Running" and plan.status["restarts"] == 0
    assert [e.reason for e in plan.events] == ["EvaluatorFailed"]
    assert plan.status["lastFailure"]["role"] == "evaluator"
    assert plan.status["replicaStatuses"]["evaluator"]["restarts"] == 1


SCHEDULER = "0/4 nodes are available: 4 Insufficient memory."


def _unschedulable_ps(since: timedelta = timedelta(0)) -> list[dict[str, Any]]:
    stuck = pod("ps", 1, phase="Pending", unschedulable=SCHEDULER, created=NOW - since)
    return [p if p["metadata"]["name"] != "ctr-ps-1" else stuck for p in BASE]


def test_an_unschedulable_pod_is_a_condition_and_one_event() -> None:
    plan = plan_reconcile(
        with_status(job(), **came_up(phase="Creating")), observed(_unschedulable_ps(), chief_job()), None, NOW
    )
    assert plan.status["phase"] == "Creating"
    assert _conditions(plan.status)["Unschedulable"] == ("True", "Unschedulable")
    [condition] = [c for c in plan.status["conditions"] if c["type"] == "Unschedulable"]
    assert "ps 1 (ctr-ps-1)" in condition["message"] and SCHEDULER in condition["message"]
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "Unschedulable")]
    again = plan_reconcile(
        {**job(), "status": plan.status}, observed(_unschedulable_ps(), chief_job()), None, NOW
    )
    assert again.events == [] and _conditions(again.status)["Unschedulable"][0] == "True"
    scheduled = plan_reconcile({**job(), "status": again.status}, observed(BASE, chief_job()), None, NOW)
    assert _conditions(scheduled.status)["Unschedulable"] == ("False", "Scheduled")


def test_scheduling_timeout_fails_the_job_as_unschedulable() -> None:
    spec = job(failurePolicy={"schedulingTimeoutSeconds": 300})
    late = observed(_unschedulable_ps(timedelta(seconds=301)), chief_job())
    plan = plan_reconcile(with_status(spec, phase="Creating"), late, None, NOW)
    assert plan.status["phase"] == "Failed" and _conditions(plan.status)["Failed"] == (
        "True",
        "Unschedulable",
    )
    assert (plan.status["lastFailure"]["role"], plan.status["lastFailure"]["reason"]) == (
        "ps",
        "Unschedulable",
    )
    early = observed(_unschedulable_ps(timedelta(seconds=200)), chief_job())
    assert plan_reconcile(with_status(spec, phase="Creating"), early, None, NOW).status["phase"] == "Creating"


def test_an_unschedulable_worker_never_fails_the_job() -> None:
    stuck = pod("worker", 1, phase="Pending", unschedulable=SCHEDULER, created=NOW - timedelta(hours=1))
    pods = [p if p["metadata"]["name"] != "ctr-worker-1" else stuck for p in BASE]
    spec = job(failurePolicy={"schedulingTimeoutSeconds": 300})
    plan = plan_reconcile(with_status(spec, phase="Running"), observed(pods, chief_job()), None, NOW)
    assert plan.status["phase"] == "Running" and _conditions(plan.status)["Unschedulable"][0] == "True"


def _chief_suspended(plan: Any) -> bool:
    assert plan.render is not None
    [chief] = [
        m
        for m in render_children(job(), plan.render)
        if m["kind"] == "Job" and "chief" in m["metadata"]["name"]
    ]
    return bool(chief["spec"]["suspend"])


def test_the_deadline_stops_the_running_chief_too() -> None:
    """The chief Job is suspended (its pod deleted) with the PS and workers, and stays so afterwards."""
    started = format_time(NOW - timedelta(seconds=61))
    over = with_status(job(runPolicy={"activeDeadlineSeconds": 60}), phase="Running", startTime=started)
    plan = plan_reconcile(over, observed(BASE, chief_job()), None, NOW)
    assert plan.status["phase"] == "Failed" and plan.render is not None and plan.render.stopped
    assert _chief_suspended(plan)
    later = plan_reconcile({**over, "status": plan.status}, observed(BASE, chief_job()), None, NOW)
    assert later.status["phase"] == "Failed" and _chief_suspended(later)


def test_a_chief_that_ended_on_its_own_is_left_as_it_ended() -> None:
    done = with_status(job(), phase="Succeeded", completionTime=format_time(NOW))
    assert not _chief_suspended(plan_reconcile(done, observed(BASE[1:], chief_job(complete=True)), None, NOW))
    failed = with_status(job(), phase="Failed", completionTime=format_time(NOW))
    gone = chief_job(failed="PodFailurePolicy")
    assert not _chief_suspended(plan_reconcile(failed, observed(BASE[1:], gone), None, NOW))


def test_clean_pod_policy_none_keeps_the_chief_of_a_failed_job_running() -> None:
    started = format_time(NOW - timedelta(seconds=61))
    spec = {"activeDeadlineSeconds": 60, "cleanPodPolicy": "None"}
    plan = plan_reconcile(
        with_status(job(runPolicy=spec), phase="Running", startTime=started),
        observed(BASE, chief_job()),
        None,
        NOW,
    )
    assert plan.status["phase"] == "Failed" and not _chief_suspended(plan)


def _ps_lost_restart() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    running = with_status(
        job(), **came_up(phase="Running", tracking=tracking_of(BASE), checkpoint={"step": 40})
    )
    lost = [p if p["metadata"]["name"] != "ctr-ps-1" else pod("ps", 1, uid="fresh") for p in BASE]
    return running, lost


def test_a_restart_deletes_the_old_chief_pod_and_holds_the_new_job_until_it_is_gone() -> None:
    """Never two coordinators: the new chief Job waits while the old attempt's pod still runs."""
    running, lost = _ps_lost_restart()
    plan = plan_reconcile(running, observed(lost, chief_job(0)), None, NOW)
    assert plan.restarted and plan.hold_chief
    # The surviving ps-0 restarts with the chief (ps_recycle.py), with the same grace.
    assert [(d.pod, d.grace_seconds) for d in plan.delete_pods] == [("ctr-ps-0", 1), ("ctr-chief-0x", 5)]
    assert plan.requeue_after == 0.5  # the common case stays fast: look again soon
    # Next reconcile: the old pods are terminating. Still held; they are not deleted again.
    ps0_dying = pod("ps", 0, deleting=True)
    dying = [pod("chief", 0, attempt=0, deleting=True), ps0_dying, *lost[2:]]
    again = plan_reconcile({**running, "status": plan.status}, observed(dying, chief_job(0)), None, NOW)
    assert again.hold_chief and again.delete_pods == [] and again.requeue_after == 0.5
    assert again.status["restarts"] == 1 and [e.reason for e in again.events] == []
    # The old chief is gone, the old ps-0 not yet: still held.
    held = plan_reconcile({**running, "status": again.status}, observed([ps0_dying, *lost[2:]]), None, NOW)
    assert held.hold_chief
    # Both gone, ps-0 replaced by its StatefulSet, not running yet: its name does not resolve.
    pending = [pod("ps", 0, uid="new-ps-0", phase="Pending", ip=None), *lost[2:]]
    held = plan_reconcile({**running, "status": held.status}, observed(pending), None, NOW)
    assert held.hold_chief and held.delete_pods == []
    # Running: the new Job may be created; nothing was a failure.
    replaced = [pod("ps", 0, uid="new-ps-0"), *lost[2:]]
    gone = plan_reconcile({**running, "status": held.status}, observed(replaced), None, NOW)
    assert not gone.hold_chief and gone.delete_pods == []
    # Remembered for the attempt, never tracked: a lagging view of the old ps-0 is no failure.
    assert gone.status["tracking"]["recycling"] == {"ctr-ps-0": "ctr-ps-0-uid"}
    assert gone.status["restarts"] == 1 and gone.status["replicaStatuses"]["ps"]["restarts"] == 1
    assert gone.status["lastFailure"]["index"] == 1 and [e.reason for e in gone.events] == []


def test_an_old_chief_that_already_failed_does_not_hold_the_new_one() -> None:
    """The common ChiefFailed restart: its pod ran to the end, nothing to wait for."""
    failed = [
        pod("chief", 0, attempt=0, phase="Failed", terminated={"exitCode": 138, "reason": "Error"}),
        *BASE[1:],
    ]
    running = with_status(
        job(), **came_up(phase="Running", tracking=tracking_of(BASE), checkpoint={"step": 40})
    )
    plan = plan_reconcile(running, observed(failed, chief_job(0, failed="BackoffLimitExceeded")), None, NOW)
    # Only the parameter servers that served it are waited for (ps_recycle.py).
    assert plan.restarted and [d.pod for d in plan.delete_pods] == ["ctr-ps-0", "ctr-ps-1"]
    replaced = [failed[0], pod("ps", 0, uid="new-0"), pod("ps", 1, uid="new-1"), *BASE[3:]]
    later = plan_reconcile({**running, "status": plan.status}, observed(replaced, chief_job(0)), None, NOW)
    assert not later.hold_chief and later.delete_pods == []


@pytest.mark.parametrize(
    ("now", "write_now"),
    [
        (BASE, False),  # nothing changed
        ([*BASE[:3], pod("worker", 0, uid="new-worker"), BASE[4]], False),  # a worker came back
        ([BASE[0], BASE[1], pod("ps", 1, phase="Pending", ready=False), *BASE[3:]], False),  # not ready
        ([BASE[0], BASE[1], pod("ps", 1, uid="new-ps"), *BASE[3:]], True),  # a PS replaced
        ([BASE[0], pod("ps", 0, restarts=1), *BASE[2:]], True),  # a PS restarted in place
    ],
)
def test_a_parameter_servers_new_tracking_is_written_at_once(
    now: list[dict[str, Any]], write_now: bool
) -> None:
    """Status-only changes are spaced, but not a PS's tracking: a PS that fails right after it
    appeared must be judged against what it was."""
    status = came_up(phase="Running", tracking=tracking_of(BASE))
    plan = plan_reconcile(with_status(job(), **status), observed(now, chief_job()), None, NOW)
    assert plan.write_now is write_now


def test_the_parameter_servers_a_restart_recycles_going_away_are_not_written_at_once() -> None:
    """A restart's status write is followed by its recycled PS going away, a status-only
    change spaced like any other: not a second read and write of every job restarting at once, while
    the API server is busiest. Their replacements are written at once, and are no failures."""
    failed = [
        pod("chief", 0, attempt=0, phase="Failed", terminated={"exitCode": 138, "reason": "Error"}),
        *BASE[1:],
    ]
    running = with_status(
        job(), **came_up(phase="Running", tracking=tracking_of(BASE), checkpoint={"step": 40})
    )
    restart = plan_reconcile(
        running, observed(failed, chief_job(0, failed="BackoffLimitExceeded")), None, NOW
    )
    assert restart.restarted and [d.pod for d in restart.delete_pods] == ["ctr-ps-0", "ctr-ps-1"]
    restarted = {**running, "status": restart.status}
    going = [failed[0], pod("ps", 0, deleting=True), pod("ps", 1, deleting=True), *BASE[3:]]
    assert not plan_reconcile(restarted, observed(going, chief_job(0)), None, NOW).write_now
    replaced = [failed[0], pod("ps", 0, uid="new-0"), pod("ps", 1, uid="new-1"), *BASE[3:]]
    back = plan_reconcile(restarted, observed(replaced, chief_job(0)), None, NOW)
    assert back.write_now and back.failures == []


def test_a_recycled_ps_is_never_judged_again_in_its_attempt_whatever_order_the_views_come_in() -> None:
    """A view that no longer shows a recycled PS is no proof that none will: a watch that lags can
    still bring an older state of it (after a resize: no lastFailure "ctr-ps-0 Deleted"). The
    restart's recycled PS is neither tracked nor judged for the rest of its attempt, so its going
    away is never a failure."""
    running, lost = _ps_lost_restart()
    restart = plan_reconcile(running, observed(lost, chief_job(0)), None, NOW)
    recycled = {"ctr-ps-0": "ctr-ps-0-uid"}
    assert restart.status["tracking"]["recycling"] == recycled
    assert "ctr-ps-0" not in tracked_in(restart.status)  # going away on purpose
    status = restart.status
    views = [
        lost[2:],  # the old ps-0 not shown (gone, as a fresh read finds it)
        lost[1:],  # shown again as it ran, by a watch that lags
        [pod("ps", 0, deleting=True), *lost[2:]],  # then going away
        [pod("ps", 0, uid="new-0"), *lost[2:]],  # then replaced
    ]
    for pods in views:
        plan = plan_reconcile({**running, "status": status}, observed(pods), None, NOW)
        assert plan.failures == [] and [e.reason for e in plan.events] == [], pods
        assert plan.status["tracking"]["recycling"] == recycled
        assert "ctr-ps-0-uid" not in {e.uid for e in tracked_in(plan.status).values()}
        status = plan.status
    assert tracked_in(plan.status)["ctr-ps-0"].uid == "new-0"
    assert status["lastFailure"]["pod"] == "ctr-ps-1"  # the restart's cause, and only it


def _stuck_worker() -> list[dict[str, Any]]:
    stuck = pod("worker", 1, waiting="ErrImagePull")
    return [p if p["metadata"]["name"] != "ctr-worker-1" else stuck for p in BASE]


# A job on each clock of the plan, as (job, what is observed, the chief's report).
CLOCKS: dict[str, tuple[dict[str, Any], Observed, ProgressReport | None]] = {
    "stall timeout": (
        with_status(
            job(failurePolicy={"stallTimeoutSeconds": 60}),
            **came_up(phase="Running", step=7, stepTime=format_time(NOW - timedelta(seconds=20))),
        ),
        observed(BASE, chief_job()),
        ProgressReport(state="running", step=7),
    ),
    "scheduling timeout": (
        with_status(job(failurePolicy={"schedulingTimeoutSeconds": 300}), **came_up(phase="Creating")),
        observed(_unschedulable_ps(timedelta(seconds=200)), chief_job()),
        None,
    ),
    "start error grace": (
        with_status(job(), **came_up(phase="Running", tracking=tracking_of(BASE))),
        observed(_stuck_worker(), chief_job()),
        None,
    ),
    "active deadline": (
        with_status(
            job(runPolicy={"activeDeadlineSeconds": 600}),
            **came_up(phase="Running", startTime=format_time(NOW - timedelta(seconds=60))),
        ),
        observed(BASE, chief_job()),
        None,
    ),
}


@pytest.mark.parametrize("clock", CLOCKS)
def test_a_plan_that_changed_nothing_asks_to_be_woken_when_its_clock_would_change_it(clock: str) -> None:
    """control/decision_cache.py keeps a decision that changed nothing until the plan's wake-up: each clock
    of the plan asks for one, or what it does on time would wait for the job's next change."""
    first_job, seen, report = CLOCKS[clock]
    first = plan_reconcile(first_job, seen, report, NOW)
    settled = {**first_job, "status": first.status}  # as the first reconcile wrote it
    again = plan_reconcile(settled, seen, report, NOW)
    assert again.status == settled["status"] and again.events == [] and again.requeue_after is not None
    wake = again.requeue_after
    before = plan_reconcile(settled, seen, report, NOW + timedelta(seconds=wake - 1))
    assert before.status == settled["status"] and before.events == []
    after = plan_reconcile(settled, seen, report, NOW + timedelta(seconds=wake + 1))
    assert after.status != settled["status"] or after.events
