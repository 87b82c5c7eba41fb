"""This process's task as the operator describes it: the cluster, the role, and the contract's settings.

Pure: no TensorFlow import, so a bad configuration is reported (exit 2) in milliseconds, and the
parsing is unit-tested without TF. Everything comes from the environment the operator injects
(pstrainer.contract); the runtime's own knobs are PSTRAINER_* variables.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pstrainer import contract
from pstrainer.contract import Role

ENV_PREFIX = "PSTRAINER_"
# On SIGTERM: how long the chief may take to save, and how long a parameter server keeps serving so
# that it can; both within the pod's termination grace (30 s unless the template says otherwise).
ENV_TERMINATION_CHECKPOINT_SECONDS = ENV_PREFIX + "TERMINATION_CHECKPOINT_SECONDS"
ENV_PS_DRAIN_SECONDS = ENV_PREFIX + "PS_DRAIN_SECONDS"
DEFAULT_TERMINATION_CHECKPOINT_SECONDS = 20.0
DEFAULT_PS_DRAIN_SECONDS = 20.0
# Checkpoint cadence when the job names none: a restart then loses at most this much work.
DEFAULT_CHECKPOINT_INTERVAL_SECONDS = 600.0
DEFAULT_CONNECT_TIMEOUT_SECONDS = 600.0


class ConfigError(ValueError):
    """TF_CONFIG, the environment or the flags are wrong: the runtime exits with BAD_CONFIG."""


@dataclass(frozen=True)
class Task:
    """What the operator tells one process of a PSTrainingJob."""

    role: Role
    task_index: int
    cluster: dict[str, list[str]]
    # TF_CONFIG as TensorFlow reads it (composed from the cluster file for a large cluster).
    tf_config: str
    checkpoint_dir: str
    checkpoint_interval_steps: int | None
    checkpoint_interval_seconds: float | None
    connect_timeout_seconds: float
    progress_port: int
    # The longest hold a checkpoint request over HTTP gets (the job's checkpointBeforeStopSeconds).
    checkpoint_before_stop_seconds: float
    # The file of the token a request to the progress port must carry; None: none needed.
    chief_token_file: str | None
    # Unset outside Kubernetes: then no termination message is written.
    termination_message_path: str | None
    job_name: str
    namespace: str
    pod_name: str
    termination_checkpoint_seconds: float = DEFAULT_TERMINATION_CHECKPOINT_SECONDS
    ps_drain_seconds: float = DEFAULT_PS_DRAIN_SECONDS

    @property
    def task_name(self) -> str:
        return f"{self.role.value}:{self.task_index}"

    @property
    def is_chief(self) -> bool:
        return self.role is Role.CHIEF

    def num_tasks(self, role: Role) -> int:
        return len(self.cluster.get(role.value, []))

    def cluster_resolver(self) -> Any:
        """TensorFlow's resolver for this task (imports TensorFlow)."""
        import tensorflow as tf

        return tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(self.cluster),
            task_type=self.role.value,
            task_id=self.task_index,
            rpc_layer="grpc",
        )


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"{text} is not a positive integer")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"{text} is negative")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{text} is not a positive number")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{text} is not a non-negative number")
    return value


def env_number(env: Mapping[str, str], name: str, kind: Callable[[str], Any], default: Any) -> Any:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return kind(raw)
    except ValueError as err:
        raise ConfigError(f"{name}={raw!r}: {err}") from None


def parse_tf_config(text: str | None) -> tuple[dict[str, list[str]], Role, int]:
    """The cluster and this task's (role, index) from TF_CONFIG; ConfigError for anything malformed."""
    name = contract.ENV_TF_CONFIG
    if not text:
        raise ConfigError(f"{name} is not set")
    try:
        data = json.loads(text)
    except ValueError as err:
        raise ConfigError(f"{name} is not JSON: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{name} is not a JSON object")
    task = data.get("task")
    if not isinstance(task, dict):
        raise ConfigError(f"{name} has no task object")
    try:
        role = Role(str(task.get("type")))
    except ValueError:
        raise ConfigError(f"{name}: unknown task type {task.get('type')!r}") from None
    index = task.get("index", 0)
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ConfigError(f"{name}: task index {index!r} is not a non-negative integer")
    cluster = _cluster(data.get("cluster", {}))
    if role is not Role.EVALUATOR:
        members = cluster.get(role.value, [])
        if index >= len(members):
            raise ConfigError(
                f"{name}: task {role.value}:{index} is not in the cluster ({len(members)} {role.value} tasks)"
            )
        for needed in (Role.CHIEF, Role.PS, Role.WORKER):
            if not cluster.get(needed.value):
                raise ConfigError(f"{name}: the cluster has no {needed.value} task")
        if len(cluster[Role.CHIEF.value]) != 1:
            raise ConfigError(f"{name}: a cluster has exactly one chief")
    return cluster, role, index


