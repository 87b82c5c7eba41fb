"""`pstrainer.keras.ContractCallback`: the contract for Keras `model.fit` under ParameterServerStrategy.

    model.fit(..., epochs=20, steps_per_epoch=500, callbacks=[ContractCallback(examples_per_step=64)])

At the start of `fit` it restores the job's latest checkpoint (model, optimizer and the global
step) and makes `fit` resume at that step, mid-epoch included; between two dispatches it serves
the checkpoint requests (the operator's before a planned stop, SIGTERM's) after joining the steps
in flight, and saves on the job's cadence; it reports the step, the loss and the pace on the
progress port; at the end of `fit` it saves the final checkpoint. The global step counts the
steps `fit` scheduled and the coordinator finished: epoch * steps_per_epoch + the step in the epoch.

Keras 2 (tf-keras; TF_USE_LEGACY_KERAS=1) is the Keras that runs under ParameterServerStrategy;
Keras 3 has no support for it.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any

import tensorflow as tf

from pstrainer.checkpoints import Checkpointer, finished
from pstrainer.contract import CheckpointAnswer, CheckpointStatus, Role
from pstrainer.runtime import session

log = logging.getLogger(__name__)


def _keras() -> Any:
    """tf.keras when it is Keras 2, which ParameterServerStrategy needs."""
    import tf_keras

    return tf_keras


class _ResumeAt:
    """What `fit` asks of `model._training_state` right after `on_train_begin`, the hook through which
    Keras's own BackupAndRestore makes it resume: the epoch and the step in it to start at."""

    def __init__(self, step: int) -> None:
        self._step = step

    def maybe_load_initial_counters_from_ckpt(
        self, steps_per_epoch: int, initial_epoch: int, mode: Any = None
    ) -> tuple[int, int]:
        epoch, step = divmod(self._step, steps_per_epoch)
        return max(epoch, initial_epoch), step if epoch >= initial_epoch else 0


class ContractCallback(_keras().callbacks.Callback):  # type: ignore[misc]
    """Checkpoints, progress and checkpoint requests for `fit` on the chief; see the module."""

    def __init__(self, examples_per_step: int | None = None, **checkpoint: Any) -> None:
        """`examples_per_step`: the global batch, for the pace (examples/s); `checkpoint`: what a
        checkpoint holds besides the model and its optimizer, by name."""
        super().__init__()
        # Batch hooks under ParameterServerStrategy: their logs are RemoteValues, never waited for.
        self._supports_tf_logs = True
        self._session = session()
        self._examples_per_step = examples_per_step
        self._extra = checkpoint
        self._checkpointer: Checkpointer | None = None
        self._coordinator: Any = None
        self._steps_per_epoch = 0
        self._epoch = 0
        # Steps scheduled and not yet known to be done: (global step at their end, their logs).
        self._in_flight: collections.deque[tuple[int, Any]] = collections.deque()
        self._window = 2
        self._paced = (0, time.monotonic())
        self._finished = False

    def on_train_begin(self, logs: Any = None) -> None:
        model, session_ = self.model, self._session
        self._steps_per_epoch = int(self.params.get("steps") or 0)
        if self._steps_per_epoch < 1:
            raise ValueError("ContractCallback needs fit(steps_per_epoch=...): the global step counts them")
        total = self._steps_per_epoch * int(self.params["epochs"])
        session_.tracker.update(total_steps=total)
        self._coordinator = getattr(model, "_cluster_coordinator", None)
        # Enough dispatches in flight to keep every worker busy while the loss is reported.
        self._window = 2 * max(session_.task.num_tasks(Role.WORKER), 1)
        self._checkpointer = Checkpointer(
            session_.task, {"model": model, "optimizer": model.optimizer, **self._extra}, session_.tracker
        )
        done = finished(session_.task.checkpoint_dir, total, session_.tracker)
        if done is not None:
            self._finished = True
            self._checkpointer.reached(done[0])
        else:
            self._checkpointer.restore()
            session_.requests.open()
        model._training_state = _ResumeAt(self._checkpointer.step)
        self._paced = (self._checkpointer.step, time.monotonic())

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        checkpointer = self._checkpointer
        assert checkpointer is not None
        scheduled = self._epoch * self._steps_per_epoch + batch
        if not self._session.requests.waiting() and not checkpointer.due(scheduled):
            return
        self._join(scheduled)
        checkpointer.save_if_due()
        self._session.requests.serve(checkpointer.on_request)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._in_flight.append((self._epoch * self._steps_per_epoch + batch + 1, logs))
        while len(self._in_flight) > self._window:
            step, oldest = self._in_flight.popleft()
            self._report(step, oldest)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        # fit waited for the epoch's last step (its logs): every step of the epoch is done.
        self._join((epoch + 1) * self._steps_per_epoch, logs)

    def on_train_end(self, logs: Any = None) -> None:
        checkpointer = self._checkpointer
        assert checkpointer is not None
        self.model._training_state = None
        if self._finished:
            self._session.requests.close(
                (CheckpointStatus.SAVED, CheckpointAnswer(checkpoint_step=checkpointer.step))
            )
            return
        checkpointer.save_final()
        self._session.requests.close(checkpointer.on_request())

    def _join(self, step: int, logs: Any = None) -> None:
        """Wait for the steps in flight; every step before `step` is then done."""
        if self._coordinator is not None:
            self._coordinator.join()
        last = self._in_flight[-1][1] if self._in_flight else logs
        self._in_flight.clear()
        self._report(step, last)
        self._session.watchdog.disarm()

    def _report(self, step: int, logs: Any) -> None:
        checkpointer = self._checkpointer
        assert checkpointer is not None
        if step <= checkpointer.step:
            return
        self._session.watchdog.disarm()
        checkpointer.reached(step)
        loss = _loss(logs)
        reported_step, reported_at = self._paced
        now = time.monotonic()
        pace = None
        if self._examples_per_step and now > reported_at:
            pace = (step - reported_step) * self._examples_per_step / (now - reported_at)
        if now > reported_at:
            self._session.tracker.step_seconds.observe((now - reported_at) / max(step - reported_step, 1))
        self._paced = (step, now)
        self._session.tracker.update(step=step, loss=loss, examples_per_second=pace)


def _loss(logs: Any) -> float | None:
    """The loss in a step's logs: a RemoteValue of the metrics under ParameterServerStrategy (waited
    for: its step is known to be done or is the oldest in flight), plain numbers otherwise."""
    if logs is None:
        return None
    if hasattr(logs, "fetch"):
        logs = logs.fetch()
    value = logs.get("loss") if isinstance(logs, dict) else None
    if value is not None and hasattr(value, "fetch"):
        value = value.fetch()
    return None if value is None else float(tf.convert_to_tensor(value).numpy())
