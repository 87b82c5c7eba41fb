"""`pstrainer.main`: one entrypoint for every role of a PSTrainingJob, honouring the operator's contract.

The role comes from TF_CONFIG (or, for a large cluster, the file PSOP_TF_CONFIG_FILE names, from
which TF_CONFIG is composed for TensorFlow's own resolver): a parameter server or a worker serves
(a parameter server draining on SIGTERM, so the chief can still save), the chief runs the user's
training function behind the progress port, the evaluator runs the user's evaluation function.
The process exits with the contract's codes: 0 done, 1 a bug, 2 a bad configuration, 138 a
transient TensorFlow error or peers that never answered, 143 stopped; the chief's final progress
report goes to the termination message.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NoReturn

from pstrainer import contract
from pstrainer.contract import CheckpointAnswer, CheckpointStatus, ExitCode, ProgressReport, Role
from pstrainer.exits import (
    RETRYABLE_TF_ERRORS,
    ConnectWatchdog,
    Exiter,
    classify_exception,
    describe,
    keep_serving,
    watch_sigterm,
)
from pstrainer.ondemand import CheckpointRequests, checkpoint_before_exit
from pstrainer.progress import ProgressServer, ProgressTracker, read_token, write_termination_message
from pstrainer.task import ConfigError, Task, load_task

log = logging.getLogger("pstrainer")

# A role's work: returns the message of a successful exit (None: a default one).
Work = Callable[[], str | None]


@dataclass(frozen=True)
class Session:
    """The chief's side of the contract while its training function runs: what the Keras callback
    and the training loop report to and serve from."""

    task: Task
    tracker: ProgressTracker
    requests: CheckpointRequests
    watchdog: ConnectWatchdog


_session: Session | None = None
_session_lock = threading.Lock()


def session() -> Session:
    """The chief's session that `pstrainer.main` runs; RuntimeError anywhere else."""
    with _session_lock:
        if _session is None:
            raise RuntimeError(
                "no chief session: the training function must run under pstrainer.main() on the chief"
            )
        return _session


def _open_session(value: Session) -> None:
    global _session
    with _session_lock:
        _session = value


def start() -> Exiter:
    """The process's way out, first thing: SIGTERM is taken by a watcher thread from now on."""
    exiter = Exiter()
    watch_sigterm(exiter)
    return exiter


def refuse_configuration(exiter: Exiter, env: Mapping[str, str], err: ConfigError) -> NoReturn:
    """Exit BAD_CONFIG, saying why in the termination message."""
    path = env.get(contract.ENV_TERMINATION_MESSAGE_PATH)
    message = f"bad configuration: {err}"
    report = ProgressReport(state="failed", exit_code=ExitCode.BAD_CONFIG, message=message)
    exiter.on_exit(lambda code, text: write_termination_message(path, report))
    exiter.exit(ExitCode.BAD_CONFIG, message)


def _retryable_types() -> tuple[type[BaseException], ...]:
    """TensorFlow's retryable error classes, if TensorFlow got imported at all."""
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return ()
    return tuple(getattr(tf.errors, name) for name in RETRYABLE_TF_ERRORS)


def _access(token_file: str | None) -> str:
    """Who the progress port answers, for the log."""
    if token_file is None:
        return f"to anyone ({contract.ENV_CHIEF_TOKEN_FILE} is not set)"
    if read_token(token_file) is None:
        return f"to nobody until {token_file} holds the job's token"
    return f"to the holder of the token in {token_file}"


def _serve_progress(task: Task, tracker: ProgressTracker, requests: CheckpointRequests) -> None:
    server = ProgressServer(
        tracker,
        task.progress_port,
        requests=requests,
        max_hold_seconds=task.checkpoint_before_stop_seconds,
        token_file=task.chief_token_file,
    ).start()
    log.info(
        "progress on port %d (%s, %s, POST %s), %s",
        server.port,
        contract.PROGRESS_PATH,
        contract.METRICS_PATH,
        contract.CHECKPOINT_PATH,
        _access(task.chief_token_file),
    )


def _serve(task: Task) -> str | None:
    from pstrainer.servers import serve

    return serve(task)


def run(
    task: Task,
    exiter: Exiter,
    chief: Work,
    evaluator: Work | None = None,
    total_steps: int | None = None,
) -> NoReturn:
    """Run this task's role and exit with the contract's code."""
    log.info(
        "%s of job %s/%s (pod %s) starting", task.task_name, task.namespace, task.job_name, task.pod_name
    )
    tracker = ProgressTracker(total_steps=total_steps if task.is_chief else None)
    exiter.on_exit(
        lambda code, message: write_termination_message(
            task.termination_message_path, tracker.finish(code, message)
        )
    )
    requests = CheckpointRequests()
    if task.is_chief:
        exiter.before_termination(
            lambda: checkpoint_before_exit(requests, task.termination_checkpoint_seconds)
        )
    elif task.role is Role.PS and task.ps_drain_seconds > 0:
        exiter.before_termination(keep_serving(task.ps_drain_seconds))
    try:
        # TensorFlow is imported only now: a bad configuration has already been reported.
        from pstrainer.storage import register_filesystems

        register_filesystems(os.environ, task.checkpoint_dir)
        work: Work = lambda: _serve(task)  # noqa: E731
        if task.is_chief:
            from pstrainer.storage import check_checkpoint_storage

            check_checkpoint_storage(task.checkpoint_dir)
            _serve_progress(task, tracker, requests)
            watchdog = ConnectWatchdog(
                exiter, task.connect_timeout_seconds, "the parameter servers and workers"
            ).start()
            _open_session(Session(task, tracker, requests, watchdog))
            work = chief
        elif task.role is Role.EVALUATOR:
            work = evaluator or (lambda: "no evaluation function was given")
        message = work() or "done"
        code = ExitCode.SUCCEEDED
    except BaseException as exc:
        code = classify_exception(exc, _retryable_types())
        message = describe(exc)
        log.error("%s failed (%s)", task.task_name, ExitCode(code).name, exc_info=exc)
        requests.close((CheckpointStatus.REFUSED, CheckpointAnswer(reason=f"training failed: {message}")))
    exiter.exit(code, message)


def main(
    train: Callable[[Task], object],
    evaluate: Callable[[Task], object] | None = None,
) -> NoReturn:
    """Run this pod's role of a PSTrainingJob and exit with the contract's code.

    On the chief, `train(task)` runs: it builds the strategy (`task.cluster_resolver()`), the
    model and trains it with `pstrainer.keras.ContractCallback` in `fit`, or with a
    `pstrainer.TrainingLoop`. On a parameter server or a worker, a TensorFlow server runs until the
    pod is stopped. On the evaluator, `evaluate(task)` runs, if given.
    """
    exiter = start()
    if not logging.getLogger().handlers:
        logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        task = load_task(os.environ)
    except ConfigError as err:
        refuse_configuration(exiter, os.environ, err)
    # For TensorFlow's own TFConfigClusterResolver, when the cluster came in a file.
    os.environ[contract.ENV_TF_CONFIG] = task.tf_config

    def message(result: object) -> str | None:
        return result if isinstance(result, str) else None

    run(
        task,
        exiter,
        chief=lambda: message(train(task)),
        evaluator=(lambda: message(evaluate(task))) if evaluate is not None else None,
    )
