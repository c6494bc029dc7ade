"""The scenarios' quiescence check sees unread entries even where Redis cannot tell a group's
lag (as after replaying its AOF, or past a deleted entry)."""

from __future__ import annotations

from redis.asyncio import Redis

from notifkit.keys import Keys
from scenarios.harness import stream_backlog


async def test_unread_entries_count_when_redis_reports_no_lag(
    redis: Redis, namespace: str,
) -> None:
    keys = Keys(namespace)
    stream = keys.enriched("normal")
    group = keys.group("engine")
    await redis.xgroup_create(stream, group, id="0", mkstream=True)
    ids = [await redis.xadd(stream, {"data": b"{}"}) for _ in range(3)]
    await redis.xdel(stream, ids[1])  # a tombstone past the group's position: lag is unknown
    [info] = await redis.xinfo_groups(stream)
    assert info["lag"] is None

    waiting = await stream_backlog(redis, keys)

    assert waiting == {f"{stream}/{group}": 2}


async def test_streams_that_do_not_exist_yet_are_skipped(redis: Redis, namespace: str) -> None:
    assert await stream_backlog(redis, Keys(namespace)) == {}
