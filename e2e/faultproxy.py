"""A reverse proxy in front of the API server that fails a fraction of the requests passing through.

The operator is given a kubeconfig pointing here (plain HTTP on loopback); the proxy forwards each
request over TLS to the API server with the caller's own credentials, so the operator keeps its
ServiceAccount's identity and RBAC. Of the requests that are not watches, `fraction` get one of:

  429  Too Many Requests, with Retry-After: 1 (API priority and fairness rejecting)
  500  Internal Server Error, 503 Service Unavailable (an apiserver or etcd hiccup)
  409  Conflict (writes only: an optimistic-concurrency failure)
  timeout  no answer for `stall` seconds, then the connection closes (a partitioned server)

Every watch stream is cut after 2-10 s: half of them end with a `410 Gone` (Expired) ERROR event, as
when the resourceVersion is compacted away, the others just stop. Counts of what was injected are
in `injected`.
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import ssl
import threading
from pathlib import Path

import aiohttp
import yaml
from aiohttp import web

from e2e.util import free_port

HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "accept-encoding"}
WRITES = {"POST", "PUT", "PATCH", "DELETE"}
REASONS = {"409": "Conflict", "429": "TooManyRequests", "503": "ServiceUnavailable"}
GONE = {
    "type": "ERROR",
    "object": {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": "too old resource version (injected)",
        "reason": "Expired",
        "code": 410,
    },
}


def _status(code: int, reason: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code}
    headers = {"Retry-After": "1"} if code == 429 else {}
    return web.json_response({**body, "message": f"{reason} (injected)"}, status=code, headers=headers)


class FaultProxy:
    def __init__(self, kubeconfig: Path, fraction: float, stall: float = 20.0, seed: int = 12) -> None:
        cluster = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]
        self.upstream = cluster["server"]
        self.tls = ssl.create_default_context(cafile=cluster["certificate-authority"])
        self.fraction, self.stall = fraction, stall
        self.random = random.Random(seed)
        self.injected: collections.Counter[str] = collections.Counter()
        self.url = f"http://127.0.0.1:{free_port()}"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    def kubeconfig(self, original: Path, path: Path) -> Path:
        """`original` (a kubeconfig with a token) pointed at the proxy, written to `path`."""
        config = yaml.safe_load(original.read_text())
        config["clusters"][0]["cluster"] = {"server": self.url}
        path.write_text(yaml.safe_dump(config))
        return path

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(timeout=30)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _serve(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._handle)
        # Stalled requests are cut at once when the proxy stops.
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1)
        await self._runner.setup()
        port = int(self.url.rsplit(":", 1)[1])
        await web.TCPSite(self._runner, "127.0.0.1", port).start()

    async def _close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
        # Requests still held (an injected timeout, a watch being relayed) end here, not when
        # the garbage collector finds them after the loop is gone.
        held = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in held:
            task.cancel()
        await asyncio.gather(*held, return_exceptions=True)

    def _fault(self, method: str) -> str | None:
        if self.random.random() >= self.fraction:
            return None
        kinds = ["429", "500", "503", "timeout"] + (["409"] if method in WRITES else [])
        return self.random.choice(kinds)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        watch = request.query.get("watch") in ("true", "1")
        fault = None if watch else self._fault(request.method)
        if fault is not None:
            self.injected[fault] += 1
        if fault == "timeout":
            await asyncio.sleep(self.stall)
            if request.transport is not None:
                request.transport.close()
            return web.Response(status=504)  # never sent: the connection is closed
        if fault is not None:
            return _status(int(fault), REASONS.get(fault, "InternalError"))
        return await self._forward(request, watch)

    async def _forward(self, request: web.Request, watch: bool) -> web.StreamResponse:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        async with self._session.request(
            request.method,
            self.upstream + request.path_qs,
            headers=headers,
            data=await request.read() or None,
            ssl=self.tls,
        ) as upstream:
            response = web.StreamResponse(status=upstream.status)
            response.content_type = upstream.content_type
            await response.prepare(request)
            if watch:
                await self._cut_watch(upstream, response, request)
                return response
            await response.write(await upstream.read())
            await response.write_eof()
            return response

    async def _cut_watch(
        self, upstream: aiohttp.ClientResponse, response: web.StreamResponse, request: web.Request
    ) -> None:
        async def relay() -> None:
            # Whole events only (one JSON object a line), as an API server ends a watch: a 410
            # written after half an event would make one line of both, which kopf cannot parse.
            pending = b""
            async for chunk in upstream.content.iter_any():
                *events, pending = (pending + chunk).split(b"\n")
                if events:
                    await response.write(b"\n".join(events) + b"\n")

        try:
            await asyncio.wait_for(relay(), timeout=self.random.uniform(2, 10))
            return  # the server ended the watch itself
        except TimeoutError:
            pass
        if self.random.random() < 0.5:
            self.injected["watch 410"] += 1
            await response.write(json.dumps(GONE).encode() + b"\n")
            await response.write_eof()
        else:
            self.injected["watch cut"] += 1
            if request.transport is not None:
                request.transport.close()
