"""The watch cache: what the watches delivered, which changes of a job wake it, and a fresh read."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from typing import Any

from psoperator.api.labels import LABEL_JOB
from psoperator.observe.cache import VANISHED_SECONDS, WatchCache
from psoperator.observe.views import parse_pod, slim_child
from psoperator.render import render_children
from tests.unit.builders import NS, job

Obj = dict[str, Any]


def _job(generation: int, version: int, **status: Any) -> Obj:
    body = job()
    body["metadata"].update(generation=generation, resourceVersion=str(version))
    body["status"] = status
    return body


def _pod(name: str, phase: str = "Running", version: int = 1) -> Obj:
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"{name}-uid",
            "resourceVersion": str(version),
            "labels": {LABEL_JOB: "ctr"},
            "managedFields": [{"manager": "kubelet"}],
        },
        "spec": {"nodeName": "n1", "containers": [{"name": "trainer", "env": [{"name": "TF_CONFIG"}]}]},
        "status": {"phase": phase},
    }


def _seen(cache: WatchCache, event: str, body: Obj) -> tuple[str, str] | None:
    """The pod as the watch's handler hands it over: with its parsed view."""
    return cache.pod_seen(event, body, parse_pod(body))


def test_the_operator_s_own_status_write_does_not_ask_for_a_reconcile() -> None:
    cache = WatchCache()
    assert cache.job_seen(NS, "ctr", _job(1, 10))  # new
    assert not cache.job_seen(NS, "ctr", _job(1, 11, step=100))  # status only
    assert cache.job_seen(NS, "ctr", _job(2, 12, step=100))  # the spec changed


def test_an_older_version_of_the_job_does_not_replace_a_newer_write_response() -> None:
    cache = WatchCache()
    cache.job_seen(NS, "ctr", _job(1, 20, step=200))  # the response of the operator's status write
    cache.job_seen(NS, "ctr", _job(1, 15, step=100))  # an earlier version, late through the watch
    snapshot = cache.snapshot((NS, "ctr"))
    assert snapshot is not None and snapshot.job["status"] == {"step": 200}


def test_children_and_pods_come_from_events_and_go_with_deletion() -> None:
    cache = WatchCache()
    cache.job_seen(NS, "ctr", _job(1, 1))
    for child in render_children(job()):
        assert cache.child_seen("ADDED", child) == (NS, "ctr")
    assert _seen(cache, "ADDED", _pod("ctr-ps-0")) == (NS, "ctr")
    _seen(cache, "MODIFIED", _pod("ctr-ps-0", "Failed", 2))
    _seen(cache, "ADDED", _pod("ctr-ps-1"))
    _seen(cache, "DELETED", _pod("ctr-ps-1"))
    snapshot = cache.snapshot((NS, "ctr"))
    assert snapshot is not None
    rendered = {(c["kind"], c["metadata"]["name"]) for c in render_children(job())}
    assert {(c["kind"], c["metadata"]["name"]) for c in snapshot.children} == rendered
    [pod] = snapshot.pods
    assert (pod.phase, pod.version) == ("Failed", 2)  # the latest version, kept as parsed
    cache.forget((NS, "ctr"))
    assert cache.snapshot((NS, "ctr")) is None and cache.jobs == {}


