"""Pods the scheduler cannot place: told in the Unschedulable condition, and, with
failurePolicy.schedulingTimeoutSeconds, a job whose chief or parameter servers wait too long fails.

Without a timeout a pod waits for room as long as Kubernetes lets it (a cluster autoscaler may be
adding nodes); the condition and its event say why, instead of a job that sits in Creating.
"""

from __future__ import annotations

from datetime import datetime

from psoperator.api.models import PSTrainingJobSpec
from psoperator.contract import Role
from psoperator.observe.failures import Failure
from psoperator.observe.views import Observed, PodView
from psoperator.timeutil import parse_time

# Training cannot start without these; a worker or the evaluator waiting for room is only told.
REQUIRED_ROLES = frozenset({Role.CHIEF, Role.PS})
MAX_NAMED = 5  # pods named in the condition's message


def unscheduled(observed: Observed, attempt: int) -> list[PodView]:
    """The current attempt's pods that the scheduler has not placed."""
    return [p for p in observed.current_pods(attempt) if p.unscheduled is not None and not p.deleting]


def as_failure(pod: PodView) -> Failure:
    assert pod.role is not None and pod.unscheduled is not None
    return Failure(pod.role, pod.name, pod.index, pod.unscheduled.reason, pod.unscheduled.message[:512])


def describe(pods: list[PodView]) -> str:
    """The scheduler's word on each waiting pod (the first few)."""
    named = "; ".join(as_failure(p).describe() for p in pods[:MAX_NAMED])
    more = len(pods) - MAX_NAMED
    return f"{named}; and {more} more" if more > 0 else named


def seconds_left(spec: PSTrainingJobSpec, pods: list[PodView], now: datetime) -> dict[str, float]:
    """Each unscheduled chief or PS pod (by name) and the seconds left of schedulingTimeoutSeconds
    (none left: it timed out); nothing without the timeout."""
    timeout = spec.failure_policy.scheduling_timeout_seconds
    left: dict[str, float] = {}
    for pod in pods:
        assert pod.unscheduled is not None
        since = parse_time(pod.unscheduled.since or pod.created)
        if timeout is not None and pod.role in REQUIRED_ROLES and since is not None:
            left[pod.name] = timeout - (now - since).total_seconds()
    return left


def timed_out(spec: PSTrainingJobSpec, pods: list[PodView], now: datetime) -> PodView | None:
    """The first chief or PS pod unscheduled for longer than schedulingTimeoutSeconds, if any."""
    left = seconds_left(spec, pods, now)
    return next((pod for pod in pods if left.get(pod.name, 1.0) <= 0), None)
