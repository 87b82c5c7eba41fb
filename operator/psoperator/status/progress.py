"""What the chief's progress report adds to the status: the step, the resumed step, the checkpoint."""

from __future__ import annotations

from datetime import UTC, datetime

from psoperator.api.models import CheckpointStatus, PSTrainingJobStatus
from psoperator.contract import ProgressReport
from psoperator.timeutil import format_time


def merge_progress(status: PSTrainingJobStatus, report: ProgressReport | None, now: str) -> None:
    """The report's step (stepTime when it moved), resumed step and checkpoint, never an older one."""
    if report is None:
        return
    if status.step is None or report.step != status.step:
        status.step_time = now
    status.step = report.step
    if report.resumed_from_step is not None:
        status.resumed_from_step = report.resumed_from_step
    if report.checkpoint_step is not None and (
        status.checkpoint is None or report.checkpoint_step >= status.checkpoint.step
    ):
        when = datetime.fromtimestamp(report.checkpoint_time, UTC) if report.checkpoint_time else None
        status.checkpoint = CheckpointStatus(
            step=report.checkpoint_step, path=report.checkpoint_path, time=format_time(when) if when else None
        )
