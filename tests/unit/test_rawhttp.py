"""The benchmark's lean HTTP client against a real aiohttp server: framing, reuse, failures."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from aiohttp import web

from benchmarks.rawhttp import HttpError, RawHttpClient
from tests.support.services import require_module


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[int]:
    """``app`` on a free local port, yielded."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


@pytest.fixture
async def server() -> AsyncIterator[tuple[int, list[tuple[str, bytes, str]]]]:
    seen: list[tuple[str, bytes, str]] = []

    async def echo(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen.append((request.headers["Authorization"], body, request.content_type))
        if body == b"close":
            request.transport.close()  # type: ignore[union-attr]
            await asyncio.sleep(0.1)
        if body == b"chunked":
            response = web.StreamResponse(status=200)
            response.enable_chunked_encoding()
            await response.prepare(request)
            await response.write(b"x")
            await response.write_eof()
            return response
        status = 202 if body.startswith(b"{") else 400
        return web.json_response({"n": len(body), "big": "y" * 100_000}, status=status)

    app = web.Application()
    app.router.add_post("/v1/notifications", echo)
    async with serving(app) as port:
        yield port, seen


async def test_posts_are_framed_and_connections_reused(
    server: tuple[int, list[tuple[str, bytes, str]]],
) -> None:
    port, seen = server
    client = RawHttpClient("127.0.0.1", port, "/v1/notifications",
                           {"Authorization": "Bearer k", "Content-Type": "application/json"})
    try:
        answers = await asyncio.gather(*(client.post(b'{"i": %d}' % i) for i in range(20)))
        for i, (status, body) in enumerate(answers):
            assert status == 202
            assert body.startswith(b'{"n": %d' % len(b'{"i": %d}' % i))
            assert len(body) > 100_000  # a response spread over many reads
        assert len(client._open) <= 20
        opened = len(client._open)
        for _ in range(5):
            assert (await client.post(b"{}"))[0] == 202
        assert len(client._open) == opened  # kept alive, not reconnected
        assert (await client.post(b"nope"))[0] == 400
        assert seen[0][0] == "Bearer k"
        assert seen[0][2] == "application/json"
    finally:
        client.close()


async def test_a_lost_connection_or_an_unframed_reply_is_an_error(
    server: tuple[int, list[tuple[str, bytes, str]]],
) -> None:
    port, _seen = server
    client = RawHttpClient("127.0.0.1", port, "/v1/notifications", {"Authorization": "x"},
                           timeout_s=5)
    try:
        with pytest.raises(HttpError):
            await client.post(b"close")
        with pytest.raises(HttpError, match="Content-Length"):
            await client.post(b"chunked")
        assert not client._idle  # neither connection is reused
        assert (await client.post(b"{}"))[0] == 202
    finally:
        client.close()


def test_works_on_uvloop_as_the_benchmark_runs_it() -> None:
    uvloop = require_module("uvloop")

    async def scenario() -> None:
        async def ok(request: web.Request) -> web.Response:
            return web.json_response({"ok": True}, status=202)
        app = web.Application()
        app.router.add_post("/p", ok)
        async with serving(app) as port:
            client = RawHttpClient("127.0.0.1", port, "/p", {})
            try:
                assert await client.post(b"{}") == (202, b'{"ok": true}')
            finally:
                client.close()

    uvloop.run(scenario())
