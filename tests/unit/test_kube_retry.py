"""Which failed requests are sent again: the client's retry policy (kube.api_retry) against a real
HTTP server on loopback that answers from a script."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.util.retry import RequestHistory

from psoperator.kube import RETRIES, RETRY_BACKOFF_SECONDS, Kube, api_retry

JOB_PATH = "/apis/psoperator.io/v1alpha1/namespaces/team-a/pstrainingjobs/ctr"


class Scripted(ThreadingHTTPServer):
    """Answers each request with the next (status, Retry-After) of `script`, then 200 {}."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Answer)
        self.script: list[tuple[int, str | None]] = []
        self.seen: list[str] = []


class _Answer(BaseHTTPRequestHandler):
    server: Scripted

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append(self.command)
        status, retry_after = self.server.script.pop(0) if self.server.script else (200, None)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if retry_after is not None:
            self.send_header("Retry-After", retry_after)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = do_PATCH = _answer

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[Scripted]:
    scripted = Scripted()
    thread = threading.Thread(target=scripted.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield scripted
    scripted.shutdown()
    scripted.server_close()


def _kube(server: Scripted) -> Kube:
    configuration = client.Configuration(host=f"http://127.0.0.1:{server.server_port}")
    configuration.retries = api_retry()
    return Kube(client.ApiClient(configuration))


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
def test_a_read_that_got_a_transient_status_is_sent_again(server: Scripted, status: int) -> None:
    server.script = [(status, None), (status, None)]
    assert _kube(server).get_job("team-a", "ctr") == {}
    assert server.seen == ["GET"] * 3


def test_a_read_that_keeps_failing_fails_after_the_retries(server: Scripted) -> None:
    server.script = [(503, None)] * (RETRIES + 2)
    with pytest.raises(ApiException) as failed:
        _kube(server).get_job("team-a", "ctr")
    assert failed.value.status == 503
    assert len(server.seen) == RETRIES + 1


def test_a_write_the_server_turned_away_with_retry_after_is_sent_again(server: Scripted) -> None:
    server.script = [(429, "0")]
    _kube(server).patch_job_status("team-a", "ctr", {"phase": "Running"}, "7")
    assert server.seen == ["PATCH", "PATCH"]


@pytest.mark.parametrize("answer", [(429, None), (500, None), (503, "0")])
def test_a_write_that_failed_otherwise_is_not_sent_again(
    server: Scripted, answer: tuple[int, str | None]
) -> None:
    server.script = [answer]
    with pytest.raises(ApiException):
        _kube(server).patch_job_status("team-a", "ctr", {"phase": "Running"}, "7")
    assert server.seen == ["PATCH"]


def test_a_missing_object_is_not_sent_again(server: Scripted) -> None:
    server.script = [(404, None)]
    assert _kube(server).get_job("team-a", "ctr") is None
    assert server.seen == ["GET"]


def test_reads_failed_together_are_sent_again_at_spread_times() -> None:
    """Past the first retry, each waits its back-off plus up to RETRY_BACKOFF_SECONDS at random: the
    reads of many jobs that one API server restart failed together do not come back together."""
    failed = RequestHistory("GET", JOB_PATH, None, 503, None)
    retry = api_retry().new(history=(failed, failed))
    waits = {retry.get_backoff_time() for _ in range(50)}
    backoff = RETRY_BACKOFF_SECONDS * 2
    assert len(waits) > 40 and all(backoff <= w <= backoff + RETRY_BACKOFF_SECONDS for w in waits)
