"""Object storage: the s3:// filesystem, loaded into every role, and the chief's check of the
checkpoint storage before anything else.

TensorFlow has no s3:// filesystem of its own (it left for tensorflow-io in 2.6, and tensorflow-io's
plugins are built against the TensorFlow C++ library of their day). The runtime ships its own
plugin, `libpstrainer_s3.so` (images/trainer/s3fs), written against TensorFlow's C filesystem
interface only, and registers it in every process: the chief (its CheckpointManager), each parameter
server (the shards of its variables, which it writes and reads itself), the workers (training data
read from a bucket) and the evaluator. It is configured from the environment the operator renders
from spec.checkpoint.s3 (the AWS SDKs' variable names: AWS_ENDPOINT_URL_S3, AWS_REGION, ...).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import tensorflow as tf

from pstrainer.task import ConfigError

log = logging.getLogger(__name__)

PLUGIN_ENV = "PSTRAINER_S3_PLUGIN"
PLUGIN_FILE = "libpstrainer_s3.so"
SCHEME = "s3://"


def plugin_path(env: Mapping[str, str]) -> Path:
    """The plugin: PSTRAINER_S3_PLUGIN, else the one installed beside this module."""
    return Path(env.get(PLUGIN_ENV) or Path(__file__).with_name(PLUGIN_FILE))


def register_filesystems(env: Mapping[str, str], checkpoint_dir: str) -> None:
    """Register the s3:// filesystem. Without it, an s3:// checkpoint directory is a bad
    configuration; any other keeps training, with a warning (s3:// is then unknown to TensorFlow)."""
    path = plugin_path(env)
    try:
        tf.experimental.register_filesystem_plugin(str(path))
    except (OSError, RuntimeError, tf.errors.OpError) as err:
        if checkpoint_dir.startswith(SCHEME):
            raise ConfigError(f"the s3:// filesystem plugin {path} cannot be loaded: {err}") from None
        log.warning("s3:// is not available: the filesystem plugin %s cannot be loaded: %s", path, err)


def check_checkpoint_storage(directory: str) -> None:
    """Make the checkpoint directory and list it, so that storage that is not there (a bucket that
    does not exist, credentials refused, an endpoint that does not answer) is a bad configuration
    told at once, naming the directory and the store's answer, rather than an error at the first
    save. Nothing in it is changed: a directory that holds checkpoints keeps them."""
    try:
        tf.io.gfile.makedirs(directory)
        tf.io.gfile.listdir(directory)
    except tf.errors.OpError as err:
        raise ConfigError(f"checkpoint storage {directory} is not usable: {err.message}") from None
