"""Parameter servers and workers: a TensorFlow server that serves until the pod is stopped.

They never finish on their own; only the chief does. The operator stops them (SIGTERM, exit 143):
a worker at once (the coordinator gives its steps to the others), a parameter server after its
drain time (PSTRAINER_PS_DRAIN_SECONDS), during which the chief can still read its variables to save.
"""

from __future__ import annotations

import logging
import os

import tensorflow as tf

from pstrainer.contract import Role
from pstrainer.task import Task

log = logging.getLogger(__name__)


def serve(task: Task) -> str:
    """Start this task's TensorFlow server and serve until the process is stopped."""
    session_config = tf.compat.v1.ConfigProto()
    workers = task.num_tasks(Role.WORKER)
    if task.role is Role.WORKER and (os.cpu_count() or 1) < workers + 1:
        # A worker runs closures for the coordinator and serves its peers at once; TensorFlow's
        # guidance is at least one inter-op thread per worker plus one.
        session_config.inter_op_parallelism_threads = workers + 1
    server = tf.distribute.Server(
        tf.train.ClusterSpec(task.cluster),
        job_name=task.role.value,
        task_index=task.task_index,
        protocol="grpc",
        config=session_config,
        start=True,
    )
    log.info("%s serving at %s", task.task_name, server.target)
    server.join()
    raise RuntimeError("the TensorFlow server stopped on its own")
