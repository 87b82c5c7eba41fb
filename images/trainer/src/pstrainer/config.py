"""The bundled runtime's configuration: the task (pstrainer.task) plus the example model's flags.

Pure: no TensorFlow import, so a bad configuration is reported (exit 2) in milliseconds, and the
parsing is unit-tested without TF. Every flag can also be set through the environment as
PSTRAINER_<FLAG> (e.g. PSTRAINER_STEPS=1000), which pod templates find convenient; a flag on the
command line wins over the environment.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

from pstrainer.contract import Role
from pstrainer.task import (
    DEFAULT_CHECKPOINT_INTERVAL_SECONDS,
    DEFAULT_PS_DRAIN_SECONDS,
    DEFAULT_TERMINATION_CHECKPOINT_SECONDS,
    ENV_PREFIX,
    ConfigError,
    Task,
    load_task,
    non_negative_float,
    non_negative_int,
    parse_tf_config,
    positive_float,
    positive_int,
)

__all__ = [
    "DEFAULT_CHECKPOINT_INTERVAL_SECONDS",
    "ConfigError",
    "ModelConfig",
    "TrainerConfig",
    "load_config",
    "parse_tf_config",
]

Partitioner = Literal["max-size", "fixed", "none"]
Fault = Literal["none", "model-bug"]


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
    task: Task
    steps: int
    steps_per_dispatch: int
    model: ModelConfig
    eval_examples: int
    eval_idle_timeout_seconds: float
    inject_fault: Fault
    fault_at_step: int
    log_level: str


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


# (flag, type, default, help); the environment fallback is PSTRAINER_<FLAG in upper snake case>.
_FLAGS: tuple[tuple[str, Any, Any, str], ...] = (
    ("steps", positive_int, 1000, "global steps to train in total (the job is done at this step)"),
    ("vocab-size", positive_int, ModelConfig.vocab_size, "rows of the embedding table"),
    ("embedding-dim", positive_int, ModelConfig.embedding_dim, "columns of the embedding table"),
    ("dense-features", positive_int, ModelConfig.dense_features, "dense features per example"),
    ("hidden-units", positive_int, ModelConfig.hidden_units, "units of the hidden layer"),
    ("batch-size", positive_int, ModelConfig.batch_size, "examples per step"),
    ("learning-rate", positive_float, ModelConfig.learning_rate, "Adagrad learning rate"),
    ("partitioner", str, ModelConfig.partitioner, "max-size, fixed or none"),
    ("max-shard-bytes", positive_int, ModelConfig.max_shard_bytes, "largest shard (max-size)"),
    ("num-shards", non_negative_int, 0, "shards per variable (fixed); 0: one per parameter server"),
    ("steps-per-dispatch", positive_int, 20, "steps scheduled between two waits for the workers"),
    ("eval-examples", positive_int, 4096, "held-out examples the evaluator scores"),
    ("eval-idle-timeout-seconds", positive_float, 3600.0, "evaluator exits when no checkpoint comes"),
    ("inject-fault", str, "none", "testing: model-bug makes the loss NaN at --fault-at-step"),
    ("fault-at-step", non_negative_int, 0, "testing: step at which the injected fault fires"),
    ("log-level", str, "INFO", "Python logging level"),
    (
        "termination-checkpoint-seconds",
        positive_float,
        DEFAULT_TERMINATION_CHECKPOINT_SECONDS,
        "chief: on SIGTERM, save within this long before exiting 143 (else exit without saving)",
    ),
    (
        "ps-drain-seconds",
        non_negative_float,
        DEFAULT_PS_DRAIN_SECONDS,
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


def load_config(argv: Sequence[str], env: Mapping[str, str]) -> TrainerConfig:
    """Everything the runtime needs, validated; ConfigError with a readable message otherwise."""
    try:
        args = _parser(env).parse_args(list(argv))
    except ValueError as err:  # a bad PSTRAINER_* default is converted lazily by argparse
        raise ConfigError(str(err)) from None
    task = dataclasses.replace(
        load_task(env),
        termination_checkpoint_seconds=args.termination_checkpoint_seconds,
        ps_drain_seconds=args.ps_drain_seconds,
    )
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
        num_shards=args.num_shards or task.num_tasks(Role.PS) or 1,
    )
    return TrainerConfig(
        task=task,
        steps=args.steps,
        steps_per_dispatch=args.steps_per_dispatch,
        model=model,
        eval_examples=args.eval_examples,
        eval_idle_timeout_seconds=args.eval_idle_timeout_seconds,
        inject_fault=args.inject_fault,
        fault_at_step=args.fault_at_step,
        log_level=args.log_level.upper(),
    )
