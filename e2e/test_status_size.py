"""The status of a job at the CRD's limits, written by a real API server into etcd.

etcd takes a request of at most 1.5 MiB: the whole job, its spec, metadata and managedFields with its
status. A job of 1,000 parameter servers and 10,000 workers with a name of the longest length has a
record of every pod in status.tracking; the status is written as the operator writes it (a merge
patch of the status subresource, from the status models), and read back as it reads it. No operator
and no pods: 11,000 simulated pods are more than this machine's control plane runs next to others.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from kubernetes import client

from e2e import psjobs
from psoperator.api.crd_rules import MAX_JOB_NAME_LENGTH
from psoperator.api.models import (
    MAX_REPLICAS,
    MAX_WORKERS,
    PSTrainingJobStatus,
    StartError,
    TrackedPod,
    Tracking,
)
from psoperator.api.vocabulary import Phase
from psoperator.kube import Kube

pytestmark = pytest.mark.cluster

ETCD_REQUEST_LIMIT = 1536 * 1024
NAME = "a" * MAX_JOB_NAME_LENGTH


def _size(obj: Any) -> int:
    return len(json.dumps(obj, separators=(",", ":")))


def _at_the_limits(unable_to_start: bool) -> PSTrainingJobStatus:
    """A Running job's status with every pod tracked, each unable to start if `unable_to_start`."""
    names = [
        f"{NAME}-{role}-{i}"
        for role, count in (("ps", MAX_REPLICAS), ("worker", MAX_WORKERS))
        for i in range(count)
    ]
    uids = {name: str(uuid.uuid4()) for name in names}
    since = "2026-11-29T12:00:00Z"
    errors = {name: StartError(uid=uid, restarts=0, since=since, told=True) for name, uid in uids.items()}
    return PSTrainingJobStatus(
        phase=Phase.RUNNING,
        tracking=Tracking(
            psEstablished=True,
            pods={name: TrackedPod(uid=uid, restarts=0, sidecarRestarts=0) for name, uid in uids.items()},
            startErrors=errors if unable_to_start else None,
        ),
    )


@pytest.mark.parametrize("unable_to_start", [False, True], ids=["running", "unable-to-start"])
def test_the_status_of_a_job_at_the_crds_limits_is_written_with_small_managed_fields(
    k8s: client.ApiClient, namespace: str, crd: str, unable_to_start: bool
) -> None:
    """Written, read back as the same records; the job stays well within etcd's limit, and the
    status write's managedFields name status.tracking, not its 11,000 pods."""
    template = {"spec": {"containers": [{"name": "trainer"}]}}
    body = psjobs.manifest(
        NAME, ps={"replicas": MAX_REPLICAS, "template": template}, worker={"replicas": MAX_WORKERS}
    )
    created = psjobs.create(k8s, namespace, body)
    status = _at_the_limits(unable_to_start)
    patch = status.model_dump(by_alias=True, exclude_none=True, mode="json")
    version = created["metadata"]["resourceVersion"]
    Kube(k8s).patch_job_status(namespace, NAME, patch, version)

    stored = psjobs.get(k8s, namespace, NAME)
    assert stored is not None
    assert PSTrainingJobStatus.model_validate(stored["status"]).tracking == status.tracking
    managed = [m for m in stored["metadata"]["managedFields"] if m.get("subresource") == "status"]
    sizes = {"job": _size(stored), "status": _size(stored["status"]), "managedFields": _size(managed)}
    print(f"sizes at the CRD's limits ({'unable to start' if unable_to_start else 'running'}): {sizes}")
    assert sizes["job"] < ETCD_REQUEST_LIMIT * 2 / 3, sizes
    assert sizes["managedFields"] < 4096, managed
