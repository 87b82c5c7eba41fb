"""The chief: ParameterServerStrategy + ClusterCoordinator, checkpoints, progress.

The global step is a variable on the chief, saved in every checkpoint: the chief counts each
scheduled step once, when the join that covers it returns, so a step a lost worker ran twice is
still counted once and the final step is exact.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import tensorflow as tf

from pstrainer.cadence import Cadence
from pstrainer.config import ModelConfig, TrainerConfig
from pstrainer.exits import ConnectWatchdog, Exiter
from pstrainer.model import Adagrad, CtrModel, make_train_step, synthetic_dataset
from pstrainer.progress import ProgressTracker

log = logging.getLogger(__name__)

STEP_KEY = "step/.ATTRIBUTES/VARIABLE_VALUE"
MAX_TO_KEEP = 3


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


def run_chief(config: TrainerConfig, exiter: Exiter, tracker: ProgressTracker) -> tuple[int, str]:
    latest = tf.train.latest_checkpoint(config.checkpoint_dir)
    if latest:
        done = checkpoint_step(latest)
        if done >= config.steps:
            # A finished job restarted by mistake: do nothing, say so, succeed at once.
            log.info("already finished: checkpoint %s is at step %d of %d", latest, done, config.steps)
            tracker.update(
                state="succeeded",
                step=done,
                resumed_from_step=done,
                checkpoint_step=done,
                checkpoint_path=latest,
            )
            return 0, f"already finished at step {done}"

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
    # Outside the scope: the step lives on the chief, which alone advances it.
    global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    checkpoint = tf.train.Checkpoint(step=global_step, model=model, optimizer=optimizer)
    manager = tf.train.CheckpointManager(checkpoint, config.checkpoint_dir, max_to_keep=MAX_TO_KEEP)
    log.info(
        "cluster connected and %d variable shards created in %.1f s",
        len(optimizer.targets),
        time.monotonic() - started,
    )

    resumed: int | None = None
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
        resumed = int(global_step.numpy())
        log.info("resumed from step %d (checkpoint %s)", resumed, manager.latest_checkpoint)
    else:
        log.info("no checkpoint in %s: starting from step 0", config.checkpoint_dir)
    step = resumed or 0
    tracker.update(
        state="running",
        step=step,
        resumed_from_step=resumed,
        checkpoint_step=resumed,
        checkpoint_path=manager.latest_checkpoint,
    )

    iterator = iter(coordinator.create_per_worker_dataset(lambda: synthetic_dataset(config.model)))
    train_step = make_train_step(model, optimizer)
    healthy, poisoned = tf.constant(False), tf.constant(True)
    cadence = Cadence(
        total_steps=config.steps,
        steps_per_dispatch=config.steps_per_dispatch,
        interval_steps=config.checkpoint_interval_steps,
        interval_seconds=config.checkpoint_interval_seconds,
    )
    last_saved_step, last_saved_time = step, time.time()

    def save() -> None:
        nonlocal last_saved_step, last_saved_time
        began = time.monotonic()
        global_step.assign(step)
        path = manager.save(checkpoint_number=step)
        last_saved_step, last_saved_time = step, time.time()
        took = time.monotonic() - began
        tracker.checkpoint_save_seconds.observe(took)
        tracker.update(checkpoint_step=step, checkpoint_path=path, checkpoint_time=last_saved_time)
        log.info("checkpoint at step %d: %s (%.2f s)", step, path, took)

    fault_armed = config.inject_fault == "model-bug"
    first_join = True
    while step < config.steps:
        count = cadence.next_dispatch(step)
        began = time.monotonic()
        result = None
        for offset in range(1, count + 1):
            poison = poisoned if fault_armed and step + offset >= config.fault_at_step else healthy
            result = coordinator.schedule(train_step, args=(iterator, poison))
        coordinator.join()
        if first_join:
            first_join = False
            watchdog.disarm()
            log.info("first %d steps done %.1f s after start", count, time.monotonic() - started)
        step += count
        global_step.assign(step)
        elapsed = max(time.monotonic() - began, 1e-6)
        tracker.step_seconds.observe(elapsed / count)
        loss = float(result.fetch()) if result is not None else None
        tracker.update(step=step, loss=loss, examples_per_second=count * config.model.batch_size / elapsed)
        log.debug("step %d loss %.4f", step, loss or 0.0)
        if cadence.checkpoint_due(step, time.time(), last_saved_step, last_saved_time):
            save()
    if last_saved_step < step or manager.latest_checkpoint is None:
        save()
    log.info("training done at step %d", step)
    return 0, f"trained to step {step}"
