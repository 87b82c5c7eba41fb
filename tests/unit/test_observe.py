"""Parsing pods: the training container is found by name, whatever the kubelet's order of statuses."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from psoperator.api.labels import ANNOTATION_TRAINER_CONTAINER
from psoperator.observe.views import parse_job, parse_pod, slim_child
from psoperator.observe.workload import parse_workload
from psoperator.plan.children import plan_children
from psoperator.render import render_children
from psoperator.timeutil import format_time
from tests.unit.builders import NOW, chief_job, job, observed, pod

OOM = {"exitCode": 137, "reason": "OOMKilled", "message": ""}


def test_the_trainers_status_is_read_by_name_when_a_sidecar_sorts_first() -> None:
    raw = pod(
        "chief",
        0,
        attempt=0,
        phase="Failed",
        terminated={"exitCode": 138, "reason": "Error"},
        sidecar={"state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
    )
    assert raw["status"]["containerStatuses"][0]["name"] == "fluent-bit"
    view = parse_pod(raw)
    assert view.terminated is not None and view.terminated.exit_code == 138


def test_sidecar_restarts_are_kept_apart_from_the_trainers() -> None:
    view = parse_pod(pod("ps", 0, restarts=1, last_terminated=OOM, sidecar={"restartCount": 3}))
    assert view.restarts == 1
    assert view.last_terminated is not None and view.last_terminated.reason == "OOMKilled"
    assert view.sidecar_restarts == {"fluent-bit": 3}


def test_without_the_annotation_the_first_container_of_the_pod_spec_is_the_trainer() -> None:
    """Pods rendered before the annotation existed: the spec keeps the template's order, statuses do not."""
    raw = pod("ps", 0, restarts=2, sidecar={"restartCount": 5})
    del raw["metadata"]["annotations"][ANNOTATION_TRAINER_CONTAINER]
    view = parse_pod(raw)
    assert (view.restarts, view.sidecar_restarts) == (2, {"fluent-bit": 5})


def test_the_annotation_names_the_trainer_wherever_it_is_in_the_spec() -> None:
    """A webhook may put its proxy first in the pod spec; the annotation still names the trainer."""
    raw = pod("ps", 0, restarts=2, sidecar={"restartCount": 5})
    raw["spec"]["containers"].reverse()
    view = parse_pod(raw)
    assert (view.restarts, view.sidecar_restarts) == (2, {"fluent-bit": 5})


def test_a_pod_without_statuses_yet() -> None:
    raw = pod("ps", 0)
    del raw["status"]["containerStatuses"]
    view = parse_pod(raw)
    assert (view.restarts, view.sidecar_restarts, view.terminated) == (0, {}, None)


def test_an_unschedulable_pod_says_why_and_since_when() -> None:
    message = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
    view = parse_pod(pod("worker", 1, phase="Pending", unschedulable=message, created=NOW))
    assert view.unscheduled is not None
    assert (view.unscheduled.reason, view.unscheduled.message, view.unscheduled.since) == (
        "Unschedulable",
        message,
        format_time(NOW),
    )
    assert parse_pod(pod("worker", 1)).unscheduled is None


def test_a_deleted_pod_says_when_its_deletion_was_asked() -> None:
    obj = pod("ps", 0)
    # The API server sets deletionTimestamp to the request plus the grace period.
    obj["metadata"].update(deletionTimestamp="2026-11-29T12:00:30Z", deletionGracePeriodSeconds=30)
    view = parse_pod(obj)
    assert view.deleting and view.deleted_at == "2026-11-29T12:00:00Z"
    assert parse_pod(pod("ps", 0)).deleted_at is None


def test_a_disrupted_pod_says_since_when() -> None:
    obj = pod("ps", 0, disruption="PreemptionByScheduler")
    obj["status"]["conditions"][-1]["lastTransitionTime"] = format_time(NOW)
    view = parse_pod(obj)
    assert (view.disruption, view.disrupted_at) == ("PreemptionByScheduler", format_time(NOW))


@pytest.mark.parametrize(
    ("where", "value"),
    [
        (("metadata", "labels", "psoperator.io/attempt"), "\u00b2"),  # a digit to isdigit(), not to int()
        (("metadata", "labels", "apps.kubernetes.io/pod-index"), "\u00b2"),
        (("metadata", "resourceVersion"), "\u00b2"),
        (("metadata", "resourceVersion"), "1" * 5000),  # more digits than int() reads
        (("metadata", "labels", "psoperator.io/attempt"), str(2**64)),  # beyond the status's 64 bits
        (("metadata", "deletionTimestamp"), 1),
        (("metadata", "deletionGracePeriodSeconds"), 10**11),  # before the calendar's first year
        (("status", "podIP"), ["10.0.0.1"]),
    ],
)
def test_an_odd_field_of_a_pod_reads_as_unknown(where: tuple[str, ...], value: Any) -> None:
    obj = pod("ps", 0, attempt=0)
    obj["metadata"]["deletionTimestamp"] = "2026-11-29T12:00:30Z"
    *parents, key = where
    node = obj
    for parent in parents:
        node = node[parent]
    node[key] = value
    view = parse_pod(obj)
    read = {
        "psoperator.io/attempt": view.attempt,
        "apps.kubernetes.io/pod-index": view.index,
        "resourceVersion": view.version,
        "deletionTimestamp": view.deleted_at,
        "deletionGracePeriodSeconds": view.deleted_at,
        "podIP": view.ip,
    }[key]
    assert read in (None, 0)


