"""The apply layer against a recording fake of the API: what it creates, patches and replaces."""

from __future__ import annotations

import asyncio
import copy
import json
import socket
import time
from typing import Any

import aiohttp
import pytest
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from psoperator import GROUP
from psoperator.api.labels import ANNOTATION_HASH, LABEL_ATTEMPT
from psoperator.control.chief_client import NotServing, fetch_progress
from psoperator.kube import FOLD_TRIES, Kube, StaleJob, api_failure, resource_of
from psoperator.managed_fields import folded
from psoperator.observe.views import parse_pod, slim_child
from psoperator.plan.children import ChildChange, ChildVerb, plan_children, with_chief_token
from psoperator.plan.draft import PodDeletion
from psoperator.render import render_chief_token, render_children
from tests.unit.builders import NS, job

Obj = dict[str, Any]


class _Wire:
    """Stands in for urllib3's pool manager under the real client: records each request as it would
    be sent (so the client's own serialization of the body is part of what is tested)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str, Any]] = []
        self.timeouts: list[Any] = []
        self.status = 200  # of every response after `statuses`
        self.statuses: list[int] = []  # of the next responses, in order
        self.answers: list[Obj] = []  # the bodies of the next responses, in order; then {}
        self.by_path: dict[str, Obj] = {}  # the body of every response to a path, before `answers`
        self.delay = 0.0  # seconds before each response

    def request(
        self, method: str, url: str, body: Any = None, headers: Any = None, timeout: Any = None, **_: Any
    ) -> Any:
        content_type = (headers or {}).get("Content-Type", "")
        self.sent.append((method, url, content_type, body))
        self.timeouts.append(timeout)
        time.sleep(self.delay)
        status = self.statuses.pop(0) if self.statuses else self.status
        path = url.removeprefix("https://api.test").split("?")[0]
        answer = self.by_path[path] if path in self.by_path else self.answers.pop(0) if self.answers else {}
        return _Ok(status, json.dumps(answer).encode())


class _Ok:
    reason, headers = "OK", {"content-type": "application/json"}

    def __init__(self, status: int, data: bytes) -> None:
        self.status, self.data = status, data

    def read(self, *_: Any, **__: Any) -> bytes:
        return self.data

    def release_conn(self) -> None:
        pass


class RecordingKube(Kube):
    """The real client with nothing behind it: every request is recorded; GETs list nothing."""

    def __init__(self, **options: Any) -> None:
        api = client.ApiClient(client.Configuration(host="https://api.test"))
        self.wire = _Wire()
        api.rest_client.pool_manager = self.wire  # type: ignore[assignment]
        super().__init__(api_client=api, **options)

    @property
    def calls(self) -> list[tuple[str, str]]:
        return [
            (method, url.removeprefix("https://api.test").split("?")[0]) for method, url, *_ in self.wire.sent
        ]

    @property
    def bodies(self) -> list[tuple[str, Any]]:
        """(content type, body as the API server decodes it) of every request."""
        return [(ct, json.loads(body) if body else None) for _, _, ct, body in self.wire.sent]


def _live(manifests: list[Obj]) -> list[Obj]:
    """The objects as the API returns them: with a uid each."""
    live = copy.deepcopy(manifests)
    for obj in live:
        obj["metadata"]["uid"] = f"{obj['kind']}-{obj['metadata']['name']}-uid"
    return live


def _without_chief(manifests: list[Obj]) -> list[Obj]:
    return [m for m in manifests if m["kind"] != "Job"]


def test_a_missing_child_is_created() -> None:
    desired = render_children(job())
    kube = RecordingKube()
    result = kube.apply_children(NS, "job-uid", desired, _live(_without_chief(desired)))
    assert result.created == ["Job/ctr-chief"]
    assert kube.calls == [("POST", f"/apis/batch/v1/namespaces/{NS}/jobs")]


def test_a_child_the_api_server_fails_holds_up_no_other_and_fails_the_reconcile() -> None:
    desired = render_children(job(networkPolicy={"enabled": False}))
    kube = RecordingKube()
    kube.wire.statuses = [500]  # the first create
    with pytest.raises(ApiException) as failed:
        kube.apply_children(NS, "job-uid", desired, [])
    assert failed.value.status == 500
    assert [method for method, _ in kube.calls] == ["POST"] * len(desired)


POLICIES = f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies"


@pytest.mark.parametrize("status", [403, 422, 500])
def test_no_pod_is_made_when_a_network_policy_cannot_be_created(status: int) -> None:
    """A ResourceQuota, RBAC or an admission webhook refuses it, or the API server fails: the pods
    would run unisolated, so no StatefulSet or Job is created; the rest of the children are."""
    desired = render_children(job(), operator_namespace="ops")
    kube = RecordingKube()
    kube.wire.statuses = [status]  # the first create: ctr-peers
    kube.wire.answers = [{"kind": "Status", "code": status, "message": "exceeded quota: np"}]
    if status == 500:
        with pytest.raises(ApiException):
            kube.apply_children(NS, "job-uid", desired, [])
    else:
        result = kube.apply_children(NS, "job-uid", desired, [])
        assert result.rejected == {"NetworkPolicy/ctr-peers": "exceeded quota: np"}
    posted = [path for method, path in kube.calls if method == "POST"]
    assert posted[:2] == [POLICIES, POLICIES]
    assert {p.rsplit("/", 1)[-1] for p in posted[2:]} == {"services"}


def test_a_policy_that_exists_holds_up_no_pod_when_its_patch_is_refused() -> None:
    """The policy in place still isolates the pods: a refused patch of it is only told."""
    live = _live(render_children(job()))
    for obj in live:
        if obj["kind"] == "NetworkPolicy":
            obj["metadata"]["annotations"][ANNOTATION_HASH] = "older-version"
    kube = RecordingKube()
    kube.wire.statuses = [422]  # the patch of ctr-peers
    result = kube.apply_children(NS, "job-uid", render_children(job()), _without_chief(live))
    assert list(result.rejected) == ["NetworkPolicy/ctr-peers"] and result.created == ["Job/ctr-chief"]


@pytest.mark.parametrize("status", [400, 403, 422])
def test_a_child_the_api_server_refuses_is_named_with_its_message(status: int) -> None:
    """A ResourceQuota or an RBAC gap (403), an admission webhook (400, 403) or a value (422): the
    job's Warning says what the API server said."""
    desired = [m for m in render_children(job()) if m["kind"] == "Service"][:1]
    kube = RecordingKube()
    kube.wire.statuses = [status]
    kube.wire.answers = [{"kind": "Status", "code": status, "message": "exceeded quota: services=1"}]
    result = kube.apply_children(NS, "job-uid", desired, [])
    ref = f"Service/{desired[0]['metadata']['name']}"
    assert result.rejected == {ref: "exceeded quota: services=1"} and result.created == []


