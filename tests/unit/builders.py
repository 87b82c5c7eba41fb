"""Small builders so a test reads like the objects it means: jobs, pods and Jobs as the API shows them."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

from psoperator.api.labels import ANNOTATION_TRAINER_CONTAINER, LABEL_ATTEMPT, LABEL_JOB, LABEL_ROLE
from psoperator.api.models import TrackedPod, Tracking
from psoperator.observe.failures import TRACKED_ROLES
from psoperator.observe.views import Observed, parse_job, parse_pod
from psoperator.status.tracking import tracked
from psoperator.timeutil import format_time

Obj = dict[str, Any]
NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
JOB = "ctr"
NS = "team-a"


def job(**spec: Any) -> Obj:
    base: Obj = {
        "apiVersion": "psoperator.io/v1alpha1",
        "kind": "PSTrainingJob",
        "metadata": {"name": JOB, "namespace": NS, "uid": "job-uid", "generation": 1},
        "spec": {
            "image": "trainer:1",
            "chief": {"template": {"spec": {"containers": [{"name": "trainer"}]}}},
            "ps": {"replicas": 2, "template": {"spec": {"containers": [{"name": "trainer"}]}}},
            "worker": {"replicas": 2, "template": {"spec": {"containers": [{"name": "trainer"}]}}},
            "checkpoint": {"dir": "/ckpt"},
        },
    }
    for key, value in spec.items():
        if isinstance(value, dict) and isinstance(base["spec"].get(key), dict):
            base["spec"][key] = {**base["spec"][key], **value}
        else:
            base["spec"][key] = value
    return base


def with_status(obj: Obj, **status: Any) -> Obj:
    result = copy.deepcopy(obj)
    result["status"] = status
    return result


def pod(
    role: str,
    index: int,
    *,
    uid: str | None = None,
    phase: str = "Running",
    restarts: int = 0,
    attempt: int | None = None,
    terminated: Obj | None = None,
    last_terminated: Obj | None = None,
    waiting: str | None = None,
    disruption: str | None = None,
    deleting: bool = False,
    ready: bool = True,
    created: datetime = NOW - timedelta(minutes=10),
    ip: str | None = "10.0.0.1",
    sidecar: Obj | None = None,
    unschedulable: str | None = None,
    job_uid: str | None = None,
) -> Obj:
    """A pod as the API shows it; `sidecar` adds the status of a `fluent-bit` container, which the
    kubelet lists before the trainer's (it sorts statuses by container name); `unschedulable` is the
    scheduler's message of a PodScheduled=False condition since the pod's creation. A chief pod is
    owned by the chief Job of its attempt (`chief_job`), or by the Job of uid `job_uid`."""
    name = f"{JOB}-{role}-{index}" if role != "chief" else f"{JOB}-chief-{attempt or 0}x"
    labels = {LABEL_JOB: JOB, LABEL_ROLE: role, "apps.kubernetes.io/pod-index": str(index)}
    if attempt is not None:
        labels[LABEL_ATTEMPT] = str(attempt)
    state: Obj = {"running": {}}
    if terminated is not None:
        state = {"terminated": terminated}
    elif waiting is not None:
        state = {"waiting": {"reason": waiting, "message": f"{waiting} happened"}}
    conditions = [{"type": "Ready", "status": "True" if ready and phase == "Running" else "False"}]
    if disruption:
        conditions.append({"type": "DisruptionTarget", "status": "True", "reason": disruption})
    if unschedulable is not None:
        scheduled = {"status": "False", "reason": "Unschedulable", "message": unschedulable}
        conditions.append({"type": "PodScheduled", **scheduled, "lastTransitionTime": format_time(created)})
    meta: Obj = {
        "name": name,
        "uid": uid or f"{name}-uid",
        "labels": labels,
        "annotations": {ANNOTATION_TRAINER_CONTAINER: "trainer"},
        "creationTimestamp": format_time(created),
    }
    if deleting:
        meta["deletionTimestamp"] = format_time(NOW)
    if role == "chief":
        uid_of_job = job_uid or chief_job_uid(attempt or 0)
        meta["ownerReferences"] = [
            {"kind": "Job", "name": f"{JOB}-chief", "uid": uid_of_job, "controller": True}
        ]
    trainer = {
        "name": "trainer",
        "restartCount": restarts,
        "state": state,
        **({"lastState": {"terminated": last_terminated}} if last_terminated else {}),
    }
    sidecars = (
        [{"name": "fluent-bit", "restartCount": 0, "state": {"running": {}}, **sidecar}] if sidecar else []
    )
    return {
        "metadata": meta,
        "spec": {
            "nodeName": "node-1",
            "containers": [{"name": "trainer"}, *({"name": "fluent-bit"} for _ in sidecars)],
        },
        "status": {
            "phase": phase,
            "podIP": ip,
            "conditions": conditions,
            "containerStatuses": [*sidecars, trainer],
        },
    }


def chief_job_uid(attempt: int) -> str:
    """The uid of the chief Job of an attempt, as `chief_job` makes it and its pods name it."""
    return f"{JOB}-chief-{attempt}-uid"


def chief_job(
    attempt: int = 0,
    *,
    failed: str | None = None,
    complete: bool = False,
    completed: datetime | None = None,
    uid: str | None = None,
) -> Obj:
    """A chief Job; `completed` is its status.completionTime (the Job controller sets it on success);
    `uid` replaces the attempt's (a Job made again for the attempt)."""
    conditions = []
    if failed:
        conditions.append(
            {"type": "Failed", "status": "True", "reason": failed, "message": f"{failed} message"}
        )
    if complete:
        conditions.append({"type": "Complete", "status": "True"})
    return {
        "kind": "Job",
        "metadata": {
            "name": f"{JOB}-chief",
            "uid": uid or chief_job_uid(attempt),
            "labels": {LABEL_JOB: JOB, LABEL_ATTEMPT: str(attempt)},
        },
        "spec": {"suspend": False},
        "status": {
            "conditions": conditions,
            "active": 0 if (failed or complete) else 1,
            **({"completionTime": format_time(completed)} if completed else {}),
        },
    }


