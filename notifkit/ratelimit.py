"""Provider token buckets, shared by every delivery (and ai) process through Redis.

    notif:ratelimit:{provider}:{projectId}   HASH  tokens (float), ts (ms of the last take),
                                             queue (ms: the next turn a waiting caller gets)

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

# KEYS: bucket hashes. ARGV: cost, queue (1 or 0, see below), then rate_per_s and burst for
# each key. Returns 0 when the tokens were taken, else the wait in ms until they would be (with
# queue: until this caller's turn).
#
# A caller that will come back for its tokens (a send waiting or parked) asks with queue: each
# short bucket then hands out turns one token apart, kept in its `queue` field (ms), so a crowd
# short of tokens comes back spread out at the bucket's rate rather than all at the next token,
# when one would get it and the rest be short again. Coming back at its turn it asks without:
# if still short (a bucket of one token loses what accrues while it is full, so a caller a
# millisecond less late than the one before finds it a hair short) it waits for the token
# alone, ahead of the line, and takes no second turn. Whether a take succeeds never depends on
# the turns, only on the tokens, so no bucket lets more through than its rate; a turn not used
# (its caller gave up) delays those behind it by one token's time at most. The API's admission
# asks without queue too: a refused request is not coming back for a turn.
_TAKE = """
-- Ten years in ms: a slow rate and a large burst must not make a wait or a TTL that Redis
-- cannot read as an integer (every call would fail).
local MAX_MS = 315360000000
local now_t = redis.call('TIME')
local now = tonumber(now_t[1]) * 1000 + math.floor(tonumber(now_t[2]) / 1000)
local cost = tonumber(ARGV[1])
local queue = ARGV[2] == '1'
local wait = 0
local tokens = {}
local queues = {}
local short = {}
for i, key in ipairs(KEYS) do
  local rate = tonumber(ARGV[2 * i + 1])
  local burst = tonumber(ARGV[2 * i + 2])
  local state = redis.call('HMGET', key, 'tokens', 'ts', 'queue')
  local have = tonumber(state[1]) or burst
  local ts = tonumber(state[2]) or now
  queues[i] = tonumber(state[3]) or 0
  if now > ts then have = math.min(burst, have + (now - ts) * rate / 1000) end
  tokens[i] = have
  if have < cost then
    short[#short + 1] = i
    wait = math.max(wait, (cost - have) * 1000 / rate)
  end
end
-- PEXPIRE takes whole milliseconds, and a turn falls between two when 1000 / rate is none.
local function keep(key, rate, burst, until_ms)
  local ttl = math.max(0, until_ms - now) + math.ceil(burst * 1000 / rate) + 1000
  redis.call('PEXPIRE', key, math.min(math.ceil(ttl), MAX_MS))
end
if wait > 0 then
  if queue then
    for _, i in ipairs(short) do
      local key = KEYS[i]
      local rate = tonumber(ARGV[2 * i + 1])
      local burst = tonumber(ARGV[2 * i + 2])
      local due = now + (cost - tokens[i]) * 1000 / rate
      local turn = math.min(math.max(due, queues[i]), now + MAX_MS)
      local after = turn + cost * 1000 / rate
      redis.call('HSET', key, 'queue', tostring(after))
      keep(key, rate, burst, after)
      wait = math.max(wait, turn - now)
    end
  end
  return math.min(math.max(1, math.ceil(wait)), MAX_MS)
end
for i, key in ipairs(KEYS) do
  local rate = tonumber(ARGV[2 * i + 1])
  local burst = tonumber(ARGV[2 * i + 2])
  redis.call('HSET', key, 'tokens', tostring(tokens[i] - cost), 'ts', now)
  keep(key, rate, burst, queues[i])
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

    async def take(self, buckets: Sequence[Bucket], cost: float = 1.0,
                   queue: bool = False) -> float:
        """Take ``cost`` tokens from every bucket, or none: 0.0 when taken, else the seconds
        to wait before the tokens would be there; with ``queue`` (the caller will come back
        then), before this caller's turn, the turns of those already waiting one token apart."""
        call = _script_call(buckets, cost, queue)
        if call is None:
            return 0.0
        keys, args = call
        wait_ms = await self._take(keys=keys, args=args)
        return int(wait_ms) / 1000.0

    async def take_soon(self, buckets: Sequence[Bucket], max_wait_s: float,
                        turn_came: bool = False) -> float:
        """:meth:`take` in turn, waiting in-process for a turn due within ``max_wait_s`` in
        all: 0.0 once taken, else the seconds until the turn (the caller parks the work for
        that long, and comes back with ``turn_came``, so that it does not queue again)."""
        waited = 0.0
        queue = not turn_came
        while True:
            wait_s = await self.take(buckets, queue=queue)
            if wait_s <= 0:
                return 0.0
            if waited + wait_s > max_wait_s:
                return wait_s
            await asyncio.sleep(wait_s)
            waited += wait_s
            queue = False

    async def take_many(self, requests: Sequence[Sequence[Bucket]]) -> list[float]:
        """:meth:`take` one token for each request, in order, in one round trip: each request
        is still its own all-or-none script call, so the answers are exactly those of calling
        :meth:`take` once per request."""
        waits = [0.0] * len(requests)
        calls: list[int] = []
        calls_pipe = pipe(self._redis)
        for index, buckets in enumerate(requests):
            call = _script_call(buckets, 1.0, queue=False)
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


def _script_call(buckets: Sequence[Bucket], cost: float,
                 queue: bool) -> tuple[list[str], list[float]] | None:
    """KEYS and ARGV of the take script for the buckets that limit anything (None: none do)."""
    live = [b for b in buckets if b.rate_per_s > 0 and math.isfinite(b.rate_per_s)]
    if not live:
        return None
    args: list[float] = [cost, 1 if queue else 0]
    for bucket in live:
        args += [bucket.rate_per_s, bucket.burst]
    return [b.key for b in live], args
