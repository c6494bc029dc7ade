"""What a scenario or benchmark run leaves behind is removed, and nothing else is."""

from __future__ import annotations

import redis.asyncio as aioredis

from scenarios.harness import remove_run_data


async def test_every_key_of_the_run_goes_and_only_those(
    redis_url: str, redis: aioredis.Redis, namespace: str
) -> None:
    # More keys than one page of the scan, and a neighbour whose name merely starts the same;
    # all inside the test's namespace, which the fixture empties whatever happens.
    run = f"{namespace}:run"
    keys = [f"{run}:notif:processed:delivery:{n}" for n in range(2_345)]
    writes = redis.pipeline(transaction=False)
    for key in keys:
        writes.set(key, b"1")
    writes.set(f"{run}x:kept", b"1")
    writes.set(f"{namespace}:kept", b"1")
    await writes.execute()

    await remove_run_data(None, aioredis.Redis.from_url(redis_url), "unused", run)

    assert [key async for key in redis.scan_iter(match=f"{run}:*", count=1000)] == []
    assert await redis.exists(f"{run}x:kept", f"{namespace}:kept") == 2
