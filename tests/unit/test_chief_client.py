"""The back-off of progress polls after a chief's port refused, the checkpoint ask, and what an
untrusted chief's answers cannot make the operator do (chief_client.py)."""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from psoperator.contract import (
    CHECKPOINT_PATH,
    LATEST_UNIX_SECONDS,
    PROGRESS_PATH,
    ProgressReport,
    RejectedReport,
)
from psoperator.control import chief_client
from psoperator.policies.planned_stop import CheckpointAsk, StopCause
from tests.unit.builders import chief_job, observed, pod


def test_a_chief_that_never_refused_is_always_asked() -> None:
    assert chief_client.due(None, "pod-a", 0.0)


def test_each_refusal_in_a_row_doubles_the_wait_up_to_its_limit() -> None:
    refusals, waits = None, []
    for _ in range(10):
        refusals = chief_client.refused(refusals, "pod-a", 100.0)
        waits.append(refusals.until - 100.0)
    assert waits[:4] == [5.0, 10.0, 20.0, 40.0]
    assert max(waits) == chief_client.MAX_WAIT_SECONDS == waits[-1]


def test_a_refused_chief_is_asked_again_once_its_wait_is_over() -> None:
    refusals = chief_client.refused(None, "pod-a", 100.0)
    assert not chief_client.due(refusals, "pod-a", 104.9)
    assert chief_client.due(refusals, "pod-a", 105.0)


def test_a_new_chief_pod_is_asked_at_once_and_starts_from_the_first_wait() -> None:
    refusals = chief_client.refused(chief_client.refused(None, "pod-a", 0.0), "pod-a", 0.0)
    assert chief_client.due(refusals, "pod-b", 0.0)
    assert chief_client.refused(refusals, "pod-b", 0.0).count == 1


def _ask() -> CheckpointAsk:
    return CheckpointAsk(StopCause.SUSPEND, ("c",), ("chief-uid",), "chief-uid", "127.0.0.1", 3.0, 7.0)


def _asked(
    handler: Callable[[web.Request], Awaitable[web.Response]] | None,
    ask: CheckpointAsk,
    refusals: chief_client.Refusals | None = None,
) -> Any:
    """The outcome of asking a chief served by `handler` on loopback (None: nothing listens), which
    also serves its progress."""

    async def progress(request: web.Request) -> web.Response:
        return web.json_response({"step": 5})

    async def scenario() -> Any:
        app = web.Application()
        if handler is not None:
            app.router.add_post(CHECKPOINT_PATH, handler)
            app.router.add_get(PROGRESS_PATH, progress)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        if handler is None:
            await runner.cleanup()
        try:
            async with chief_client.chief_session() as session:
                return await chief_client.ask_checkpoint(session, port, ask, refusals, None)
        finally:
            await runner.cleanup()

    return asyncio.run(scenario())


