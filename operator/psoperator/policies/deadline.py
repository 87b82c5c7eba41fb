"""activeDeadlineSeconds: a job that runs for too long fails."""

from __future__ import annotations

from datetime import datetime

from psoperator.api.models import PSTrainingJobSpec, PSTrainingJobStatus
from psoperator.timeutil import parse_time


def seconds_left(spec: PSTrainingJobSpec, status: PSTrainingJobStatus, now: datetime) -> float | None:
    """Seconds until the deadline (negative once passed), or None without a deadline or start."""
    deadline = spec.run_policy.active_deadline_seconds
    started = parse_time(status.start_time)
    if deadline is None or started is None:
        return None
    return deadline - (now - started).total_seconds()