def test_after_the_end_a_missing_child_stays_missing_and_the_rest_is_still_patched() -> None:
    desired = render_children(job(), stopped=True)
    running = _live(_without_chief(render_children(job())))
    kube = RecordingKube()
    result = kube.apply_children(NS, "job-uid", desired, running, create_missing=False)
    assert result.created == [] and result.deleted == []
    assert sorted(result.patched) == ["StatefulSet/ctr-ps", "StatefulSet/ctr-worker"]
    assert all(method == "PATCH" for method, _ in kube.calls)


def test_after_the_end_a_chief_of_an_older_attempt_is_not_replaced() -> None:
    desired = render_children(job(), attempt=2, stopped=True)
    live = _live(render_children(job(), attempt=1, stopped=True))
    assert [o["metadata"]["labels"][LABEL_ATTEMPT] for o in live if o["kind"] == "Job"] == ["1"]
    kube = RecordingKube()
    result = kube.apply_children(NS, "job-uid", desired, live, create_missing=False)
    assert (result.created, result.deleted, kube.calls) == ([], [], [])


CHIEF_PATH = f"/apis/batch/v1/namespaces/{NS}/jobs/ctr-chief"


def test_a_change_of_permanent_exit_codes_leaves_the_running_chief_job_alone() -> None:
    """Its podFailurePolicy is immutable: re-applying it would be refused (422) at every reconcile."""
    live = _live(render_children(job()))
    desired = render_children(job(failurePolicy={"permanentExitCodes": [1, 2, 3]}))
    kube = RecordingKube()
    result = kube.apply_children(NS, "job-uid", desired, live)
    assert (result.patched, kube.calls) == ([], [])


