"""The tracking memory in the job's status: typed records, and the strings earlier versions stored."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from psoperator.api.crd import openapi_schema
from psoperator.api.crd_rules import MAX_JOB_NAME_LENGTH
from psoperator.api.labels import LABEL_JOB
from psoperator.api.models import (
    MAX_REPLICAS,
    MAX_WORKERS,
    Condition,
    FailureRecord,
    PlannedStop,
    PSTrainingJobStatus,
    StartError,
    TrackedPod,
    Tracking,
)
from psoperator.api.vocabulary import ConditionType
from psoperator.plan.stages import plan_reconcile
from psoperator.status.patch import merge_patch
from psoperator.timeutil import format_time
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
    with_status,
)

BASE = running_cluster()


def _as_strings(pods: list[dict[str, Any]]) -> dict[str, str]:
    """The tracking of BASE as an earlier version stored it: "uid/restarts/sidecar restarts"."""
    tracked = [p for p in pods if p["metadata"]["labels"]["psoperator.io/role"] != "chief"]
    return {p["metadata"]["name"]: f"{p['metadata']['uid']}/0/0" for p in tracked}


def test_the_strings_an_earlier_version_stored_are_read_as_records() -> None:
    tracking = Tracking.model_validate(
        {
            "psEstablished": True,
            "pods": {"ctr-ps-0": "uid-a/2/1", "ctr-worker-0": "uid-b/3", "typed": {"uid": "uid-c"}},
            "startErrors": {
                "ctr-ps-1": "uid-d/1/2026-11-29T11:55:00Z/told",
                "ctr-worker-1": "uid-e/0/2026-11-29T11:59:00Z",
                "garbled": "nonsense",
            },
        }
    )
    assert tracking.pods == {
        "ctr-ps-0": TrackedPod(uid="uid-a", restarts=2, sidecarRestarts=1),
        "ctr-worker-0": TrackedPod(uid="uid-b", restarts=3),
        "typed": TrackedPod(uid="uid-c"),
    }
    assert tracking.start_errors == {
        "ctr-ps-1": StartError(uid="uid-d", restarts=1, since="2026-11-29T11:55:00Z", told=True),
        "ctr-worker-1": StartError(uid="uid-e", restarts=0, since="2026-11-29T11:59:00Z"),
    }


@pytest.mark.parametrize("stored", ["strings", "records"])
def test_a_job_running_through_the_upgrade_keeps_its_tracking_and_stores_rows(stored: str) -> None:
    """From the strings of the oldest versions or the records by name of the last one: the first
    write stores rows and takes the pods' old entries away."""
    running = with_status(job(), **came_up(phase="Running", tracking={"psEstablished": True}))
    running["status"]["tracking"]["pods"] = (
        _as_strings(BASE) if stored == "strings" else tracking_of(BASE)["pods"]
    )
    quiet = plan_reconcile(running, observed(BASE, chief_job(0)), None, NOW)
    assert not quiet.restarted and not quiet.failures
    rows = {
        "ctr-ps": ["ctr-ps-0-uid/0/0", "ctr-ps-1-uid/0/0"],
        "ctr-worker": ["ctr-worker-0-uid/0/0", "ctr-worker-1-uid/0/0"],
    }
    assert quiet.status["tracking"]["statefulSets"] == rows
    patch = merge_patch(running["status"], quiet.status)["tracking"]
    assert patch == {"pods": dict.fromkeys(running["status"]["tracking"]["pods"]), "statefulSets": rows}
    lost = [p if p["metadata"]["name"] != "ctr-ps-1" else pod("ps", 1, uid="fresh") for p in BASE]
    restart = plan_reconcile(running, observed(lost, chief_job(0)), None, NOW)
    assert restart.restarted and restart.failures == [("ps", "Replaced")]


def test_a_disruption_seen_is_recorded_so_the_pods_loss_is_never_counted_unseen() -> None:
    """A PS marked for preemption (DisruptionTarget, still running) and then gone while the operator
    was away (a restart, a failover: its memory of departed pods is empty) is a disruption, read
    from the status: no counted restart, where an unexplained replacement would count."""
    running = with_status(job(), **came_up(phase="Running", restarts=0, countedRestarts=0))
    running["status"]["tracking"] = {"psEstablished": True, "pods": _as_strings(BASE)}
    marked = [p if p["metadata"]["name"] != "ctr-ps-1" else pod("ps", 1, disruption="PreemptionByScheduler")
              for p in BASE]  # fmt: skip
    seen = plan_reconcile(running, observed(marked, chief_job(0)), None, NOW)
    assert not seen.restarted and not seen.failures and seen.write_now
    assert tracked_in(seen.status)["ctr-ps-1"].disruption == "PreemptionByScheduler"

    later = with_status(job(), **{**running["status"], "tracking": seen.status["tracking"]})
    replaced = [p if p["metadata"]["name"] != "ctr-ps-1" else pod("ps", 1, uid="fresh") for p in BASE]
    restart = plan_reconcile(later, observed(replaced, chief_job(0)), None, NOW)
    assert restart.restarted and restart.failures == [("ps", "Preempted")]
    assert restart.status["countedRestarts"] == 0 and restart.status["restarts"] == 1


