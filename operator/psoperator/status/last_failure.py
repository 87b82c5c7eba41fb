"""status.lastFailure: a failure as the job's status records it."""

from __future__ import annotations

from psoperator.api.models import FailureRecord
from psoperator.contract import Role
from psoperator.observe.failures import Failure


def failure_record(failure: Failure, now: str) -> FailureRecord:
    replicated = failure.role in (Role.PS, Role.WORKER) and failure.index is not None
    task = f"{failure.role.value}-{failure.index}" if replicated else failure.role.value
    return FailureRecord(
        role=failure.role.value,
        index=failure.index,
        pod=failure.pod or None,
        exitCode=failure.exit_code,
        reason=failure.reason,
        message=failure.message,
        time=failure.at or now,
        summary=f"{task} {failure.reason}",
    )
