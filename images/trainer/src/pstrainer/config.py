"""The runtime's configuration: the operator's contract (TF_CONFIG, PSOP_*) plus the training flags.

Pure: no TensorFlow import, so a bad configuration is reported (exit 2) in milliseconds, and the
parsing is unit-tested without TF. Every flag can also be set through the environment as
PSTRAINER_<FLAG> (e.g. PSTRAINER_STEPS=1000), which pod templates find convenient; a flag on the
command line wins over the environment.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

from psoperator import contract
from psoperator.contract import Role

ENV_PREFIX = "PSTRAINER_"
# Checkpoint cadence when the job names none: a restart then loses at most this much work.
DEFAULT_CHECKPOINT_INTERVAL_SECONDS = 600.0
DEFAULT_CONNECT_TIMEOUT_SECONDS = 600.0

Partitioner = Literal["max-size", "fixed", "none"]
Fault = Literal["none", "model-bug"]


class ConfigError(ValueError):
    """TF_CONFIG, the environment or the flags are wrong: the runtime exits with BAD_CONFIG."""


@dataclass(frozen=True)
class ModelConfig:
    """Sizes and hyper-parameters of the example CTR model."""

    vocab_size: int = 100_000
    embedding_dim: int = 16
    dense_features: int = 8
    hidden_units: int = 64
    batch_size: int = 256
    learning_rate: float = 0.1
    partitioner: Partitioner = "max-size"
    # Largest shard of a partitioned variable (MaxSizePartitioner); 64 MiB by default.
    max_shard_bytes: int = 64 << 20
    # Shards of every variable (FixedShardsPartitioner); 0 means one per parameter server.
    num_shards: int = 0


@dataclass(frozen=True)
class TrainerConfig:
    role: Role
    task_index: int
    cluster: dict[str, list[str]]
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
    steps: int
    steps_per_dispatch: int
    model: ModelConfig
    eval_examples: int
    eval_idle_timeout_seconds: float
    inject_fault: Fault
    fault_at_step: int
    log_level: str
    # SIGTERM: how long the chief may take to save, and how long a parameter server keeps serving so
    # that it can; both within the pod's termination grace (30 s unless the template says otherwise).
    termination_checkpoint_seconds: float = 20.0
    ps_drain_seconds: float = 20.0

    @property
    def task_name(self) -> str:
        return f"{self.role.value}:{self.task_index}"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"{text} is not a positive integer")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"{text} is negative")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{text} is not a positive number")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{text} is not a non-negative number")
    return value


# (flag, type, default, help); the environment fallback is PSTRAINER_<FLAG in upper snake case>.
_FLAGS: tuple[tuple[str, Any, Any, str], ...] = (
    ("steps", _positive_int, 1000, "global steps to train in total (the job is done at this step)"),
    ("vocab-size", _positive_int, ModelConfig.vocab_size, "rows of the embedding table"),
    ("embedding-dim", _positive_int, ModelConfig.embedding_dim, "columns of the embedding table"),
    ("dense-features", _positive_int, ModelConfig.dense_features, "dense features per example"),
    ("hidden-units", _positive_int, ModelConfig.hidden_units, "units of the hidden layer"),
    ("batch-size", _positive_int, ModelConfig.batch_size, "examples per step"),
    ("learning-rate", _positive_float, ModelConfig.learning_rate, "Adagrad learning rate"),
    ("partitioner", str, ModelConfig.partitioner, "max-size, fixed or none"),
    ("max-shard-bytes", _positive_int, ModelConfig.max_shard_bytes, "largest shard (max-size)"),
    ("num-shards", _non_negative_int, 0, "shards per variable (fixed); 0: one per parameter server"),
    ("steps-per-dispatch", _positive_int, 20, "steps scheduled between two waits for the workers"),
    ("eval-examples", _positive_int, 4096, "held-out examples the evaluator scores"),
    ("eval-idle-timeout-seconds", _positive_float, 3600.0, "evaluator exits when no checkpoint comes"),
    ("inject-fault", str, "none", "testing: model-bug makes the loss NaN at --fault-at-step"),
    ("fault-at-step", _non_negative_int, 0, "testing: step at which the injected fault fires"),
    ("log-level", str, "INFO", "Python logging level"),
    (
        "termination-checkpoint-seconds",
        _positive_float,
        TrainerConfig.termination_checkpoint_seconds,
        "chief: on SIGTERM, save within this long before exiting 143 (else exit without saving)",
    ),
    (
        "ps-drain-seconds",
        _non_negative_float,
        TrainerConfig.ps_drain_seconds,
        "ps: on SIGTERM, serve this long before exiting 143, so the chief can still save; 0: exit at once",
    ),
)


def _parser(env: Mapping[str, str]) -> _Parser:
    parser = _Parser(
        prog="pstrainer",
        description="TensorFlow parameter-server training runtime (one entrypoint for every role).",
    )
    for flag, kind, default, text in _FLAGS:
        env_name = ENV_PREFIX + flag.upper().replace("-", "_")
        raw = env.get(env_name)
        parser.add_argument(
            f"--{flag}",
            type=kind,
            default=raw if raw is not None else default,
            help=f"{text} (env {env_name}; default {default})",
        )
    return parser


def _env_number(env: Mapping[str, str], name: str, kind: Any, default: Any) -> Any:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return kind(raw)
    except ValueError as err:
        raise ConfigError(f"{name}={raw!r}: {err}") from None


def parse_tf_config(text: str | None) -> tuple[dict[str, list[str]], Role, int]:
    """The cluster and this task's (role, index) from TF_CONFIG; ConfigError for anything malformed."""
    if not text:
        raise ConfigError(f"{contract.ENV_TF_CONFIG} is not set")
    try:
        data = json.loads(text)
    except ValueError as err:
        raise ConfigError(f"{contract.ENV_TF_CONFIG} is not JSON: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{contract.ENV_TF_CONFIG} is not a JSON object")
    task = data.get("task")
    if not isinstance(task, dict):
        raise ConfigError(f"{contract.ENV_TF_CONFIG} has no task object")
    try:
        role = Role(str(task.get("type")))
    except ValueError:
        raise ConfigError(f"{contract.ENV_TF_CONFIG}: unknown task type {task.get('type')!r}") from None
    index = task.get("index", 0)
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ConfigError(f"{contract.ENV_TF_CONFIG}: task index {index!r} is not a non-negative integer")

    raw_cluster = data.get("cluster", {})
    if not isinstance(raw_cluster, dict):
        raise ConfigError(f"{contract.ENV_TF_CONFIG}: cluster is not an object")
    cluster: dict[str, list[str]] = {}
    for job, addresses in raw_cluster.items():
        if not isinstance(addresses, list) or not all(isinstance(a, str) and a for a in addresses):
            raise ConfigError(f"{contract.ENV_TF_CONFIG}: cluster.{job} is not a list of addresses")
        for address in addresses:
            host, sep, port = address.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError(f"{contract.ENV_TF_CONFIG}: {address!r} is not host:port")
        cluster[job] = list(addresses)

    if role is not Role.EVALUATOR:
        members = cluster.get(role.value, [])
        if index >= len(members):
            raise ConfigError(
                f"{contract.ENV_TF_CONFIG}: task {role.value}:{index} is not in the cluster "
                f"({len(members)} {role.value} tasks)"
            )
        for needed in (Role.CHIEF, Role.PS, Role.WORKER):
            if not cluster.get(needed.value):
                raise ConfigError(f"{contract.ENV_TF_CONFIG}: the cluster has no {needed.value} task")
        if len(cluster[Role.CHIEF.value]) != 1:
            raise ConfigError(f"{contract.ENV_TF_CONFIG}: a cluster has exactly one chief")
    return cluster, role, index


