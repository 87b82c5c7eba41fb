"""What the watches have shown of each job, its children and its pods: reconciles read here.

kopf already streams every job and, through server-side label selectors (handlers.configure), only
the children and pods that carry a job's label; the event handlers keep the latest version of each
here, so a reconcile lists nothing. The operator's own creates and patches are kept as the API
server answered them, before their watch events arrive. A reconcile that is about to act (create,
patch or delete a child, delete a pod, restart the chief, emit an event) reads the job, its pods and
its chief Jobs fresh from the API and decides again (control/reconciler.py): the watch may lag the API
server by a few events, and the restart counter and the chief's attempt must be read where they were
last written, or a restart could be made twice. Now and then a full read (every kind of child) also
adds what the watch has not delivered and drops what vanished unseen (a watch that restarted after
its history was compacted sends no DELETED for objects gone meanwhile), which is why a reconcile
waiting for pods to go reads them fresh now and then too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from psoperator.api.labels import LABEL_JOB
from psoperator.observe.views import PodView, resource_version, slim_child, slim_job

Obj = dict[str, Any]
JobKey = tuple[str, str]  # (namespace, job name)
ChildKey = tuple[str, str]  # (kind, name)
# How long an object a fresh read found gone stays vanished when its DELETED never comes (a watch
# that re-listed meanwhile does not send it): an older event of it still queued in kopf that long
# after would mean the operator is minutes behind its watch.
VANISHED_SECONDS = 600.0


def _version(obj: Obj) -> int:
    return resource_version(obj.get("metadata", {}))


@dataclass
class _Entry:
    obj: Any  # a slim child, or a pod's view
    seen: float  # time.monotonic() of its arrival
    version: int  # observe.resource_version
    uid: str | None  # which object of its name: a pod replaced under the same name is another


@dataclass
class Snapshot:
    job: Obj
    children: list[Obj]  # with `kind` set on each
    pods: list[PodView]


@dataclass
class _Cached:
    """What the watches have shown of one job: the job, its children and its pods."""

    job: Obj
    children: dict[ChildKey, _Entry] = field(default_factory=dict)
    pods: dict[str, _Entry] = field(default_factory=dict)
    # The uids of the objects whose DELETED the watch delivered since the job's last fresh read: a
    # read under way then may still list them, and must not bring them back.
    deleted: set[str] = field(default_factory=set)
    # The uids of the objects a fresh read found gone (a consistent list without them; a uid is
    # never used again) whose DELETED the watch has not delivered yet: a watch that lags may still
    # bring an older state of one, which must not show it again. Each with when it was found gone.
    vanished: dict[str, float] = field(default_factory=dict)


@dataclass
class WatchCache:
    jobs: dict[JobKey, _Cached] = field(default_factory=dict)

    def job_seen(self, namespace: str, name: str, body: Obj) -> bool:
        """Keep the newer version of the job; True when it asks for a reconcile: new, a changed
        spec (generation) or being deleted. Its status, which the operator writes, does not."""
        key = (namespace, name)
        cached = self.jobs.get(key)
        old = cached.job if cached is not None else None
        if old is not None and _version(body) and _version(body) < _version(old):
            return False  # the echo of a write whose response is stored already
        if cached is None:
            self.jobs[key] = _Cached(slim_job(body))
        else:
            cached.job = slim_job(body)
        meta, before = body.get("metadata", {}), (old or {}).get("metadata", {})
        return (
            old is None or meta.get("generation") != before.get("generation") or "deletionTimestamp" in meta
        )

    def child_seen(self, event: str | None, body: Obj) -> JobKey | None:
        key = (str(body.get("kind")), _name(body))
        kept = _Entry(slim_child(body), time.monotonic(), _version(body), _uid(body))
        return self._seen(lambda cached: cached.children, event, body, key, kept)

    def pod_seen(self, event: str | None, body: Obj, view: PodView) -> JobKey | None:
        """The pod `body`, as parsed (`view`: observe.parse_pod) by the watch's handler."""
        kept = _Entry(view, time.monotonic(), view.version, view.uid)
        return self._seen(lambda cached: cached.pods, event, body, view.name, kept)

    def _seen(
        self,
        store_of: Callable[[_Cached], dict[Any, _Entry]],
        event: str | None,
        body: Obj,
        key: Any,
        kept: _Entry,
    ) -> JobKey | None:
        meta = body.get("metadata", {})
        job = meta.get("labels", {}).get(LABEL_JOB)
        if not job or not meta.get("namespace"):
            return None
        owner = (meta["namespace"], job)
        cached = self.jobs.get(owner)
        if cached is None:
            # A job forgotten (the garbage collector deletes its objects after it) or not seen yet
            # (a watch listed before the jobs' own): its first reconcile reads it in full.
            return None
        store = store_of(cached)
        if kept.uid in cached.vanished:
            if event != "DELETED":
                return owner  # an older state of an object a fresh read found gone: it stays gone
            del cached.vanished[kept.uid]
        if event == "DELETED":
            if kept.uid:
                cached.deleted.add(kept.uid)
            # Only the object it names: a fresh read may have stored its successor of the same name
            # before the watch delivered this (a late DELETED of the old ctr-ps-0).
            if store.get(key, kept).uid == kept.uid:
                store.pop(key, None)
        else:
            held = store.get(key)
            if held is None or kept.version >= held.version:  # else the echo of a write kept already
                store[key] = kept
        return owner

    def forget(self, key: JobKey) -> None:
        self.jobs.pop(key, None)

    def snapshot(self, key: JobKey) -> Snapshot | None:
        cached = self.jobs.get(key)
        if cached is None:
            return None
        children = [e.obj for e in cached.children.values()]
        return Snapshot(cached.job, children, [e.obj for e in cached.pods.values()])

    def read_fresh(
        self,
        key: JobKey,
        job: Obj,
        children: list[Obj],
        pods: list[PodView],
        started: float,
        kinds: Collection[str] | None = None,
    ) -> list[PodView]:
        """A fresh read of the job (begun at `started`; its pods parsed already; its children of
        `kinds`, or of every kind: None, a full read): add what the watch has not shown yet, drop
        what it last showed before the read began and the read no longer found, and leave out what
        the watch saw deleted meanwhile. A later read begins after every deletion seen so far, so
        none of them is kept for it. What it dropped stays gone (vanished) until its DELETED, or
        VANISHED_SECONDS if the watch never sends that.
        Returns the pods it dropped or found replaced, as the watch last showed them: gone, and the
        watch has not said how yet."""
        self.job_seen(*key, job)
        cached = self.jobs[key]
        deleted, cached.deleted = cached.deleted, set()
        slim = {
            (str(c["kind"]), _name(c)): _Entry(slim_child(c), started, _version(c), _uid(c)) for c in children
        }

        def was_read(child: ChildKey) -> bool:
            return kinds is None or child[0] in kinds

        dropped_children = _merge(cached.children, slim, started, deleted, was_read)
        pods_listed = {p.name: _Entry(p, started, p.version, p.uid) for p in pods}
        dropped = _merge(cached.pods, pods_listed, started, deleted, lambda _: True)
        uids = [e.uid for e in [*dropped_children, *dropped] if e.uid]
        kept = {uid: at for uid, at in cached.vanished.items() if started < at + VANISHED_SECONDS}
        cached.vanished = {**kept, **dict.fromkeys(uids, started)}  # found gone long ago: let go
        return [entry.obj for entry in dropped]


def _merge(
    entries: dict[Any, _Entry],
    listed: dict[Any, _Entry],
    started: float,
    deleted: set[str],
    was_read: Callable[[Any], bool],
) -> list[_Entry]:
    """Merge a read into a job's entries of one kind; the entries it dropped, or replaced by another
    object."""
    dropped = []
    for name in [n for n, e in entries.items() if n not in listed and e.seen < started and was_read(n)]:
        dropped.append(entries.pop(name))
    for name, entry in listed.items():
        kept = entries.get(name)
        if entry.uid in deleted or (kept is not None and entry.version <= kept.version):
            continue
        if kept is not None and kept.uid != entry.uid:
            dropped.append(kept)
        entries[name] = entry
    return dropped


def _name(obj: Obj) -> str:
    return str(obj.get("metadata", {}).get("name", ""))


def _uid(obj: Obj) -> str | None:
    uid = obj.get("metadata", {}).get("uid")
    return str(uid) if uid else None