def test_the_next_attempt_gets_the_new_permanent_exit_codes() -> None:
    live = _live(render_children(job()))
    desired = render_children(job(failurePolicy={"permanentExitCodes": [1, 2, 3]}), attempt=1)
    kube = RecordingKube()
    result = kube.apply_children(NS, "job-uid", desired, live)
    assert result.deleted == ["Job/ctr-chief"] and result.created == ["Job/ctr-chief"]
    _, created = kube.bodies[-1]
    [fail_job] = [r for r in created["spec"]["podFailurePolicy"]["rules"] if r["action"] == "FailJob"]
    assert fail_job["onExitCodes"]["values"] == [1, 2, 3]


def test_a_job_is_patched_in_its_mutable_fields_only() -> None:
    """Stopping the chief with new exit codes pending: the patch suspends and carries nothing immutable."""
    live = _live(render_children(job()))
    desired = render_children(job(failurePolicy={"permanentExitCodes": [3]}), chief_stopped=True)
    kube = RecordingKube()
    jobs = [m for m in desired if m["kind"] == "Job"]
    kube.apply_children(NS, "job-uid", jobs, [o for o in live if o["kind"] == "Job"])
    [(method, path)] = kube.calls
    content_type, body = kube.bodies[0]
    assert (method, path, content_type) == ("PATCH", CHIEF_PATH, "application/merge-patch+json")
    assert body["spec"]["suspend"] is True
    assert not {"template", "podFailurePolicy", "completions"} & set(body["spec"])


def test_a_child_is_created_in_the_operators_name() -> None:
    """A create records an Update entry of FIELD_MANAGER (an earlier version's was the client's)."""
    kube = RecordingKube()
    kube.apply_children(NS, "job-uid", render_children(job()), [])
    assert {url.split("?")[1] for _, url, *_ in kube.wire.sent} == {"fieldManager=ps-training-operator"}


def _created(statefulset: Obj, managers: list[str]) -> Obj:
    """`statefulset` as the API server returns it once created and applied: `managers` each owning
    the trainer's env var of its name (the operator's Update entries the create and earlier merge
    patches made), FIELD_MANAGER's Apply entry owning PSOP_ROLE, the controller's status entry."""
    container = 'k:{"name":"trainer"}'

    def env(name: str) -> Obj:
        var: Obj = {f'k:{{"name":"{name}"}}': {".": {}, "f:name": {}, "f:value": {}}}
        return {"f:spec": {"f:template": {"f:spec": {"f:containers": {container: {"f:env": var}}}}}}

    def entry(manager: str, operation: str, fields: Obj, **more: str) -> Obj:
        base = {"manager": manager, "operation": operation, "apiVersion": "apps/v1", "fieldsType": "FieldsV1"}
        return {**base, "fieldsV1": fields, **more}

    live = _live([statefulset])[0]
    live["metadata"]["resourceVersion"] = "41"
    live["metadata"]["annotations"][ANNOTATION_HASH] = "an-older-render"
    live["metadata"]["managedFields"] = [
        *(entry(manager, "Update", env(manager)) for manager in managers),
        entry("ps-training-operator", "Apply", env("PSOP_ROLE")),
        entry("kube-controller-manager", "Update", {"f:status": {}}, subresource="status"),
    ]
    return live


def _statefulset() -> Obj:
    return next(m for m in render_children(job()) if m["kind"] == "StatefulSet")


