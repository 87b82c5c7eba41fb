"""Each reconcile stage on its own: a draft in, the draft changed and whether the reconcile is decided."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from psoperator.api.models import PSTrainingJobSpec, PSTrainingJobStatus
from psoperator.api.vocabulary import ConditionType, Phase
from psoperator.contract import Role
from psoperator.observe.views import Observed, build_observed, owned_pods, parse_pod
from psoperator.plan import stages
from psoperator.plan.draft import Draft, Event
from psoperator.plan.stages import (
    DECIDED,
    GO_ON,
    STAGES,
    admit_sizing,
    count_replicas,
    detect_stall,
    detect_success,
    enforce_deadline,
    note_all_running,
    note_overridden_template,
    recover,
    require_network_policies,
    set_phase,
    suspend_or_resume,
    when_finished,
)
from psoperator.policies.recovery import restart_budget_used
from psoperator.sizing.admission import SizingLevel, SizingVerdict
from psoperator.timeutil import format_time
from tests.unit.builders import (
    NOW,
    came_up,
    chief_job,
    job,
    observed,
    pod,
    running_cluster,
    tracking_of,
    with_status,
)

BASE = running_cluster()


def _draft(obj: dict[str, Any], seen: Observed | None = None) -> tuple[PSTrainingJobSpec, Draft]:
    return PSTrainingJobSpec.model_validate(obj["spec"]), Draft.start(
        obj, seen or Observed(), NOW, "cluster.local"
    )


def _conditions(d: Draft) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in d.status.conditions}


def test_the_stages_run_in_the_documented_order() -> None:
    assert [s.__name__ for s in STAGES] == [
        "when_finished",
        "admit_sizing",
        "note_overridden_template",
        "require_network_policies",
        "suspend_or_resume",
        "wait_for_admission",
        "enforce_deadline",
        "detect_success",
        "force_delete_lost_pods",
        "watch_scheduling",
        "checkpoint_before_drain",
        "resize_job",
        "recover",
        "count_replicas",
        "set_phase",
        "note_all_running",
        "detect_stall",
        "recycle_parameter_servers",
        "retire_old_chiefs",
        "await_former_job",
    ]


def test_condition_queues_its_event_only_when_it_flips() -> None:
    _, d = _draft(job())
    event = Event("Warning", "Stalled", "stuck")
    d.condition(ConditionType.STALLED, False, "Progressing", event=event)  # absent counts as False
    d.condition(ConditionType.STALLED, True, "NoProgress", event=event)
    d.condition(ConditionType.STALLED, True, "NoProgress", event=event)
    assert d.events == [event]
    assert _conditions(d)["Stalled"] == ("True", "NoProgress")


def test_enter_queues_its_event_only_when_the_phase_changes() -> None:
    _, d = _draft(with_status(job(), phase="Running"))
    d.enter(Phase.RUNNING, event=Event("Normal", "Running", ""))
    assert d.events == [] and d.status.phase == Phase.RUNNING
    d.enter(Phase.CREATING, event=Event("Normal", "Creating", ""))
    assert [e.reason for e in d.events] == ["Creating"]


def test_when_finished_only_cleans_up() -> None:
    spec, d = _draft(with_status(job(), phase="Failed", tracking=tracking_of(BASE)))
    assert when_finished(spec, d) is DECIDED
    assert d.render is not None and d.render.stopped and not d.create_missing
    assert d.status.tracking.pods == {}
    spec, running = _draft(with_status(job(), phase="Running"))
    assert when_finished(spec, running) is GO_ON and running.render is None


def test_admit_sizing_warns_once_and_refuses_only_with_enforce() -> None:
    small_ps = {
        "replicas": 2,
        "template": {"spec": {"containers": [{"name": "t", "resources": {"limits": {"memory": "1Gi"}}}]}},
    }
    model = {"parameters": 4_000_000_000, "optimizer": "adam"}
    spec, d = _draft(job(model=model, ps=small_ps))
    assert admit_sizing(spec, d) is GO_ON
    assert [e.reason for e in d.events] == ["SizingWarning"]
    spec, again = _draft(with_status(job(model=model, ps=small_ps), **d.plan().status))
    assert admit_sizing(spec, again) is GO_ON and again.events == []
    spec, refused = _draft(job(model={**model, "enforce": True}, ps=small_ps))
    assert admit_sizing(spec, refused) is DECIDED
    assert refused.status.phase == Phase.FAILED and refused.render is None


def test_admit_sizing_checks_only_while_it_can_still_warn_or_refuse(monkeypatch: pytest.MonkeyPatch) -> None:
    """Told already and past Pending: nothing the check says can change anything, so it is not made."""
    checked: list[str] = []

    def check(spec: PSTrainingJobSpec) -> SizingVerdict:
        checked.append(spec.ps.template["spec"]["containers"][0]["name"])
        return SizingVerdict(SizingLevel.OK, "PSMemorySufficient", "")

    monkeypatch.setattr(stages, "check_ps_memory", check)
    model = {"parameters": 1_000, "optimizer": "adam"}
    spec, new = _draft(job(model=model))
    assert admit_sizing(spec, new) is GO_ON and len(checked) == 1
    told = new.plan().status
    for phase, checks in (("Pending", 2), ("Running", 2), ("Suspended", 2)):
        spec, d = _draft(with_status(job(model=model), **{**told, "phase": phase}))
        assert admit_sizing(spec, d) is GO_ON and len(checked) == checks
    spec, without = _draft(with_status(job(), phase="Pending"))
    assert admit_sizing(spec, without) is GO_ON and len(checked) == 2


def test_suspend_then_resume() -> None:
    spec, d = _draft(with_status(job(runPolicy={"suspend": True}), phase="Running", startTime="x"))
    assert suspend_or_resume(spec, d) is DECIDED
    assert d.status.phase == Phase.SUSPENDED and d.status.start_time is None
    assert d.render is not None and d.render.suspended
    spec, resumed = _draft({**job(), "status": d.plan().status})
    assert suspend_or_resume(spec, resumed) is GO_ON
    assert [e.reason for e in resumed.events] == ["Resumed"] and resumed.status.start_time == format_time(NOW)


def test_enforce_deadline() -> None:
    started = format_time(NOW - timedelta(seconds=61))
    spec, d = _draft(with_status(job(runPolicy={"activeDeadlineSeconds": 60}), startTime=started))
    assert enforce_deadline(spec, d) is DECIDED
    assert d.status.last_failure is not None and d.status.last_failure.reason == "DeadlineExceeded"
    spec, early = _draft(with_status(job(runPolicy={"activeDeadlineSeconds": 600}), startTime=started))
    assert enforce_deadline(spec, early) is GO_ON


def test_detect_success_needs_the_current_attempts_job() -> None:
    spec, d = _draft(with_status(job(), phase="Running"), observed(BASE, chief_job(complete=True)))
    assert detect_success(spec, d) is DECIDED and d.status.phase == Phase.SUCCEEDED
    spec, old = _draft(with_status(job(), restarts=1), observed(BASE, chief_job(0, complete=True)))
    assert detect_success(spec, old) is GO_ON


def test_recover_restarts_with_the_budget_the_policy_computed() -> None:
    lost = [p if p["metadata"]["name"] != "ctr-ps-1" else pod("ps", 1, uid="fresh") for p in BASE]
    status = {"phase": "Running", "tracking": tracking_of(BASE), "countedRestarts": 1}
    spec, d = _draft(with_status(job(), **status), observed(lost, chief_job()))
    assert recover(spec, d) is GO_ON and d.restarted
    assert (d.status.restarts, d.status.counted_restarts) == (1, 2)
    assert _conditions(d)["Restarting"] == ("True", "ParameterServerLost")


def test_restart_budget_used_starts_afresh_after_progress() -> None:
    def status(step: int) -> PSTrainingJobStatus:
        fields = {"countedRestarts": 2, "restartCheckpointStep": 100, "checkpoint": {"step": step}}
        return PSTrainingJobStatus.model_validate(fields)

    stuck, moved = status(100), status(150)
    assert (restart_budget_used(stuck, True), restart_budget_used(stuck, False)) == (3, 2)
    assert (restart_budget_used(moved, True), restart_budget_used(moved, False)) == (1, 0)


def test_count_replicas() -> None:
    spec, d = _draft(with_status(job(), phase="Running"), observed(BASE, chief_job()))
    assert count_replicas(spec, d) is GO_ON
    assert (d.status.ps_ready, d.status.workers_ready) == ("2/2", "2/2")
    assert d.status.tracking.ps_established


def test_set_phase_running_and_recovered() -> None:
    failed = format_time(NOW - timedelta(seconds=3))
    restarting = came_up(
        phase="Restarting",
        restarts=1,
        resumedFromStep=1200,
        lastFailure={"role": "ps", "index": 1, "reason": "OOMKilled", "time": failed},
    )
    restarting["conditions"].append(
        {"type": "Restarting", "status": "True", "reason": "X", "lastTransitionTime": format_time(NOW)}
    )
    spec, d = _draft(with_status(job(), **restarting), observed(running_cluster(attempt=1), chief_job(1)))
    assert set_phase(spec, d) is GO_ON and d.status.phase == Phase.RUNNING
    assert _conditions(d)["Restarting"] == ("False", "Recovered")
    # Measured from the failure itself, not from when the operator restarted the chief.
    assert d.recovery_seconds == 3.0
    assert [(e.reason, e.message) for e in d.events] == [
        ("Recovered", "resumed from step 1200, 3s after the failure")
    ]


def test_note_all_running_tells_the_startup_once() -> None:
    created = {"creationTimestamp": format_time(NOW - timedelta(seconds=12))}
    new = with_status(job(), phase="Running")
    new["metadata"].update(created)
    spec, d = _draft(new, observed(BASE, chief_job()))
    assert note_all_running(spec, d) is GO_ON
    assert (d.status.all_running_time, d.startup_seconds) == (format_time(NOW), 12.0)
    assert [(e.reason, e.message) for e in d.events] == [
        ("AllRunning", "every pod runs: a chief, 2 PS, 2 workers, 12s after its creation")
    ]
    spec, again = _draft({**new, "status": d.plan().status}, observed(BASE, chief_job()))
    assert note_all_running(spec, again) is GO_ON
    assert (again.startup_seconds, again.events) == (None, [])


def test_note_all_running_waits_for_every_worker() -> None:
    spec, d = _draft(with_status(job(), phase="Running"), observed(BASE[:-1], chief_job()))
    assert note_all_running(spec, d) is GO_ON
    assert (d.status.all_running_time, d.startup_seconds, d.events) == (None, None, [])


def test_detect_stall_is_off_without_a_timeout() -> None:
    since = format_time(NOW - timedelta(hours=1))
    spec, d = _draft(with_status(job(), stepTime=since), observed(BASE, chief_job()))
    assert detect_stall(spec, d) is GO_ON and "Stalled" not in _conditions(d)
    spec, on = _draft(
        with_status(job(failurePolicy={"stallTimeoutSeconds": 60}), stepTime=since),
        observed(BASE, chief_job()),
    )
    detect_stall(spec, on)
    assert _conditions(on)["Stalled"] == ("True", "NoProgress")


def test_observed_names_the_current_chief_job_and_running_pods() -> None:
    seen = observed([*BASE[:2], pod("ps", 1, phase="Pending"), *BASE[3:]], chief_job(1))
    assert seen.current_chief_job(0) is None
    job_view = seen.current_chief_job(1)
    assert job_view is not None and job_view.attempt == 1
    assert [p.name for p in seen.running(Role.PS)] == ["ctr-ps-0"]


def test_pods_of_an_older_chief_job_count_as_ours_after_that_job_is_deleted() -> None:
    """The old chief Job is deleted first; its terminating pod must still hold the new chief back."""
    old = pod("chief", 0, attempt=0)
    old["metadata"]["ownerReferences"] = [
        {"kind": "Job", "name": "ctr-chief", "uid": "gone", "controller": True}
    ]
    stranger = pod("ps", 0)
    stranger["metadata"]["ownerReferences"] = [{"kind": "StatefulSet", "name": "x", "uid": "other"}]
    ours = pod("ps", 1)
    ours["metadata"]["ownerReferences"] = [{"kind": "StatefulSet", "name": "ctr-ps", "uid": "sts-uid"}]
    views = [parse_pod(p) for p in (old, stranger, ours)]
    assert [p.name for p in owned_pods(views, {"sts-uid"}, "ctr")] == ["ctr-chief-0x", "ctr-ps-1"]


def test_pods_of_an_earlier_job_of_the_name_at_its_addresses_are_former_pods() -> None:
    """An earlier job's parameter servers and workers, their StatefulSets gone, hold this job's
    addresses until they have ended; other pods with the labels do not."""
    ours = pod("ps", 0)
    ours["metadata"]["ownerReferences"] = [{"kind": "StatefulSet", "name": "ctr-ps", "uid": "sts-uid"}]
    earlier = [pod("ps", 1, uid="old-ps"), pod("worker", 0, uid="old-worker", deleting=True)]
    ended = pod("worker", 1, uid="old-done", phase="Succeeded")
    other = pod("ps", 2, uid="other")
    other["metadata"]["name"] = "ctr-ps-copy"
    chief = pod("chief", 0, attempt=0)
    for obj in (*earlier, ended, other, chief):
        obj["metadata"]["ownerReferences"] = [{"kind": "StatefulSet", "name": "ctr-ps", "uid": "old-sts"}]
    seen = build_observed(
        [{"kind": "StatefulSet", "metadata": {"name": "ctr-ps", "uid": "sts-uid"}}],
        [parse_pod(p) for p in (ours, *earlier, ended, other, chief)],
        "ctr",
        {},
    )
    assert [p.name for p in seen.former] == ["ctr-ps-1", "ctr-worker-0"]
    assert [p.name for p in seen.pods] == ["ctr-ps-0"]


def _without_policies(seen: Observed) -> Observed:
    return replace(seen, children={k: v for k, v in seen.children.items() if k[0] != "NetworkPolicy"})


def test_a_new_job_waits_for_nothing_but_the_policies_it_is_about_to_create() -> None:
    """Its first reconcile writes the status, then creates the policies before any pod: no condition."""
    spec, d = _draft(job())
    assert require_network_policies(spec, d) is GO_ON
    assert "NetworkPolicyMissing" not in _conditions(d) and d.events == []


def test_a_refused_policy_is_a_condition_with_the_api_servers_answer_and_one_warning() -> None:
    acted = with_status(job(), phase="Pending", observedGeneration=1)
    spec, d = _draft(acted, _without_policies(observed([])))
    answer = "NetworkPolicy/ctr-peers: networkpolicies is forbidden: exceeded quota: np"
    d.unmade = {"NetworkPolicy/ctr-peers": answer, "Service/ctr-ps": "Service/ctr-ps: no"}
    require_network_policies(spec, d)
    set_phase(spec, d)
    [condition] = [c for c in d.status.conditions if c.type == ConditionType.NETWORK_POLICY_MISSING]
    assert (condition.status, condition.reason) == ("True", "NetworkPolicyRefused")
    assert condition.message.startswith(answer) and "no pod of the job is created" in condition.message
    assert "Service/ctr-ps" not in condition.message
    assert [(e.type, e.reason) for e in d.events] == [("Warning", "NetworkPolicyMissing")]
    assert "Created" not in _conditions(d)  # the Services exist; no StatefulSet or Job does
    # Told once: the next reconcile keeps the condition and posts nothing.
    spec, again = _draft(with_status(acted, **d.plan().status), _without_policies(observed([])))
    require_network_policies(spec, again)
    assert _conditions(again)["NetworkPolicyMissing"] == ("True", "NetworkPolicyNotCreated")
    assert again.events == []


def test_a_running_job_whose_policy_went_away_says_so_and_clears_it_once_it_is_back() -> None:
    running = with_status(job(), **came_up(phase="Running", observedGeneration=1))
    spec, d = _draft(running, _without_policies(observed(BASE, chief_job())))
    require_network_policies(spec, d)
    assert _conditions(d)["NetworkPolicyMissing"] == ("True", "NetworkPolicyNotCreated")
    assert "NetworkPolicy/ctr-peers does not exist" in d.status.conditions[-1].message
    spec, back = _draft(with_status(running, **d.plan().status), observed(BASE, chief_job()))
    require_network_policies(spec, back)
    assert _conditions(back)["NetworkPolicyMissing"] == ("False", "NetworkPoliciesCreated")


def test_network_policies_switched_off_want_none() -> None:
    off = with_status(job(networkPolicy={"enabled": False}), phase="Running", observedGeneration=1)
    spec, d = _draft(off, _without_policies(observed(BASE, chief_job())))
    require_network_policies(spec, d)
    assert "NetworkPolicyMissing" not in _conditions(d)


def test_a_stored_template_the_operator_overrides_is_told_once() -> None:
    """A job stored before the CRD refused the contract's variables and port names in templates."""
    trainer = {
        "name": "trainer",
        "env": [{"name": "PSOP_PROGRESS_PORT", "value": "9000"}],
        "ports": [{"name": "tf", "containerPort": 9999}],
    }
    stored = with_status(job(worker={"template": {"spec": {"containers": [trainer]}}}), phase="Running")
    spec, d = _draft(stored)
    assert note_overridden_template(spec, d) is GO_ON
    [condition] = [c for c in d.status.conditions if c.type == ConditionType.TEMPLATE_OVERRIDDEN]
    assert condition.status == "True"
    where = "spec.worker.template.spec.containers[0]"
    assert f"{where}.env[PSOP_PROGRESS_PORT], {where}.ports[tf]" in condition.message
    assert [(e.type, e.reason) for e in d.events] == [("Warning", "TemplateOverridden")]
    spec, again = _draft(with_status(stored, **d.plan().status))
    note_overridden_template(spec, again)
    assert again.events == [] and _conditions(again)["TemplateOverridden"][0] == "True"
    spec, clean = _draft(with_status(job(), phase="Running"))
    note_overridden_template(spec, clean)
    assert "TemplateOverridden" not in _conditions(clean)
