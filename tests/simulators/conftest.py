"""Fixtures for the simulator tests: a simulator on free ports, and the official clients
configured with nothing but its base URL (and a short timeout where a test needs one)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import resend
from aiohttp import web

from simulators import SimulatorServer


@pytest.fixture
async def sim() -> AsyncIterator[SimulatorServer]:
    async with SimulatorServer(seed=1) as server:
        yield server


@dataclass
class Received:
    """One HTTP request as the receiver saw it."""

    url: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """A tiny webhook endpoint that records what is posted to it."""

    url: str
    requests: list[Received] = field(default_factory=list)
    status: int = 200
    _arrived: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def wait_for(self, count: int, timeout_s: float = 5.0) -> list[Received]:
        async with self._arrived:
            await asyncio.wait_for(
                self._arrived.wait_for(lambda: len(self.requests) >= count), timeout_s
            )
        return list(self.requests)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    state = Receiver(url="")

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        async with state._arrived:
            state.requests.append(Received(str(request.url), dict(request.headers), body))
            state._arrived.notify_all()
        return web.Response(status=state.status)

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}/hooks"
    yield state
    await runner.cleanup()


@pytest.fixture
def resend_sdk(sim: SimulatorServer, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The official resend package, pointed at ``sim``."""
    monkeypatch.setattr(resend, "api_url", sim.base_url)
    monkeypatch.setattr(resend, "api_key", "re_test_key")
    monkeypatch.setattr(resend, "default_http_client", resend.RequestsClient(timeout=5))
    return resend