def test_the_create_s_fields_are_folded_into_the_apply_s_before_the_first_apply() -> None:
    """Read fresh (the watch cache keeps which managers, not their fields), folded with the version
    read as a precondition, then applied: a field the apply drops is then removed."""
    desired = _statefulset()
    live = _created(desired, ["ps-training-operator", "OpenAPI-Generator"])
    kube = RecordingKube()
    kube.wire.answers = [{"items": [live]}]
    result = kube.apply_children(NS, "job-uid", [desired], [slim_child(live)])
    path = f"/apis/apps/v1/namespaces/{NS}/statefulsets"
    assert kube.calls == [("GET", path), ("PATCH", f"{path}/ctr-ps"), ("PATCH", f"{path}/ctr-ps")]
    assert result.patched == ["StatefulSet/ctr-ps"]
    (_, fold), (applied, _) = kube.bodies[1:]
    assert applied == "application/apply-patch+yaml"
    managed = live["metadata"]["managedFields"]
    assert fold == {"metadata": {"resourceVersion": "41", "managedFields": folded(managed, "apps/v1")}}
    [apply, status] = fold["metadata"]["managedFields"]
    assert status["subresource"] == "status"
    containers = apply["fieldsV1"]["f:spec"]["f:template"]["f:spec"]["f:containers"]
    names = ("OpenAPI-Generator", "PSOP_ROLE", "ps-training-operator")
    assert sorted(containers['k:{"name":"trainer"}']["f:env"]) == [f'k:{{"name":"{n}"}}' for n in names]


def test_a_child_with_nothing_to_fold_is_applied_at_once() -> None:
    desired = _statefulset()
    live = _created(desired, [])
    kube = RecordingKube()
    kube.apply_children(NS, "job-uid", [desired], [slim_child(live)])
    assert [(method, ct) for (method, _), (ct, _) in zip(kube.calls, kube.bodies, strict=True)] == [
        ("PATCH", "application/apply-patch+yaml")
    ]


def test_a_patch_carries_the_uid_of_the_child_it_was_planned_from() -> None:
    """The API server refuses it for an object of the name with another uid, and makes none."""
    desired = _statefulset()
    live = _created(desired, [])
    kube = RecordingKube()
    kube.apply_children(NS, "job-uid", [desired], [slim_child(live)])
    [(_, applied)] = kube.bodies
    assert applied["metadata"]["uid"] == live["metadata"]["uid"]


def test_a_patch_refused_for_its_uid_is_a_name_conflict() -> None:
    """The child went and a stranger's object took its name since the view the patch was planned from."""
    desired = _statefulset()
    kube = RecordingKube()
    kube.wire.statuses = [422]
    field = {"field": "metadata.uid", "reason": "FieldValueInvalid", "message": "field is immutable"}
    kube.wire.answers = [{"kind": "Status", "code": 422, "details": {"causes": [field]}}]
    result = kube.apply_children(NS, "job-uid", [desired], [slim_child(_created(desired, []))])
    assert (result.conflicts, result.rejected, result.patched) == (["StatefulSet/ctr-ps"], {}, [])


CONFLICT = {"kind": "Status", "code": 409, "reason": "Conflict"}


def test_a_fold_refused_as_the_child_changed_since_its_read_reads_it_again() -> None:
    """Its controller writes its status (a new version) between the read and the fold."""
    desired = _statefulset()
    live = _created(desired, ["ps-training-operator"])
    kube = RecordingKube()
    kube.wire.statuses = [200, 409]
    kube.wire.answers = [{"items": [live]}, CONFLICT, {"items": [live]}]
    result = kube.apply_children(NS, "job-uid", [desired], [slim_child(live)])
    assert [method for method, _ in kube.calls] == ["GET", "PATCH", "GET", "PATCH", "PATCH"]
    assert result.patched == ["StatefulSet/ctr-ps"]


def test_a_fold_refused_every_time_fails_the_reconcile() -> None:
    desired = _statefulset()
    live = _created(desired, ["ps-training-operator"])
    kube = RecordingKube()
    kube.wire.statuses = [200, 409] * FOLD_TRIES
    kube.wire.answers = [{"items": [live]}, CONFLICT] * FOLD_TRIES
    with pytest.raises(ApiException):
        kube.apply_children(NS, "job-uid", [desired], [slim_child(live)])
    assert [method for method, _ in kube.calls] == ["GET", "PATCH"] * FOLD_TRIES


