"""The objects the structure-aware harnesses start from: jobs, statuses, pods, children and nodes as
the API shows them, from the unit tests' builders and the examples."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from psoperator.api.labels import LABEL_QUEUE
from psoperator.contract import ExitCode
from psoperator.render import RenderOptions, render_children
from psoperator.timeutil import format_time
from tests.unit.builders import JOB, NOW, NS, came_up, chief_job, job, pod, running_cluster, tracking_of

Obj = dict[str, Any]
EXAMPLES = Path(__file__).parents[2] / "examples"


def _example(path: str) -> Obj:
    found: Obj = next(
        d for d in yaml.safe_load_all((EXAMPLES / path).read_text()) if d["kind"] == "PSTrainingJob"
    )
    return job(**found["spec"])


def specs() -> list[Obj]:
    """Specs that use every field of the API."""
    s3 = {
        "dir": "s3://bucket/ctr",
        "s3": {
            "endpoint": "http://seaweedfs.storage:8333",
            "region": "us-east-1",
            "addressingStyle": "path",
            "credentialsSecret": {"name": "store", "accessKeyIdKey": "id", "secretAccessKeyKey": "secret"},
            "shareWithWorkers": True,
        },
        "intervalSeconds": 600,
    }
    policies = {
        "failurePolicy": {
            "maxRestarts": 3,
            "permanentExitCodes": [1, 2, 3],
            "workerPermanentExit": "Record",
            "stallTimeoutSeconds": 600,
            "schedulingTimeoutSeconds": 300,
            "nodeLostTimeoutSeconds": 0,
            "checkpointBeforeStopSeconds": 30,
            "startupErrorGraceSeconds": 60,
        },
        "runPolicy": {
            "activeDeadlineSeconds": 3600,
            "ttlSecondsAfterFinished": 60,
            "cleanPodPolicy": "Running",
        },
        "scheduling": {"schedulerName": "volcano", "priorityClassName": "high"},
        "networkPolicy": {"enabled": False},
    }
    sidecar = {
        "template": {
            "metadata": {"annotations": {"psoperator.io/trainer-container": "trainer"}},
            "spec": {
                "containers": [
                    {"name": "fluent-bit", "image": "fluent-bit:3"},
                    {
                        "name": "trainer",
                        "env": [{"name": "DATA", "value": "/data"}],
                        "ports": [{"name": "metrics", "containerPort": 9090}],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    },
                ],
                "volumes": [{"name": "data", "emptyDir": {}}],
            },
        }
    }
    return [
        job()["spec"],
        _example("ctr-job.yaml")["spec"],
        _example("plain-tf/job.yaml")["spec"],
        job(checkpoint=s3, **policies)["spec"],
        job(checkpoint={"dir": "gs://bucket/ctr"}, ps={"replicas": 100}, worker={"replicas": 1000})["spec"],
        job(
            worker=sidecar,
            evaluator=sidecar,
            model={"embeddings": [{"name": "ids", "rows": 10**9, "dim": 64}]},
        )["spec"],
        job(runPolicy={"suspend": True})["spec"],
    ]


def statuses() -> list[Obj]:
    """Statuses of a job at several points of its life, and tracking in the forms of older versions."""
    old_tracking = {
        "psEstablished": True,
        "pods": {
            f"{JOB}-ps-0": "ps-0-uid/0",
            f"{JOB}-ps-1": "ps-1-uid/1/2",
            f"{JOB}-evaluator-0": {"uid": "ev-uid", "restarts": 1, "disruption": "PreemptionByScheduler"},
        },
        "startErrors": {f"{JOB}-worker-1": "w-1-uid/0/2026-11-29T11:00:00Z/told"},
    }
    later = came_up(
        phase="Running",
        restarts=2,
        countedRestarts=1,
        restartCheckpointStep=100,
        step=150,
        stepTime=format_time(NOW),
        resumedFromStep=100,
        checkpoint={"step": 140, "path": "/ckpt/ckpt-140", "time": format_time(NOW)},
        shape={"ps": 2, "workers": 2, "psResources": {"trainer": {"limits": {"memory": "8Gi"}}}},
        lastFailure={
            "role": "ps",
            "index": 1,
            "reason": "OOMKilled",
            "time": format_time(NOW),
            "exitCode": 137,
        },
        lastPlannedStop={"cause": "Drain", "pods": [f"{JOB}-ps-1"], "uids": ["u"], "time": format_time(NOW)},
        startTime=format_time(NOW),
        tracking={**tracking_of(running_cluster(attempt=2)), "recycling": {f"{JOB}-ps-0": "old-uid"}},
        admission={
            "workload": f"{JOB}-2ps-2w",
            "clusterQueue": "cq",
            "podSets": [{"name": "ps", "flavors": {"cpu": "highmem"}, "nodeSelector": {"pool": "highmem"}}],
        },
        observedGeneration=1,
    )
    return [
        {},
        came_up(phase="Running", tracking=tracking_of(running_cluster())),
        came_up(phase="Restarting", restarts=1, tracking=old_tracking),
        later,
        {**later, "phase": "Suspended"},
        {**later, "phase": "Failed", "completionTime": format_time(NOW)},
        {"phase": "Queued"},
    ]


def pods() -> list[Obj]:
    """Pods of every role, in the states the policies tell apart."""
    terminated = {"exitCode": int(ExitCode.RETRYABLE), "reason": "Error", "finishedAt": format_time(NOW)}
    deleting = pod("ps", 1, deleting=True)
    deleting["metadata"]["deletionGracePeriodSeconds"] = 30
    return [
        *running_cluster(),
        pod("chief", 0, attempt=0, phase="Failed", terminated={**terminated, "message": '{"step": 5}'}),
        pod("chief", 0, attempt=1, phase="Succeeded", terminated={"exitCode": 0, "reason": "Completed"}),
        pod("ps", 0, restarts=2, last_terminated={"exitCode": 137, "reason": "OOMKilled"}),
        pod("ps", 1, disruption="PreemptionByScheduler"),
        deleting,
        pod("worker", 3, waiting="ImagePullBackOff", phase="Pending"),
        pod("worker", 0, sidecar={"restartCount": 3, "lastState": {"terminated": {"exitCode": 1}}}),
        pod("evaluator", 0, unschedulable="0/3 nodes are available"),
    ]


def workload() -> Obj:
    rendered = next(c for c in children(queued=True) if c["kind"] == "Workload")
    admission = {
        "clusterQueue": "cq",
        "podSetAssignments": [{"name": "ps", "flavors": {"cpu": "highmem"}, "count": 2}],
    }
    conditions = [
        {"type": t, "status": "True", "reason": "R", "lastTransitionTime": format_time(NOW)}
        for t in ("QuotaReserved", "Admitted")
    ]
    checks = [{"name": "prov", "state": "Ready", "podSetUpdates": [{"name": "ps", "labels": {"zone": "a"}}]}]
    status = {"conditions": conditions, "admission": admission, "admissionChecks": checks}
    return {**rendered, "metadata": {**rendered["metadata"], "resourceVersion": "7"}, "status": status}


def children(queued: bool = False) -> list[Obj]:
    """The children of a job as rendered, with the status their controllers give them."""
    obj = job(evaluator={"template": {"spec": {"containers": [{"name": "trainer"}]}}})
    options = RenderOptions(queue="team-a", priority=("high", 1000)) if queued else RenderOptions()
    rendered = render_children(obj, options)
    statuses: dict[str, Obj] = {
        "StatefulSet": {"replicas": 2, "readyReplicas": 2, "currentRevision": "r1"},
        "Job": chief_job()["status"],
    }
    for child in rendered:
        child["metadata"]["uid"] = f"{child['metadata']['name']}-uid"
        child["metadata"]["resourceVersion"] = "3"
        child["metadata"]["managedFields"] = [
            {"manager": "ps-training-operator", "operation": "Update", "apiVersion": child["apiVersion"]},
            {"manager": "kube-controller-manager", "operation": "Update", "subresource": "status"},
        ]
        if child["kind"] in statuses:
            child["status"] = copy.deepcopy(statuses[child["kind"]])
    return rendered


def nodes() -> list[Obj]:
    ready = {"type": "Ready", "status": "True", "lastTransitionTime": format_time(NOW)}
    return [
        {"metadata": {"name": "node-1"}, "status": {"conditions": [ready]}},
        {
            "metadata": {"name": "node-2"},
            "spec": {"taints": [{"key": "node.kubernetes.io/out-of-service", "effect": "NoExecute"}]},
            "status": {"conditions": [{**ready, "status": "Unknown"}]},
        },
    ]


def queued(obj: Obj) -> Obj:
    """The job labelled for a Kueue LocalQueue."""
    return {**obj, "metadata": {**obj["metadata"], "labels": {LABEL_QUEUE: "team-a"}}}


__all__ = ["JOB", "NOW", "NS", "children", "nodes", "pods", "queued", "specs", "statuses", "workload"]