def _live(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rendered children as the API returns them: a uid, managedFields (of their create and
    their controller's status), a status."""
    live = copy.deepcopy(manifests)
    for obj in live:
        managed = [
            {"manager": "ps-training-operator", "operation": "Update", "fieldsV1": {"f:spec": {}}},
            {"manager": "x", "operation": "Update", "subresource": "status", "fieldsV1": {"f:status": {}}},
        ]
        obj["metadata"] |= {"uid": f"{obj['metadata']['name']}-uid", "managedFields": managed}
        obj["status"] = {"replicas": 1}
    return live


def test_a_slim_child_decides_what_the_whole_child_decides_in_a_fraction_of_its_size() -> None:
    desired = render_children(job())
    live = _live(desired)
    slim = [slim_child(c) for c in live]
    changed = render_children(job(image="trainer:2"))
    for wanted in (desired, changed):
        assert plan_children("job-uid", wanted, slim) == plan_children("job-uid", wanted, live)
    suspended = chief_job(complete=True) | {"spec": {"suspend": True, "template": {"spec": {}}}}
    assert parse_job(slim_child(suspended)) == parse_job(suspended)
    assert len(json.dumps(slim)) < len(json.dumps(live)) / 2
    # Of the managers, which Update entries a patch folds first (it reads their fields fresh).
    create = [{"manager": "ps-training-operator", "operation": "Update"}]
    assert {str(c["metadata"].get("managedFields")) for c in slim} == {str(create)}


def test_a_pod_view_keeps_its_owners_and_version_for_the_cache_and_owned_pods() -> None:
    raw = pod("ps", 0)
    raw["metadata"] |= {
        "resourceVersion": "42",
        "ownerReferences": [{"kind": "StatefulSet", "name": "ctr-ps", "uid": "sts-uid"}, "odd"],
    }
    view = parse_pod(raw)
    assert view.owners == (("StatefulSet", "ctr-ps", "sts-uid"),) and view.version == 42
    assert parse_pod(pod("ps", 0)).version == 0  # none: orders first


def test_the_chief_is_the_pod_of_the_current_attempts_job_and_any_other_live_one_is_former() -> None:
    """By the Job's uid: a Job made again for the attempt (a resumed job) has the deleted one's name
    and attempt, and the deleted one's pod may still run."""
    old, new = pod("chief", 0, attempt=0), pod("chief", 0, attempt=0, uid="new-pod", job_uid="new-job")
    done = pod("chief", 0, attempt=0, uid="done", phase="Succeeded", terminated={"exitCode": 0})
    made_again = observed([old, new, done], chief_job(0, uid="new-job"))
    assert made_again.chief_pod(0) == parse_pod(new) and made_again.chief_pods(0) == [parse_pod(new)]
    assert made_again.former_chiefs(0) == [parse_pod(old)]  # the ended one runs nothing
    jobless = observed([old])
    assert jobless.chief_pod(0) is None and jobless.former_chiefs(0) == [parse_pod(old)]
    first = observed([old], chief_job(0))
    assert first.chief_pod(0) == parse_pod(old) and first.former_chiefs(0) == []
    assert observed([old], chief_job(1)).former_chiefs(1) == [parse_pod(old)]  # an older attempt's


def test_a_job_condition_without_a_type_is_left_out() -> None:
    obj = chief_job(failed="BackoffLimitExceeded")
    obj["status"]["conditions"] += [{"type": ["Complete"], "status": "True"}, None]
    view = parse_job(obj)
    assert (view.failed, view.succeeded, view.failure_reason) == (True, False, "BackoffLimitExceeded")


def test_an_odd_field_of_a_workload_reads_as_missing() -> None:
    admitted = {"type": "Admitted", "status": "True"}
    status = {
        "conditions": [None, {"status": "True"}, admitted],
        "admission": ["cq"],
        "admissionChecks": [None, {"podSetUpdates": [None, {"name": "ps"}]}],
    }
    view = parse_workload({"metadata": {"name": "w", "resourceVersion": 7}, "status": status})
    assert (view.conditions, view.cluster_queue, view.assignments) == ((admitted,), None, ())
    assert (view.updates, view.resource_version) == (({"name": "ps"},), "7")
