"""The scheduler and events services run inside NotifkitServer like every other service."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.keys import Keys
from notifkit.server import NotifkitServer
from notifkit.services.base import WorkerService
from notifkit.streams import decode, xadd
from tests.support.streams import xrange

from .helpers import scheduled_task


async def wait_for_entry(redis: Redis, stream: str, timeout_s: float = 20.0) -> dict[str, Any]:
    """The first entry of ``stream``, once the running services have written it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reply = await xrange(redis, stream, count=1)
        if reply:
            return decode(reply[0][1])
        await asyncio.sleep(0.02)
    raise AssertionError(f"nothing arrived on {stream} within {timeout_s:.0f} s")


async def test_scheduler_and_events_run_in_a_server_and_stop_cleanly(
    settings: Settings, redis: Redis, keys: Keys, db: asyncpg.Pool, project_id: str,
) -> None:
    fast = settings.replace(scheduler_poll_interval_s=0.05, read_block_ms=100)
    server = NotifkitServer(["scheduler", "events"], settings=fast, auto_migrate=False)
    await server.start()
    try:
        # The services' own loops (read, poll) do the work: nothing is driven by hand here.
        due = scheduled_task(keys, project_id, time.time_ns() // 1_000_000 - 1)
        await xadd(redis, keys.scheduled, due, maxlen=1000)
        await xadd(redis, keys.events_inbound, {
            "type": "custom", "projectId": project_id, "name": "signed-up", "userId": "u1",
            "data": {}, "at": "2026-06-01T00:00:00.000Z"}, maxlen=1000)
        assert await wait_for_entry(redis, keys.outbound("normal")) == due["payload"]
        assert (await wait_for_entry(redis, keys.workflow_inbound))["name"] == "signed-up"
        assert await redis.get(keys.scheduler_lock) is not None
    finally:
        await server.stop()
    assert await redis.get(keys.scheduler_lock) is None  # released on a graceful stop


async def test_a_server_stops_a_loop_that_swallows_its_first_cancel(
    settings: Settings, redis: Redis, keys: Keys, db: asyncpg.Pool,
) -> None:
    # Python 3.11's wait_for, under redis-py's calls, can return its result and drop a cancel
    # that lands as the call completes; the scheduler's poll loop then ran on, and a lone
    # cancel() followed by gather() held the server's stop forever.
    server = NotifkitServer(["scheduler", "events"], settings=settings, auto_migrate=False)
    await server.start()
    swallowed: list[str] = []

    async def stubborn(name: str) -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                swallowed.append(name)
                if swallowed.count(name) > 1:
                    raise

    scheduler, events = server.service("scheduler"), server.service("events")
    assert isinstance(scheduler, WorkerService)
    assert isinstance(events, WorkerService)
    scheduler._background.append(asyncio.create_task(stubborn("poll")))
    events.worker._loops.append(asyncio.create_task(stubborn("read")))
    await asyncio.wait_for(server.stop(), 30)
    assert sorted(swallowed) == ["poll", "poll", "read", "read"]
