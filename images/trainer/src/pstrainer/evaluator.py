"""The evaluator: follows the chief's checkpoints and scores each on a fixed held-out set.

It runs outside the TensorFlow cluster, on its own variables: a checkpoint of a sharded table
restores into an unsharded one. It stops after the final step's checkpoint, or when no new
checkpoint has come for --eval-idle-timeout-seconds.
"""

from __future__ import annotations

import json
import logging

import tensorflow as tf

from pstrainer.config import TrainerConfig
from pstrainer.model import CtrModel, evaluation_set
from pstrainer.scoring import log_loss_and_auc

log = logging.getLogger(__name__)


def run_evaluator(config: TrainerConfig) -> str:
    model = CtrModel(config.model)
    global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    checkpoint = tf.train.Checkpoint(step=global_step, model=model)
    features, labels = evaluation_set(config.model, config.eval_examples)
    evaluate = tf.function(model.__call__)
    log.info("following checkpoints in %s", config.task.checkpoint_dir)
    for path in tf.train.checkpoints_iterator(
        config.task.checkpoint_dir, timeout=config.eval_idle_timeout_seconds
    ):
        try:
            # expect_partial: the optimizer's accumulators are in the checkpoint, not needed here.
            checkpoint.restore(path).expect_partial()
        except tf.errors.NotFoundError:
            log.warning("checkpoint %s was deleted before it could be read; waiting for the next", path)
            continue
        step = int(global_step.numpy())
        loss, auc = log_loss_and_auc(labels.numpy(), evaluate(features).numpy())
        record = {"event": "evaluation", "step": step, "logLoss": round(loss, 6), "auc": round(auc, 6)}
        log.info("%s", json.dumps(record, sort_keys=True))
        if step >= config.steps:
            return f"evaluated the final checkpoint (step {step})"
    return f"no new checkpoint for {config.eval_idle_timeout_seconds:g} s"
