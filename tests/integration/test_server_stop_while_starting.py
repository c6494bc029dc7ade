"""``NotifkitServer.stop()`` may be called at any time (README, Embedding), a start still in
progress included: when it returns nothing runs, and the start ends without an error.

A stop during the start's checks (Redis, the migrations) returned at once, having nothing to
stop, and the start then went on to run every service. A stop while services were starting
stopped those already started, then cleared the server's list, and the services the start
added meanwhile went on reading their streams with nothing left that could stop them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.keys import Keys
from notifkit.server import NotifkitServer, service_class
from tests.support.waiting import until


async def _consumers(redis: Redis, keys: Keys) -> list[str]:
    """The consumers of the engine's and enricher's groups, on every stream they read."""
    names: list[str] = []
    for stream, service in ([(s, "enricher") for s in keys.inbound_all()]
                            + [(s, "engine") for s in keys.enriched_all()]):
        if await redis.exists(stream):
            groups: Any = await redis.xinfo_groups(stream)
            if any(g["name"].decode() == keys.group(service) for g in groups):
                for c in await redis.xinfo_consumers(stream, keys.group(service)):
                    names.append(c["name"].decode())
    return names


async def _nothing_runs(redis: Redis, keys: Keys) -> None:
    await asyncio.sleep(0.5)  # long enough for a worker left running to beat and read
    assert [k async for k in redis.scan_iter(match=keys.health_pattern())] == []
    assert await _consumers(redis, keys) == []


async def test_a_stop_while_services_start_stops_every_one_of_them(
    settings: Settings, redis: Redis, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a server whose second service is still starting (the first runs already)
    engine = service_class("engine")
    original = engine.start
    engine_started = asyncio.Event()
    release = asyncio.Event()

    async def slow_start(self: Any) -> None:
        await original(self)
        engine_started.set()
        await release.wait()

    monkeypatch.setattr(engine, "start", slow_start)
    server = NotifkitServer(services=["enricher", "engine"], settings=settings,
                            auto_migrate=False)
    starting = asyncio.create_task(server.start())
    await until(engine_started.is_set)

    # When the server is stopped
    stopping = asyncio.create_task(server.stop())
    await asyncio.sleep(0.1)
    release.set()  # were the start not abandoned, it would now go on
    await asyncio.wait_for(stopping, 15)

    # Then the start ended without an error, and nothing runs: no heartbeat, no consumer
    await asyncio.wait_for(starting, 5)
    assert server.services == {}
    await _nothing_runs(redis, Keys(settings.namespace))


async def test_a_stop_before_any_service_started_keeps_them_all_from_starting(
    settings: Settings, redis: Redis, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a start still checking Redis
    checking = asyncio.Event()
    release = asyncio.Event()
    from notifkit import server as server_module

    original = server_module._require_redis

    async def slow_check(s: Settings) -> None:
        checking.set()
        await release.wait()
        await original(s)

    monkeypatch.setattr(server_module, "_require_redis", slow_check)
    server = NotifkitServer(services=["enricher", "engine"], settings=settings,
                            auto_migrate=False)
    starting = asyncio.create_task(server.start())
    await until(checking.is_set)

    # When the server is stopped, and the check would then go on
    await asyncio.wait_for(server.stop(), 15)
    release.set()

    # Then the start ended without an error and started nothing
    await asyncio.wait_for(starting, 5)
    assert server.services == {}
    await _nothing_runs(redis, Keys(settings.namespace))


async def test_a_start_cancelled_by_its_caller_is_still_a_cancellation(
    settings: Settings, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A caller's own timeout around start() (what the CLI does at a SIGTERM) still cancels it.
    from notifkit import server as server_module

    async def never(s: Settings) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(server_module, "_require_redis", never)
    server = NotifkitServer(services=["enricher"], settings=settings, auto_migrate=False)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await server.start()
    await server.stop()
    assert server.services == {}


async def test_a_server_stopped_while_starting_starts_again(
    settings: Settings, redis: Redis, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from notifkit import server as server_module

    original = server_module._require_redis
    checking = asyncio.Event()

    async def slow_check(s: Settings) -> None:
        checking.set()
        await asyncio.sleep(0.5)
        await original(s)

    monkeypatch.setattr(server_module, "_require_redis", slow_check)
    server = NotifkitServer(services=["enricher"], settings=settings, auto_migrate=False)
    starting = asyncio.create_task(server.start())
    await until(checking.is_set)
    await server.stop()
    await starting
    await server.start()
    try:
        assert list(server.services) == ["enricher"]
    finally:
        await server.stop()