def observed(pods: list[Obj], job_obj: Obj | None = None) -> Observed:
    children: dict[tuple[str, str], Obj] = {
        ("Service", f"{JOB}-ps"): {},
        ("NetworkPolicy", f"{JOB}-peers"): {},  # the peers' policy: its pods are isolated
    }
    if job_obj is not None:
        children[("Job", job_obj["metadata"]["name"])] = job_obj
    return Observed(
        pods=[parse_pod(p) for p in pods],
        chief_job=parse_job(job_obj) if job_obj is not None else None,
        children=children,
    )


def running_cluster(attempt: int = 0, ps_restarts: int = 0) -> list[Obj]:
    return [
        pod("chief", 0, attempt=attempt),
        pod("ps", 0, restarts=ps_restarts),
        pod("ps", 1),
        pod("worker", 0),
        pod("worker", 1),
    ]


def came_up(**status: Any) -> Obj:
    """The status of a job whose children were created and whose pods have all run: the start of
    its story (the Created and AllRunning events) is told already."""
    created = {"type": "Created", "status": "True", "reason": "ChildrenCreated", "lastTransitionTime": "x"}
    return {"conditions": [created], "allRunningTime": format_time(NOW - timedelta(minutes=9)), **status}


def tracked_in(status: Obj) -> dict[str, TrackedPod]:
    """The pods a written status tracks, by name (its StatefulSet pods are stored as rows)."""
    return Tracking.model_validate(status.get("tracking") or {}).pods


def tracking_of(pods: list[Obj]) -> Obj:
    views = [parse_pod(p) for p in pods]
    entries = {v.name: tracked(v).model_dump(by_alias=True) for v in views if v.role in TRACKED_ROLES}
    return {"psEstablished": True, "pods": entries}
