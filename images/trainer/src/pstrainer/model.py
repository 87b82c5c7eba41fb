"""The example model: click-through-rate prediction with a large embedding table.

Plain tf.Variables in a tf.Module and a hand-written Adagrad, because Keras 3 does not work with
ParameterServerStrategy (a partitioned Keras 3 variable has no `.handle`). Under the strategy's
scope the embedding table becomes a ShardedVariable spread over the parameter servers; the
initializers accept `partition_shape`, so every shard is created on its own parameter server
instead of being built whole on the chief and shipped.

The data is synthetic: users and items drawn with a popularity skew, a few dense features, and a
click drawn from a hidden per-id bias, so the loss falls as the embeddings learn it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from pstrainer.config import ModelConfig

Features = dict[str, tf.Tensor]


def _uniform(
    shape: Sequence[int],
    dtype: tf.DType,
    scale: float,
    partition_shape: Sequence[int] | None = None,
    partition_offset: Sequence[int] | None = None,
) -> tf.Tensor:
    return tf.random.uniform(partition_shape or shape, -scale, scale, dtype=dtype)


def _constant(
    shape: Sequence[int],
    dtype: tf.DType,
    value: float,
    partition_shape: Sequence[int] | None = None,
    partition_offset: Sequence[int] | None = None,
) -> tf.Tensor:
    return tf.fill(partition_shape or shape, tf.constant(value, dtype))


def _variable(name: str, shape: tuple[int, ...], init: Callable[..., tf.Tensor], **kwargs: Any) -> Any:
    initial = functools.partial(init, shape=shape, dtype=tf.float32, **kwargs)
    return tf.Variable(initial_value=initial, shape=shape, dtype=tf.float32, name=name)


def shards(variable: Any) -> list[tf.Variable]:
    """The real variables behind a variable: its shards for a ShardedVariable, else itself."""
    return [variable] if isinstance(variable, tf.Variable) else list(variable.variables)


class CtrModel(tf.Module):  # type: ignore[misc]  # TensorFlow ships no type hints
    """logit = MLP([embedding(user), embedding(item), dense features])."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(name="ctr")
        inputs = 2 * config.embedding_dim + config.dense_features
        hidden = config.hidden_units
        self.embedding = _variable(
            "embedding", (config.vocab_size, config.embedding_dim), _uniform, scale=0.05
        )
        self.hidden_kernel = _variable(
            "hidden_kernel", (inputs, hidden), _uniform, scale=math.sqrt(6.0 / (inputs + hidden))
        )
        self.hidden_bias = _variable("hidden_bias", (hidden,), _constant, value=0.0)
        self.output_kernel = _variable(
            "output_kernel", (hidden, 1), _uniform, scale=math.sqrt(6.0 / (hidden + 1))
        )
        self.output_bias = _variable("output_bias", (1,), _constant, value=0.0)

    @property
    def named_parameters(self) -> dict[str, Any]:
        """The parameters by attribute name, which is also their name in a checkpoint (model/<name>)."""
        names = ("embedding", "hidden_kernel", "hidden_bias", "output_kernel", "output_bias")
        return {name: getattr(self, name) for name in names}

    @property
    def parameters(self) -> list[Any]:
        return list(self.named_parameters.values())

    def __call__(self, features: Features) -> tf.Tensor:
        user = tf.nn.embedding_lookup(self.embedding, features["user"])
        item = tf.nn.embedding_lookup(self.embedding, features["item"])
        x = tf.concat([user, item, features["dense"]], axis=1)
        hidden = tf.nn.relu(tf.matmul(x, self.hidden_kernel) + self.hidden_bias)
        return tf.squeeze(tf.matmul(hidden, self.output_kernel) + self.output_bias, axis=1)


class _Untracked:
    """Holds references the checkpoint must not see twice (they belong to the model or an accumulator)."""

    def __init__(self, variables: list[tf.Variable]) -> None:
        self.variables = variables


def _accumulator(name: str, parameter: Any, initial: float) -> Any:
    """Adagrad's accumulator of a parameter, each shard on its parameter shard's PS.

    A sharded parameter gets a ShardedVariable, which checkpoints as one full-shape tensor as the
    parameter does: the checkpoint then restores into any number of shards (parameter servers).
    """
    strategy = tf.distribute.get_strategy()
    parts = []
    for variable in shards(parameter):
        with strategy.extended.colocate_vars_with(variable):
            # A callable: the fill runs on the variable's parameter server, not on the chief.
            parts.append(
                tf.Variable(
                    functools.partial(tf.fill, variable.shape, initial),
                    shape=variable.shape,
                    dtype=tf.float32,
                    trainable=False,
                    name=variable.name.split(":")[0].replace("/", "_") + "_accumulator",
                )
            )
    if isinstance(parameter, tf.Variable):
        return parts[0]
    # The class ParameterServerStrategy itself wraps the shards of a partitioned variable in.
    return tf.__internal__.distribute.ShardedVariable(parts, name=f"{name}_accumulator")