def _tf_config(env: Mapping[str, str]) -> str | None:
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


def load_config(argv: Sequence[str], env: Mapping[str, str]) -> TrainerConfig:
    """Everything the runtime needs, validated; ConfigError with a readable message otherwise."""
    try:
        args = _parser(env).parse_args(list(argv))
    except ValueError as err:  # a bad PSTRAINER_* default is converted lazily by argparse
        raise ConfigError(str(err)) from None

    cluster, role, index = parse_tf_config(_tf_config(env))
    declared_role = env.get(contract.ENV_ROLE)
    if declared_role and declared_role != role.value:
        raise ConfigError(f"{contract.ENV_ROLE}={declared_role} but TF_CONFIG says {role.value}")
    declared_index = env.get(contract.ENV_TASK_INDEX)
    if declared_index and role is not Role.EVALUATOR and declared_index != str(index):
        raise ConfigError(f"{contract.ENV_TASK_INDEX}={declared_index} but TF_CONFIG says {index}")

    checkpoint_dir = env.get(contract.ENV_CHECKPOINT_DIR, "").strip()
    if role in (Role.CHIEF, Role.EVALUATOR) and not checkpoint_dir:
        raise ConfigError(f"{contract.ENV_CHECKPOINT_DIR} is required for the {role.value}")
    interval_steps = _env_number(env, contract.ENV_CHECKPOINT_INTERVAL_STEPS, _positive_int, None)
    interval_seconds = _env_number(env, contract.ENV_CHECKPOINT_INTERVAL_SECONDS, _positive_float, None)
    if interval_steps is None and interval_seconds is None:
        interval_seconds = DEFAULT_CHECKPOINT_INTERVAL_SECONDS
    port = _env_number(env, contract.ENV_PROGRESS_PORT, _positive_int, contract.DEFAULT_PROGRESS_PORT)
    if port > 65535:
        raise ConfigError(f"{contract.ENV_PROGRESS_PORT}={port} is not a port")

    if args.partitioner not in ("max-size", "fixed", "none"):
        raise ConfigError(f"--partitioner={args.partitioner}: expected max-size, fixed or none")
    if args.inject_fault not in ("none", "model-bug"):
        raise ConfigError(f"--inject-fault={args.inject_fault}: expected none or model-bug")

    model = ModelConfig(
        vocab_size=args.vocab_size,
        embedding_dim=args.embedding_dim,
        dense_features=args.dense_features,
        hidden_units=args.hidden_units,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        partitioner=args.partitioner,
        max_shard_bytes=args.max_shard_bytes,
        num_shards=args.num_shards or len(cluster.get(Role.PS.value, [])) or 1,
    )
    return TrainerConfig(
        role=role,
        task_index=index,
        cluster=cluster,
        checkpoint_dir=checkpoint_dir,
        checkpoint_interval_steps=interval_steps,
        checkpoint_interval_seconds=interval_seconds,
        connect_timeout_seconds=_env_number(
            env, contract.ENV_CONNECT_TIMEOUT_SECONDS, _positive_float, DEFAULT_CONNECT_TIMEOUT_SECONDS
        ),
        progress_port=port,
        chief_token_file=env.get(contract.ENV_CHIEF_TOKEN_FILE) or None,
        checkpoint_before_stop_seconds=_env_number(
            env,
            contract.ENV_CHECKPOINT_BEFORE_STOP_SECONDS,
            _non_negative_float,
            float(contract.DEFAULT_CHECKPOINT_BEFORE_STOP_SECONDS),
        ),
        termination_message_path=env.get(contract.ENV_TERMINATION_MESSAGE_PATH) or None,
        job_name=env.get(contract.ENV_JOB_NAME, ""),
        namespace=env.get(contract.ENV_NAMESPACE, ""),
        pod_name=env.get(contract.ENV_POD_NAME, ""),
        steps=args.steps,
        steps_per_dispatch=args.steps_per_dispatch,
        model=model,
        eval_examples=args.eval_examples,
        eval_idle_timeout_seconds=args.eval_idle_timeout_seconds,
        inject_fault=args.inject_fault,
        fault_at_step=args.fault_at_step,
        log_level=args.log_level.upper(),
        termination_checkpoint_seconds=args.termination_checkpoint_seconds,
        ps_drain_seconds=args.ps_drain_seconds,
    )
