"""One reconcile's reads and writes (control/reconciler.py) against a recording API: what it reads
fresh and when, the order of its writes, and what it does when one fails."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import http.server
import logging
import math
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import aiohttp
import kopf
import pytest
from kubernetes.client.exceptions import ApiException

from psoperator import GROUP
from psoperator.api.labels import ANNOTATION_HASH, LABEL_QUEUE
from psoperator.contract import PROGRESS_PATH
from psoperator.control import loop, reconciler
from psoperator.control.chief_client import chief_report
from psoperator.control.chief_key import ChiefKey
from psoperator.control.leader import Election, Elector
from psoperator.control.state import Config, JobState, OperatorState
from psoperator.kube import StaleJob
from psoperator.metrics.registry import Metrics
from psoperator.observe.cache import Snapshot
from psoperator.observe.views import parse_pod, slim_child
from psoperator.plan.children import ChildChange, ChildVerb
from psoperator.plan.draft import PodDeletion
from psoperator.plan.stages import ReconcilePlan
from psoperator.render import RenderOptions, render_children
from tests.unit import builders
from tests.unit.test_kube import RecordingKube
from tests.unit.test_loop import _drawing_the, _looping


def _counting_renders(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The job's resourceVersion at each of the protocol's render_children calls, as they come."""
    renders: list[str] = []

    def counting_render(job: Any, options: RenderOptions) -> list[Any]:
        renders.append(job["metadata"]["resourceVersion"])
        return render_children(job, options)

    monkeypatch.setattr(reconciler, "render_children", counting_render)
    return renders


def _as_created(job: Any) -> list[Any]:
    """The job's children as the API server returns them once created: each with its own uid."""
    rendered = render_children(job, RenderOptions())
    return [c | {"metadata": {**c["metadata"], "uid": f"child-{i}"}} for i, c in enumerate(rendered)]


def test_the_children_are_rendered_again_only_when_what_decides_them_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Running job's reconciles render nothing while its spec (generation), the plan and the
    children's owners, attempts and hashes stay the same; nothing rendered is kept for it."""
    renders = _counting_renders(monkeypatch)
    state = OperatorState(RecordingKube(), Metrics())
    job_state = JobState(logging.getLogger("test"))
    job = builders.job() | {"metadata": {**builders.job()["metadata"], "resourceVersion": "7"}}

    def decide(seen_job: Any, children: list[Any]) -> reconciler.Decision:
        return asyncio.run(reconciler.decide(state, job_state, Snapshot(seen_job, children, []), fresh=False))

    assert decide(job, []).changes  # a new job: its children are to be created
    created = [slim_child(c) for c in _as_created(job)]
    assert not decide(job, created).changes and len(renders) == 2
    assert not decide(job, created).changes and len(renders) == 2
    assert job_state.in_sync is not None  # the inputs, nothing rendered
    generation, _options, _create, _hold, fingerprint = job_state.in_sync
    assert generation == 1 and len(fingerprint) == len(created)
    edited = copy.deepcopy(created)
    edited[0]["metadata"]["annotations"][ANNOTATION_HASH] = "edited by hand"
    assert [c.verb for c in decide(job, edited).changes] == [ChildVerb.PATCH] and len(renders) == 3
    respecified = job | {"metadata": {**job["metadata"], "resourceVersion": "8", "generation": 2}}
    assert not decide(respecified, created).changes and renders[-1] == "8"