def test_the_checkpoint_ask_posts_its_deadline_and_hold_and_reads_the_answer() -> None:
    bodies: list[Any] = []

    async def chief(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        return web.json_response({"checkpointStep": 340, "checkpointPath": "/ckpt/c-4", "saved": True})

    outcome = _asked(chief, _ask())
    assert bodies == [{"deadlineSeconds": 3.0, "holdSeconds": 7.0}]
    assert outcome.saved and outcome.answer.checkpoint_step == 340 and outcome.status == 200


def test_a_refusal_or_an_answer_that_is_no_checkpoint_answer_is_an_outcome_without_a_checkpoint() -> None:
    async def refusing(request: web.Request) -> web.Response:
        return web.json_response({"reason": "ps-1 does not answer"}, status=503)

    async def other(request: web.Request) -> web.Response:
        return web.Response(status=404, text="404: Not Found")

    refused = _asked(refusing, _ask())
    assert not refused.saved and refused.answer.reason == "ps-1 does not answer"
    unknown = _asked(other, _ask())
    assert not unknown.saved and "HTTP 404" in (unknown.answer.reason or "")


def test_nothing_listening_or_a_chief_that_refused_its_progress_port_is_no_wait() -> None:
    assert "could not be asked" in (_asked(None, _ask()).answer.reason or "")
    refusals = chief_client.refused(None, "chief-uid", 0.0)
    skipped = _asked(None, _ask(), refusals)
    assert "does not serve its progress port" in (skipped.answer.reason or "")


def test_a_chief_that_refused_while_it_started_and_serves_now_is_asked() -> None:
    """Its polls back off after the refusals of its start; a stop does not wait for the next one."""

    async def chief(request: web.Request) -> web.Response:
        return web.json_response({"checkpointStep": 340, "checkpointPath": "s3://b/c-4", "saved": True})

    refusals = chief_client.refused(chief_client.refused(None, "chief-uid", 0.0), "chief-uid", 0.0)
    outcome = _asked(chief, _ask(), refusals)
    assert outcome.saved and outcome.answer.checkpoint_step == 340


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def _serving(routes: dict[tuple[str, str], Handler]) -> AsyncIterator[int]:
    """An HTTP server on loopback with these (method, path) routes; its port."""
    app = web.Application()
    for (method, path), handler in routes.items():
        app.router.add_route(method, path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


def _redirect(target: str, status: int) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=status, headers={"Location": target + request.path_qs})

    return handler


def test_a_redirect_from_a_chief_is_not_followed_to_another_jobs_chief() -> None:
    victim_hits: list[str] = []

    async def victim(request: web.Request) -> web.Response:
        victim_hits.append(f"{request.method} {request.path_qs}")
        return web.json_response({"state": "running", "step": 999, "checkpointPath": "/victim/ckpt-999"})

    async def scenario() -> tuple[Any, Any]:
        victims: dict[tuple[str, str], Handler] = {
            ("GET", PROGRESS_PATH): victim,
            ("POST", CHECKPOINT_PATH): victim,
        }
        async with _serving(victims) as victim_port:
            target = f"http://127.0.0.1:{victim_port}"
            # 307 has the client post the same body (holdSeconds) again, to the victim.
            attacker = {
                ("GET", PROGRESS_PATH): _redirect(target, 302),
                ("POST", CHECKPOINT_PATH): _redirect(target, 307),
            }
            async with _serving(attacker) as port, chief_client.chief_session() as session:
                report = await chief_client.fetch_progress(session, "127.0.0.1", port, None)
                ask = CheckpointAsk(StopCause.SUSPEND, ("c",), ("u",), "u", "127.0.0.1", 3.0, 3600.0)
                return report, await chief_client.ask_checkpoint(session, port, ask, None, None)

    report, outcome = asyncio.run(scenario())
    assert report is None
    assert not outcome.saved and outcome.status == 307 and "redirect" in (outcome.answer.reason or "")
    assert victim_hits == []


def _polled(handler: Handler) -> Any:
    """What fetch_progress makes of a chief whose GET /progress is `handler`."""

    async def scenario() -> Any:
        async with (
            _serving({("GET", PROGRESS_PATH): handler}) as port,
            chief_client.chief_session() as session,
        ):
            return await chief_client.fetch_progress(session, "127.0.0.1", port, None)

    return asyncio.run(scenario())


# A valid report, of more than a MiB: a hostile chief's answer to fill the operator's memory.
HUGE_REPORT = json.dumps({"state": "running", "step": 7, "message": "x" * (1 << 20)}).encode()


def test_an_answer_over_the_limit_is_garbled_whether_its_length_is_told_or_streamed() -> None:
    async def told(request: web.Request) -> web.Response:
        return web.Response(body=HUGE_REPORT, content_type="application/json")

    async def streamed(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for start in range(0, len(HUGE_REPORT), 4096):
            await response.write(HUGE_REPORT[start : start + 4096])
        await response.write_eof()
        return response

    async def small(request: web.Request) -> web.Response:
        return web.json_response({"state": "running", "step": 7})

    too_long = RejectedReport(f"longer than {chief_client.MAX_ANSWER_BYTES} bytes")
    assert _polled(told) == too_long and _polled(streamed) == too_long
    assert _polled(small) is not None  # the same chief, answering within the limit
    asked = _asked(told, _ask())
    assert not asked.saved and f"over {chief_client.MAX_ANSWER_BYTES} bytes" in (asked.answer.reason or "")


def test_a_compressed_answer_is_not_inflated() -> None:
    async def compressed(request: web.Request) -> web.Response:
        body = gzip.compress(json.dumps({"state": "running", "step": 7}).encode())
        return web.Response(
            body=body, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}
        )

    assert _polled(compressed) is None


def test_every_request_to_the_chief_carries_the_jobs_token() -> None:
    authorizations: list[str | None] = []

    async def chief(request: web.Request) -> web.Response:
        authorizations.append(request.headers.get("Authorization"))
        return web.json_response({"state": "running", "step": 7, "checkpointStep": 7, "saved": True})

    async def scenario() -> None:
        routes: dict[tuple[str, str], Handler] = {
            ("GET", PROGRESS_PATH): chief,
            ("POST", CHECKPOINT_PATH): chief,
        }
        async with _serving(routes) as port, chief_client.chief_session() as session:
            await chief_client.fetch_progress(session, "127.0.0.1", port, "t0ken")
            await chief_client.ask_checkpoint(session, port, _ask(), None, "t0ken")

    asyncio.run(scenario())
    assert authorizations == ["Bearer t0ken", "Bearer t0ken"]


def _reported(body: bytes) -> tuple[Any, Any]:
    """What chief_report makes of a running chief whose progress port on loopback answers `body`."""
    chief = observed([pod("chief", 0, attempt=0, ip="127.0.0.1")], chief_job()).chief_pod(0)

    async def progress(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()  # chunked: no Content-Length to go by
        await response.prepare(request)
        for start in range(0, len(body), 8192):
            await response.write(body[start : start + 8192])
        await response.write_eof()
        return response

    async def scenario() -> tuple[Any, Any]:
        async with (
            _serving({("GET", PROGRESS_PATH): progress}) as port,
            chief_client.chief_session() as session,
        ):
            return await chief_client.chief_report(session, port, chief, None, None)

    return asyncio.run(scenario())


def test_a_progress_report_the_status_cannot_keep_or_too_long_is_rejected_naming_the_pod() -> None:
    """The port's answer is read up to MAX_ANSWER_BYTES: a chief that serves more is rejected, not
    held in the operator's memory whole."""
    report, refusals = _reported(b'{"step": 5, "checkpointTime": NaN}')
    assert report == RejectedReport(
        "the progress report of pod ctr-chief-0x is ignored: checkpointTime: must be Unix seconds"
        f" from 0 to {LATEST_UNIX_SECONDS:.0f}, not milliseconds (got NaN)"
    )
    assert refusals is None  # it answered
    long = b'{"step": 5, "message": "' + b"x" * chief_client.MAX_ANSWER_BYTES + b'"}'
    report, _ = _reported(long)
    assert report == RejectedReport(
        "the progress report of pod ctr-chief-0x is ignored: "
        f"longer than {chief_client.MAX_ANSWER_BYTES} bytes"
    )
    at_the_limit = long[: chief_client.MAX_ANSWER_BYTES - 2] + b'"}'
    assert _reported(at_the_limit) == (ProgressReport.read(at_the_limit), None)
    assert isinstance(ProgressReport.read(at_the_limit), ProgressReport)
