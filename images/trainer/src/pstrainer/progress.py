"""What the chief tells the operator about training, without API credentials.

GET /progress: the contract's ProgressReport as JSON. GET /metrics: Prometheus text. On exit the
same report goes to the termination message path, where the kubelet picks it up. POST /checkpoint:
a checkpoint now (ondemand.py), answered as the contract's CheckpointAnswer.

With a token file (the contract's ENV_CHIEF_TOKEN_FILE), /progress and /checkpoint answer only a
request that carries its token (`Authorization: Bearer <token>`), others 401: the report names the
checkpoints' storage and a checkpoint request stops training for a while. /healthz and /metrics
(numbers about training, which a Prometheus scrape reads) need no token.

Whoever reaches the port is served within bounds: a request is read whole within
REQUEST_READ_SECONDS or the connection is closed (an idle or trickling client keeps no thread),
at most MAX_CONNECTIONS are served at once (more are closed unanswered), a request body holds
MAX_REQUEST_BODY bytes at most, and a hold asked over HTTP lasts max_hold_seconds at most (the
job's checkpointBeforeStopSeconds).
"""

from __future__ import annotations

import hmac
import io
import logging
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pstrainer.contract import (
    CHECKPOINT_PATH,
    DEFAULT_CHECKPOINT_BEFORE_STOP_SECONDS,
    METRICS_PATH,
    PROGRESS_PATH,
    CheckpointAnswer,
    CheckpointStatus,
    ExitCode,
    ProgressReport,
)
from pstrainer.metrics import CONTENT_TYPE, Registry
from pstrainer.ondemand import CheckpointRequests, parse_request

log = logging.getLogger(__name__)

# A checkpoint request's body holds two numbers.
MAX_REQUEST_BODY = 4096
# The operator sends its request at once; the answer to a checkpoint request may take its deadline.
REQUEST_READ_SECONDS = 5.0
# The operator asks one thing at a time (a progress read or a checkpoint request); a scrape is one more.
MAX_CONNECTIONS = 8