@pytest.mark.parametrize("now", ["a stranger's", "gone"])
def test_a_child_to_fold_that_is_no_longer_the_jobs_is_neither_folded_nor_applied(now: str) -> None:
    """Deleted since the watch showed it, and perhaps made again by someone else: an apply would
    make it (or take it over); the next reconcile creates it, or tells of the conflict."""
    desired = _statefulset()
    live = _created(desired, ["ps-training-operator"])
    there = {**live, "metadata": {**live["metadata"], "ownerReferences": [{"uid": "other"}]}}
    kube = RecordingKube()
    kube.wire.answers = [{"items": [there] if now == "a stranger's" else []}]
    result = kube.apply_children(NS, "job-uid", [desired], [slim_child(live)])
    assert [method for method, _ in kube.calls] == ["GET"]
    assert result.patched == []
    assert result.conflicts == (["StatefulSet/ctr-ps"] if now == "a stranger's" else [])


def test_a_merge_patched_child_is_not_folded() -> None:
    """A Job's immutable fields are never sent: its create's Update entry keeps them."""
    live = _live(render_children(job()))
    chief = next(o for o in live if o["kind"] == "Job")
    chief["metadata"]["managedFields"] = [{"manager": "ps-training-operator", "operation": "Update"}]
    desired = render_children(job(), chief_stopped=True)
    kube = RecordingKube()
    kube.apply_children(NS, "job-uid", [m for m in desired if m["kind"] == "Job"], [chief])
    assert kube.calls == [("PATCH", CHIEF_PATH)]


def test_a_held_chief_replaces_nothing_yet_but_the_old_job_is_deleted() -> None:
    live = _live(render_children(job()))
    desired = render_children(job(), attempt=1)
    kube = RecordingKube()
    result = kube.apply_children(NS, "job-uid", desired, live, hold_chief=True)
    assert result.deleted == ["Job/ctr-chief"] and result.created == []
    assert kube.calls == [("DELETE", CHIEF_PATH)]
    held = RecordingKube()
    assert held.apply_children(NS, "job-uid", desired, _without_chief(live), hold_chief=True).created == []


def test_pods_are_deleted_with_their_grace_and_uid_precondition() -> None:
    kube = RecordingKube()
    kube.delete_pod(NS, PodDeletion("ctr-chief-0x", "uid-1", 0))
    assert kube.calls == [("DELETE", f"/api/v1/namespaces/{NS}/pods/ctr-chief-0x")]
    _, body = kube.bodies[0]
    assert body["gracePeriodSeconds"] == 0 and body["preconditions"] == {"uid": "uid-1"}
    kube.delete_pod(NS, PodDeletion("ctr-chief-0x", "uid-1", None))
    _, body = kube.bodies[1]
    assert "gracePeriodSeconds" not in body  # the pod's own terminationGracePeriodSeconds


@pytest.mark.parametrize("job_there", ["none", "another uid", "its own"])
def test_an_orphaned_chief_pod_is_deleted_only_once_its_job_is_gone(job_there: str) -> None:
    """A chief pod the reconcile found without its Job: the Job is listed by name first, and the pod
    is kept while its own Job (by uid) exists, seen now though the reconcile's read missed it."""
    jobs = f"/apis/batch/v1/namespaces/{NS}/jobs"
    listed = {"none": [], "another uid": ["new-uid"], "its own": ["old-uid"]}[job_there]
    kube = RecordingKube()
    kube.wire.by_path[jobs] = {"items": [{"metadata": {"name": "ctr-chief", "uid": uid}} for uid in listed]}
    kube.delete_pod(NS, PodDeletion("ctr-chief-0x", "uid-1", 5, orphan_of=("ctr-chief", "old-uid")))
    method, url, *_ = kube.wire.sent[0]
    assert (method, url) == ("GET", f"https://api.test{jobs}?fieldSelector=metadata.name%3Dctr-chief")
    deleted = [("DELETE", f"/api/v1/namespaces/{NS}/pods/ctr-chief-0x")]
    assert kube.calls[1:] == ([] if job_there == "its own" else deleted)