def test_the_objects_of_a_forgotten_job_leave_nothing_behind_as_the_garbage_collector_deletes_them() -> None:
    """After its job is forgotten, the garbage collector marks each pod and child deleting, then
    deletes it: none of their events keeps anything (not even its uid) or wakes a loop."""
    cache = WatchCache()
    key = (NS, "ctr")
    cache.job_seen(NS, "ctr", _job(1, 1))
    pods = [_pod(f"ctr-worker-{i}") for i in range(200)]
    children = render_children(job())
    for pod in pods:
        _seen(cache, "ADDED", pod)
    for child in children:
        cache.child_seen("ADDED", child | {"metadata": {**child["metadata"], "uid": child["kind"]}})
    cache.forget(key)
    for pod in pods:
        deleting = {**pod["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z", "resourceVersion": "2"}
        assert _seen(cache, "MODIFIED", pod | {"metadata": deleting}) is None
        assert _seen(cache, "DELETED", pod | {"metadata": deleting}) is None
    for child in children:
        assert (
            cache.child_seen("DELETED", child | {"metadata": {**child["metadata"], "uid": child["kind"]}})
            is None
        )
    assert cache.jobs == {}


def test_an_object_without_the_job_label_is_not_kept() -> None:
    cache = WatchCache()
    stranger = _pod("other")
    stranger["metadata"]["labels"] = {}
    assert _seen(cache, "ADDED", stranger) is None and cache.jobs == {}


def test_a_fresh_read_adds_what_the_watch_has_not_shown_and_drops_what_vanished_unseen() -> None:
    cache = WatchCache()
    key = (NS, "ctr")
    cache.job_seen(NS, "ctr", _job(1, 1))
    _seen(cache, "ADDED", _pod("vanished"))  # its DELETED event was lost (a watch restarted)
    _seen(cache, "ADDED", _pod("ctr-ps-0", "Running", 5))
    started = time.monotonic()
    _seen(cache, "ADDED", _pod("after-the-read-began"))  # too new for the read to know
    listed = [parse_pod(_pod("ctr-ps-0", "Pending", 3)), parse_pod(_pod("not-watched-yet"))]
    cache.read_fresh(key, _job(1, 2), [], listed, started)
    snapshot = cache.snapshot(key)
    assert snapshot is not None
    phases = {p.name: p.phase for p in snapshot.pods}
    # ctr-ps-0: the watch's version is newer than the listed one, and is kept.
    assert phases == {"ctr-ps-0": "Running", "after-the-read-began": "Running", "not-watched-yet": "Running"}


def test_a_fresh_read_returns_the_pods_it_found_gone_as_the_watch_last_showed_them() -> None:
    """Gone (or replaced under its name) while the watch has not said how: its last watched state
    is what the reconcile will go by if the watch stays silent (control/reconciler.py observe)."""
    cache = WatchCache()
    key = (NS, "ctr")
    cache.job_seen(NS, "ctr", _job(1, 1))
    marked = _pod("ctr-ps-0", version=5)
    marked["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True", "reason": "Preemption"}]
    _seen(cache, "MODIFIED", marked)
    _seen(cache, "ADDED", _pod("ctr-ps-1", version=6))
    _seen(cache, "ADDED", _pod("ctr-worker-0", version=7))
    started = time.monotonic()
    _seen(cache, "ADDED", _pod("after-the-read-began"))
    replaced = _pod("ctr-ps-1", "Pending", 9)
    replaced["metadata"]["uid"] = "ctr-ps-1-new-uid"
    listed = [parse_pod(replaced), parse_pod(_pod("ctr-worker-0", version=7))]
    dropped = cache.read_fresh(key, _job(1, 2), [], listed, started)
    assert {(p.name, p.uid, p.disruption) for p in dropped} == {
        ("ctr-ps-0", "ctr-ps-0-uid", "Preemption"),
        ("ctr-ps-1", "ctr-ps-1-uid", None),
    }
    assert cache.read_fresh(key, _job(1, 3), [], listed, time.monotonic()) == [
        parse_pod(_pod("after-the-read-began"))
    ]


def test_a_late_deletion_of_an_old_pod_does_not_remove_the_new_pod_of_its_name() -> None:
    """The StatefulSet replaced ctr-ps-0; a fresh read stored the new one before the watch delivered
    the old one's DELETED. The next reconcile from the cache must still see the PS."""
    cache = WatchCache()
    key = (NS, "ctr")
    cache.job_seen(NS, "ctr", _job(1, 1))
    old = _pod("ctr-ps-0", "Running", 5)
    _seen(cache, "ADDED", old)
    new = _pod("ctr-ps-0", "Pending", 9)
    new["metadata"]["uid"] = "ctr-ps-0-new-uid"
    cache.read_fresh(key, _job(1, 2), [], [parse_pod(new)], time.monotonic())
    _seen(cache, "DELETED", _pod("ctr-ps-0", "Failed", 6))  # the old pod's last word, late
    snapshot = cache.snapshot(key)
    assert snapshot is not None and [p.uid for p in snapshot.pods] == ["ctr-ps-0-new-uid"]
    _seen(cache, "DELETED", new)
    assert cache.snapshot(key) == replace(snapshot, pods=[])


