"""When the chief waits for its workers and when it checkpoints: pure decisions, unit-tested."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cadence:
    total_steps: int
    steps_per_dispatch: int
    interval_steps: int | None
    interval_seconds: float | None

    def next_dispatch(self, step: int) -> int:
        """Steps to schedule before the next join: never past the end nor past a checkpoint boundary.

        Stopping exactly on multiples of interval_steps makes every step checkpoint land on the
        boundary, so a restart loses at most one interval.
        """
        count = min(self.steps_per_dispatch, self.total_steps - step)
        if self.interval_steps:
            count = min(count, self.interval_steps - step % self.interval_steps)
        return max(count, 0)

    def checkpoint_due(self, step: int, now: float, last_step: int, last_time: float) -> bool:
        """After a join at `step`: save now? The final save is decided by the caller."""
        if step <= last_step:
            return False
        if self.interval_steps and step // self.interval_steps > last_step // self.interval_steps:
            return True
        return bool(self.interval_seconds and now - last_time >= self.interval_seconds)
