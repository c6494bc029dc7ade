"""``notif:workflow:timers``: a sorted set of wake-ups, member ``{instanceId}:{path}``,
score = due time in ms.

A poller moves due members into ``workflow:inbound`` as ``{"type": "wake", "timer": member}``
with one Lua script (ZRANGEBYSCORE + XADD + ZREM), so any number of workflow processes may
poll at once: a member is moved by exactly one of them, and a poller that dies mid-way has
moved nothing or everything of its batch. A wake is only a hint to look at an instance again;
the instance's own state decides what happens, so a stale or repeated wake does nothing.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

_MOVE_DUE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, member in ipairs(due) do
  local data = '{"type":"wake","timer":' .. cjson.encode(member) .. '}'
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', 'data', data)
  redis.call('ZREM', KEYS[1], member)
end
return #due
"""


def timer_member(instance_id: str, tag: str) -> str:
    return f"{instance_id}:{tag}"


def instance_of(member: str) -> str:
    return member.split(":", 1)[0]


class Timers:
    def __init__(self, redis: Redis, key: str, stream: str, maxlen: int) -> None:
        self.redis = redis
        self.key = key
        self.stream = stream
        self.maxlen = maxlen
        self._move = redis.register_script(_MOVE_DUE)

    async def schedule(self, instance_id: str, tag: str, due_ms: int) -> None:
        await self.redis.zadd(self.key, {timer_member(instance_id, tag): due_ms})

    async def cancel(self, instance_id: str, tag: str) -> None:
        await self.redis.zrem(self.key, timer_member(instance_id, tag))

    async def move_due(self, now_ms: int, limit: int = 500) -> int:
        """Move up to ``limit`` due timers into the stream; returns how many moved."""
        moved: Any = await self._move(
            keys=[self.key, self.stream], args=[now_ms, limit, self.maxlen]
        )
        return int(moved)
