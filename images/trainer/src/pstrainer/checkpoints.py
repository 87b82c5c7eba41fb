"""The chief's checkpoints: the global step, restored at start, saved on the job's cadence, on request
and at the end, and reported.

The global step is a variable on the chief, saved in every checkpoint beside the user's objects
(model, optimizer, ...): the chief counts each step once, when the join that covers it returns, so
a step a lost worker ran twice is still counted once. Used by the training loop's thread only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import tensorflow as tf

from pstrainer.cadence import Cadence
from pstrainer.contract import CheckpointAnswer, CheckpointStatus, Role
from pstrainer.ondemand import Outcome, unanswered
from pstrainer.progress import ProgressTracker
from pstrainer.task import ConfigError, Task

log = logging.getLogger(__name__)

# A variable's key in a checkpoint: its path from the tf.train.Checkpoint, then this.
VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"
STEP_KEY = "step" + VALUE_SUFFIX
MAX_TO_KEEP = 3
# A parameter server that does not accept a connection within this long cannot serve a save.
PS_ANSWER_SECONDS = 3.0


def checkpoint_step(path: str) -> int:
    """The global step stored in a checkpoint, read from its files without the cluster."""
    return int(tf.train.load_checkpoint(path).get_tensor(STEP_KEY))


def finished(directory: str, total_steps: int, tracker: ProgressTracker) -> tuple[int, str] | None:
    """The latest checkpoint's step and path when it is at the end of training, reported as
    succeeded; else None. A finished job restarted by mistake then does nothing and succeeds."""
    latest = tf.train.latest_checkpoint(directory)
    done = checkpoint_step(latest) if latest else None
    if latest is None or done is None or done < total_steps:
        return None
    log.info("already finished: checkpoint %s is at step %d of %d", latest, done, total_steps)
    tracker.update(
        state="succeeded", step=done, resumed_from_step=done, checkpoint_step=done, checkpoint_path=latest
    )
    return done, latest


class Checkpointer:
    """The global step and the checkpoints of `objects` (name -> trackable) in the task's directory."""

    def __init__(
        self,
        task: Task,
        objects: Mapping[str, Any],
        tracker: ProgressTracker,
        *,
        total_steps: int | None = None,
        steps_per_dispatch: int = 1,
        mismatch: Callable[[str], str | None] | None = None,
    ) -> None:
        # Outside any strategy's scope: the step lives on the chief, which alone advances it.
        self._global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self._checkpoint = tf.train.Checkpoint(step=self._global_step, **objects)
        self._manager = tf.train.CheckpointManager(
            self._checkpoint, task.checkpoint_dir, max_to_keep=MAX_TO_KEEP
        )
        self._parameter_servers = task.cluster.get(Role.PS.value, [])
        self._mismatch = mismatch
        self.cadence = Cadence(
            total_steps=total_steps if total_steps is not None else 2**63 - 1,
            steps_per_dispatch=steps_per_dispatch,
            interval_steps=task.checkpoint_interval_steps,
            interval_seconds=task.checkpoint_interval_seconds,
        )
        self.tracker = tracker
        self.step = 0
        self._saved_step, self._saved_time = 0, time.time()

    @property
    def saved_step(self) -> int:
        return self._saved_step

    def restore(self) -> int | None:
        """Restore the latest checkpoint, if any; the step it was at."""
        latest = self._manager.latest_checkpoint
        resumed: int | None = None
        if latest:
            why = self._mismatch(latest) if self._mismatch else None
            if why is not None:
                raise ConfigError(why)  # the program does not fit the job's checkpoints: exit 2
            began = time.monotonic()
            self._checkpoint.restore(latest).assert_existing_objects_matched()
            resumed = int(self._global_step.numpy())
            log.info(
                "resumed from step %d (checkpoint %s, %.2f s)", resumed, latest, time.monotonic() - began
            )
        else:
            log.info("no checkpoint in %s: starting from step 0", self._manager.directory)
        self.step = resumed or 0
        self._saved_step, self._saved_time = self.step, time.time()
        self.tracker.update(
            state="running",
            step=self.step,
            resumed_from_step=resumed,
            checkpoint_step=resumed,
            checkpoint_path=latest,
        )
        return resumed

    def reached(self, step: int) -> None:
        """Every step up to `step` is done (its join returned)."""
        self.step = step
        self._global_step.assign(step)

    def due(self, step: int | None = None) -> bool:
        """Whether the job's cadence asks for a checkpoint at `step` (the current step unless given)."""
        at = self.step if step is None else step
        return self.cadence.checkpoint_due(at, time.time(), self._saved_step, self._saved_time)

    def save_if_due(self) -> None:
        if self.due():
            self.save()

    def save_final(self) -> None:
        if self._saved_step < self.step or self._manager.latest_checkpoint is None:
            self.save()

    def on_request(self) -> Outcome:
        """A checkpoint request, between two steps: the latest checkpoint when it is at this step,
        else a new one, unless a parameter server does not answer."""
        latest = self._manager.latest_checkpoint
        if latest is not None and self._saved_step == self.step:
            return CheckpointStatus.SAVED, CheckpointAnswer(checkpoint_step=self.step, checkpoint_path=latest)
        gone = unanswered(self._parameter_servers, PS_ANSWER_SECONDS)
        if gone is not None:
            log.warning("checkpoint request at step %d refused: %s", self.step, gone)
            return CheckpointStatus.REFUSED, CheckpointAnswer(reason=f"a parameter server is gone: {gone}")
        path = self.save()
        return CheckpointStatus.SAVED, CheckpointAnswer(
            checkpoint_step=self.step, checkpoint_path=path, saved=True
        )

    def save(self) -> str:
        began = time.monotonic()
        self._global_step.assign(self.step)
        path: str = self._manager.save(checkpoint_number=self.step)
        self._saved_step, self._saved_time = self.step, time.time()
        took = time.monotonic() - began
        self.tracker.checkpoint_save_seconds.observe(took)
        self.tracker.update(checkpoint_step=self.step, checkpoint_path=path, checkpoint_time=self._saved_time)
        log.info("checkpoint at step %d: %s (%.2f s)", self.step, path, took)
        return path