class ProgressTracker:
    """The chief's current report and its Prometheus view; safe to update from any thread."""

    def __init__(self, total_steps: int | None = None) -> None:
        self._lock = threading.Lock()
        self._report = ProgressReport(state="starting", step=0, total_steps=total_steps)
        self.registry = Registry()
        gauge = self.registry.gauge
        self._gauges = {
            "step": gauge("pstrainer_global_step", "Global step reached."),
            "total_steps": gauge("pstrainer_total_steps", "Steps to train."),
            "examples_per_second": gauge("pstrainer_examples_per_second", "Training throughput."),
            "loss": gauge("pstrainer_loss", "Loss of the latest step."),
            "checkpoint_step": gauge("pstrainer_last_checkpoint_step", "Step of the latest checkpoint."),
            "checkpoint_time": gauge(
                "pstrainer_last_checkpoint_timestamp_seconds", "Unix time of the latest checkpoint."
            ),
            "resumed_from_step": gauge("pstrainer_resumed_from_step", "Step restored at start."),
        }
        self.step_seconds = self.registry.histogram(
            "pstrainer_step_seconds",
            "Wall time of one global step (a dispatch's time over its steps).",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.checkpoint_save_seconds = self.registry.histogram(
            "pstrainer_checkpoint_save_seconds",
            "Wall time of writing one checkpoint.",
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
        )
        self._sync_gauges()

    def update(self, **fields: Any) -> ProgressReport:
        """Replace fields (python names of ProgressReport) and return the new report."""
        with self._lock:
            self._report = self._report.replace(**fields)
            self._sync_gauges()
            return self._report

    def snapshot(self) -> ProgressReport:
        with self._lock:
            return self._report

    def finish(self, code: int, message: str) -> ProgressReport:
        """The final report for an exit code."""
        state = "succeeded" if code == ExitCode.SUCCEEDED else "failed"
        return self.update(state=state, exit_code=code, message=message or None)

    def _sync_gauges(self) -> None:
        for name, gauge in self._gauges.items():
            value = getattr(self._report, name)
            if value is not None:
                gauge.set(value)


def write_termination_message(path: str | None, report: ProgressReport) -> None:
    """Write the report where the kubelet reads a terminated container's message; never raises."""
    if not path:
        return
    try:
        directory = os.path.dirname(path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        with open(path, "w", encoding="utf-8") as out:
            out.write(report.to_json())
    except (OSError, ValueError) as err:
        log.warning("cannot write the termination message to %s: %s", path, err)


# A token is 64 hexadecimal digits; a file much longer is no token.
MAX_TOKEN_BYTES = 1024


def read_token(path: str) -> bytes | None:
    """The token in the file, or None when it cannot be read or holds none."""
    try:
        with open(path, "rb") as file:
            token = file.read(MAX_TOKEN_BYTES).strip()
    except OSError:
        return None
    return token or None


class _DeadlineReader(io.RawIOBase):
    """A socket's reads, each given only what is left of one deadline: the whole request must come
    within it, however slowly its bytes trickle in."""

    def __init__(self, connection: socket.socket, seconds: float) -> None:
        self._connection, self._deadline = connection, time.monotonic() + seconds

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not come in time")
        self._connection.settimeout(left)
        return self._connection.recv_into(buffer)


class _Handler(BaseHTTPRequestHandler):
    tracker: ProgressTracker
    requests: CheckpointRequests | None
    max_hold_seconds: float
    token_file: str | None

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the socket stays open: what it reads goes through the deadline instead
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, REQUEST_READ_SECONDS))

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in (PROGRESS_PATH, CHECKPOINT_PATH) and not self._authorized():
            self._unauthorized()
        elif path == CHECKPOINT_PATH and self.requests is not None:
            self._answer(CheckpointStatus.METHOD_NOT_ALLOWED, CheckpointAnswer(reason="POST it"))
        elif path == PROGRESS_PATH:
            self._send(200, "application/json", self.tracker.snapshot().to_json().encode())
        elif path == METRICS_PATH:
            self._send(200, CONTENT_TYPE, self.tracker.registry.exposition())
        elif path == "/healthz":
            self._send(200, "text/plain", b"ok\n")
        else:
            self._send(404, "text/plain", b"not found\n")

    def do_POST(self) -> None:
        path, _, query = self.path.partition("?")
        if path != CHECKPOINT_PATH or self.requests is None:
            self._send(404, "text/plain", b"not found\n")
            return
        if not self._authorized():
            self._unauthorized()
            return
        length = self.headers.get("Content-Length") or "0"
        if not length.isdigit() or int(length) > MAX_REQUEST_BODY:
            self._answer(CheckpointStatus.BAD_REQUEST, CheckpointAnswer(reason="bad Content-Length"))
            return
        try:
            params = parse_request(query, self.rfile.read(int(length)))
        except ValueError as err:
            self._answer(CheckpointStatus.BAD_REQUEST, CheckpointAnswer(reason=str(err)))
            return
        if params.hold_seconds > self.max_hold_seconds:  # the job's checkpointBeforeStopSeconds
            params = params.replace(hold_seconds=self.max_hold_seconds)
        log.info(
            "checkpoint requested (deadline %g s, hold %g s)", params.deadline_seconds, params.hold_seconds
        )
        self.requests.ask(params, lambda outcome: self._answer(*outcome))

    def _authorized(self) -> bool:
        """Whether the request carries the chief's token; any does when the chief has no token
        file (an older operator made its pod), none when the file cannot be read."""
        if self.token_file is None:
            return True
        token = read_token(self.token_file)
        scheme, _, given = self.headers.get("Authorization", "").partition(" ")
        return (
            token is not None
            and scheme.lower() == "bearer"
            and hmac.compare_digest(given.strip().encode(errors="replace"), token)
        )

    def _unauthorized(self) -> None:
        reason = "a request needs the job's chief token: Authorization: Bearer <token>"
        answer = CheckpointAnswer(reason=reason).to_json().encode()
        self._send(CheckpointStatus.UNAUTHORIZED, "application/json", answer, {"WWW-Authenticate": "Bearer"})

    def _answer(self, status: CheckpointStatus, answer: CheckpointAnswer) -> None:
        self._send(status, "application/json", answer.to_json().encode())

    def _send(
        self, status: int, content_type: str, body: bytes, headers: dict[str, str] | None = None
    ) -> None:
        self.connection.settimeout(REQUEST_READ_SECONDS)  # the reads may have left less
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("progress server: " + format, *args)


class _BoundedServer(ThreadingHTTPServer):
    """A thread per connection, MAX_CONNECTIONS at most: one more is closed unanswered."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[_Handler]) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class ProgressServer:
    """The HTTP endpoint on the progress port (every interface: the pod's network is private)."""

    def __init__(
        self,
        tracker: ProgressTracker,
        port: int,
        host: str = "",
        requests: CheckpointRequests | None = None,
        max_hold_seconds: float = DEFAULT_CHECKPOINT_BEFORE_STOP_SECONDS,
        token_file: str | None = None,
    ) -> None:
        served = {
            "tracker": tracker,
            "requests": requests,
            "max_hold_seconds": max_hold_seconds,
            "token_file": token_file,
        }
        self._server = _BoundedServer((host, port), type("ProgressHandler", (_Handler,), served))
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="progress-server", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> ProgressServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
