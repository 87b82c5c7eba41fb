"""The chief: ParameterServerStrategy + ClusterCoordinator, checkpoints, progress.

The global step is a variable on the chief, saved in every checkpoint: the chief counts each
scheduled step once, when the join that covers it returns, so a step a lost worker ran twice is
still counted once and the final step is exact. Checkpoint requests (POST /checkpoint, SIGTERM)
are served by the training loop between two dispatches, never concurrently with a step.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from psoperator.contract import CheckpointAnswer, CheckpointStatus, ExitCode, Role
from pstrainer.cadence import Cadence
from pstrainer.config import ConfigError, ModelConfig, TrainerConfig
from pstrainer.exits import ConnectWatchdog, Exiter, describe
from pstrainer.model import Adagrad, CtrModel, make_train_step, synthetic_dataset
from pstrainer.ondemand import CheckpointRequests, Outcome, unanswered
from pstrainer.progress import ProgressTracker
from pstrainer.storage import check_checkpoint_storage

log = logging.getLogger(__name__)

# A variable's key in a checkpoint: its path from the tf.train.Checkpoint, then this.
VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"
STEP_KEY = "step" + VALUE_SUFFIX
MAX_TO_KEEP = 3
# A parameter server that does not accept a connection within this long cannot serve a save.
PS_ANSWER_SECONDS = 3.0


def cluster_resolver(config: TrainerConfig) -> tf.distribute.cluster_resolver.ClusterResolver:
    """The resolver for this task, from the TF_CONFIG the runtime already validated."""
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(config.cluster),
        task_type=config.role.value,
        task_id=config.task_index,
        rpc_layer="grpc",
    )


def variable_partitioner(model: ModelConfig) -> Any:
    if model.partitioner == "max-size":
        return tf.distribute.experimental.partitioners.MaxSizePartitioner(model.max_shard_bytes)
    if model.partitioner == "fixed":
        return tf.distribute.experimental.partitioners.FixedShardsPartitioner(model.num_shards)
    return None


def checkpoint_step(path: str) -> int:
    """The global step stored in a checkpoint, read from its files without the cluster."""
    return int(tf.train.load_checkpoint(path).get_tensor(STEP_KEY))


def checkpointed(model: CtrModel, optimizer: Adagrad) -> dict[str, Any]:
    """The model's and the optimizer's variables by their path in a checkpoint."""
    paths = {f"model/{name}": parameter for name, parameter in model.named_parameters.items()}
    paths |= {f"optimizer/accumulators/{i}": slot for i, slot in enumerate(optimizer.accumulators)}
    return paths


def shape_mismatch(path: str, variables: dict[str, Any]) -> str | None:
    """Why the checkpoint cannot restore into these variables (checkpointed), or None.

    A partitioned variable is saved whole, so the shard count may change across a restore; its
    full shape (the vocabulary, for the embedding) may not.
    """
    saved = tf.train.load_checkpoint(path).get_variable_to_shape_map()
    for key, variable in variables.items():
        stored, wanted = saved.get(key + VALUE_SUFFIX), variable.shape.as_list()
        if stored is None or stored == wanted:
            continue
        # The model's shapes are checked first: an accumulator alone differs in the older layout.
        why = (
            "an earlier pstrainer wrote it, with one accumulator per variable shard, which only it restores"
            if key.startswith("optimizer/")
            else "the vocabulary and the model's sizes must not change across a restore "
            "(the number of parameter servers may)"
        )
        return f"checkpoint {path} holds {key} of shape {stored}, the model's is {wanted}: {why}"
    return None


def run_chief(
    config: TrainerConfig, exiter: Exiter, tracker: ProgressTracker, requests: CheckpointRequests
) -> tuple[ExitCode, str]:
    check_checkpoint_storage(config.checkpoint_dir)
    finished = already_finished(config, tracker)
    if finished is not None:
        return ExitCode.SUCCEEDED, f"already finished at step {finished}"
    cluster = connect(config, exiter)
    cadence = Cadence(
        total_steps=config.steps,
        steps_per_dispatch=config.steps_per_dispatch,
        interval_steps=config.checkpoint_interval_steps,
        interval_seconds=config.checkpoint_interval_seconds,
    )
    checkpointer = Checkpointer(config, cluster, cadence, tracker)
    checkpointer.restore()
    train(config, cluster, cadence, checkpointer, requests)
    log.info("training done at step %d", checkpointer.step)
    return ExitCode.SUCCEEDED, f"trained to step {checkpointer.step}"


def already_finished(config: TrainerConfig, tracker: ProgressTracker) -> int | None:
    """The final step when the latest checkpoint is at it: a finished job restarted by mistake
    does nothing, says so and succeeds at once, without the cluster."""
    latest = tf.train.latest_checkpoint(config.checkpoint_dir)
    done = checkpoint_step(latest) if latest else None
    if done is None or done < config.steps:
        return None
    log.info("already finished: checkpoint %s is at step %d of %d", latest, done, config.steps)
    tracker.update(
        state="succeeded", step=done, resumed_from_step=done, checkpoint_step=done, checkpoint_path=latest
    )
    return done


@dataclass(frozen=True)
class Cluster:
    """What the chief trains with once every parameter server and worker answered."""

    coordinator: Any
    model: CtrModel
    optimizer: Adagrad
    watchdog: ConnectWatchdog
    started: float


def connect(config: TrainerConfig, exiter: Exiter) -> Cluster:
    """Connect to the cluster and create the variables on the parameter servers, under the watchdog
    (disarmed by the first join)."""
    watchdog = ConnectWatchdog(exiter, config.connect_timeout_seconds, "the parameter servers and workers")
    watchdog.start()
    started = time.monotonic()
    strategy = tf.distribute.ParameterServerStrategy(
        cluster_resolver(config), variable_partitioner=variable_partitioner(config.model)
    )
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = CtrModel(config.model)
        optimizer = Adagrad(model, config.model.learning_rate)
    log.info(
        "cluster connected and %d variable shards created in %.1f s",
        len(optimizer.targets),
        time.monotonic() - started,
    )
    return Cluster(coordinator, model, optimizer, watchdog, started)


class Checkpointer:
    """The global step and the checkpoints: restored at start, saved on the cadence, on request and
    at the end. Used by the training loop's thread only."""

    def __init__(
        self, config: TrainerConfig, cluster: Cluster, cadence: Cadence, tracker: ProgressTracker
    ) -> None:
        # Outside the strategy's scope: the step lives on the chief, which alone advances it.
        self._global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self._checkpoint = tf.train.Checkpoint(
            step=self._global_step, model=cluster.model, optimizer=cluster.optimizer
        )
        self._manager = tf.train.CheckpointManager(
            self._checkpoint, config.checkpoint_dir, max_to_keep=MAX_TO_KEEP
        )
        self._variables = checkpointed(cluster.model, cluster.optimizer)
        self._parameter_servers = config.cluster.get(Role.PS.value, [])
        self._cadence = cadence
        self.tracker = tracker
        self.step = 0
        self._saved_step, self._saved_time = 0, time.time()

    def restore(self) -> None:
        latest = self._manager.latest_checkpoint
        resumed: int | None = None
        if latest:
            mismatch = shape_mismatch(latest, self._variables)
            if mismatch is not None:
                raise ConfigError(mismatch)  # the flags do not fit the job's checkpoints: exit 2
            began = time.monotonic()
            self._checkpoint.restore(latest).assert_existing_objects_matched()
            resumed = int(self._global_step.numpy())
            took = time.monotonic() - began
            log.info("resumed from step %d (checkpoint %s, %.2f s)", resumed, latest, took)
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

    def advance(self, count: int) -> None:
        """Count steps whose join returned."""
        self.step += count
        self._global_step.assign(self.step)

    def save_if_due(self) -> None:
        if self._cadence.checkpoint_due(self.step, time.time(), self._saved_step, self._saved_time):
            self._save()

    def save_final(self) -> None:
        if self._saved_step < self.step or self._manager.latest_checkpoint is None:
            self._save()

    def on_request(self) -> Outcome:
        """A checkpoint request, between two steps: the latest checkpoint when it is at this step,
        else a new one, unless a parameter server does not answer."""
        latest = self._manager.latest_checkpoint
        if latest is not None and self._saved_step == self.step:
            return CheckpointStatus.SAVED, CheckpointAnswer(checkpointStep=self.step, checkpointPath=latest)
        gone = unanswered(self._parameter_servers, PS_ANSWER_SECONDS)
        if gone is not None:
            log.warning("checkpoint request at step %d refused: %s", self.step, gone)
            return CheckpointStatus.REFUSED, CheckpointAnswer(reason=f"a parameter server is gone: {gone}")
        path = self._save()
        return CheckpointStatus.SAVED, CheckpointAnswer(
            checkpointStep=self.step, checkpointPath=path, saved=True
        )

    def _save(self) -> str:
        began = time.monotonic()
        self._global_step.assign(self.step)
        path: str = self._manager.save(checkpoint_number=self.step)
        self._saved_step, self._saved_time = self.step, time.time()
        took = time.monotonic() - began
        self.tracker.checkpoint_save_seconds.observe(took)
        self.tracker.update(checkpoint_step=self.step, checkpoint_path=path, checkpoint_time=self._saved_time)
        log.info("checkpoint at step %d: %s (%.2f s)", self.step, path, took)
        return path


