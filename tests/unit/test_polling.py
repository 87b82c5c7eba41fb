"""The back-off of progress polls after a chief's port refused, and the checkpoint ask (polling.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from psoperator.contract import (
    CHECKPOINT_PATH,
    LATEST_UNIX_SECONDS,
    PROGRESS_PATH,
    ProgressReport,
    RejectedReport,
)
from psoperator.control import polling
from psoperator.policies.planned_stop import CheckpointAsk, StopCause
from tests.unit.builders import observed, pod


def test_a_chief_that_never_refused_is_always_asked() -> None:
    assert polling.due(None, "pod-a", 0.0)


def test_each_refusal_in_a_row_doubles_the_wait_up_to_its_limit() -> None:
    refusals, waits = None, []
    for _ in range(10):
        refusals = polling.refused(refusals, "pod-a", 100.0)
        waits.append(refusals.until - 100.0)
    assert waits[:4] == [5.0, 10.0, 20.0, 40.0]
    assert max(waits) == polling.MAX_WAIT_SECONDS == waits[-1]


def test_a_refused_chief_is_asked_again_once_its_wait_is_over() -> None:
    refusals = polling.refused(None, "pod-a", 100.0)
    assert not polling.due(refusals, "pod-a", 104.9)
    assert polling.due(refusals, "pod-a", 105.0)


def test_a_new_chief_pod_is_asked_at_once_and_starts_from_the_first_wait() -> None:
    refusals = polling.refused(polling.refused(None, "pod-a", 0.0), "pod-a", 0.0)
    assert polling.due(refusals, "pod-b", 0.0)
    assert polling.refused(refusals, "pod-b", 0.0).count == 1


def _ask() -> CheckpointAsk:
    return CheckpointAsk(StopCause.SUSPEND, ("c",), ("chief-uid",), "chief-uid", "127.0.0.1", 3.0, 7.0)


def _asked(handler: Callable[[web.Request], Awaitable[web.Response]] | None, ask: CheckpointAsk) -> Any:
    """The outcome of asking a chief served by `handler` on loopback (None: nothing listens)."""

    async def scenario() -> Any:
        app = web.Application()
        if handler is not None:
            app.router.add_post(CHECKPOINT_PATH, handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        if handler is None:
            await runner.cleanup()
        try:
            async with aiohttp.ClientSession() as session:
                return await polling.ask_checkpoint(session, port, ask, None)
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
    refusals = polling.refused(None, "chief-uid", 0.0)
    skipped = asyncio.run(polling.ask_checkpoint(None, 1, _ask(), refusals))
    assert "does not serve its progress port" in (skipped.answer.reason or "")


def _reported(body: bytes) -> tuple[Any, Any]:
    """What chief_report makes of a running chief whose progress port on loopback answers `body`."""
    chief = observed([pod("chief", 0, attempt=0, ip="127.0.0.1")]).chief_pod(0)

    async def progress(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()  # chunked: no Content-Length to go by
        await response.prepare(request)
        for start in range(0, len(body), 8192):
            await response.write(body[start : start + 8192])
        await response.write_eof()
        return response

    async def scenario() -> tuple[Any, Any]:
        app = web.Application()
        app.router.add_get(PROGRESS_PATH, progress)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            async with aiohttp.ClientSession() as session:
                return await polling.chief_report(session, port, chief, None)
        finally:
            await runner.cleanup()

    return asyncio.run(scenario())


def test_a_progress_report_the_status_cannot_keep_or_too_long_is_rejected_naming_the_pod() -> None:
    """The port's answer is read up to MAX_REPORT_BYTES: a chief that serves more is rejected, not
    held in the operator's memory whole."""
    report, refusals = _reported(b'{"step": 5, "checkpointTime": NaN}')
    assert report == RejectedReport(
        "the progress report of pod ctr-chief-0x is ignored: checkpointTime: must be Unix seconds"
        f" from 0 to {LATEST_UNIX_SECONDS:.0f}, not milliseconds (got NaN)"
    )
    assert refusals is None  # it answered
    long = b'{"step": 5, "message": "' + b"x" * polling.MAX_REPORT_BYTES + b'"}'
    report, _ = _reported(long)
    assert report == RejectedReport(
        f"the progress report of pod ctr-chief-0x is ignored: longer than {polling.MAX_REPORT_BYTES} bytes"
    )
    at_the_limit = long[: polling.MAX_REPORT_BYTES - 2] + b'"}'
    assert _reported(at_the_limit) == (ProgressReport.read(at_the_limit), None)
    assert isinstance(ProgressReport.read(at_the_limit), ProgressReport)
