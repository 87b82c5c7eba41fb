"""Your own Keras program under ps-training-operator, with the contract's library (`pstrainer`).

The plain program of examples/plain-tf with the library: `pstrainer.main(train)` is the entrypoint
and `ContractCallback` goes into `fit` in place of BackupAndRestore. Every pod of the job runs this
file, and `pstrainer.main` reads which task it is from TF_CONFIG:
- ps and worker: serve the chief until the pod is stopped (a parameter server keeps serving for a
  while after its SIGTERM, so that the chief can still save);
- chief: `train` runs behind the progress port. `ContractCallback` restores the job's latest
  checkpoint (model, optimizer, global step; `fit` resumes at that step), reports the step, the loss
  and the pace, saves on the job's cadence, when the operator asks (before a suspend, a drain, a
  preemption or a resize) and on SIGTERM.
The process exits with the contract's codes: 0 done, 1 a bug, 2 a bad configuration, 138 a
transient TensorFlow error (a lost parameter server: the operator restarts the chief).

Keras 3 has no ParameterServerStrategy support: the model is built with tf-keras (Keras 2), which
`TF_USE_LEGACY_KERAS=1` makes `tf.keras` (set below, before TensorFlow is imported).

    python train.py --epochs 20 --steps-per-epoch 50
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf

import pstrainer
from pstrainer.keras import ContractCallback

VOCABULARY, DIMENSION, IDS_PER_EXAMPLE, BATCH = 5_000, 16, 8, 64


def examples(_: tf.distribute.InputContext) -> tf.data.Dataset:
    """Endless synthetic examples: a bag of feature ids, clicked when they come from the upper half
    of the vocabulary (which the embedding learns)."""

    def example(seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        clicked = seed % 2
        ids = tf.random.stateless_uniform([IDS_PER_EXAMPLE], [seed, 0], 0, VOCABULARY // 2, tf.int64)
        return ids + clicked * (VOCABULARY // 2), tf.cast(clicked, tf.float32)

    return tf.data.Dataset.random(seed=1).map(example).batch(BATCH).prefetch(2)


def train(task: pstrainer.Task) -> str:
    """The chief: the model's variables live on the parameter servers, the steps run on the workers."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--steps-per-epoch", type=int, default=50)
    args = parser.parse_args()
    strategy = tf.distribute.ParameterServerStrategy(
        task.cluster_resolver(),
        variable_partitioner=tf.distribute.experimental.partitioners.FixedShardsPartitioner(
            len(task.cluster["ps"])
        ),
    )
    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.Input(shape=(IDS_PER_EXAMPLE,), dtype=tf.int64),
                tf.keras.layers.Embedding(VOCABULARY, DIMENSION),
                tf.keras.layers.GlobalAveragePooling1D(),
                tf.keras.layers.Dense(1, activation="sigmoid"),
            ]
        )
        model.compile(optimizer="adam", loss="binary_crossentropy")
    model.fit(
        tf.keras.utils.experimental.DatasetCreator(examples),
        epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch,
        callbacks=[ContractCallback(examples_per_step=BATCH)],
        verbose=0,
    )
    return f"trained {args.epochs} epochs of {args.steps_per_epoch} steps"


if __name__ == "__main__":
    pstrainer.main(train)