def test_network_policies_switched_off_are_deleted_and_what_is_not_ours_is_left() -> None:
    live = _live(render_children(job(), operator_namespace="ops"))
    foreign = copy.deepcopy(next(o for o in live if o["metadata"]["name"] == "ctr-peers"))
    foreign["metadata"].update(name="theirs", ownerReferences=[{"uid": "someone-else"}])
    desired = render_children(job(networkPolicy={"enabled": False}), operator_namespace="ops")
    kube = RecordingKube()
    result = kube.apply_children(NS, "job-uid", desired, [*live, foreign])
    assert result.deleted == ["NetworkPolicy/ctr-peers", "NetworkPolicy/ctr-chief-progress"]
    policies = f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies"
    assert kube.calls == [("DELETE", f"{policies}/ctr-peers"), ("DELETE", f"{policies}/ctr-chief-progress")]
    assert result.created == result.patched == []


def test_a_chief_job_of_a_newer_attempt_than_the_status_read_is_never_deleted() -> None:
    """A replica that read an older status (split brain) must not undo the other's restart."""
    live = _live(render_children(job(), attempt=3))
    kube = RecordingKube()
    result = kube.apply_children(NS, "job-uid", render_children(job(), attempt=2), live)
    assert result.deleted == [] and result.created == []
    assert all(method != "DELETE" for method, _ in kube.calls)


def test_the_status_is_written_with_the_version_it_was_computed_from() -> None:
    kube = RecordingKube()
    kube.patch_job_status(NS, "ctr", {"phase": "Running"}, "42")
    [(method, path)] = kube.calls
    assert (method, path) == (
        "PATCH",
        f"/apis/psoperator.io/v1alpha1/namespaces/{NS}/pstrainingjobs/ctr/status",
    )
    assert kube.bodies == [
        (
            "application/merge-patch+json",
            {"metadata": {"resourceVersion": "42"}, "status": {"phase": "Running"}},
        )
    ]


def test_a_status_write_refused_as_stale_says_so() -> None:
    kube = RecordingKube()
    kube.wire.status = 409
    with pytest.raises(StaleJob):
        kube.patch_job_status(NS, "ctr", {"phase": "Running"}, "42")


def test_every_request_gives_up_after_the_timeout() -> None:
    kube = RecordingKube(timeout=7.0)
    kube.get_job(NS, "ctr")
    kube.list_pods(NS, "ctr", parse_pod)
    assert [(t.connect_timeout, t.read_timeout) for t in kube.wire.timeouts] == [(5.0, 7.0), (5.0, 7.0)]


def test_every_request_is_told_with_its_answer_and_how_long_it_took() -> None:
    told: list[tuple[str, str, str, float]] = []
    kube = RecordingKube(on_response=lambda *request: told.append(request))
    kube.wire.delay = 0.05
    kube.get_job(NS, "ctr")
    kube.wire.statuses = [404]
    kube.get_job(NS, "gone")
    assert [request[:3] for request in told] == [
        ("GET", "pstrainingjobs", "200"),
        ("GET", "pstrainingjobs", "404"),
    ]
    assert all(0.05 <= seconds < 1.0 for *_, seconds in told)