def test_a_pod_a_fresh_read_found_gone_is_not_brought_back_by_a_watch_that_lags() -> None:
    """A consistent list that no longer has a pod proves it gone (a uid is never used again): an
    older event of it that a lagging watch delivers afterwards must not show it again as it ran,
    nor may any later one but its DELETED (which lets it go from memory)."""
    cache = WatchCache()
    key = (NS, "ctr")
    cache.job_seen(NS, "ctr", _job(1, 1))
    _seen(cache, "ADDED", _pod("ctr-ps-0", "Pending", 3))
    cache.read_fresh(key, _job(1, 2), [], [], time.monotonic())  # gone, and the watch has not said so
    for event, phase, version in [("MODIFIED", "Running", 4), ("MODIFIED", "Failed", 9)]:
        assert _seen(cache, event, _pod("ctr-ps-0", phase, version)) == key  # still wakes the job
        snapshot = cache.snapshot(key)
        assert snapshot is not None and snapshot.pods == []
    _seen(cache, "DELETED", _pod("ctr-ps-0", "Failed", 10))
    assert not cache.jobs[key].vanished


def test_a_pod_found_gone_whose_deleted_never_comes_is_let_go_at_a_read_long_after() -> None:
    """A watch that re-listed across a pod's deletion never sends its DELETED: the uid it left
    vanished is let go at the first fresh read VANISHED_SECONDS later, not kept for the job's
    lifetime; a read before then keeps it, so a lagging event still cannot show the pod again.
    The read comes at a time where `(start + VANISHED_SECONDS) - start` rounds below
    VANISHED_SECONDS, as it does at some times of a clock that has run long enough."""
    cache = WatchCache()
    key = (NS, "ctr")
    cache.job_seen(NS, "ctr", _job(1, 1))
    _seen(cache, "ADDED", _pod("ctr-ps-0", "Pending", 3))
    start = _a_later_time_whose_sum_rounds_down(VANISHED_SECONDS)
    cache.read_fresh(key, _job(1, 2), [], [], start)
    assert cache.jobs[key].vanished
    cache.read_fresh(key, _job(1, 2), [], [], start + VANISHED_SECONDS - 1)
    _seen(cache, "MODIFIED", _pod("ctr-ps-0", "Running", 4))
    snapshot = cache.snapshot(key)
    assert snapshot is not None and snapshot.pods == []
    cache.read_fresh(key, _job(1, 2), [], [], start + VANISHED_SECONDS)
    assert not cache.jobs[key].vanished


def _a_later_time_whose_sum_rounds_down(span: float) -> float:
    """A time after now at which `(t + span) - t < span` in floating point: `t + span` crosses a
    power of two, where the spacing of floats doubles."""
    t = 2.0 ** math.ceil(math.log2(time.monotonic() + 2 * span)) - span / 2
    while (t + span) - t >= span:
        t = math.nextafter(t, math.inf)
    return t


def test_a_deletion_seen_while_a_fresh_read_is_under_way_is_not_undone_by_it() -> None:
    """A child deleted by hand while a read was under way (the TF_CONFIG ConfigMap of a job with 400
    pods, on a loaded machine): the list still had it, its DELETED came before the read ended.
    Brought back by the read, it stayed in the cache with no event to remove it, and was not made
    again."""
    cache = WatchCache()
    key = (NS, "ctr")
    cache.job_seen(NS, "ctr", _job(1, 1))
    children = render_children(job())
    for child in children:
        child["metadata"]["uid"] = f"{child['kind']}-{child['metadata']['name']}-uid"
        cache.child_seen("ADDED", child)
    pod = _pod("ctr-chief-x")
    _seen(cache, "ADDED", pod)
    started = time.monotonic()
    [service] = [c for c in children if c["metadata"]["name"] == "ctr-ps" and c["kind"] == "Service"]
    cache.child_seen("DELETED", service)
    _seen(cache, "DELETED", pod)
    cache.read_fresh(key, _job(1, 2), children, [parse_pod(pod)], started)
    snapshot = cache.snapshot(key)
    assert snapshot is not None and not snapshot.pods
    kept = {(c["kind"], c["metadata"]["name"]) for c in snapshot.children}
    assert len(kept) == len(children) - 1 and ("Service", "ctr-ps") not in kept
    # The next read begins after the deletion: what it lists is the API server's word again.
    service["metadata"]["uid"] = "the-new-service-uid"
    cache.read_fresh(key, _job(1, 3), children, [], time.monotonic())
    snapshot = cache.snapshot(key)
    assert snapshot is not None and len(snapshot.children) == len(children)


