"""Queueing with Kueue (policies/queueing.py, plan/kueue_admission.py): whole reconciles of a labelled job
against the Workload as Kueue leaves it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from psoperator.api.labels import LABEL_QUEUE
from psoperator.api.models import PodSetAdmission, Toleration
from psoperator.api.vocabulary import Phase
from psoperator.contract import CheckpointAnswer, CheckpointStatus
from psoperator.observe.views import Observed
from psoperator.observe.workload import KueueView, parse_workload
from psoperator.plan.draft import ReconcilePlan
from psoperator.plan.stages import plan_reconcile
from psoperator.policies import queueing
from psoperator.policies.planned_stop import CheckpointOutcome
from psoperator.render import render_children
from psoperator.render.workload import with_admission
from tests.unit.builders import NOW, chief_job, job, observed, running_cluster, with_status

Obj = dict[str, Any]
FLAVORS: dict[str, Obj] = {
    "highmem": {"nodeLabels": {"pool": "highmem"}, "tolerations": [{"key": "highmem", "operator": "Exists"}]},
    "gpu": {"nodeLabels": {"pool": "gpu"}},
}


def queued_job(queue: str = "team-a", **status: Any) -> Obj:
    obj = with_status(job(), **status) if status else job()
    obj["metadata"]["labels"] = {LABEL_QUEUE: queue}
    return obj


def condition(type_: str, status: bool, reason: str = "R", message: str = "") -> Obj:
    value = "True" if status else "False"
    return {"type": type_, "status": value, "reason": reason, "message": message, "lastTransitionTime": "x"}


def workload(name: str = "ctr-2ps-2w", *conditions: Obj, admitted: bool = False) -> Obj:
    status: Obj = {"conditions": list(conditions)}
    if admitted:
        status["conditions"] += [condition("QuotaReserved", True), condition("Admitted", True)]
        status["admission"] = {
            "clusterQueue": "cq",
            "podSetAssignments": [
                {"name": "ps", "flavors": {"cpu": "highmem", "memory": "highmem"}},
                {"name": "worker", "flavors": {"cpu": "gpu"}},
                {"name": "chief", "flavors": {"cpu": "highmem"}},
            ],
        }
    return {
        "kind": "Workload",
        "metadata": {"name": name, "uid": "wl-uid", "resourceVersion": "5"},
        "status": status,
    }


def seen(pods: list[Obj], wl: Obj | None, served: bool = True, with_chief: bool = True) -> Observed:
    base = observed(pods, chief_job() if with_chief else None)
    flavors = FLAVORS if wl is not None and served else {}
    return replace(
        base,
        workload=parse_workload(wl) if wl is not None else None,
        kueue=KueueView(served=served, flavors=flavors),
    )


def reconcile(obj: Obj, seen_: Observed, outcome: CheckpointOutcome | None = None) -> ReconcilePlan:
    return plan_reconcile(obj, seen_, None, NOW, checkpoint_outcome=outcome)


def kinds(plan: ReconcilePlan, obj: Obj) -> dict[str, Obj]:
    assert plan.render is not None
    return {f"{c['kind']}/{c['metadata']['name']}": c for c in render_children(obj, plan.render)}


def test_a_new_labelled_job_gets_one_workload_with_a_pod_set_per_role_and_runs_nothing() -> None:
    obj = queued_job()
    plan = reconcile(obj, seen([], None, with_chief=False))
    assert plan.status["phase"] == Phase.QUEUED
    queued = next(c for c in plan.status["conditions"] if c["type"] == "Queued")
    assert (queued["status"], queued["reason"]) == ("True", "Pending")
    children = kinds(plan, obj)
    wl = children["Workload/ctr-2ps-2w"]
    assert wl["spec"]["queueName"] == "team-a"
    assert [(p["name"], p["count"]) for p in wl["spec"]["podSets"]] == [
        ("chief", 1),
        ("ps", 2),
        ("worker", 2),
    ]
    assert wl["metadata"]["ownerReferences"][0]["controller"] is True
    assert "Job/ctr-chief" not in children
    assert children["StatefulSet/ctr-ps"]["spec"]["replicas"] == 0


def test_a_waiting_job_says_what_kueue_says() -> None:
    said = "couldn't assign flavors to pod set ps: insufficient quota for memory in flavor highmem"
    wl = workload("ctr-2ps-2w", condition("QuotaReserved", False, "Pending", said))
    plan = reconcile(queued_job(phase="Queued"), seen([], wl, with_chief=False))
    queued = next(c for c in plan.status["conditions"] if c["type"] == "Queued")
    assert (
        queued["status"] == "True" and said in queued["message"] and "LocalQueue team-a" in queued["message"]
    )
    assert plan.workload_patch is None


def test_an_admitted_job_records_its_admission_and_its_pods_carry_the_flavors() -> None:
    obj = queued_job(phase="Queued")
    plan = reconcile(obj, seen([], workload(admitted=True), with_chief=False))
    assert plan.status["phase"] != Phase.QUEUED
    assert plan.status["admission"]["clusterQueue"] == "cq"
    assert [e.reason for e in plan.events if e.reason == "Admitted"] == ["Admitted"]
    children = kinds(plan, {**obj, "status": plan.status})
    ps = children["StatefulSet/ctr-ps"]["spec"]["template"]["spec"]
    assert ps["nodeSelector"] == {"pool": "highmem"} and ps["tolerations"] == [
        {"key": "highmem", "operator": "Exists"}
    ]
    assert children["StatefulSet/ctr-worker"]["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "gpu"}
    assert "Job/ctr-chief" in children
    # The Workload's pod sets keep the templates as rendered before the admission.
    podsets = {p["name"]: p for p in children["Workload/ctr-2ps-2w"]["spec"]["podSets"]}
    assert "nodeSelector" not in podsets["ps"]["template"]["spec"]


def _outcome(ask: Any, step: int) -> CheckpointOutcome:
    answer = CheckpointAnswer(checkpoint_step=step, checkpoint_path=f"/ckpt/ckpt-{step}", saved=True)
    return CheckpointOutcome(ask, CheckpointStatus.SAVED, answer, NOW)


def test_an_evicted_job_checkpoints_then_stops_then_gives_its_quota_back() -> None:
    admitted = queueing.admission_of(parse_workload(workload(admitted=True)), FLAVORS)
    status: Obj = {"phase": "Running", "admission": admitted.model_dump(by_alias=True)}
    evicted = workload(
        "ctr-2ps-2w", condition("Evicted", True, "Preempted", "preempted by team-b/big"), admitted=True
    )
    first = reconcile(queued_job(**status), seen(running_cluster(), evicted))
    assert first.ask_checkpoint is not None and first.ask_checkpoint.cause == "Evicted"
    assert first.render is not None and not first.render.suspended  # it trains until the answer
    stopped = reconcile(
        queued_job(**first.status), seen(running_cluster(), evicted), _outcome(first.ask_checkpoint, 840)
    )
    assert stopped.status["phase"] == Phase.QUEUED and "admission" not in stopped.status
    assert stopped.status["lastPlannedStop"]["checkpointStep"] == 840
    assert stopped.render is not None and stopped.render.suspended
    assert stopped.workload_patch is None  # its pods still stop
    assert sorted(d.pod for d in stopped.delete_pods if d.grace_seconds == 1) == ["ctr-ps-0", "ctr-ps-1"]
    assert ("ctr-chief-0x", None) in {(d.pod, d.grace_seconds) for d in stopped.delete_pods}  # its own grace
    gone = reconcile(queued_job(**stopped.status), seen([], evicted, with_chief=False))
    assert gone.workload_patch is not None and gone.workload_patch.status["admission"] is None
    reserved = next(c for c in gone.workload_patch.status["conditions"] if c["type"] == "QuotaReserved")
    requeued = next(c for c in gone.workload_patch.status["conditions"] if c["type"] == "Requeued")
    assert (reserved["status"], requeued["status"]) == ("False", "True")


def test_without_kueue_a_labelled_job_waits_saying_so_and_looks_again() -> None:
    plan = reconcile(queued_job(), seen([], None, served=False, with_chief=False))
    queued = next(c for c in plan.status["conditions"] if c["type"] == "Queued")
    assert queued["reason"] == "KueueNotInstalled" and plan.requeue_after is not None
    assert not any(c["kind"] == "Workload" for c in render_children(queued_job(), plan.render))


def test_an_ended_job_finishes_its_workload() -> None:
    admitted = queueing.admission_of(parse_workload(workload(admitted=True)), FLAVORS)
    obj = queued_job(phase="Running", admission=admitted.model_dump(by_alias=True))
    done = replace(
        seen(running_cluster(), workload(admitted=True)),
        chief_job=observed([], chief_job(complete=True)).chief_job,
    )
    plan = reconcile(obj, done)
    assert plan.status["phase"] == Phase.SUCCEEDED
    assert plan.workload_patch is not None
    finished = next(c for c in plan.workload_patch.status["conditions"] if c["type"] == "Finished")
    assert (finished["status"], finished["reason"]) == ("True", "Succeeded")


def test_the_label_removed_deletes_the_workload_and_the_job_runs_unqueued() -> None:
    obj = with_status(job(), phase="Queued")
    plan = reconcile(obj, seen([], workload(), with_chief=False))
    queued = next(c for c in plan.status["conditions"] if c["type"] == "Queued")
    assert (queued["status"], queued["reason"]) == ("False", "Unqueued")
    children = kinds(plan, obj)
    assert not any(k.startswith("Workload/") for k in children) and "Job/ctr-chief" in children


def test_a_resize_of_an_admitted_job_stops_it_deletes_the_old_workload_then_queues_a_new_one() -> None:
    admitted = queueing.admission_of(parse_workload(workload(admitted=True)), FLAVORS)
    status: Obj = {
        "phase": "Running",
        "admission": admitted.model_dump(by_alias=True),
        "shape": {"ps": 2, "workers": 2},
    }
    resized = queued_job(**status)
    resized["spec"]["ps"]["replicas"] = 3
    ask = reconcile(resized, seen(running_cluster(), workload(admitted=True))).ask_checkpoint
    assert ask is not None and ask.cause == "Resize"
    stopped = reconcile(resized, seen(running_cluster(), workload(admitted=True)), _outcome(ask, 900))
    assert stopped.status["phase"] == Phase.QUEUED and stopped.status["shape"] == {
        "ps": 3,
        "workers": 2,
        "psResources": {},
    }
    assert not any(k.startswith("Workload/") for k in kinds(stopped, resized))  # the old one goes first
    again = reconcile({**resized, "status": stopped.status}, seen([], None, with_chief=False))
    podsets = kinds(again, resized)["Workload/ctr-3ps-2w"]["spec"]["podSets"]
    assert [p["count"] for p in podsets] == [1, 3, 2]


def test_a_suspended_queued_job_gives_its_workload_up() -> None:
    obj = queued_job(phase="Running")
    obj["spec"]["runPolicy"] = {"suspend": True, "checkpointBeforeStopSeconds": 0}
    plan = reconcile(obj, seen([], workload(admitted=True), with_chief=False))
    assert plan.status["phase"] == Phase.SUSPENDED
    assert not any(k.startswith("Workload/") for k in kinds(plan, obj))


def test_admission_of_merges_the_flavors_and_the_admission_checks_updates() -> None:
    wl = workload(admitted=True)
    wl["status"]["admissionChecks"] = [
        {
            "name": "prov",
            "podSetUpdates": [{"name": "ps", "labels": {"a": "b"}, "nodeSelector": {"zone": "z1"}}],
        }
    ]
    admission = queueing.admission_of(parse_workload(wl), FLAVORS)
    ps = admission.of("ps")
    assert (
        ps is not None and ps.node_selector == {"pool": "highmem", "zone": "z1"} and ps.labels == {"a": "b"}
    )
    assert ps.flavors == {"cpu": "highmem", "memory": "highmem"}
    assert queueing.describe(admission) == "admitted by ClusterQueue cq on gpu, highmem"


def test_with_admission_wins_over_the_template_and_adds_a_toleration_once() -> None:
    template: Obj = {
        "spec": {
            "nodeSelector": {"pool": "any", "disk": "ssd"},
            "tolerations": [{"key": "highmem", "operator": "Exists"}],
        }
    }
    admitted = PodSetAdmission(
        name="ps",
        nodeSelector={"pool": "highmem"},
        tolerations=[Toleration(key="highmem", operator="Exists")],
    )
    merged = with_admission(template, admitted)
    assert merged["spec"]["nodeSelector"] == {"pool": "highmem", "disk": "ssd"}
    assert merged["spec"]["tolerations"] == [{"key": "highmem", "operator": "Exists"}]
    assert template["spec"]["nodeSelector"]["pool"] == "any"  # the spec's template is not changed


def test_every_pod_running_reports_pods_ready_once() -> None:
    admitted = queueing.admission_of(parse_workload(workload(admitted=True)), FLAVORS)
    obj = queued_job(phase="Running", admission=admitted.model_dump(by_alias=True))
    plan = reconcile(obj, seen(running_cluster(), workload(admitted=True)))
    assert plan.workload_patch is not None
    assert any(
        c["type"] == "PodsReady" and c["status"] == "True" for c in plan.workload_patch.status["conditions"]
    )
    ready = workload("ctr-2ps-2w", condition("PodsReady", True), admitted=True)
    assert reconcile(obj, seen(running_cluster(), ready)).workload_patch is None


def test_the_label_added_to_a_running_job_stops_it_after_a_checkpoint_and_queues_it() -> None:
    obj = queued_job(phase="Running")
    ask = reconcile(obj, seen(running_cluster(), None)).ask_checkpoint
    assert ask is not None and ask.cause == "Evicted"
    queued = reconcile(obj, seen(running_cluster(), None), _outcome(ask, 500))
    assert (
        queued.status["phase"] == Phase.QUEUED and queued.status["lastPlannedStop"]["checkpointStep"] == 500
    )
    assert "Workload/ctr-2ps-2w" in kinds(queued, obj) and "Job/ctr-chief" not in kinds(queued, obj)