def test_a_status_write_does_not_render_the_children_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every status write changes the job's resourceVersion, but the renderer reads only the job's
    name, uid and spec (its generation): the next reconcile does not render."""
    renders = _counting_renders(monkeypatch)
    state = OperatorState(RecordingKube(), Metrics())
    job_state = JobState(logging.getLogger("test"))
    job = builders.job() | {"metadata": {**builders.job()["metadata"], "resourceVersion": "7"}}
    created = [slim_child(c) for c in _as_created(job)]

    def decide(seen_job: Any) -> reconciler.Decision:
        return asyncio.run(reconciler.decide(state, job_state, Snapshot(seen_job, created, []), fresh=False))

    assert not decide(job).changes and renders == ["7"]
    written = builders.with_status(job, phase="Running", step=100)
    written["metadata"]["resourceVersion"] = "8"
    assert not decide(written).changes and renders == ["7"]


def _free_port() -> int:
    """A loopback port nothing listens on (yet): a connection to it is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def _answering(port: int, body: bytes) -> Iterator[list[str]]:
    """Answers every GET on the loopback `port` with `body`; yields the paths asked for."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield hits
    finally:
        server.shutdown()
        server.server_close()


def test_a_chief_whose_port_refused_is_not_asked_again_until_its_wait_is_over() -> None:
    """A plain TensorFlow image never serves progress: its chief is not asked at every reconcile.
    Any answer, even a garbled one, ends the back-off."""
    port = _free_port()
    pods = [builders.pod("chief", 0, attempt=0, ip="127.0.0.1")]
    chief = builders.observed(pods, builders.chief_job()).chief_pod(0)

    async def run() -> None:
        async with aiohttp.ClientSession() as session:
            report, refusals = await chief_report(session, port, chief, None, None)
            assert report is None and refusals is not None and refusals.count == 1
            with _answering(port, b"not a report") as hits:
                assert await chief_report(session, port, chief, refusals, None) == (None, refusals)
                assert hits == []  # its wait runs: not asked
                over = replace(refusals, until=time.monotonic())
                assert await chief_report(session, port, chief, over, None) == (None, None)
                assert hits == [PROGRESS_PATH]

    asyncio.run(run())


def test_a_restarts_old_chief_job_and_pod_deletions_go_out_at_once() -> None:
    """The old chief Job, the old chief pod and the PS that served it are asked to stop
    together: each deletion below waits until all four are in flight, which one after another
    never are (a round trip to a loaded API server each)."""
    in_flight = threading.Barrier(4, timeout=5)

    class TogetherKube(RecordingKube):
        def _delete_at(self, path: str, uid: str, **options: Any) -> None:
            in_flight.wait()
            super()._delete_at(path, uid, **options)

    kube = TogetherKube()
    state = OperatorState(kube, Metrics())
    job = builders.job() | {"metadata": {**builders.job()["metadata"], "resourceVersion": "7"}}
    chief = next(c for c in render_children(job) if c["kind"] == "Job")
    old = chief | {"metadata": {**chief["metadata"], "uid": "uid-old-chief"}}
    deletions = [PodDeletion(f"ctr-{name}", f"uid-{name}", 5) for name in ("chief-0x", "ps-0", "ps-1")]
    plan = ReconcilePlan(status={}, render=None, delete_pods=deletions)
    replaced = ChildChange(chief, ChildVerb.DELETE_REPLACED, old)
    decision = reconciler.Decision(plan, None, [replaced], [], datetime.now(UTC))
    log = logging.getLogger("test")
    asyncio.run(reconciler.act(state, JobState(log), Snapshot(job, [], []), decision, log))
    assert sorted(path for _, path in kube.calls) == [
        *(f"/api/v1/namespaces/team-a/pods/ctr-{name}" for name in ("chief-0x", "ps-0", "ps-1")),
        f"/apis/batch/v1/namespaces/team-a/jobs/{chief['metadata']['name']}",
    ]


def test_a_statefulsets_new_template_is_in_place_before_its_pods_are_deleted() -> None:
    """A resize patches the PS StatefulSet (OnDelete) and restarts its pods: a pod deleted before
    the patch is made again by the StatefulSet controller from the old template. A stop's drain cut
    comes before the scale-down: the kubelet holds to the grace of the first deletion."""
    deletions = [PodDeletion("ctr-ps-0", "uid-ps-0", 5), PodDeletion("ctr-ps-1", "uid-ps-1", 1, first=True)]
    kube = RecordingKube()
    state = OperatorState(kube, Metrics())
    job = builders.job() | {"metadata": {**builders.job()["metadata"], "resourceVersion": "7"}}
    ps = next(c for c in render_children(job) if c["kind"] == "StatefulSet")
    plan = ReconcilePlan(status={}, render=None, delete_pods=deletions)
    decision = reconciler.Decision(plan, None, [ChildChange(ps, ChildVerb.PATCH)], [], datetime.now(UTC))
    log = logging.getLogger("test")
    asyncio.run(reconciler.act(state, JobState(log), Snapshot(job, [], []), decision, log))
    paths = [path for _, path in kube.calls]
    patched = paths.index("/apis/apps/v1/namespaces/team-a/statefulsets/ctr-ps")
    assert paths.index("/api/v1/namespaces/team-a/pods/ctr-ps-1") < patched
    assert patched < paths.index("/api/v1/namespaces/team-a/pods/ctr-ps-0")


def test_a_job_never_acted_on_is_decided_from_the_watch_and_one_with_a_status_is_read_fresh() -> None:
    """A new job (no status: nothing of ours exists) gets its status and children with one read, of
    its pods (an earlier job's of its name may still be there: plan/stages.await_former_job); once
    it has a status, a reconcile that acts reads the job and its children first."""
    new = builders.job() | {"metadata": {**builders.job()["metadata"], "resourceVersion": "7"}}
    written = new | {"metadata": {**new["metadata"], "resourceVersion": "8"}, "status": {"phase": "Pending"}}

    path = f"/apis/{GROUP}/v1alpha1/namespaces/team-a/pstrainingjobs/ctr"

    def first_reconcile(job: Any) -> list[tuple[str, str]]:
        kube = RecordingKube()
        # The job's read and its status write are answered with it; every other request gets {}.
        kube.wire.by_path = {path: job, f"{path}/status": written}
        state = OperatorState(kube, Metrics())
        state.cache.job_seen("team-a", "ctr", job)
        asyncio.run(reconciler.reconcile_once(state, "team-a", "ctr", logging.getLogger("test")))
        return kube.calls

    calls = first_reconcile(new)
    assert [call for call in calls if call[0] == "GET"] == [("GET", "/api/v1/namespaces/team-a/pods")]
    assert calls[0][0] == "GET" and calls[1] == ("PATCH", f"{path}/status")
    assert len([method for method, _ in calls if method == "POST"]) == len(render_children(new))
    acted_on = first_reconcile(builders.with_status(new, phase="Pending"))
    # The job, its pods and its chief Jobs, read at once: in whichever order their threads send them.
    reads = acted_on[:3]
    assert ("GET", path) in reads
    assert [method for method, _ in reads] == ["GET"] * 3


def test_a_new_jobs_chief_waits_for_an_earlier_jobs_pod_that_only_the_api_shows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job made again under the name of one just deleted, whose parameter server still drains: the
    watch dropped that pod with the earlier job, the read of the new job's pods shows it. Its
    StatefulSets and Services are made; its chief Job (and token) are not."""
    new = builders.job() | {"metadata": {**builders.job()["metadata"], "resourceVersion": "7"}}
    path = f"/apis/{GROUP}/v1alpha1/namespaces/team-a/pstrainingjobs/ctr"
    draining = builders.pod("ps", 0, uid="earlier-ps-0", deleting=True)
    draining["metadata"]["ownerReferences"] = [
        {"kind": "StatefulSet", "name": "ctr-ps", "uid": "earlier-sts"}
    ]
    kube = RecordingKube()
    kube.wire.by_path = {
        path: new,
        f"{path}/status": new | {"status": {"phase": "Pending"}},
        "/api/v1/namespaces/team-a/pods": {"items": [draining]},
    }
    state = OperatorState(kube, Metrics(), Config(chief_key=ChiefKey(b"k" * 32)))
    state.cache.job_seen("team-a", "ctr", new)
    told: list[str] = []
    monkeypatch.setattr(kopf, "event", lambda _job, type, reason, message: told.append(reason))
    asyncio.run(reconciler.reconcile_once(state, "team-a", "ctr", logging.getLogger("test")))
    assert told == ["FormerPodsRemain"]
    posted = [path.rsplit("/", 1)[1] for method, path in kube.calls if method == "POST"]
    assert "statefulsets" in posted and "jobs" not in posted and "secrets" not in posted, posted


def test_a_new_chief_job_comes_after_its_token_secret() -> None:
    key = ChiefKey(b"k" * 32)
    new = builders.job() | {"metadata": {**builders.job()["metadata"], "resourceVersion": "7"}}
    path = f"/apis/{GROUP}/v1alpha1/namespaces/team-a/pstrainingjobs/ctr"
    kube = RecordingKube()
    kube.wire.by_path = {path: new, f"{path}/status": new | {"status": {"phase": "Pending"}}}
    state = OperatorState(kube, Metrics(), Config(chief_key=key))
    state.cache.job_seen("team-a", "ctr", new)
    asyncio.run(reconciler.reconcile_once(state, "team-a", "ctr", logging.getLogger("test")))
    posted = [path for method, path in kube.calls if method == "POST"]
    secret = posted.index("/api/v1/namespaces/team-a/secrets")
    assert posted[secret + 1] == "/apis/batch/v1/namespaces/team-a/jobs"
    assert kube.bodies[len(kube.calls) - len(posted) + secret][1]["stringData"] == {
        "token": key.token("job-uid")
    }


def test_a_reconcile_does_not_act_once_the_lease_is_past_its_renew_deadline() -> None:
    """A renew that hangs: the elector still leads until its request returns, but the standby may
    take the Lease over then; a reconcile about to write, delete or create does nothing."""
    kube = RecordingKube()
    state = OperatorState(kube, Metrics())
    state.elector = Elector(kube, Election("ops", "psop", 8), lead=lambda: None, lost=lambda: None)
    state.elector.leading, state.elector.until = True, time.monotonic() - 0.5  # renewed 5.8 s ago
    job = builders.job() | {"metadata": {**builders.job()["metadata"], "resourceVersion": "7"}}
    plan = ReconcilePlan(
        status={"phase": "Restarting"}, render=None, delete_pods=[PodDeletion("ctr-ps-0", "uid-ps-0", 5)]
    )
    decision = reconciler.Decision(plan, None, [], [], datetime.now(UTC))
    log = logging.getLogger("test")
    asyncio.run(reconciler.act(state, JobState(log), Snapshot(job, [], []), decision, log))
    assert kube.calls == []


def _merged(target: Any, patch: Any) -> Any:
    """`patch` applied to `target` as the API server applies a merge patch (RFC 7386)."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merged(result.get(key), value)
    return result


class OneJobKube(RecordingKube):
    """The API of one job and its children, as reads answer; a status write is merged into the job
    and bumps its resourceVersion. Requests that reach the wire (creates, patches) are recorded."""

    def __init__(self, job: Any, children: list[Any]) -> None:
        super().__init__()
        self.job, self.children, self.reads = job, children, 0
        self.listed: list[str] = []  # the kinds of children read, in order

    def get_job(self, namespace: str, name: str) -> Any:
        self.reads += 1
        return copy.deepcopy(self.job)

    def list_children(self, namespace: str, job_name: str, kind: str) -> list[Any]:
        self.listed.append(kind)
        return [copy.deepcopy(c) for c in self.children if c["kind"] == kind]

    def list_pods(self, namespace: str, job_name: str, keep: Any) -> list[Any]:
        return []

    def patch_job_status(self, namespace: str, name: str, patch: Any, resource_version: str) -> Any:
        self.wire.sent.append(("PATCH", "status", "", None))
        meta = self.job["metadata"]
        status = _merged(self.job["status"], patch)
        self.job = {
            **self.job,
            "metadata": {**meta, "resourceVersion": str(int(meta["resourceVersion"]) + 1)},
        }
        self.job["status"] = status
        return copy.deepcopy(self.job)


def test_a_plans_events_are_posted_even_when_a_child_write_then_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Events fire when a condition flips, so the next reconcile does not post them again: they go
    out right after the status write that flipped it, before the children are touched."""
    posted: list[str] = []
    monkeypatch.setattr(kopf, "event", lambda _job, type, reason, message: posted.append(reason))
    job = builders.with_status(builders.job(runPolicy={"suspend": True}), phase="Pending")
    job["metadata"]["resourceVersion"] = "7"
    kube = OneJobKube(job, [])
    kube.wire.status = 500  # every child create
    state = OperatorState(kube, Metrics())
    state.cache.job_seen("team-a", "ctr", job)
    with pytest.raises(ApiException):
        asyncio.run(reconciler.reconcile_once(state, "team-a", "ctr", logging.getLogger("test")))
    assert posted == ["Suspended"]


@pytest.mark.parametrize("unmade", ["NameConflict", "ChildRejected"])
def test_a_child_that_cannot_be_made_is_told_once_and_then_costs_no_reads_or_writes(
    monkeypatch: pytest.MonkeyPatch, unmade: str
) -> None:
    """A Service of the job's name that another owner holds, or one whose create the API server
    refuses (422): the first reconcile tells it (one event); the next ones, while nothing changed,
    neither read fresh nor write nor tell again (at a 10 s resync, 8,640 events and 60,000 requests
    a day otherwise) until the job's periodic fresh read (every 10 minutes)."""
    warnings: list[str] = []
    monkeypatch.setattr(kopf, "warn", lambda _job, reason, message: warnings.append(reason))
    monkeypatch.setattr(kopf, "event", lambda *_, **__: None)
    job = builders.with_status(builders.job(), phase="Pending")
    job["metadata"]["resourceVersion"] = "7"
    children = _as_created(job)
    service = next(c for c in children if c["kind"] == "Service")
    if unmade == "NameConflict":
        service["metadata"]["ownerReferences"] = [{"kind": "Deployment", "name": "web", "uid": "other"}]
    else:
        children.remove(service)
    kube = OneJobKube(job, children)
    kube.wire.statuses = [422]  # the create of the missing Service
    state = OperatorState(kube, Metrics())
    state.cache.job_seen("team-a", "ctr", job)
    for child in children:
        state.cache.child_seen("ADDED", child)

    def reconcile() -> None:
        asyncio.run(reconciler.reconcile_once(state, "team-a", "ctr", logging.getLogger("test")))

    reconcile()
    assert warnings == [unmade] and kube.reads == 1
    sent, reads = len(kube.wire.sent), kube.reads
    reconcile()
    reconcile()
    assert warnings == [unmade] and kube.reads == reads and len(kube.wire.sent) == sent
    # The job's periodic fresh read tries again (an object in the way without the job label is
    # watched by no one), and tells nothing new.
    state.jobs[("team-a", "ctr")].read_at = None
    reconcile()
    assert warnings == [unmade] and kube.reads == reads + 1


def test_a_refused_network_policy_holds_every_pod_and_the_next_status_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ResourceQuota of no NetworkPolicies: the job's Services are created, no StatefulSet or Job
    is; the Warning and then the NetworkPolicyMissing condition carry the API server's answer."""
    warnings: list[str] = []
    monkeypatch.setattr(kopf, "warn", lambda _job, reason, message: warnings.append(message))
    monkeypatch.setattr(kopf, "event", lambda *_, **__: None)
    job = builders.job() | {"metadata": {**builders.job()["metadata"], "resourceVersion": "7"}}
    kube = OneJobKube(job | {"status": {}}, [])
    quota = 'networkpolicies "ctr-peers" is forbidden: exceeded quota: np, limited: networkpolicies=0'
    policies = "/apis/networking.k8s.io/v1/namespaces/team-a/networkpolicies"
    kube.wire.by_path[policies] = {"kind": "Status", "code": 403, "message": quota}
    answer = kube.wire.request

    def refusing(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if url.removeprefix("https://api.test").split("?")[0] == policies:
            kube.wire.statuses.insert(0, 403)
        return answer(method, url, *args, **kwargs)

    monkeypatch.setattr(kube.wire, "request", refusing)
    state = OperatorState(kube, Metrics())
    state.cache.job_seen("team-a", "ctr", job)

    def reconcile() -> None:
        asyncio.run(reconciler.reconcile_once(state, "team-a", "ctr", logging.getLogger("test")))

    reconcile()  # decided from the watch: the status, then the children
    reconcile()  # the job's first fresh read: the status says why, and the policy is tried again
    posted = [url.split("?")[0].rsplit("/", 1)[-1] for method, url, *_ in kube.wire.sent if method == "POST"]
    assert posted[0] == "networkpolicies" and set(posted[1:]) == {"networkpolicies", "services"}
    assert warnings == [f"NetworkPolicy/ctr-peers: {quota}"]
    [condition] = [c for c in kube.job["status"]["conditions"] if c["type"] == "NetworkPolicyMissing"]
    assert (condition["status"], condition["reason"]) == ("True", "NetworkPolicyRefused")
    assert quota in condition["message"]


def test_a_reconcile_about_to_act_reads_its_chief_jobs_fresh_and_keeps_what_it_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before acting, the job, its pods and its chief Jobs are read fresh (3 requests; 7
    with every kind of child), the other children come from the watch cache. The Service created is
    kept as the API server answered it: the next reconcile, the watch still silent, makes nothing."""
    monkeypatch.setattr(kopf, "event", lambda *_, **__: None)
    job = builders.with_status(builders.job(), phase="Pending")
    job["metadata"]["resourceVersion"] = "7"
    children = _as_created(job)
    service = next(c for c in children if c["kind"] == "Service")
    kube = OneJobKube(job, [c for c in children if c is not service])
    kube.wire.answers = [service]  # the create's answer
    state = OperatorState(kube, Metrics())
    state.cache.job_seen("team-a", "ctr", job)
    for child in kube.children:
        state.cache.child_seen("ADDED", child)
    state.job(("team-a", "ctr"), logging.getLogger("test")).read_at = time.monotonic()  # read in full lately

    def reconcile() -> list[tuple[str, str]]:
        asyncio.run(reconciler.reconcile_once(state, "team-a", "ctr", logging.getLogger("test")))
        return [call for call in kube.calls if call[0] == "POST"]

    assert reconcile() == [("POST", "/api/v1/namespaces/team-a/services")]
    assert kube.listed == ["Job"] and kube.reads == 1
    assert len(reconcile()) == 1 and kube.listed == ["Job"]


def test_a_fresh_read_asks_for_the_job_its_pods_and_its_chief_jobs_at_once() -> None:
    """The 3 requests of the read before acting are in flight together (each waits below
    until all are), not the job first and its pods and chief Jobs after it."""
    in_flight = threading.Barrier(3, timeout=5)
    job = builders.with_status(builders.job(), phase="Running")

    class TogetherKube(OneJobKube):
        def get_job(self, namespace: str, name: str) -> Any:
            in_flight.wait()
            return super().get_job(namespace, name)

        def list_children(self, namespace: str, job_name: str, kind: str) -> list[Any]:
            in_flight.wait()
            return super().list_children(namespace, job_name, kind)

        def list_pods(self, namespace: str, job_name: str, keep: Any) -> list[Any]:
            in_flight.wait()
            return super().list_pods(namespace, job_name, keep)

    kube = TogetherKube(job, [])
    state = OperatorState(kube, Metrics())
    state.cache.job_seen("team-a", "ctr", job)
    job_state = state.job(("team-a", "ctr"), logging.getLogger("test"))
    seen = asyncio.run(reconciler.read_fresh(state, job_state, ("team-a", "ctr"), full=False))
    assert seen is not None and seen.job == job and kube.listed == ["Job"]
    # A read of its pods, not the job's full read: that is still due when it was.
    assert job_state.read_at is None and job_state.pods_read_at > -math.inf


def test_a_job_queued_since_the_cache_saw_it_has_its_workloads_read_too() -> None:
    """Whether a fresh read lists the job's Workloads is told by the job the cache holds; the job
    read with it says otherwise (a queue label added meanwhile): they are listed after it."""
    unqueued = builders.with_status(builders.job(), phase="Running")
    queued = copy.deepcopy(unqueued)
    queued["metadata"]["labels"] = {**queued["metadata"].get("labels", {}), LABEL_QUEUE: "team-a-queue"}
    kube = OneJobKube(queued, [])
    state = OperatorState(kube, Metrics())
    state.kueue_served = True
    state.cache.job_seen("team-a", "ctr", unqueued)
    asyncio.run(
        reconciler.read_fresh(
            state, state.job(("team-a", "ctr"), logging.getLogger("test")), ("team-a", "ctr"), full=False
        )
    )
    assert kube.listed == ["Job", "Workload"]


def _pending_job_in_cache(config: Config) -> tuple[OneJobKube, OperatorState]:
    """A Pending job with its children as created, served by a OneJobKube and in the watch cache."""
    job = builders.with_status(builders.job(), phase="Pending")
    job["metadata"]["resourceVersion"] = "7"
    children = _as_created(job)
    kube = OneJobKube(job, children)
    state = OperatorState(kube, Metrics(), config)
    state.cache.job_seen("team-a", "ctr", job)
    for child in children:
        state.cache.child_seen("ADDED", child)
    return kube, state


def _reads_of_a_reconcile(kube: OneJobKube, state: OperatorState, last_read_ago: float | None) -> int:
    """The fresh reads of a reconcile of _pending_job_in_cache's job, last read `last_read_ago`
    seconds ago (None: never)."""
    if last_read_ago is None:
        state.job(("team-a", "ctr"), logging.getLogger("test")).read_at = None
    else:
        state.job(("team-a", "ctr"), logging.getLogger("test")).read_at = time.monotonic() - last_read_ago
    before = kube.reads
    asyncio.run(reconciler.reconcile_once(state, "team-a", "ctr", logging.getLogger("test")))
    return kube.reads - before


def test_with_many_jobs_the_periodic_fresh_reads_stretch_to_their_pace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each job is read fresh every 10 minutes, unless the jobs' reads together would pass
    fresh_reads_per_second: 1,000 jobs at 0.5 a second are read every 2,000 s each, not 600."""
    monkeypatch.setattr(kopf, "event", lambda *_, **__: None)
    kube, state = _pending_job_in_cache(Config(fresh_read_seconds=600, fresh_reads_per_second=0.5))

    def reads_after(seconds_since_read: float, jobs: int) -> int:
        state.jobs = _looping(jobs)
        state.next_periodic_read = -math.inf  # no other job's periodic read lately
        return _reads_of_a_reconcile(kube, state, seconds_since_read)

    reads_after(0, jobs=100)  # its first decision acts (reading fresh first); the next ones rest
    assert reads_after(590, jobs=100) == 0
    assert reads_after(610, jobs=100) == 1
    assert reads_after(610, jobs=1000) == 0
    assert reads_after(1990, jobs=1000) == 0
    assert reads_after(2010, jobs=1000) == 1


def test_periodic_fresh_reads_that_come_due_together_go_one_at_a_time_at_their_pace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Jobs read together (at a start) come due together: they are read in turn, at most
    fresh_reads_per_second, not in a burst; a job refused its turn is read at a later reconcile.
    A job's first read (a new loop) does not wait for a turn."""
    monkeypatch.setattr(kopf, "event", lambda *_, **__: None)
    kube, state = _pending_job_in_cache(Config(fresh_read_seconds=600, fresh_reads_per_second=0.5))
    state.jobs = _looping(100)
    real, ahead = time.monotonic, [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: real() + ahead[0])

    def reads(last_read_ago: float | None) -> int:
        return _reads_of_a_reconcile(kube, state, last_read_ago)

    reads(None)  # its first decision acts (reading fresh first); the next ones rest
    assert reads(610) == 1  # due, the first periodic read: at once
    assert reads(610) == 0  # another job due at the same time waits its turn...
    assert reads(None) == 1  # ...which a job's first read does not
    ahead[0] += 1.0
    assert reads(611) == 0  # 1 s later: still not its turn (one every 2 s)
    ahead[0] += 1.1
    assert reads(612) == 1
    ahead[0] += 2.1
    assert reads(10) == 0  # not due: it takes no turn...
    assert reads(614) == 1  # ...which the next job due has


class PodsKube(OneJobKube):
    """OneJobKube whose reads list pods too (as Kube.list_pods gives them: passed through `keep`)."""

    def __init__(self, job: Any, children: list[Any], pods: list[Any]) -> None:
        super().__init__(job, children)
        self.pods = pods

    def list_pods(self, namespace: str, job_name: str, keep: Any) -> list[Any]:
        return [keep(copy.deepcopy(p)) for p in self.pods]


def _owned(pod: Any, kind: str, name: str, uid: str) -> Any:
    """A pod of the job's namespace, owned by its StatefulSet or Job."""
    owners = [{"kind": kind, "name": name, "uid": uid}]
    return pod | {"metadata": {**pod["metadata"], "namespace": "team-a", "ownerReferences": owners}}


@dataclass
class Restarted:
    """A job just restarted (attempt 1): its children but a chief Job, its PS and worker pods."""

    job: Any
    children: list[Any]
    others: list[Any]


def _restarted_job() -> Restarted:
    job = builders.with_status(builders.job(), phase="Pending")
    job["metadata"]["resourceVersion"] = "7"
    children = [c for c in _as_created(job) if c["kind"] != "Job"]
    sets = {c["metadata"]["name"]: c["metadata"]["uid"] for c in children if c["kind"] == "StatefulSet"}
    others = [
        _owned(builders.pod(role, i), "StatefulSet", f"ctr-{role}", sets[f"ctr-{role}"])
        for role in ("ps", "worker")
        for i in range(2)
    ]
    status = builders.came_up(phase="Restarting", restarts=1, tracking=builders.tracking_of(others))
    return Restarted(builders.with_status(job, **status) | {"metadata": job["metadata"]}, children, others)


@pytest.mark.parametrize(
    "cache_shows",
    ["the old chief Job", "no chief Job and no chief pod", "no PS StatefulSet", "nothing but the job"],
)
def test_a_restarts_new_chief_job_waits_for_the_old_chief_pod_whatever_the_watch_cache_shows(
    monkeypatch: pytest.MonkeyPatch, cache_shows: str
) -> None:
    """Never two chiefs: after a restart (attempt 1) the API still has the old attempt's chief pod
    running, its Job gone. However stale the watch cache is (it missed the Job's deletion, the old
    pod, or a child across an API server restart), the reconcile that would create the new chief
    Job reads the chief Jobs and the pods fresh first, and holds it. From the cache alone it would
    replace the Job at once in the first two cases."""
    monkeypatch.setattr(kopf, "event", lambda *_, **__: None)
    monkeypatch.setattr(reconciler, "UNEXPLAINED_WAIT", 0.0)
    restarted = _restarted_job()
    job, children, others = restarted.job, restarted.children, restarted.others
    old_chief = _owned(builders.pod("chief", 0, attempt=0), "Job", "ctr-chief", "old-job-uid")
    kube = PodsKube(job, children, [old_chief, *others])
    state = OperatorState(kube, Metrics())
    state.cache.job_seen("team-a", "ctr", job)
    old_job = builders.chief_job(0)
    old_job["metadata"] |= {"namespace": "team-a", "uid": "old-job-uid"}
    cached = {
        "the old chief Job": ([*children, old_job], others),
        "no chief Job and no chief pod": (children, others),
        "no PS StatefulSet": ([c for c in children if c["metadata"]["name"] != "ctr-ps"], others),
        "nothing but the job": ([], []),
    }[cache_shows]
    for child in cached[0]:
        state.cache.child_seen("ADDED", child)
    for pod in cached[1]:
        state.cache.pod_seen("ADDED", pod, parse_pod(pod))
    # Read fresh lately: the cache decides
    state.job(("team-a", "ctr"), logging.getLogger("test")).read_at = time.monotonic()
    asyncio.run(reconciler.reconcile_once(state, "team-a", "ctr", logging.getLogger("test")))
    assert ("POST", "/apis/batch/v1/namespaces/team-a/jobs") not in kube.calls
    assert ("DELETE", "/api/v1/namespaces/team-a/pods/ctr-chief-0x") in kube.calls  # asked to stop


@pytest.mark.parametrize("last_read_seconds_ago", [2.0, reconciler.DEPARTURE_RECHECK_SECONDS + 1])
def test_a_new_chief_held_for_an_old_chief_pod_the_watch_never_saw_go_is_made_at_a_fresh_read(
    monkeypatch: pytest.MonkeyPatch, last_read_seconds_ago: float
) -> None:
    """The watch showed the old chief pod stopping, then re-listed (410 Gone, a cut stream: seen in
    e2e/test_api_faults, a job held in Restarting for its whole 90 s wait) and sent no DELETED for
    it. The cache alone holds the new chief until the next full read, 10 minutes on; once the wait
    has lasted DEPARTURE_RECHECK_SECONDS since the last fresh read, the reconcile reads fresh, finds
    the pod gone and creates the next attempt's chief Job."""
    monkeypatch.setattr(kopf, "event", lambda *_, **__: None)
    monkeypatch.setattr(reconciler, "UNEXPLAINED_WAIT", 0.0)
    restarted = _restarted_job()
    job, children, others = restarted.job, restarted.children, restarted.others
    stopping = _owned(builders.pod("chief", 0, attempt=0, deleting=True), "Job", "ctr-chief", "old-job-uid")
    kube = PodsKube(job, children, others)  # the API: the old chief pod is gone
    state = OperatorState(kube, Metrics())
    state.cache.job_seen("team-a", "ctr", job)
    for child in children:
        state.cache.child_seen("ADDED", child)
    for pod in [stopping, *others]:
        state.cache.pod_seen("ADDED", pod, parse_pod(pod))
    state.job(("team-a", "ctr"), logging.getLogger("test")).read_at = time.monotonic() - last_read_seconds_ago
    asyncio.run(reconciler.reconcile_once(state, "team-a", "ctr", logging.getLogger("test")))
    created = ("POST", "/apis/batch/v1/namespaces/team-a/jobs") in kube.calls
    assert created == (last_read_seconds_ago > reconciler.DEPARTURE_RECHECK_SECONDS), kube.calls


def test_a_ps_the_watch_showed_marked_for_preemption_and_a_read_found_gone_counts_as_preempted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """e2e/test_recovery's preempted PS beside e2e/real's load (lastFailure "Deleted", once): the
    watch delivered the PS's DisruptionTarget, the reconcile it woke read fresh before acting and
    found the PS gone (KWOK removes a deleted pod at once), and the watch lagged on its deletion
    past the wait. Its last watched state tells how it ended."""
    monkeypatch.setattr(kopf, "event", lambda *_, **__: None)
    monkeypatch.setattr(reconciler, "UNEXPLAINED_WAIT", 0.0)
    job = builders.with_status(builders.job(), phase="Pending")
    job["metadata"]["resourceVersion"] = "7"
    children = _as_created(job)
    uids = {(c["kind"], c["metadata"]["name"]): c["metadata"]["uid"] for c in children}
    chief = _owned(builders.pod("chief", 0, attempt=0), "Job", "ctr-chief", uids[("Job", "ctr-chief")])
    pods = [chief] + [
        _owned(builders.pod(role, i), "StatefulSet", f"ctr-{role}", uids[("StatefulSet", f"ctr-{role}")])
        for role in ("ps", "worker")
        for i in range(2)
    ]
    status = builders.came_up(phase="Running", startTime="x", tracking=builders.tracking_of(pods))
    job = builders.with_status(job, **status) | {"metadata": job["metadata"]}
    marked = _owned(
        builders.pod("ps", 0, disruption="PreemptionByScheduler"),
        "StatefulSet",
        "ctr-ps",
        uids[("StatefulSet", "ctr-ps")],
    )
    kube = PodsKube(job, children, [p for p in pods if p["metadata"]["name"] != "ctr-ps-0"])  # gone
    state = OperatorState(kube, Metrics())
    state.cache.job_seen("team-a", "ctr", job)
    for child in children:
        state.cache.child_seen("ADDED", child)
    for pod in [marked if p["metadata"]["name"] == "ctr-ps-0" else p for p in pods]:
        state.cache.pod_seen("ADDED", pod, parse_pod(pod))
    # Read fresh lately: the cache decides
    state.job(("team-a", "ctr"), logging.getLogger("test")).read_at = time.monotonic() - 1
    asyncio.run(reconciler.reconcile_once(state, "team-a", "ctr", logging.getLogger("test")))
    status = kube.job["status"]
    assert (status["restarts"], status["countedRestarts"]) == (1, 0)
    assert status["lastFailure"]["reason"] == "Preempted", status["lastFailure"]


@pytest.mark.parametrize(
    "report",
    [
        '{"state":"failed","step":250,"checkpointStep":200,"checkpointTime":1733500000000}',  # ms
        '{"state":"failed","step":250,"checkpointStep":200,"checkpointTime":Infinity}',
        '{"state":"failed","step":250,"checkpointStep":200,"checkpointTime":NaN}',
        '{"state":"failed","step":100000000000000000000000000}',
        '{"state":"failed","step":"many","checkpointStep":[200]}',
    ],
)
def test_a_chief_whose_termination_message_is_no_valid_report_still_gets_its_verdict(
    monkeypatch: pytest.MonkeyPatch, report: str
) -> None:
    """A chief that failed with exit code 1 and a termination message the status cannot keep (a
    time in milliseconds, NaN, Infinity, a step past 64 bits, a wrong type): the job fails for the
    exit code, the report left out, and the report is told once, not at every reconcile of the
    message that never changes."""
    warnings: list[str] = []
    monkeypatch.setattr(kopf, "warn", lambda _job, reason, message: warnings.append(f"{reason}: {message}"))
    monkeypatch.setattr(kopf, "event", lambda *_, **__: None)
    job = builders.with_status(builders.job(), phase="Pending")
    job["metadata"]["resourceVersion"] = "7"
    children = _as_created(job)
    uids = {(c["kind"], c["metadata"]["name"]): c["metadata"]["uid"] for c in children}
    for child in children:
        if child["kind"] == "Job":
            child["status"] = builders.chief_job(failed="PodFailurePolicy")["status"]
    failed = {"exitCode": 1, "reason": "Error", "message": report}
    chief = builders.pod("chief", 0, attempt=0, phase="Failed", terminated=failed)
    pods = [_owned(chief, "Job", "ctr-chief", uids[("Job", "ctr-chief")])] + [
        _owned(builders.pod(role, i), "StatefulSet", f"ctr-{role}", uids[("StatefulSet", f"ctr-{role}")])
        for role in ("ps", "worker")
        for i in range(2)
    ]
    running = builders.came_up(phase="Running", step=100, tracking=builders.tracking_of(pods[1:]))
    job = builders.with_status(job, **running) | {"metadata": job["metadata"]}
    kube = PodsKube(job, children, pods)
    state = OperatorState(kube, Metrics())
    state.cache.job_seen("team-a", "ctr", job)

    def reconcile() -> None:
        asyncio.run(reconciler.reconcile_once(state, "team-a", "ctr", logging.getLogger("test")))

    reconcile()
    status = kube.job["status"]
    assert (status["phase"], status["lastFailure"]["exitCode"], status["step"]) == ("Failed", 1, 100)
    [warning] = warnings
    assert warning.startswith("InvalidProgressReport: the termination message of pod ctr-chief-0x is ignored")
    state.jobs[("team-a", "ctr")].read_at = None  # read again in full: the same message, told already
    reconcile()
    assert len(warnings) == 1


class ConflictingKube(OneJobKube):
    """OneJobKube that refuses a status write computed from another version than the job's (409),
    as the API server does, and has the job deleted once a write went through; every read of the
    job and status write is recorded in `job_requests`."""

    def __init__(self, job: Any, children: list[Any]) -> None:
        super().__init__(job, children)
        self.job_requests: list[str] = []
        self.deleted = False

    def get_job(self, namespace: str, name: str) -> Any:
        self.job_requests.append(
            "GET " + ("(gone)" if self.deleted else self.job["metadata"]["resourceVersion"])
        )
        return None if self.deleted else super().get_job(namespace, name)

    def patch_job_status(self, namespace: str, name: str, patch: Any, resource_version: str) -> Any:
        self.job_requests.append(f"PATCH {resource_version}")
        if resource_version != self.job["metadata"]["resourceVersion"]:
            raise StaleJob(f"{namespace}/{name} changed since version {resource_version}")
        self.deleted = True
        return super().patch_job_status(namespace, name, patch, resource_version)


def test_a_status_write_refused_as_stale_is_written_again_after_a_pause_and_a_fresh_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job never acted on is decided from the watch alone. Another writer changed it after the
    watch showed it (version 8 where the cache holds 7), so the status write is refused (409).
    The loop waits a random pause within RETRY_FIRST, reads the job and writes the status computed
    from what it read: not the same refused write again and again from the watch cache, at once."""
    monkeypatch.setattr(kopf, "event", lambda *_, **__: None)
    job = builders.job() | {"metadata": {**builders.job()["metadata"], "resourceVersion": "7"}}
    changed = job | {"metadata": {**job["metadata"], "resourceVersion": "8", "labels": {"team": "a"}}}
    kube = ConflictingKube(changed | {"status": {}}, [])
    state = OperatorState(kube, Metrics(), Config(resync_seconds=3600))
    state.cache.job_seen("team-a", "ctr", job)
    waits: list[float] = []
    real_timeout = asyncio.timeout

    def recorded_timeout(delay: float) -> asyncio.Timeout:
        waits.append(delay)
        return real_timeout(0)

    monkeypatch.setattr(asyncio, "timeout", recorded_timeout)
    _drawing_the("high", monkeypatch)
    asyncio.run(asyncio.wait_for(loop.run_job(state, "team-a", "ctr", logging.getLogger("test")), 10))
    # The refused write, the pause, the read and the write from it; then the job is gone.
    assert kube.job_requests == ["PATCH 7", "GET 8", "PATCH 8", "GET (gone)"]
    assert waits[0] == loop.RETRY_FIRST and kube.job["status"]["phase"] == "Pending"


def test_after_a_failed_reconcile_the_jobs_full_read_is_due_at_its_turn_not_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An API outage fails the reconciles of every job at once: none of them reads in full at its
    retry unless the periodic reads' pace gives it the turn (1,000 jobs: 7,000 requests at once
    otherwise); each decides from the watch cache meanwhile."""
    monkeypatch.setattr(kopf, "event", lambda *_, **__: None)
    kube, state = _pending_job_in_cache(Config(fresh_read_seconds=600, fresh_reads_per_second=0.5))
    key = ("team-a", "ctr")
    outcomes: list[Exception | None] = [ApiException(status=503, reason="Service Unavailable"), None, None]
    reads: list[int] = []
    reconcile = reconciler.reconcile_once

    async def failing_once(state: OperatorState, namespace: str, name: str, logger: Any) -> Any:
        before = kube.listed.count("Service")  # only a full read lists them
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome
        plan = await reconcile(state, namespace, name, logger)
        reads.append(kube.listed.count("Service") - before)
        if not outcomes:
            return None  # the loop ends
        state.next_periodic_read = -math.inf  # the next turn is this job's
        return plan

    monkeypatch.setattr(loop, "reconcile_once", failing_once)
    real_timeout = asyncio.timeout
    monkeypatch.setattr(asyncio, "timeout", lambda _delay: real_timeout(0))  # no wait between them
    state.job(key, logging.getLogger("test")).read_at = time.monotonic()  # read in full lately
    state.next_periodic_read = time.monotonic() + 60  # another job's periodic read just went
    state.jobs = _looping(1000)
    asyncio.run(loop.run_job(state, *key, logging.getLogger("test")))
    assert reads == [0, 1]  # the retry waits for its turn, then reads in full
