"""`pstrainer.TrainingLoop`: the contract for a custom training loop with ClusterCoordinator.

    with pstrainer.TrainingLoop(coordinator, {"model": model, "optimizer": optimizer},
                                total_steps=10_000, examples_per_step=batch_size) as loop:
        while not loop.done:
            count = loop.next_dispatch()
            for _ in range(count):
                loss = coordinator.schedule(train_step, args=(iterator,))
            loop.dispatched(count, loss)

Entering restores the latest checkpoint (`loop.step` is where training resumes); `next_dispatch`
serves the checkpoint requests (the operator's, SIGTERM's) between two dispatches, when no step is
in flight, and says how many steps to schedule; `dispatched` joins them, counts them, reports the
step, the loss and the pace, and saves on the job's cadence; leaving saves the final checkpoint.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from pstrainer.checkpoints import Checkpointer, finished
from pstrainer.contract import CheckpointAnswer, CheckpointStatus
from pstrainer.exits import describe
from pstrainer.runtime import session

log = logging.getLogger(__name__)


class TrainingLoop:
    """One chief's training loop: call `next_dispatch` before and `dispatched` after each dispatch."""

    def __init__(
        self,
        coordinator: Any,
        checkpoint: Mapping[str, Any],
        *,
        total_steps: int,
        steps_per_dispatch: int = 20,
        examples_per_step: int | None = None,
        mismatch: Callable[[str], str | None] | None = None,
    ) -> None:
        """`checkpoint`: what a checkpoint holds besides the global step (the model, the optimizer,
        anything trackable), by name; `mismatch(path)`: why a checkpoint cannot restore into them
        (a bad configuration, exit 2), or None."""
        self._session = session()
        self._coordinator = coordinator
        self._total_steps = total_steps
        self._examples_per_step = examples_per_step
        self._checkpointer = Checkpointer(
            self._session.task,
            checkpoint,
            self._session.tracker,
            total_steps=total_steps,
            steps_per_dispatch=steps_per_dispatch,
            mismatch=mismatch,
        )
        self._first_join = True
        self._began = self._dispatch_began = time.monotonic()
        # The latest checkpoint's step and path when it already was at the end.
        self._finished: tuple[int, str] | None = None

    @property
    def step(self) -> int:
        """The global step: every step before it is done."""
        return self._checkpointer.step

    @property
    def done(self) -> bool:
        return self.step >= self._total_steps

    def __enter__(self) -> TrainingLoop:
        task, tracker = self._session.task, self._session.tracker
        self._finished = finished(task.checkpoint_dir, self._total_steps, tracker)
        if self._finished is not None:
            self._checkpointer.reached(self._finished[0])
            return self
        self._checkpointer.restore()
        self._session.requests.open()
        return self

    def next_dispatch(self) -> int:
        """Serve the checkpoint requests, then the number of steps to schedule before the next join:
        never past the end nor past a checkpoint boundary."""
        self._session.requests.serve(self._checkpointer.on_request)
        self._dispatch_began = time.monotonic()
        return self._checkpointer.cadence.next_dispatch(self.step)

    def dispatched(self, count: int, result: Any = None) -> None:
        """Join the `count` steps scheduled since `next_dispatch`; report them and the loss (the
        last step's RemoteValue, `result`), and save on the cadence."""
        self._coordinator.join()
        if self._first_join:
            self._first_join = False
            self._session.watchdog.disarm()
            log.info("first %d steps done %.1f s after the loop began", count, time.monotonic() - self._began)
        elapsed = max(time.monotonic() - self._dispatch_began, 1e-6)
        self._checkpointer.reached(self.step + count)
        tracker = self._session.tracker
        tracker.step_seconds.observe(elapsed / max(count, 1))
        loss = float(result.fetch()) if result is not None else None
        pace = count * self._examples_per_step / elapsed if self._examples_per_step else None
        tracker.update(step=self.step, loss=loss, examples_per_second=pace)
        self._checkpointer.save_if_due()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        requests = self._session.requests
        if error is not None:
            requests.close(
                (CheckpointStatus.REFUSED, CheckpointAnswer(reason=f"training failed: {describe(error)}"))
            )
        elif self._finished is not None:
            step, path = self._finished
            requests.close(
                (CheckpointStatus.SAVED, CheckpointAnswer(checkpoint_step=step, checkpoint_path=path))
            )
        else:
            self._checkpointer.save_final()
            requests.close(self._checkpointer.on_request())
