"""Stalled: the global step has not advanced for stallTimeoutSeconds while every pod runs."""

from __future__ import annotations

from datetime import datetime

from psoperator.api.models import PSTrainingJobSpec
from psoperator.timeutil import parse_time


def seconds_left(
    spec: PSTrainingJobSpec, step_since: str | None, all_running: bool, now: datetime
) -> float | None:
    """Seconds until the job counts as stalled (none left: it does); None while no stall clock runs.
    `step_since`: when the step last changed (or the job started running), as stored in status."""
    timeout = spec.failure_policy.stall_timeout_seconds
    since = parse_time(step_since)
    if timeout is None or since is None or not all_running:
        return None
    return timeout - (now - since).total_seconds()