def test_pods_are_read_a_page_at_a_time_and_kept_as_each_page_arrives() -> None:
    kube = RecordingKube()
    kube.wire.answers = [
        {"metadata": {"continue": "next"}, "items": [{"metadata": {"name": "ctr-ps-0"}}]},
        {"metadata": {}, "items": [{"metadata": {"name": "ctr-worker-0"}}]},
    ]
    kept: list[str] = []

    def keep(pod: Obj) -> Obj:
        kept.append(pod["metadata"]["name"])
        return {"name": pod["metadata"]["name"], "pages read": len(kube.wire.sent)}

    pods = kube.list_pods(NS, "ctr", keep)
    # Each page is kept (parsed) before the next is asked for, and the second page continues the first.
    assert pods == [{"name": "ctr-ps-0", "pages read": 1}, {"name": "ctr-worker-0", "pages read": 2}]
    queries = [url.split("?")[1] for _, url, *_ in kube.wire.sent]
    assert all("limit=500" in q for q in queries)
    assert ["continue=next" in q for q in queries] == [False, True]


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (
            ApiException(status=503, reason="Service Unavailable"),
            "the API server answered 503 Service Unavailable",
        ),
        (
            urllib3.exceptions.ReadTimeoutError(None, "/", "timed out"),  # type: ignore[arg-type]
            "no answer from the API server (ReadTimeoutError)",
        ),
        (KeyError("status"), None),
    ],
)
def test_a_failed_request_is_told_in_one_line_and_nothing_else_is(error: Exception, line: str | None) -> None:
    assert api_failure(error) == line


@pytest.mark.parametrize(
    ("path", "resource"),
    [
        ("/api/v1/namespaces/ns/pods/ctr-ps-0", "pods"),
        ("/api/v1/namespaces/ns/pods?labelSelector=x&limit=500", "pods"),
        ("/apis/apps/v1/namespaces/ns/statefulsets", "statefulsets"),
        (f"/apis/{GROUP}/v1alpha1/namespaces/ns/pstrainingjobs/ctr/status", "pstrainingjobs/status"),
        ("/apis/coordination.k8s.io/v1/namespaces/ops/leases/psoperator", "leases"),
        ("/api/v1/namespaces/ns", "namespaces"),
        (f"/apis/{GROUP}/v1alpha1", "discovery"),
    ],
)
def test_a_requests_resource_is_named_as_kubernetes_names_it(path: str, resource: str) -> None:
    assert resource_of(path) == resource


def test_a_progress_port_that_takes_the_connection_and_never_answers_is_not_serving() -> None:
    """A hung chief (or one whose runtime stopped answering): each ask costs the whole timeout, so
    it backs off as a refusal does (handlers._progress), instead of costing every reconcile 2 s."""
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen()  # the kernel completes the handshake; nothing ever reads or answers

        async def ask() -> None:
            async with aiohttp.ClientSession() as session:
                await fetch_progress(session, "127.0.0.1", hung.getsockname()[1], None, timeout=0.2)

        started = time.monotonic()
        with pytest.raises(NotServing):
            asyncio.run(ask())
        assert time.monotonic() - started < 2


@pytest.mark.parametrize("reason", ["AlreadyExists", "Conflict"])
def test_only_a_create_refused_as_already_existing_is_a_name_conflict(reason: str) -> None:
    """409 AlreadyExists: an object has the name (here a stranger's). Any other 409
    (e2e/faultproxy.py's injected Conflict held a PS StatefulSet back as a "conflict" until the job's
    next full read, minutes on) is raised, and the reconcile tries again."""
    kube = RecordingKube()
    kube.wire.statuses = [409]
    kube.wire.answers = [{"kind": "Status", "code": 409, "reason": reason}]
    [statefulset] = [c for c in render_children(job()) if c["kind"] == "StatefulSet"][:1]
    change = ChildChange(statefulset, ChildVerb.CREATE)
    if reason == "AlreadyExists":
        result = kube.make_changes(NS, [change], [])
        assert result.conflicts == [f"StatefulSet/{statefulset['metadata']['name']}"]
    else:
        with pytest.raises(ApiException):
            kube.make_changes(NS, [change], [])