# etcd takes a request of at most 1.5 MiB: the whole job, its spec, metadata and managedFields with
# its status.
ETCD_REQUEST_LIMIT = 1536 * 1024
LONG_NAME = "a" * MAX_JOB_NAME_LENGTH


def _named(obj: dict[str, Any], name: str, uid: str | None = None) -> dict[str, Any]:
    """`obj` of the job LONG_NAME (a builder makes them for the job "ctr"), with `uid` if given."""
    meta = obj["metadata"]
    meta["name"] = meta["name"].replace("ctr", name, 1)
    meta["labels"] = {**meta.get("labels", {}), LABEL_JOB: name}
    for owner in meta.get("ownerReferences", []):
        owner["name"] = owner["name"].replace("ctr", name, 1)
    if uid is not None:
        meta["uid"] = uid
    return obj


def _at_the_crds_limits() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A job of MAX_REPLICAS parameter servers and MAX_WORKERS workers with a name of the longest
    length, and its pods running, their uids as the API server makes them."""
    template = {"spec": {"containers": [{"name": "trainer"}]}}
    spec = {"ps": {"replicas": MAX_REPLICAS, "template": template}}
    big = _named(job(**spec, worker={"replicas": MAX_WORKERS, "template": template}), LONG_NAME)
    pods = [_named(pod("chief", 0, attempt=0), LONG_NAME, str(uuid.uuid4()))] + [
        _named(pod(role, i), LONG_NAME, str(uuid.uuid4()))
        for role, count in (("ps", MAX_REPLICAS), ("worker", MAX_WORKERS))
        for i in range(count)
    ]
    return big, pods


def _size(status: dict[str, Any]) -> int:
    """Bytes of the status as the API server stores it (compact JSON)."""
    return len(json.dumps(status, separators=(",", ":")))


def test_the_status_of_a_job_at_the_crds_limits_takes_a_third_of_what_etcd_takes() -> None:
    """Every pod of the job is tracked. As a map of records by pod name it would take 1.4 MiB (and
    as many entries in managedFields, another MiB): every status write would fail, and the job,
    whose status is written before it acts, would never act. Stored as rows it is under a third of etcd's
    limit, and the next reconcile reads the same records back: nothing failed, nothing new to track."""
    big, pods = _at_the_crds_limits()
    chief = _named(chief_job(0), LONG_NAME)
    seen = observed(pods, chief)
    plan = plan_reconcile(with_status(big, **came_up(phase="Running")), seen, None, NOW)
    assert plan.status["phase"] == "Running" and len(tracked_in(plan.status)) == MAX_REPLICAS + MAX_WORKERS
    assert _size(plan.status) < ETCD_REQUEST_LIMIT / 3, _size(plan.status)
    again = plan_reconcile(with_status(big, **plan.status), seen, None, NOW)
    assert again.status["tracking"] == plan.status["tracking"] and again.failures == []


def test_at_the_most_a_status_holds_at_the_crds_limits_it_takes_under_two_thirds() -> None:
    """The most a status holds at the CRD's limits: every worker tracked and unable to start (a
    wrong image: a start error each, told), every parameter server recycled by a restart and named
    by the planned stop before it, the longest messages."""
    ps = [f"{LONG_NAME}-ps-{i}" for i in range(MAX_REPLICAS)]
    workers = {f"{LONG_NAME}-worker-{i}": str(uuid.uuid4()) for i in range(MAX_WORKERS)}
    recycled = {name: str(uuid.uuid4()) for name in ps}
    since, message = format_time(NOW), "m" * 1024
    status = PSTrainingJobStatus(
        tracking=Tracking(
            psEstablished=False,
            pods={
                name: TrackedPod(uid=uid, restarts=99, sidecarRestarts=99) for name, uid in workers.items()
            },
            startErrors={
                name: StartError(uid=uid, restarts=99, since=since, told=True)
                for name, uid in workers.items()
            },
            recycling=recycled,
        ),
        lastPlannedStop=PlannedStop(
            cause="Drain", pods=ps, uids=list(recycled.values()), time=since, reason=message
        ),
        lastFailure=FailureRecord(role="ps", reason="StartupError", message=message, time=since),
        conditions=[
            Condition(type=t, status="True", reason="R", message=message, last_transition_time=since)
            for t in ConditionType
        ],
    )
    written = status.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert _size(written) < ETCD_REQUEST_LIMIT * 2 / 3, _size(written)
    assert PSTrainingJobStatus.model_validate(written) == status


def test_rows_keep_every_record_and_start_error_and_leave_the_others_by_name() -> None:
    """A row per StatefulSet pod (its disruption, its start error, no sidecar count from the
    oldest versions kept as unknown, empty rows where no pod is); by name, what is no StatefulSet
    pod (the evaluator's), a name whose ordinal is not the StatefulSet's form, and a start error
    of another episode than the record's (or of a pod not tracked: the chief)."""
    tracking = Tracking(
        psEstablished=True,
        pods={
            "ctr-ps-0": TrackedPod(
                uid="a", restarts=2, sidecarRestarts=1, disruption="PreemptionByScheduler"
            ),
            "ctr-ps-2": TrackedPod(uid="b", restarts=0),
            "ctr-worker-1": TrackedPod(uid="c", restarts=1, sidecarRestarts=0),
            "ctr-worker-0": TrackedPod(uid="d", restarts=3, sidecarRestarts=0),
            "ctr-evaluator-0-x7k2p": TrackedPod(uid="e", restarts=0, sidecarRestarts=0),
            "ctr-worker-007": TrackedPod(uid="f", restarts=0, sidecarRestarts=0),
            f"ctr-worker-{MAX_WORKERS}": TrackedPod(uid="g", restarts=0, sidecarRestarts=0),
        },
        startErrors={
            "ctr-worker-1": StartError(uid="c", restarts=1, since="2026-11-29T11:55:00Z"),
            "ctr-ps-2": StartError(uid="b", restarts=0, since="2026-11-29T11:50:00Z", told=True),
            "ctr-worker-0": StartError(uid="d", restarts=2, since="2026-11-29T11:40:00Z"),
            "ctr-chief-0x": StartError(uid="h", restarts=0, since="2026-11-29T11:45:00Z"),
        },
    )
    written = tracking.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert written["statefulSets"] == {
        "ctr-ps": ["a/2/1/PreemptionByScheduler", "", "b/0///2026-11-29T11:50:00Z/told"],
        "ctr-worker": ["d/3/0", "c/1/0//2026-11-29T11:55:00Z"],
    }
    assert set(written["pods"]) == {"ctr-evaluator-0-x7k2p", "ctr-worker-007", f"ctr-worker-{MAX_WORKERS}"}
    assert set(written["startErrors"]) == {"ctr-worker-0", "ctr-chief-0x"}
    assert Tracking.model_validate(written) == tracking
    assert Tracking.model_validate(json.loads(json.dumps(written))) == tracking


def test_the_crd_keeps_the_tracking_whole_so_managed_fields_name_none_of_its_entries() -> None:
    tracking = openapi_schema()["properties"]["status"]["properties"]["tracking"]
    assert tracking["x-kubernetes-map-type"] == "atomic"


def test_an_entry_that_cannot_be_read_is_left_out_and_the_rest_is_read() -> None:
    kept = {"uid": "ev-uid", "restarts": 1}
    pods = {
        "ctr-evaluator-0": kept,
        "no-uid": {"restarts": 1},
        "negative": {"uid": "u", "restarts": -1},
        "beyond-64-bits": {"uid": "u", "sidecarRestarts": 2**63},
        "odd-type": 7,
    }
    errors = {"old": "w-uid/\u00b2/2026-11-29T11:00:00Z", "record": {"uid": "w-uid"}}
    tracking = Tracking.model_validate({"pods": pods, "startErrors": errors})
    assert tracking.pods == {"ctr-evaluator-0": TrackedPod.model_validate(kept)}
    assert not tracking.start_errors


@pytest.mark.parametrize(
    "count",
    [
        "\u00b2",  # a digit to isdigit(), not to int()
        "1" * 5000,  # more digits than int() reads
        str(2**63),  # beyond the status's 64 bits
    ],
)
def test_an_odd_count_in_a_string_or_row_reads_as_unknown(count: str) -> None:
    stored = {
        "pods": {"ctr-evaluator-0": f"ev-uid/{count}/{count}"},
        "statefulSets": {"ctr-ps": [f"u/{count}"]},
    }
    pods = Tracking.model_validate(stored).pods
    assert pods["ctr-evaluator-0"] == TrackedPod(uid="ev-uid", restarts=0)
    assert pods["ctr-ps-0"] == TrackedPod(uid="u", restarts=0)
