"""A plain TensorFlow program for ps-training-operator: no code of ours inside, only TF_CONFIG.

Every pod of the job runs this file, and TF_CONFIG (which the operator sets in each container) says
which task it is:
- ps and worker: start a `tf.distribute.Server` and serve the chief until the pod is stopped;
- chief: fits a small click-through model (an embedding table sharded over the parameter servers)
  with ParameterServerStrategy. A BackupAndRestore callback keeps a backup under the job's checkpoint
  directory (PSOP_CHECKPOINT_DIR, from `spec.checkpoint.dir`) after every epoch, so a chief that the
  operator restarts after a lost parameter server resumes from the last epoch, not from the start.

Keras 3, which `tf.keras` is since TensorFlow 2.16, has no ParameterServerStrategy support: the model
is built with tf-keras (Keras 2), which `TF_USE_LEGACY_KERAS=1` makes `tf.keras` (set below, before
TensorFlow is imported; the image installs tf-keras).

    python train.py --epochs 20 --steps-per-epoch 50
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf

VOCABULARY, DIMENSION, IDS_PER_EXAMPLE, BATCH = 5_000, 16, 8, 64


def serve(resolver: tf.distribute.cluster_resolver.TFConfigClusterResolver) -> None:
    """A parameter server or a worker: the chief places variables and steps on it."""
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    server.join()


def examples(_: tf.distribute.InputContext) -> tf.data.Dataset:
    """Endless synthetic examples: a bag of feature ids, clicked when they come from the upper half
    of the vocabulary (which the embedding learns)."""

    def example(seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        clicked = seed % 2
        ids = tf.random.stateless_uniform([IDS_PER_EXAMPLE], [seed, 0], 0, VOCABULARY // 2, tf.int64)
        return ids + clicked * (VOCABULARY // 2), tf.cast(clicked, tf.float32)

    return tf.data.Dataset.random(seed=1).map(example).batch(BATCH).prefetch(2)


def fit(resolver: tf.distribute.cluster_resolver.TFConfigClusterResolver, args: argparse.Namespace) -> None:
    """The chief: the model's variables live on the parameter servers, the steps run on the workers."""
    shards = resolver.cluster_spec().num_tasks("ps")
    strategy = tf.distribute.ParameterServerStrategy(
        resolver, variable_partitioner=tf.distribute.experimental.partitioners.FixedShardsPartitioner(shards)
    )
    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.layers.Embedding(VOCABULARY, DIMENSION),
                tf.keras.layers.GlobalAveragePooling1D(),
                tf.keras.layers.Dense(1, activation="sigmoid"),
            ]
        )
        model.compile(optimizer="adam", loss="binary_crossentropy", steps_per_execution=10)
    backup = tf.keras.callbacks.BackupAndRestore(backup_dir=os.path.join(args.checkpoint_dir, "backup"))
    model.fit(
        tf.keras.utils.experimental.DatasetCreator(examples),
        epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch,
        callbacks=[backup],
        verbose=2,
    )
    model.save(os.path.join(args.checkpoint_dir, "model"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--steps-per-epoch", type=int, default=50)
    parser.add_argument("--checkpoint-dir", default=os.environ.get("PSOP_CHECKPOINT_DIR", "/tmp/plain-tf"))
    args = parser.parse_args()
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("ps", "worker"):
        serve(resolver)
    else:
        fit(resolver, args)


if __name__ == "__main__":
    main()