@pytest.mark.parametrize("owner", ["the job", "a stranger"])
def test_a_create_refused_as_already_existing_lists_the_name_to_tell_the_jobs_own_from_a_strangers(
    owner: str,
) -> None:
    """A reconcile decided from a watch that has not shown the job's own child yet creates it again:
    the 409 is answered by a list by name (the chart grants list, not get). The job's own is kept as
    written (for the watch cache), not told as a NameConflict; a stranger's is a conflict."""
    [statefulset] = [c for c in render_children(job()) if c["kind"] == "StatefulSet"][:1]
    name = statefulset["metadata"]["name"]
    there = _live([statefulset])[0]
    if owner == "a stranger":
        there["metadata"]["ownerReferences"] = [{"kind": "Deployment", "name": "web", "uid": "other"}]
    kube = RecordingKube()
    kube.wire.statuses = [409]
    kube.wire.answers = [{"kind": "Status", "code": 409, "reason": "AlreadyExists"}, {"items": [there]}]
    result = kube.make_changes(NS, [ChildChange(statefulset, ChildVerb.CREATE)], [])
    method, url, *_ = kube.wire.sent[-1]
    listed = (
        f"https://api.test/apis/apps/v1/namespaces/{NS}/statefulsets?fieldSelector=metadata.name%3D{name}"
    )
    assert (method, url) == ("GET", listed)
    if owner == "the job":
        assert result.conflicts == [] and result.written == [{**there, "kind": "StatefulSet"}]
    else:
        assert result.conflicts == [f"StatefulSet/{name}"] and result.written == []


def test_the_api_servers_answers_to_creates_and_patches_are_kept_for_the_watch_cache() -> None:
    desired = render_children(job())
    answers = _live(desired)
    kube = RecordingKube()
    kube.wire.answers = list(answers)
    result = kube.make_changes(NS, [ChildChange(m, ChildVerb.CREATE) for m in desired], [])
    assert result.written == answers


def _creating_the_chief(token_answer: Obj, status: int) -> tuple[RecordingKube, Any]:
    """The changes of a job whose chief Job is missing, made against an API server that answers the
    token Secret's create with `status` and `token_answer`: the Kube, and the result (or the error)."""
    desired = render_children(job())
    changes, conflicts = plan_children("job-uid", desired, _live(_without_chief(desired)))
    changes = with_chief_token(changes, render_chief_token(job(), "t" * 64))
    kube = RecordingKube()
    kube.wire.statuses, kube.wire.answers = [status], [token_answer]
    try:
        return kube, kube.make_changes(NS, changes, conflicts)
    except ApiException as error:
        return kube, error


SECRETS, JOBS = f"/api/v1/namespaces/{NS}/secrets", f"/apis/batch/v1/namespaces/{NS}/jobs"


def test_the_chiefs_token_secret_is_created_just_before_its_job_and_never_read_back() -> None:
    made = {"kind": "Secret", "metadata": {"name": "ctr-chief-token-job-uid"}, "data": {"token": "dHR0"}}
    kube, result = _creating_the_chief(made, 201)
    assert kube.calls == [("POST", SECRETS), ("POST", JOBS)]
    assert kube.bodies[0][1]["stringData"] == {"token": "t" * 64}
    assert result.created == ["Secret/ctr-chief-token-job-uid", "Job/ctr-chief"]
    assert all(child["kind"] != "Secret" for child in result.written)  # not into the watch cache


def test_a_token_secret_already_there_is_taken_as_the_jobs_without_reading_it() -> None:
    kube, result = _creating_the_chief({"kind": "Status", "reason": "AlreadyExists"}, 409)
    assert kube.calls == [("POST", SECRETS), ("POST", JOBS)]  # no GET: the operator may not read Secrets
    assert result.created == ["Job/ctr-chief"] and not result.conflicts


def test_a_token_secret_refused_is_told_and_the_chief_still_runs() -> None:
    refusal = {"kind": "Status", "message": 'secrets is forbidden: cannot create resource "secrets"'}
    _, result = _creating_the_chief(refusal, 403)
    assert result.rejected == {
        "Secret/ctr-chief-token-job-uid": 'secrets is forbidden: cannot create resource "secrets"'
    }
    assert result.created == ["Job/ctr-chief"]


def test_a_token_secret_the_api_server_fails_holds_its_chief_job_back() -> None:
    kube, error = _creating_the_chief({}, 500)
    assert isinstance(error, ApiException) and error.status == 500
    assert kube.calls == [("POST", SECRETS)]  # the Job waits for the next reconcile, with its Secret
