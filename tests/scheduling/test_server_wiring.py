"""The scheduler and events services run inside NotifkitServer like every other service."""

from __future__ import annotations

import time

import asyncpg
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.keys import Keys
from notifkit.server import NotifkitServer
from notifkit.streams import decode, xadd

from .helpers import scheduled_task


async def test_scheduler_and_events_start_drain_and_stop_in_a_server(
    settings: Settings, redis: Redis, keys: Keys, db: asyncpg.Pool, project_id: str,
) -> None:
    server = NotifkitServer(["scheduler", "events"], settings=settings, auto_migrate=False)
    await server.start()
    try:
        due = scheduled_task(keys, project_id, time.time_ns() // 1_000_000 - 1)
        await xadd(redis, keys.scheduled, due, maxlen=1000)
        await xadd(redis, keys.events_inbound, {
            "type": "custom", "projectId": project_id, "name": "signed-up", "userId": "u1",
            "data": {}, "at": "2026-06-01T00:00:00.000Z"}, maxlen=1000)
        # The background poller or this drain moves the task (same service, same lock token)
        await server.run_until_idle()
        [(_id, fields)] = await redis.xrange(keys.outbound("normal"))
        assert decode(fields) == due["payload"]
        [(_id, fields)] = await redis.xrange(keys.workflow_inbound)
        assert decode(fields)["name"] == "signed-up"
        assert await redis.get(keys.scheduler_lock) is not None
    finally:
        await server.stop()
    assert await redis.get(keys.scheduler_lock) is None  # released on a graceful stop
