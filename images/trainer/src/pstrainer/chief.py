"""The bundled chief: the example model under ParameterServerStrategy + ClusterCoordinator, trained
through the library's TrainingLoop (checkpoints, progress, checkpoint requests).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from pstrainer.checkpoints import VALUE_SUFFIX, finished
from pstrainer.config import ModelConfig, TrainerConfig
from pstrainer.loop import TrainingLoop
from pstrainer.model import Adagrad, CtrModel, make_train_step, synthetic_dataset
from pstrainer.runtime import session

log = logging.getLogger(__name__)


def variable_partitioner(model: ModelConfig) -> Any:
    if model.partitioner == "max-size":
        return tf.distribute.experimental.partitioners.MaxSizePartitioner(model.max_shard_bytes)
    if model.partitioner == "fixed":
        return tf.distribute.experimental.partitioners.FixedShardsPartitioner(model.num_shards)
    return None


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


def run_chief(config: TrainerConfig) -> str:
    tracker = session().tracker
    done = finished(config.task.checkpoint_dir, config.steps, tracker)
    if done is not None:
        return f"already finished at step {done[0]}"
    cluster = connect(config)
    step = train(config, cluster)
    log.info("training done at step %d", step)
    return f"trained to step {step}"


@dataclass(frozen=True)
class Cluster:
    """What the chief trains with once every parameter server and worker answered."""

    coordinator: Any
    model: CtrModel
    optimizer: Adagrad
    started: float


def connect(config: TrainerConfig) -> Cluster:
    """Connect to the cluster and create the variables on the parameter servers (under the
    runtime's connect watchdog, disarmed by the first join)."""
    started = time.monotonic()
    strategy = tf.distribute.ParameterServerStrategy(
        config.task.cluster_resolver(), variable_partitioner=variable_partitioner(config.model)
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
    return Cluster(coordinator, model, optimizer, started)


def train(config: TrainerConfig, cluster: Cluster) -> int:
    """The loop: checkpoint requests, then one dispatch, then the cadence's checkpoint, to the last
    step; the final save. The global step it reached."""
    dispatcher = Dispatcher(config, cluster)
    variables = checkpointed(cluster.model, cluster.optimizer)
    with TrainingLoop(
        cluster.coordinator,
        {"model": cluster.model, "optimizer": cluster.optimizer},
        total_steps=config.steps,
        steps_per_dispatch=config.steps_per_dispatch,
        examples_per_step=config.model.batch_size,
        mismatch=lambda path: shape_mismatch(path, variables),
    ) as loop:
        while not loop.done:
            count = loop.next_dispatch()
            loop.dispatched(count, dispatcher.schedule(loop.step, count))
    return loop.step


class Dispatcher:
    """Schedules steps on the workers."""

    def __init__(self, config: TrainerConfig, cluster: Cluster) -> None:
        self._coordinator = cluster.coordinator
        self._iterator = iter(
            cluster.coordinator.create_per_worker_dataset(lambda: synthetic_dataset(config.model))
        )
        self._train_step = make_train_step(cluster.model, cluster.optimizer)
        self._fault_at = config.fault_at_step if config.inject_fault == "model-bug" else None
        self._healthy, self._poisoned = tf.constant(False), tf.constant(True)

    def schedule(self, step: int, count: int) -> Any:
        """Schedule steps step+1 .. step+count; the last one's loss (a RemoteValue)."""
        result = None
        for number in range(step + 1, step + count + 1):
            poisoned = self._fault_at is not None and number >= self._fault_at
            result = self._coordinator.schedule(
                self._train_step, args=(self._iterator, self._poisoned if poisoned else self._healthy)
            )
        return result
