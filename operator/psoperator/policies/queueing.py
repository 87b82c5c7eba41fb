"""Queueing with Kueue: a job labelled `kueue.x-k8s.io/queue-name` runs only while Kueue
admits its Workload, which the operator makes and keeps, as Kueue's jobframework does for the jobs
it knows (Kueue is configured with PSTrainingJob as an external framework, so it leaves the job's
StatefulSets, Job and pods alone).

    the job                                   what the operator does
    labelled, Kueue's API not served          nothing runs; Queued (KueueNotInstalled)
    no Workload of its shape                  creates it: one pod set per role, their templates
                                              (Kueue sums their requests), the priority class
    its Workload not admitted                 nothing runs; Queued, with Kueue's word on why
    admitted                                  status.admission records what the flavors and
                                              admission checks put on each role's pods; it runs
    evicted while running (preemption,        a checkpoint first (planned_stop), then every pod
    deactivation, a PodsReady timeout)        stops; once none is left the quota is given back
                                              (Kueue requeues it) and the job waits again
    every pod runs                            PodsReady on the Workload (for waitForPodsReady)
    finished                                  Finished on the Workload (Kueue frees its quota)
    resized (another shape)                   a checkpoint, the pods stop, the old Workload is
                                              deleted, then a new one is queued
    the label removed                         the Workload is deleted; the job runs unqueued
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psoperator.api.labels import LABEL_QUEUE
from psoperator.api.models import Admission, PodSetAdmission, Toleration
from psoperator.observe.workload import WorkloadView
from psoperator.timeutil import format_time

Obj = dict[str, Any]


@dataclass(frozen=True)
class WorkloadPatch:
    """A merge patch of a Workload's status, computed from the version it names."""

    name: str
    resource_version: str
    status: Obj


def queue_of(labels: dict[str, str] | None) -> str | None:
    return (labels or {}).get(LABEL_QUEUE) or None


def admission_of(workload: WorkloadView, flavors: dict[str, Obj]) -> Admission:
    """What the admission puts on each role's pods: each assigned flavor's node labels and
    tolerations (Kueue's podset.FromAssignment), then the admission checks' updates."""
    pod_sets = []
    for assignment in workload.assignments:
        name = str(assignment.get("name"))
        names = dict(assignment.get("flavors") or {})
        specs = [flavors.get(flavor) or {} for flavor in sorted(set(names.values()))]
        selector = {k: v for spec in specs for k, v in (spec.get("nodeLabels") or {}).items()}
        tolerations = [t for spec in specs for t in spec.get("tolerations") or []]
        labels: dict[str, str] = {}
        annotations: dict[str, str] = {}
        for update in (u for u in workload.updates if u.get("name") == name):
            labels.update(update.get("labels") or {})
            annotations.update(update.get("annotations") or {})
            selector.update(update.get("nodeSelector") or {})
            tolerations += update.get("tolerations") or []
        pod_sets.append(
            PodSetAdmission(
                name=name,
                flavors=names,
                node_selector=selector,
                tolerations=[Toleration.model_validate(t) for t in tolerations],
                labels=labels,
                annotations=annotations,
            )
        )
    return Admission(workload=workload.name, cluster_queue=workload.cluster_queue or "", pod_sets=pod_sets)


def describe(admission: Admission) -> str:
    flavors = sorted({f for p in admission.pod_sets for f in p.flavors.values()})
    on = f" on {', '.join(flavors)}" if flavors else ""
    return f"admitted by ClusterQueue {admission.cluster_queue}{on}"


def waiting_reason(queue: str, workload: WorkloadView | None) -> tuple[str, str]:
    """Why a queued job does not run yet, in Kueue's own words where it gave some."""
    if workload is None:
        return "Pending", f"creating its Workload in LocalQueue {queue}"
    evicted = workload.condition("Evicted") if workload.true("Evicted") else None
    if evicted is not None:
        return "Evicted", f"evicted by Kueue ({evicted.get('reason')}): {evicted.get('message', '')}"
    waiting = workload.condition("QuotaReserved") or workload.condition("Admitted")
    said = f": {waiting['message']}" if waiting and waiting.get("message") else ""
    reason = waiting.get("reason") if waiting else None
    return str(reason or "Pending"), f"waiting in LocalQueue {queue} for admission{said}"


def _with(conditions: tuple[Obj, ...], changes: list[Obj], now: datetime) -> list[Obj]:
    """The conditions with `changes` set (type, status, reason, message); a transition time moves
    only when the status does."""
    by_type = {c["type"]: dict(c) for c in conditions}
    for change in changes:
        old = by_type.get(change["type"])
        moved = old is None or old.get("status") != change["status"]
        stamp = format_time(now) if moved or old is None else old.get("lastTransitionTime")
        by_type[change["type"]] = {**change, "lastTransitionTime": stamp}
    return list(by_type.values())


def _condition(type_: str, value: bool, reason: str, message: str) -> Obj:
    return {"type": type_, "status": "True" if value else "False", "reason": reason, "message": message}


def give_back(workload: WorkloadView, now: datetime) -> WorkloadPatch:
    """The job stopped after its eviction: the quota is given back (Kueue's
    UnsetQuotaReservationWithCondition, and Requeued), so Kueue queues the Workload again."""
    evicted = workload.condition("Evicted") or {}
    message = str(evicted.get("message") or "evicted")
    requeued = evicted.get("reason") in ("Preempted", "NodeFailures")
    changes = [
        _condition("Requeued", requeued, str(evicted.get("reason") or "Evicted"), message),
        _condition("QuotaReserved", False, "Pending", message),
        _condition("Admitted", False, "NoReservation", "The workload has no reservation"),
    ]
    status = {"admission": None, "conditions": _with(workload.conditions, changes, now)}
    return WorkloadPatch(workload.name, workload.resource_version, status)


def finish(workload: WorkloadView, succeeded: bool, message: str, now: datetime) -> WorkloadPatch:
    reason = "Succeeded" if succeeded else "Failed"
    conditions = _with(workload.conditions, [_condition("Finished", True, reason, message)], now)
    return WorkloadPatch(workload.name, workload.resource_version, {"conditions": conditions})


def pods_ready(workload: WorkloadView, now: datetime) -> WorkloadPatch:
    ready = _condition(
        "PodsReady", True, "PodsReady", "All pods reached readiness and the workload is running"
    )
    conditions = _with(workload.conditions, [ready], now)
    return WorkloadPatch(workload.name, workload.resource_version, {"conditions": conditions})
