"""Parameter servers and workers: a TensorFlow server that serves until the pod is stopped.

They never finish on their own; only the chief does. The operator stops them (SIGTERM, exit 143):
a worker at once (the coordinator gives its steps to the others), a parameter server after its
drain time (--ps-drain-seconds), during which the chief can still read its variables to save.
"""

from __future__ import annotations

import logging
import os

import tensorflow as tf

from psoperator.contract import ExitCode, Role
from pstrainer.chief import cluster_resolver
from pstrainer.config import TrainerConfig

log = logging.getLogger(__name__)


def run_server(config: TrainerConfig) -> tuple[ExitCode, str]:
    resolver = cluster_resolver(config)
    session_config = tf.compat.v1.ConfigProto()
    workers = len(config.cluster.get("worker", []))
    if config.role is Role.WORKER and (os.cpu_count() or 1) < workers + 1:
        # A worker runs closures for the coordinator and serves its peers at once; TensorFlow's
        # guidance is at least one inter-op thread per worker plus one.
        session_config.inter_op_parallelism_threads = workers + 1
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=config.role.value,
        task_index=config.task_index,
        protocol="grpc",
        config=session_config,
        start=True,
    )
    log.info("%s serving at %s", config.task_name, server.target)
    server.join()
    return ExitCode.PERMANENT, "the TensorFlow server stopped on its own"
