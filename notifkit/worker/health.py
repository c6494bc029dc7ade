"""Who a consumer is, and the heartbeat that tells /health it is alive."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from typing import Any

from redis.asyncio import Redis

from notifkit import codec
from notifkit.keys import Keys


def consumer_name(service: str) -> str:
    """``{service}-{hostname}-{pid}``: two containers both running as pid 1 must differ."""
    return f"{service}-{socket.gethostname()}-{os.getpid()}"


async def write_heartbeat(redis: Redis, keys: Keys, consumer: str, beat: Mapping[str, Any],
                          ttl_s: int) -> None:
    """The consumer's ``notif:health:*`` key, and its entry in the index /health reads (a SCAN
    for the keys would walk every key of a shared Redis: millions of dedup marks)."""
    writes = redis.pipeline(transaction=True)
    writes.set(keys.health(consumer), codec.dumps(beat), ex=ttl_s)
    writes.zadd(keys.heartbeats, {consumer: time.time()})
    await writes.execute()
