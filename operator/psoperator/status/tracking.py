"""The tracking memory in the job's status: what the operator last saw of the long-running pods
(a `TrackedPod` each) and of the pods unable to start (a `StartError` each), computed after each
reconcile, so that the next one can tell a lost or restarted pod from a healthy one."""

from __future__ import annotations

from datetime import datetime

from psoperator.api.models import PSTrainingJobStatus, StartError, TrackedPod, Tracking
from psoperator.contract import Role
from psoperator.observe.failures import TRACKED_ROLES
from psoperator.observe.views import START_ERRORS, Observed, PodView
from psoperator.timeutil import format_time, parse_time


def tracked(pod: PodView, previous: TrackedPod | None = None) -> TrackedPod:
    """The pod's record; a disruption once seen stays in it while the pod is the same."""
    kept = previous.disruption if previous is not None and previous.uid == pod.uid else None
    return TrackedPod(
        uid=pod.uid,
        restarts=pod.restarts,
        sidecarRestarts=sum(pod.sidecar_restarts.values()),
        disruption=pod.disruption or kept,
    )


def unchanged_since(entry: TrackedPod | None, pod: PodView) -> bool:
    """The same pod, its trainer not restarted, since `entry` was tracked."""
    return entry is not None and (entry.uid, entry.restarts) == (pod.uid, pod.restarts)


def tracked_pods(observed: Observed) -> list[PodView]:
    return [p for role in TRACKED_ROLES for p in observed.role_pods(role)]


def _grace_left(error: StartError, now: datetime, grace_seconds: int) -> float:
    """Seconds of the grace period the episode has left (none when its start is unknown)."""
    since = parse_time(error.since)
    return 0.0 if since is None else grace_seconds - (now - since).total_seconds()


def overdue(error: StartError, now: datetime, grace_seconds: int) -> bool:
    return _grace_left(error, now, grace_seconds) <= 0


def start_error_of(tracking: Tracking, pod: PodView, now: datetime) -> StartError | None:
    """The pod's current inability to start, continuing the tracked episode if it is the same one.

    The API gives a waiting state no time and the pod's age says nothing after a restart in place,
    so the grace period runs from when the operator first saw this episode (same pod, same restarts).
    """
    if pod.waiting_reason not in START_ERRORS:
        return None
    seen = (tracking.start_errors or {}).get(pod.name)
    if seen is not None and (seen.uid, seen.restarts) == (pod.uid, pod.restarts):
        return seen
    return StartError(uid=pod.uid, restarts=pod.restarts, since=format_time(now))


def next_start_errors(
    tracking: Tracking, observed: Observed, attempt: int, now: datetime, grace_seconds: int
) -> dict[str, StartError]:
    """The start errors to track after this reconcile; those past the grace period are told."""
    result: dict[str, StartError] = {}
    for pod in observed.current_pods(attempt):
        error = start_error_of(tracking, pod, now)
        if error is not None:
            told = error.told or overdue(error, now, grace_seconds)
            result[pod.name] = error.model_copy(update={"told": told})
    return result


def grace_left(errors: dict[str, StartError], now: datetime, grace_seconds: int) -> float | None:
    """Seconds until the first start error not told yet is past the grace period; None: none is."""
    return min((_grace_left(e, now, grace_seconds) for e in errors.values() if not e.told), default=None)


def ps_tracking_changed(old: Tracking, new: Tracking, observed: Observed) -> bool:
    """A parameter server appeared, was replaced or restarted since the tracking was last stored.
    One that a restart recycles going away is not news: it is written with the next status change."""
    recycled = set((old.recycling or {}).values())
    ps = [p for p in observed.role_pods(Role.PS) if p.uid not in recycled]
    return any(old.pods.get(p.name) != new.pods.get(p.name) for p in ps)


def next_tracking(
    status: PSTrainingJobStatus, observed: Observed, ps_replicas: int, restarted: bool
) -> Tracking:
    """The tracking to store after this reconcile of a running job.

    After a restart the new chief has not met the parameter servers yet, so they are not established.
    """
    live = [p for p in tracked_pods(observed) if not (p.deleting or p.failed or p.node_lost)]
    pods = {p.name: tracked(p, status.tracking.pods.get(p.name)) for p in live}
    if restarted:
        return Tracking(psEstablished=False, pods=pods)
    current = observed.current_chief_job(status.restarts) is not None
    all_ps_run = len(observed.running(Role.PS)) == ps_replicas
    established = status.tracking.ps_established or (all_ps_run and current)
    return Tracking(psEstablished=established, pods=pods)
