"""Checkpoints on demand: POST /checkpoint and SIGTERM hand a request to the training loop.

The loop runs in the chief's main thread and alone touches TensorFlow; the HTTP server and the
SIGTERM watcher run in their own threads. They queue a request here and wait for its answer up
to their deadline; the loop serves the queue between two steps (after a join, so no step is in
flight), and may then hold, scheduling nothing, while it keeps answering.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import parse_qsl

from pstrainer.contract import CheckpointAnswer, CheckpointRequest, CheckpointStatus, Invalid

log = logging.getLogger(__name__)

# What the loop makes of a request: the status and the answer.
Outcome = tuple[CheckpointStatus, CheckpointAnswer]
# How long a refused asker gets to write its answer before the process exits.
DELIVERY_SECONDS = 2.0


def parse_request(query: str, body: bytes) -> CheckpointRequest:
    """The request's parameters from a JSON body and the query string (which wins); ValueError."""
    fields: dict[str, object] = {}
    if body.strip():
        try:
            loaded = json.loads(body)
        except (ValueError, UnicodeDecodeError) as err:
            raise ValueError(f"the body is not JSON: {err}") from None
        if not isinstance(loaded, dict):
            raise ValueError("the body is not a JSON object")
        fields.update(loaded)
    fields.update(parse_qsl(query))
    try:
        return CheckpointRequest.from_json_object(fields)
    except Invalid as err:
        raise ValueError(str(err)) from None


def unanswered(addresses: Sequence[str], timeout: float) -> str | None:
    """The first `host:port` that does not accept a connection within the timeout, and why; else None.

    Reading a variable from a parameter server that is gone can block inside TensorFlow; a TCP
    connect is bounded, and a parameter server draining after its SIGTERM still accepts.
    """
    deadline = time.monotonic() + timeout
    for address in addresses:
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), max(deadline - time.monotonic(), 0.01)):
                pass
        except OSError as err:
            return f"{address} does not answer: {err}"
    return None


@dataclass(eq=False)
class _Request:
    params: CheckpointRequest
    taken: bool = False
    outcome: Outcome | None = None
    answered: threading.Event = field(default_factory=threading.Event)
    delivered: threading.Event = field(default_factory=threading.Event)


class CheckpointRequests:
    """The queue between the askers' threads and the training loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._pending: list[_Request] = []
        # While set, requests are not queued but answered with it at once.
        self._closed: Outcome | None = (
            CheckpointStatus.REFUSED,
            CheckpointAnswer(reason="the chief is not training yet"),
        )
        # The step of the checkpoint the latest hold counts from, and when it was first answered.
        self._held: tuple[int | None, float] | None = None

    def ask(self, params: CheckpointRequest, reply: Callable[[Outcome], None]) -> None:
        """Queue a request, wait for its outcome up to its deadline and pass it to reply (any thread)."""
        request = _Request(params)
        with self._lock:
            outcome = self._closed
            if outcome is None:
                self._pending.append(request)
                self._arrived.notify_all()
        if outcome is None:
            outcome = self._wait(request)
        try:
            reply(outcome)
        finally:
            request.delivered.set()

    def _wait(self, request: _Request) -> Outcome:
        if request.answered.wait(request.params.deadline_seconds):
            assert request.outcome is not None
            return request.outcome
        with self._lock:
            if request.outcome is not None:  # answered just as the wait ended
                return request.outcome
            if request in self._pending:
                self._pending.remove(request)
            going_on = "; the save goes on" if request.taken else ""
        reason = f"no checkpoint within the deadline of {request.params.deadline_seconds:g} s{going_on}"
        return CheckpointStatus.DEADLINE_EXCEEDED, CheckpointAnswer(reason=reason)

    def waiting(self) -> bool:
        """Whether a request waits to be served (a cheap check before stopping to serve it)."""
        with self._lock:
            return bool(self._pending)

    def open(self) -> None:
        """The loop is training: queue requests from now on."""
        with self._lock:
            self._closed = None

    def serve(self, handle: Callable[[], Outcome]) -> None:
        """Answer every queued request (loop thread), then hold as long as one answered with a
        checkpoint asked, answering the requests that come meanwhile.

        A hold counts from the first answer at its checkpoint (the save's end, when it saved): a
        request answered by the same checkpoint later (saved=false) does not extend it, so asking
        again and again cannot stop training for good; a step is trained before the next hold.
        """
        hold_until = time.monotonic()
        while True:
            with self._lock:
                remaining = hold_until - time.monotonic()
                if not self._pending and remaining > 0:
                    self._arrived.wait(remaining)
                taken, self._pending = self._pending, []
                for request in taken:
                    request.taken = True
            if not taken and time.monotonic() >= hold_until:
                return
            for request in taken:
                outcome = handle()
                self._answer(request, outcome)
                if outcome[0] is CheckpointStatus.SAVED:
                    hold_until = max(hold_until, self._hold_start(outcome[1]) + request.params.hold_seconds)

    def _hold_start(self, answer: CheckpointAnswer) -> float:
        """When the hold of the answer's checkpoint counts from: its first answer."""
        if self._held is None or self._held[0] != answer.checkpoint_step:
            self._held = (answer.checkpoint_step, time.monotonic())
        return self._held[1]

    def close(self, outcome: Outcome) -> None:
        """Training is over (loop thread): answer what is queued and every later request with the
        outcome, and give the askers a moment to write it before the process exits."""
        with self._lock:
            self._closed = outcome
            taken, self._pending = self._pending, []
        for request in taken:
            self._answer(request, outcome)
        deadline = time.monotonic() + DELIVERY_SECONDS
        for request in taken:
            request.delivered.wait(max(deadline - time.monotonic(), 0))

    @staticmethod
    def _answer(request: _Request, outcome: Outcome) -> None:
        request.outcome = outcome
        request.answered.set()


def checkpoint_before_exit(requests: CheckpointRequests, seconds: float) -> None:
    """The chief's action on SIGTERM: a checkpoint within `seconds`, holding until the exit (a step
    more would be lost), or none when a parameter server does not answer or time runs out."""

    def report(outcome: Outcome) -> None:
        status, answer = outcome
        if status is CheckpointStatus.SAVED:
            log.info("SIGTERM: checkpoint at step %s: %s", answer.checkpoint_step, answer.checkpoint_path)
        else:
            log.warning("SIGTERM: exiting without a checkpoint: %s", answer.reason)

    requests.ask(CheckpointRequest(deadline_seconds=seconds, hold_seconds=seconds), report)
