"""How the runtime ends: exit-code classification, one prompt exit path, SIGTERM and the connect watchdog.

TensorFlow's teardown can hang for seconds (gRPC channels, coordinator threads), so every exit is
`os._exit` after a final flush. The first exit wins: a SIGTERM arriving while the main thread is
already exiting cannot change the code. Once a SIGTERM came, the role's action before termination
runs (the chief saves, a parameter server keeps serving) and every exit but success is 143.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from typing import NoReturn

from pstrainer.contract import ExitCode
from pstrainer.task import ConfigError

log = logging.getLogger(__name__)

# Names of the TensorFlow errors a restart can cure (tf.errors.*). The runtime passes the classes;
# the names let the unit tests and the docs say the same thing without importing TensorFlow.
RETRYABLE_TF_ERRORS: tuple[str, ...] = (
    "UnavailableError",
    "AbortedError",
    "DeadlineExceededError",
    "CancelledError",
)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception and what it wraps: the coordinator's `original_exception`, then `raise ... from`."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        wrapped = getattr(current, "original_exception", None)
        current = wrapped if isinstance(wrapped, BaseException) else current.__cause__


def classify_exception(exc: BaseException, retryable: tuple[type[BaseException], ...]) -> ExitCode:
    """The exit code for an exception that ended training.

    By type, never by message: every remote TF error carries "GRPC error information" text, and
    an InvalidArgumentError from a worker is still a bug in the model.
    """
    for error in _chain(exc):
        if isinstance(error, ConfigError):
            return ExitCode.BAD_CONFIG
        if isinstance(error, retryable):
            return ExitCode.RETRYABLE
        if isinstance(error, KeyboardInterrupt):
            return ExitCode.TERMINATED
    return ExitCode.PERMANENT


def describe(exc: BaseException, limit: int = 400) -> str:
    """A one-line reason for the termination message: the type and the first line of the text."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:limit]


class Exiter:
    """The single way out of the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hooks: list[Callable[[int, str], None]] = []
        self._before_termination: Callable[[], None] | None = None
        self._terminated: str | None = None

    def on_exit(self, hook: Callable[[int, str], None]) -> None:
        """Run hook(code, message) before the process exits (e.g. write the termination message)."""
        self._hooks.append(hook)

    def before_termination(self, action: Callable[[], None]) -> None:
        """Run action (which bounds its own time) on SIGTERM, before exiting 143."""
        self._before_termination = action

    def terminate(self, message: str) -> NoReturn:
        # The pod was asked to stop: whatever fails meanwhile (the chief's save when a parameter
        # server is gone too) is still a stop, not a crash.
        self._terminated = message
        if self._before_termination is not None:
            try:
                self._before_termination()
            except Exception:
                log.exception("the action before termination failed")
        self.exit(ExitCode.TERMINATED, message)

    def exit(self, code: int, message: str = "") -> NoReturn:
        # Never released: whoever comes second waits here until the first one's os._exit.
        self._lock.acquire()
        if self._terminated is not None and code != ExitCode.SUCCEEDED:
            code, message = ExitCode.TERMINATED, self._terminated
        level = logging.INFO if code == ExitCode.SUCCEEDED else logging.ERROR
        log.log(level, "exiting with code %d: %s", code, message or "done")
        for hook in self._hooks:
            try:
                hook(code, message)
            except Exception:
                log.exception("exit hook failed")
        for handler in logging.getLogger().handlers:
            handler.flush()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)


def watch_sigterm(exiter: Exiter) -> threading.Thread:
    """Take SIGTERM and SIGINT on a thread of their own: `exiter.terminate` runs whatever the main
    thread is blocked in (a C++ join runs no Python signal handler). Call from the main thread,
    first thing.

    The signals are blocked in this thread and so in every thread started later (TensorFlow's),
    and unblocked in the watcher's, which the kernel then gives them to. A thread started earlier
    (a program that imported TensorFlow first) may take them too: Python's own handler, installed
    here for both, writes the signal's number to the wakeup socket in whichever thread takes it,
    and the watcher reads it there.
    """
    receiver, sender = socket.socketpair()
    sender.setblocking(False)
    stopping = {signal.SIGTERM, signal.SIGINT}
    for number in stopping:
        signal.signal(number, lambda *_: None)
    signal.set_wakeup_fd(sender.fileno(), warn_on_full_buffer=False)
    signal.pthread_sigmask(signal.SIG_BLOCK, stopping)

    def wait() -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stopping)
        with receiver, sender:  # the sender stays open while the watcher runs
            received = 0
            while received not in stopping:  # other signals with a Python handler pass by
                received = receiver.recv(1)[0]
            exiter.terminate(f"terminated by {signal.Signals(received).name}")

    thread = threading.Thread(target=wait, name="sigterm-watcher", daemon=True)
    thread.start()
    return thread


def keep_serving(seconds: float) -> Callable[[], None]:
    """A parameter server's action before termination: serve on (the main thread does), so that the
    chief can still read its variables for a checkpoint."""

    def drain() -> None:
        log.info("SIGTERM: serving %g s more so that the chief can checkpoint", seconds)
        threading.Event().wait(seconds)

    return drain


class ConnectWatchdog:
    """Exit RETRYABLE when the peers have not answered within the connect timeout.

    A chief whose parameter server never comes otherwise waits forever inside TensorFlow.
    """

    def __init__(self, exiter: Exiter, timeout_seconds: float, what: str) -> None:
        self._exiter = exiter
        self._timeout = timeout_seconds
        self._what = what
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="connect-watchdog", daemon=True)

    def start(self) -> ConnectWatchdog:
        self._thread.start()
        return self

    def disarm(self) -> None:
        self._done.set()

    def _watch(self) -> None:
        if not self._done.wait(self._timeout):
            self._exiter.exit(ExitCode.RETRYABLE, f"{self._what} did not answer within {self._timeout:g} s")