def _cluster(raw: object) -> dict[str, list[str]]:
    name = contract.ENV_TF_CONFIG
    if not isinstance(raw, dict):
        raise ConfigError(f"{name}: cluster is not an object")
    cluster: dict[str, list[str]] = {}
    for job, addresses in raw.items():
        if not isinstance(addresses, list) or not all(isinstance(a, str) and a for a in addresses):
            raise ConfigError(f"{name}: cluster.{job} is not a list of addresses")
        for address in addresses:
            host, sep, port = address.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError(f"{name}: {address!r} is not host:port")
        cluster[job] = list(addresses)
    return cluster


def tf_config_text(env: Mapping[str, str]) -> str | None:
    """TF_CONFIG from the environment or, for a cluster too large for it, from the file it names."""
    text = contract.tf_config_text(env)
    path = env.get(contract.ENV_TF_CONFIG_FILE)
    if text is not None or not path:
        return text
    try:
        with open(path, encoding="utf-8") as file:
            return contract.tf_config_from_file(file.read(), env)
    except (OSError, ValueError) as err:
        raise ConfigError(f"{contract.ENV_TF_CONFIG_FILE}={path}: {err}") from None


def load_task(env: Mapping[str, str] | None = None) -> Task:
    """This process's task from the environment (os.environ unless given), validated; ConfigError
    with a readable message otherwise."""
    env = os.environ if env is None else env
    text = tf_config_text(env)
    cluster, role, index = parse_tf_config(text)
    assert text is not None
    declared_role = env.get(contract.ENV_ROLE)
    if declared_role and declared_role != role.value:
        raise ConfigError(f"{contract.ENV_ROLE}={declared_role} but TF_CONFIG says {role.value}")
    declared_index = env.get(contract.ENV_TASK_INDEX)
    if declared_index and role is not Role.EVALUATOR and declared_index != str(index):
        raise ConfigError(f"{contract.ENV_TASK_INDEX}={declared_index} but TF_CONFIG says {index}")

    checkpoint_dir = env.get(contract.ENV_CHECKPOINT_DIR, "").strip()
    if role in (Role.CHIEF, Role.EVALUATOR) and not checkpoint_dir:
        raise ConfigError(f"{contract.ENV_CHECKPOINT_DIR} is required for the {role.value}")
    interval_steps = env_number(env, contract.ENV_CHECKPOINT_INTERVAL_STEPS, positive_int, None)
    interval_seconds = env_number(env, contract.ENV_CHECKPOINT_INTERVAL_SECONDS, positive_float, None)
    if interval_steps is None and interval_seconds is None:
        interval_seconds = DEFAULT_CHECKPOINT_INTERVAL_SECONDS
    port = env_number(env, contract.ENV_PROGRESS_PORT, positive_int, contract.DEFAULT_PROGRESS_PORT)
    if port > 65535:
        raise ConfigError(f"{contract.ENV_PROGRESS_PORT}={port} is not a port")
    return Task(
        role=role,
        task_index=index,
        cluster=cluster,
        tf_config=text,
        checkpoint_dir=checkpoint_dir,
        checkpoint_interval_steps=interval_steps,
        checkpoint_interval_seconds=interval_seconds,
        connect_timeout_seconds=env_number(
            env, contract.ENV_CONNECT_TIMEOUT_SECONDS, positive_float, DEFAULT_CONNECT_TIMEOUT_SECONDS
        ),
        progress_port=port,
        chief_token_file=env.get(contract.ENV_CHIEF_TOKEN_FILE) or None,
        checkpoint_before_stop_seconds=env_number(
            env,
            contract.ENV_CHECKPOINT_BEFORE_STOP_SECONDS,
            non_negative_float,
            float(contract.DEFAULT_CHECKPOINT_BEFORE_STOP_SECONDS),
        ),
        termination_message_path=env.get(contract.ENV_TERMINATION_MESSAGE_PATH) or None,
        job_name=env.get(contract.ENV_JOB_NAME, ""),
        namespace=env.get(contract.ENV_NAMESPACE, ""),
        pod_name=env.get(contract.ENV_POD_NAME, ""),
        termination_checkpoint_seconds=env_number(
            env, ENV_TERMINATION_CHECKPOINT_SECONDS, positive_float, DEFAULT_TERMINATION_CHECKPOINT_SECONDS
        ),
        ps_drain_seconds=env_number(env, ENV_PS_DRAIN_SECONDS, non_negative_float, DEFAULT_PS_DRAIN_SECONDS),
    )
