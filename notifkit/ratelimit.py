"""Provider token buckets, shared by every delivery (and ai) process through Redis.

    notif:ratelimit:{provider}:{projectId}   HASH  tokens (float), ts (ms of the last take)

A send takes one token from each bucket that applies to it (the provider's own rate, under
the bucket ``{provider}:_all``, and the project's override from ``projects.settings.rateLimits``
for the channel, under ``{provider}:{projectId}``), all or none, in one Lua call that reads the
clock of the Redis server, so processes on different hosts agree on time. When a bucket is
short the call takes nothing and answers how long until the send would fit.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio import Redis

from notifkit.redis_pipe import pipe

# KEYS: bucket hashes. ARGV: cost, then rate_per_s and burst for each key.
# Returns 0 when the tokens were taken, else the wait in ms until they would be.
_TAKE = """
-- Ten years in ms: a slow rate and a large burst must not make a wait or a TTL that Redis
-- cannot read as an integer (every call would fail).
local MAX_MS = 315360000000
local now_t = redis.call('TIME')
local now = tonumber(now_t[1]) * 1000 + math.floor(tonumber(now_t[2]) / 1000)
local cost = tonumber(ARGV[1])
local wait = 0
local tokens = {}
for i, key in ipairs(KEYS) do
  local rate = tonumber(ARGV[2 * i])
  local burst = tonumber(ARGV[2 * i + 1])
  local state = redis.call('HMGET', key, 'tokens', 'ts')
  local have = tonumber(state[1]) or burst
  local ts = tonumber(state[2]) or now
  if now > ts then have = math.min(burst, have + (now - ts) * rate / 1000) end
  tokens[i] = have
  if have < cost then
    wait = math.max(wait, (cost - have) * 1000 / rate)
  end
end
if wait > 0 then return math.min(math.max(1, math.ceil(wait)), MAX_MS) end
for i, key in ipairs(KEYS) do
  local rate = tonumber(ARGV[2 * i])
  local burst = tonumber(ARGV[2 * i + 1])
  redis.call('HSET', key, 'tokens', tostring(tokens[i] - cost), 'ts', now)
  redis.call('PEXPIRE', key, math.min(math.ceil(burst * 1000 / rate) + 1000, MAX_MS))
end
return 0
"""

ALL_PROJECTS = "_all"


@dataclass(frozen=True)
class Bucket:
    key: str
    rate_per_s: float
    burst: float

    @classmethod
    def per_second(cls, key: str, rate_per_s: float) -> Bucket:
        """A bucket that allows a one-second burst at its rate (at least one send)."""
        return cls(key, rate_per_s, max(1.0, rate_per_s))


class TokenBuckets:
    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._take = redis.register_script(_TAKE)

    async def take(self, buckets: Sequence[Bucket], cost: float = 1.0) -> float:
        """Take ``cost`` tokens from every bucket, or none: 0.0 when taken, else the seconds
        to wait before the tokens would be there."""
        call = _script_call(buckets, cost)
        if call is None:
            return 0.0
        keys, args = call
        wait_ms = await self._take(keys=keys, args=args)
        return int(wait_ms) / 1000.0

    async def take_soon(self, buckets: Sequence[Bucket], max_wait_s: float) -> float:
        """:meth:`take`, waiting in-process for tokens due within ``max_wait_s`` in all: 0.0
        once taken, else the seconds a longer wait would take (the caller parks the work)."""
        waited = 0.0
        while True:
            wait_s = await self.take(buckets)
            if wait_s <= 0:
                return 0.0
            if waited + wait_s > max_wait_s:
                return wait_s
            await asyncio.sleep(wait_s)
            waited += wait_s

    async def take_many(self, requests: Sequence[Sequence[Bucket]]) -> list[float]:
        """:meth:`take` one token for each request, in order, in one round trip: each request
        is still its own all-or-none script call, so the answers are exactly those of calling
        :meth:`take` once per request."""
        waits = [0.0] * len(requests)
        calls: list[int] = []
        calls_pipe = pipe(self._redis)
        for index, buckets in enumerate(requests):
            call = _script_call(buckets, 1.0)
            if call is None:
                continue
            keys, args = call
            # EVAL, not the registered script: redis-py would precede the pipeline with a
            # SCRIPT EXISTS round trip; Redis caches the body anyway.
            calls_pipe.eval(_TAKE, len(keys), *keys, *args)
            calls.append(index)
        if calls:
            for index, wait_ms in zip(calls, await calls_pipe.execute(), strict=True):
                waits[index] = int(wait_ms) / 1000.0
        return waits


def _script_call(buckets: Sequence[Bucket], cost: float) -> tuple[list[str], list[float]] | None:
    """KEYS and ARGV of the take script for the buckets that limit anything (None: none do)."""
    live = [b for b in buckets if b.rate_per_s > 0 and math.isfinite(b.rate_per_s)]
    if not live:
        return None
    args: list[float] = [cost]
    for bucket in live:
        args += [bucket.rate_per_s, bucket.burst]
    return [b.key for b in live], args
