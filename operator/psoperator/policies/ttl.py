"""ttlSecondsAfterFinished: a finished job is deleted, and its children with it."""

from __future__ import annotations

from datetime import datetime

from psoperator.api.models import PSTrainingJobSpec, PSTrainingJobStatus
from psoperator.api.vocabulary import FINISHED_PHASES
from psoperator.timeutil import parse_time


def seconds_left(spec: PSTrainingJobSpec, status: PSTrainingJobStatus, now: datetime) -> float | None:
    """Seconds until the job is to be deleted (negative once due), or None if it is not to be."""
    ttl = spec.run_policy.ttl_seconds_after_finished
    finished = parse_time(status.completion_time)
    if ttl is None or finished is None or status.phase not in FINISHED_PHASES:
        return None
    return ttl - (now - finished).total_seconds()