def test_the_job_is_kept_without_its_managed_fields() -> None:
    cache = WatchCache()
    body = _job(1, 3, phase="Running")
    body["metadata"]["managedFields"] = [{"manager": "ps-training-operator", "fieldsV1": {"f:status": {}}}]
    cache.job_seen(NS, "ctr", body)
    kept = cache.jobs[(NS, "ctr")].job
    assert "managedFields" not in kept["metadata"]
    assert kept == {**body, "metadata": {k: v for k, v in body["metadata"].items() if k != "managedFields"}}


def test_the_kept_objects_of_two_jobs_share_one_copy_of_their_short_strings() -> None:
    """Each watch event is parsed anew, so each job's objects come with their own copies of the same
    keys, labels and kinds; the cache keeps one copy of each."""
    cache = WatchCache()
    bodies = {}
    for name in ("a", "b"):
        # As parsed from JSON: equal strings, not the same objects.
        body = json.loads(json.dumps(_job(1, 3, phase="Running")))
        body["metadata"]["name"] = name
        bodies[name] = body
        cache.job_seen(NS, name, body)
        [service] = [json.loads(json.dumps(c)) for c in render_children(body) if c["kind"] == "Service"][:1]
        cache.child_seen("ADDED", service)
    a, b = cache.jobs[(NS, "a")].job, cache.jobs[(NS, "b")].job
    assert a["status"]["phase"] is b["status"]["phase"]
    assert all(x is y for x, y in zip(a["spec"], b["spec"], strict=True))  # the keys
    (sa,), (sb,) = (list(cache.jobs[(NS, name)].children.values()) for name in ("a", "b"))
    assert sa.obj["metadata"]["labels"][LABEL_JOB] == "a" and sa.obj == slim_child(sa.obj)
    assert all(
        x is y for x, y in zip(sa.obj["metadata"]["labels"], sb.obj["metadata"]["labels"], strict=True)
    )
    assert a == bodies["a"]  # equal, only shared


def test_a_read_of_some_kinds_drops_only_what_it_read_and_is_not_the_jobs_full_read() -> None:
    """The read before acting lists the job's pods and chief Jobs (control/reconciler.py ACT_READ):
    a chief Job it no longer found goes; a Service it did not read stays."""
    cache = WatchCache()
    key = (NS, "ctr")
    cache.job_seen(NS, "ctr", _job(1, 1))
    children = render_children(job())
    for child in children:
        cache.child_seen("ADDED", child)
    cache.read_fresh(key, _job(1, 2), [], [], time.monotonic(), ["Job"])
    snapshot = cache.snapshot(key)
    assert snapshot is not None
    kept = {(c["kind"], c["metadata"]["name"]) for c in snapshot.children}
    assert kept == {(c["kind"], c["metadata"]["name"]) for c in children if c["kind"] != "Job"}


def test_a_late_watch_event_does_not_replace_the_operators_own_write() -> None:
    """The operator keeps a child as the API server answered its patch (version 9); the watch then
    delivers the version before it (8), the patch's own (9) and a later one (10)."""
    cache = WatchCache()
    cache.job_seen(NS, "ctr", _job(1, 1))
    statefulset = next(c for c in render_children(job()) if c["kind"] == "StatefulSet")

    def version(number: int) -> Obj:
        return {**statefulset, "metadata": {**statefulset["metadata"], "resourceVersion": str(number)}}

    def kept() -> Any:
        snapshot = cache.snapshot((NS, "ctr"))
        assert snapshot is not None
        [child] = snapshot.children
        return child["metadata"]["resourceVersion"]

    cache.child_seen("MODIFIED", version(9))
    cache.child_seen("MODIFIED", version(8))
    assert kept() == "9"
    cache.child_seen("MODIFIED", version(9))
    cache.child_seen("MODIFIED", version(10))
    assert kept() == "10"
