"""The chief's progress report, from its progress port (bytes) or its termination message (text).

Promised (contract.ProgressReport.read): no exception, whatever the text; a report or a rejection
saying why in at most 512 characters; a report's values keep the job's status writable once
merged; a report's JSON is a fixed point (what the trainer writes, the operator reads back).
"""

from __future__ import annotations

from psoperator.api.models import CheckpointStatus, PSTrainingJobStatus
from psoperator.contract import ProgressReport, RejectedReport
from psoperator.status.progress import merge_progress
from tests.fuzz.invariants import writable

NOW = "2026-11-29T12:00:00Z"


def check(given: bytes | str) -> None:
    report = ProgressReport.read(given)
    assert report is None or isinstance(report, ProgressReport | RejectedReport)
    if isinstance(report, RejectedReport):
        assert 0 < len(report.reason) <= 512
    if not isinstance(report, ProgressReport):
        assert ProgressReport.parse(given) is None
        return
    for status in (
        PSTrainingJobStatus(),
        PSTrainingJobStatus(step=7, checkpoint=CheckpointStatus(step=5, path="/c/ckpt-5", time=NOW)),
    ):
        merge_progress(status, report, NOW)
        writable(status.model_dump(by_alias=True, exclude_none=True, mode="json"))
    text = report.to_json()
    again = ProgressReport.read(text)
    assert isinstance(again, ProgressReport), again
    assert again.to_json() == text


def TestOneInput(data: bytes) -> None:
    check(data)
    check(data.decode(errors="replace"))  # a termination message: text as the API gives it
