"""A service's Redis client makes a burst wait for a connection instead of failing it."""

from __future__ import annotations

import asyncio

from notifkit.config import Settings
from notifkit.services.base import open_redis


async def test_a_burst_larger_than_the_pool_waits_instead_of_failing(
    settings: Settings, namespace: str
) -> None:
    # Given a client with two connections
    client = open_redis(settings, max_connections=2)
    try:
        # When ten commands that each hold a connection for a moment run at once
        key = f"{namespace}:empty-list"
        results = await asyncio.gather(
            *(client.blpop([key], timeout=0.1) for _ in range(10)), return_exceptions=True
        )
    finally:
        await client.aclose()
    # Then every one completes (nothing was there to pop), none fails for want of a connection
    assert results == [None] * 10