def train(
    config: TrainerConfig,
    cluster: Cluster,
    cadence: Cadence,
    checkpointer: Checkpointer,
    requests: CheckpointRequests,
) -> None:
    """The loop: checkpoint requests, then one dispatch, then the cadence's checkpoint, to the last
    step; the final save. Requests are served only here, between two steps."""
    dispatcher = Dispatcher(config, cluster, checkpointer.tracker)
    requests.open()
    try:
        while True:
            requests.serve(checkpointer.on_request)
            if checkpointer.step >= config.steps:
                break
            count = cadence.next_dispatch(checkpointer.step)
            dispatcher.run(checkpointer.step, count)
            checkpointer.advance(count)
            checkpointer.save_if_due()
        checkpointer.save_final()
    except BaseException as exc:
        requests.close(
            (CheckpointStatus.REFUSED, CheckpointAnswer(reason=f"training failed: {describe(exc)}"))
        )
        raise
    requests.close(checkpointer.on_request())


class Dispatcher:
    """Schedules steps on the workers, waits for them and reports their pace."""

    def __init__(self, config: TrainerConfig, cluster: Cluster, tracker: ProgressTracker) -> None:
        self._cluster = cluster
        self._tracker = tracker
        self._batch_size = config.model.batch_size
        self._iterator = iter(
            cluster.coordinator.create_per_worker_dataset(lambda: synthetic_dataset(config.model))
        )
        self._train_step = make_train_step(cluster.model, cluster.optimizer)
        self._fault_at = config.fault_at_step if config.inject_fault == "model-bug" else None
        self._healthy, self._poisoned = tf.constant(False), tf.constant(True)
        self._first_join = True

    def run(self, step: int, count: int) -> None:
        """Schedule steps step+1 .. step+count and join them."""
        coordinator = self._cluster.coordinator
        began = time.monotonic()
        result = None
        for number in range(step + 1, step + count + 1):
            poisoned = self._fault_at is not None and number >= self._fault_at
            result = coordinator.schedule(
                self._train_step, args=(self._iterator, self._poisoned if poisoned else self._healthy)
            )
        coordinator.join()
        if self._first_join:
            self._first_join = False
            self._cluster.watchdog.disarm()
            log.info(
                "first %d steps done %.1f s after start", count, time.monotonic() - self._cluster.started
            )
        elapsed = max(time.monotonic() - began, 1e-6)
        self._tracker.step_seconds.observe(elapsed / count)
        loss = float(result.fetch()) if result is not None else None
        self._tracker.update(
            step=step + count, loss=loss, examples_per_second=count * self._batch_size / elapsed
        )
        log.debug("step %d loss %.4f", step + count, loss or 0.0)
