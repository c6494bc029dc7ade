"""The per-project API rate limit: a token bucket in Redis shared by every API process.

One Lua call refills the bucket from the time elapsed (Redis ``TIME``, so every process agrees
on the clock), takes a token if there is one, and says how long to wait if there is not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

_TAKE = """
local now_t = redis.call('TIME')
local now = tonumber(now_t[1]) * 1000 + math.floor(tonumber(now_t[2]) / 1000)
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1])
local ts = tonumber(state[2])
if tokens == nil or ts == nil then
  tokens = burst
  ts = now
end
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate / 1000)
local allowed = 0
local wait_ms = 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
else
  wait_ms = math.ceil((1 - tokens) * 1000 / rate)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst * 1000 / rate) + 1000)
return {allowed, wait_ms}
"""


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    retry_after_s: int  # whole seconds, as the Retry-After header wants; 0 when allowed


class TokenBucket:
    def __init__(self, redis: Redis, rate_per_s: float, burst: int) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._take = redis.register_script(_TAKE)

    async def take(self, key: str) -> Decision:
        reply: Any = await self._take(keys=[key], args=[self.rate_per_s, self.burst])
        allowed, wait_ms = int(reply[0]), int(reply[1])
        if allowed:
            return Decision(True, 0)
        return Decision(False, max(1, math.ceil(wait_ms / 1000)))
