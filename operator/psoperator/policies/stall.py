"""Stalled: the global step has not advanced for stallTimeoutSeconds while every pod runs."""

from __future__ import annotations

from datetime import datetime

from psoperator.api.models import PSTrainingJobSpec
from psoperator.timeutil import parse_time


def is_stalled(spec: PSTrainingJobSpec, step_since: str | None, all_running: bool, now: datetime) -> bool:
    """`step_since`: when the step last changed (or the job started running), as stored in status."""
    timeout = spec.failure_policy.stall_timeout_seconds
    since = parse_time(step_since)
    if timeout is None or since is None or not all_running:
        return False
    return (now - since).total_seconds() >= timeout
