"""`pstrainer`: one entrypoint for every role of a PSTrainingJob.

The role comes from TF_CONFIG (and must agree with PSOP_ROLE): ps and worker serve, the chief
trains and checkpoints, the evaluator follows checkpoints. Exit codes are psoperator.contract's
ExitCode; see docs/reference/runtime.md.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from psoperator import contract
from psoperator.contract import ExitCode, ProgressReport, Role
from pstrainer.config import ConfigError, TrainerConfig, load_config
from pstrainer.exits import (
    RETRYABLE_TF_ERRORS,
    Exiter,
    block_sigterm,
    classify_exception,
    describe,
    keep_serving,
    watch_sigterm,
)
from pstrainer.ondemand import CheckpointRequests, checkpoint_before_exit
from pstrainer.progress import ProgressServer, ProgressTracker, read_token, write_termination_message

log = logging.getLogger("pstrainer")


def _retryable_types() -> tuple[type[BaseException], ...]:
    """TensorFlow's retryable error classes, if TensorFlow got imported at all."""
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return ()
    return tuple(getattr(tf.errors, name) for name in RETRYABLE_TF_ERRORS)


class _QuietJoins(logging.Filter):
    """Drop the coordinator's line for every join (one per dispatch); keep the rest of TF's logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Waiting for all global closures")


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level if level in logging.getLevelNamesMapping() else "INFO",
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stdout,
        force=True,
    )
    if level != "DEBUG":
        logging.getLogger("tensorflow").addFilter(_QuietJoins())


def _run_role(
    config: TrainerConfig, exiter: Exiter, tracker: ProgressTracker, requests: CheckpointRequests
) -> tuple[ExitCode, str]:
    # TensorFlow is imported only now: a bad configuration has already been reported.
    from pstrainer.storage import register_filesystems

    register_filesystems(os.environ, config.checkpoint_dir)
    if config.role is Role.CHIEF:
        from pstrainer.chief import run_chief

        return run_chief(config, exiter, tracker, requests)
    if config.role is Role.EVALUATOR:
        from pstrainer.evaluator import run_evaluator

        return run_evaluator(config)
    from pstrainer.servers import run_server

    return run_server(config)


def _prepare_termination(config: TrainerConfig, exiter: Exiter, requests: CheckpointRequests) -> None:
    """What a SIGTERM does before the exit 143: the chief saves, a parameter server drains."""
    if config.role is Role.CHIEF:
        exiter.before_termination(
            lambda: checkpoint_before_exit(requests, config.termination_checkpoint_seconds)
        )
    elif config.role is Role.PS and config.ps_drain_seconds > 0:
        exiter.before_termination(keep_serving(config.ps_drain_seconds))


def _access(token_file: str | None) -> str:
    """Who the progress port answers, for the log."""
    if token_file is None:
        return f"to anyone ({contract.ENV_CHIEF_TOKEN_FILE} is not set)"
    if read_token(token_file) is None:
        return f"to nobody until {token_file} holds the job's token"
    return f"to the holder of the token in {token_file}"


def main(argv: Sequence[str] | None = None) -> NoReturn:
    block_sigterm()
    exiter = Exiter()
    watch_sigterm(exiter)
    env = dict(os.environ)
    _setup_logging(env.get("PSTRAINER_LOG_LEVEL", "INFO").upper())
    try:
        config = load_config(sys.argv[1:] if argv is None else argv, env)
    except ConfigError as err:
        path = env.get(contract.ENV_TERMINATION_MESSAGE_PATH)
        report = ProgressReport(
            state="failed", exitCode=ExitCode.BAD_CONFIG, message=f"bad configuration: {err}"
        )
        exiter.on_exit(lambda code, message: write_termination_message(path, report))
        exiter.exit(ExitCode.BAD_CONFIG, f"bad configuration: {err}")
    _setup_logging(config.log_level)
    log.info(
        "%s of job %s/%s (pod %s) starting",
        config.task_name,
        config.namespace,
        config.job_name,
        config.pod_name,
    )

    tracker = ProgressTracker(total_steps=config.steps if config.role is Role.CHIEF else None)
    exiter.on_exit(
        lambda code, message: write_termination_message(
            config.termination_message_path, tracker.finish(code, message)
        )
    )
    requests = CheckpointRequests()
    _prepare_termination(config, exiter, requests)
    try:
        if config.role is Role.CHIEF:
            server = ProgressServer(
                tracker,
                config.progress_port,
                requests=requests,
                max_hold_seconds=config.checkpoint_before_stop_seconds,
                token_file=config.chief_token_file,
            ).start()
            log.info(
                "progress on port %d (%s, %s, POST %s), %s",
                server.port,
                contract.PROGRESS_PATH,
                contract.METRICS_PATH,
                contract.CHECKPOINT_PATH,
                _access(config.chief_token_file),
            )
        code, message = _run_role(config, exiter, tracker, requests)
    except BaseException as exc:
        code = classify_exception(exc, _retryable_types())
        message = describe(exc)
        log.error("%s failed (%s)", config.task_name, ExitCode(code).name, exc_info=exc)
    exiter.exit(code, message)
