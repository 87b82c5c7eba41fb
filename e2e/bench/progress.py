"""Plays the chiefs' runtimes: serves a progress report whose step moves at every request, on each
chief pod's IP (KWOK gives pods loopback addresses), counts the requests and which chiefs were asked."""

from __future__ import annotations

import asyncio
import threading

from aiohttp import web

from psoperator.contract import DEFAULT_PROGRESS_PORT, PROGRESS_PATH


class ChiefProgress:
    def __init__(self) -> None:
        self.requests = 0
        self.asked: set[str] = set()  # the chief addresses asked at least once
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="chief-progress", daemon=True)
        self._runner: web.AppRunner | None = None

    async def _report(self, request: web.Request) -> web.Response:
        self.requests += 1
        if request.transport is not None:
            self.asked.add(request.transport.get_extra_info("sockname")[0])
        return web.json_response({"state": "running", "step": self.requests})

    async def _start(self, addresses: list[str]) -> None:
        app = web.Application()
        app.router.add_get(PROGRESS_PATH, self._report)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        for address in addresses:
            await web.TCPSite(self._runner, address, DEFAULT_PROGRESS_PORT).start()

    def __enter__(self) -> ChiefProgress:
        self._thread.start()
        return self

    def serve(self, addresses: list[str]) -> None:
        asyncio.run_coroutine_threadsafe(self._start(addresses), self._loop).result(timeout=60)

    def __exit__(self, *_: object) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