class Adagrad(tf.Module):  # type: ignore[misc]
    """Adagrad whose accumulators sit next to their variable shard, so every update stays on one PS."""

    def __init__(self, model: CtrModel, learning_rate: float, initial_accumulator: float = 0.1) -> None:
        super().__init__(name="adagrad")
        self.learning_rate = learning_rate
        self._targets = _Untracked([v for p in model.parameters for v in shards(p)])
        # One per parameter, not per shard: the checkpoint's keys and shapes do not depend on the
        # shard count.
        self.accumulators = [
            _accumulator(name, parameter, initial_accumulator)
            for name, parameter in model.named_parameters.items()
        ]
        self._slots = _Untracked([a for accumulator in self.accumulators for a in shards(accumulator)])

    @property
    def targets(self) -> list[tf.Variable]:
        return self._targets.variables

    def apply(self, gradients: Sequence[Any]) -> None:
        lr = tf.constant(self.learning_rate, tf.float32)
        epsilon = tf.constant(1e-7, tf.float32)
        for grad, variable, accumulator in zip(gradients, self.targets, self._slots.variables, strict=True):
            if grad is None:
                continue
            if isinstance(grad, tf.IndexedSlices):
                # Sum duplicate rows first: the sparse kernel applies each index on its own.
                rows, position = tf.unique(grad.indices)
                values = tf.math.unsorted_segment_sum(grad.values, position, tf.shape(rows)[0])
                tf.raw_ops.ResourceSparseApplyAdagradV2(
                    var=variable.handle,
                    accum=accumulator.handle,
                    lr=lr,
                    epsilon=epsilon,
                    grad=values,
                    indices=rows,
                )
            else:
                tf.raw_ops.ResourceApplyAdagradV2(
                    var=variable.handle, accum=accumulator.handle, lr=lr, epsilon=epsilon, grad=grad
                )


def _id_bias(ids: tf.Tensor) -> tf.Tensor:
    """A fixed pseudo-random bias in [-2, 2) per id: what the embeddings have to learn."""
    return tf.cast(tf.math.floormod(ids * 2654435761, 1009), tf.float32) / 1009.0 * 4.0 - 2.0


def _examples(
    config: ModelConfig,
    count: int,
    uniform: Callable[[list[int]], tf.Tensor],
    normal: Callable[[list[int]], tf.Tensor],
) -> tuple[Features, tf.Tensor]:
    vocab = tf.constant(config.vocab_size, tf.int64)

    def popular_id() -> tf.Tensor:
        u = uniform([count])
        ids = tf.cast(tf.floor(u * u * float(config.vocab_size)), tf.int64)
        return tf.minimum(ids, vocab - 1)

    user, item = popular_id(), vocab - 1 - popular_id()
    dense = normal([count, config.dense_features])
    truth = _id_bias(user) + _id_bias(item) + 0.8 * dense[:, 0]
    clicks = tf.cast(uniform([count]) < tf.sigmoid(truth), tf.float32)
    return {"user": user, "item": item, "dense": dense}, clicks


def synthetic_dataset(config: ModelConfig) -> tf.data.Dataset:
    """An endless stream of click batches; each worker builds its own and draws its own randomness."""

    def batch(_: tf.Tensor) -> tuple[Features, tf.Tensor]:
        return _examples(
            config,
            config.batch_size,
            lambda shape: tf.random.uniform(shape),
            lambda shape: tf.random.normal(shape),
        )

    return tf.data.Dataset.from_tensors(tf.constant(0)).repeat().map(batch).prefetch(2)


def evaluation_set(config: ModelConfig, count: int, seed: int = 7) -> tuple[Features, tf.Tensor]:
    """The same held-out examples every time (stateless randomness)."""
    counter = iter(range(1_000_000))

    def uniform(shape: list[int]) -> tf.Tensor:
        return tf.random.stateless_uniform(shape, seed=[seed, next(counter)])

    def normal(shape: list[int]) -> tf.Tensor:
        return tf.random.stateless_normal(shape, seed=[seed, next(counter)])

    return _examples(config, count, uniform, normal)


def make_train_step(model: CtrModel, optimizer: Adagrad) -> Callable[..., tf.Tensor]:
    """The step the coordinator schedules on the workers: one batch, one Adagrad update, the loss."""
    variables = optimizer.targets

    @tf.function  # type: ignore[untyped-decorator]
    def train_step(iterator: Any, poison: tf.Tensor) -> tf.Tensor:
        features, labels = next(iterator)
        with tf.GradientTape() as tape:
            logits = model(features)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
            # The injectable "bug in the model": a diverged loss, caught by the model's own check.
            loss = tf.where(poison, tf.constant(float("nan")), loss)
            loss = tf.debugging.check_numerics(loss, "training loss")
        optimizer.apply(tape.gradient(loss, variables))
        return loss

    step: Callable[..., tf.Tensor] = train_step
    return step
