"""The chief's answer to a checkpoint request (POST /checkpoint), as the operator reads it.

Promised (contract.CheckpointAnswer.parse): no exception, whatever the body; an answer's values keep
the job's status writable once recorded as status.lastPlannedStop; its JSON round-trips.
"""

from __future__ import annotations

from datetime import UTC, datetime

from psoperator.api.models import PSTrainingJobStatus
from psoperator.contract import CheckpointAnswer
from psoperator.policies import planned_stop
from psoperator.policies.planned_stop import CheckpointAsk, CheckpointOutcome, StopCause
from tests.fuzz.invariants import writable

ASK = CheckpointAsk(
    cause=StopCause.DRAIN,
    chief_uid="chief-uid",
    chief_ip="10.0.0.1",
    deadline_seconds=60.0,
    hold_seconds=60.0,
    pods=("ctr-ps-0",),
    uids=("ps-0-uid",),
)
AT = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


def TestOneInput(data: bytes) -> None:
    answer = CheckpointAnswer.parse(data)
    if answer is None:
        return
    assert CheckpointAnswer.parse(answer.to_json()) == answer
    for status in (200, 503):
        stop = planned_stop.record(CheckpointOutcome(ASK, status, answer, AT))
        planned_stop.describe(stop)
        planned_stop.describe_drain(stop)
        job_status = PSTrainingJobStatus(lastPlannedStop=stop)
        writable(job_status.model_dump(by_alias=True, exclude_none=True, mode="json"))
