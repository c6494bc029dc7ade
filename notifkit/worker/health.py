"""Who a consumer is, and the heartbeat that tells /health it is alive."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Mapping
from typing import Any, cast

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from notifkit import codec
from notifkit.keys import Keys
from notifkit.streams import as_str


def consumer_name(service: str) -> str:
    """``{service}-{hostname}-{pid}``: two containers both running as pid 1 must differ."""
    return f"{service}-{socket.gethostname()}-{os.getpid()}"


_PIPELINE_ERROR = " of pipeline caused error: "
# How long a process that stopped beating without a clean stop (killed) stays in the index:
# /health lists it, stale, meanwhile. Every beat and every /health drops older entries.
HEARTBEAT_INDEX_KEEP_S = 3600
# How soon a failed beat is tried again, at most.
BEAT_RETRY_S = 1.0


def next_beat_in(interval_s: float, failed: bool) -> float:
    """Seconds until the next beat. After a failed one (Redis away) the next comes within
    ``BEAT_RETRY_S``: waiting a whole interval kept /health degraded, the process listed as
    stale, for up to that long after Redis answered again."""
    return min(interval_s, BEAT_RETRY_S) if failed else interval_s


def heartbeat_failure(exc: BaseException) -> str:
    """Why a heartbeat failed, without redis-py's "Command # 2 (ZADD <key> <score> <member>) of
    pipeline caused error: " prefix: its score is the time of the beat, so every failed beat
    wrote a different warning, one a second per worker, that no repeat filter could fold."""
    text = str(exc) or type(exc).__name__
    if _PIPELINE_ERROR not in text:
        return text
    reason = text.rpartition(_PIPELINE_ERROR)[2]
    # What follows is the repr of the server's error's arguments: ('WRONGTYPE ...',)
    if reason.startswith(("('", '("')) and reason.endswith(("',)", '",)')):
        reason = reason[2:-3]
    return reason


async def write_heartbeat(redis: Redis, keys: Keys, consumer: str, beat: Mapping[str, Any],
                          ttl_s: int) -> None:
    """The consumer's ``notif:health:*`` key, and its entry in the index /health reads (a SCAN
    for the keys would walk every key of a shared Redis: millions of dedup marks)."""
    now = time.time()
    writes = redis.pipeline(transaction=True)
    writes.set(keys.health(consumer), codec.dumps(beat), ex=ttl_s)
    writes.zadd(keys.heartbeats, {consumer: now})
    # Killed processes' entries go here too, not only when /health is asked: a deployment
    # nobody asks would keep one for every process ever killed.
    writes.zremrangebyscore(keys.heartbeats, "-inf", now - HEARTBEAT_INDEX_KEEP_S)
    await writes.execute()


async def remove_heartbeat(redis: Redis, keys: Keys, consumer: str) -> None:
    """Take the consumer off /health on a clean stop; a Redis that cannot be reached leaves
    the key to expire.

    Tried twice: a pooled connection the server closed without the client noticing yet (a
    restart, a failover) fails the first command sent on it, and so may the pool's other idle
    ones, so one removal alone left a cleanly stopped process listed, stale, and /health
    degraded (for an hour, if it was its service's last process). The second try runs on a
    fresh connection."""
    for last in (False, True):
        try:
            gone = redis.pipeline(transaction=True)
            gone.delete(keys.health(consumer))
            gone.zrem(keys.heartbeats, consumer)
            await gone.execute()
            await forget_dead_siblings(redis, keys, consumer)
            return
        except RedisConnectionError:
            if last:
                return
            # Idle connections only: requests still being answered keep theirs.
            with contextlib.suppress(RedisError, OSError):
                await redis.connection_pool.disconnect(inuse_connections=False)
        except (RedisError, OSError):
            return


async def forget_dead_siblings(redis: Redis, keys: Keys, consumer: str) -> None:
    """Take off the index the killed processes of ``consumer``'s service (heartbeat key
    expired) that a clean stop follows: /health lists a service's last dead process, stale,
    to say nothing runs it since a crash, and once a later process of it stopped cleanly
    that is no longer true. One killed but not yet expired stays, as does a live one."""
    prefix = consumer.partition("-")[0] + "-"
    indexed = cast(list[bytes], await redis.zrange(keys.heartbeats, 0, -1))
    members = [as_str(m) for m in indexed]
    siblings = [m for m in members if m.startswith(prefix) and m != consumer]
    if not siblings:
        return
    checks = redis.pipeline(transaction=False)
    for name in siblings:
        checks.exists(keys.health(name))
    dead = [name for name, alive in zip(siblings, await checks.execute(), strict=True)
            if not alive]
    if dead:
        await redis.zrem(keys.heartbeats, *dead)
