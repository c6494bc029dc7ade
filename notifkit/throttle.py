"""Per-user throttle: a sliding window of sends in Redis, checked and recorded in one Lua call.

    throttle:{projectId}:user:{userId}   ZSET  member = what counts as one send (the engine
                                               passes the event id: one notification is one
                                               send on however many channels), score = when
                                               it was allowed (ms); expires one window after
                                               the last allowed send

A send at ``now`` is allowed when fewer than ``limit`` sends were allowed in the window
``(now - window, now]``; an allowed send is recorded, a refused one is not (a throttled send
is not a send). The member makes the check idempotent: a retried decision for a send that was
already allowed is allowed again without counting twice.

``limit == 0`` turns the throttle off. Limits come from the project's ``settings.throttle``
(``{"limit", "windowSeconds"}``), else the deployment's ``THROTTLE_LIMIT`` /
``THROTTLE_WINDOW_SECONDS`` (:func:`rule_for`). Who bypasses the throttle (critical sends) is
the caller's decision.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.keys import Keys
from notifkit.redis_pipe import pipe
from notifkit.wording import counted

# KEYS[1] the user's window. ARGV: now_ms, window_ms, limit, member.
# Returns {allowed (0|1), sends in the window after this call, oldest score in the window}.
_SLIDING_WINDOW = """
local key = KEYS[1]
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
local allowed = 0
if redis.call('ZSCORE', key, ARGV[4]) then
  allowed = 1
elseif redis.call('ZCARD', key) < limit then
  redis.call('ZADD', key, now, ARGV[4])
  redis.call('PEXPIRE', key, window)
  allowed = 1
end
local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
return {allowed, redis.call('ZCARD', key), oldest[2] or false}
"""


@dataclass(frozen=True)
class ThrottleRule:
    limit: int  # sends per window; 0 = off
    window_s: int

    @property
    def enabled(self) -> bool:
        return self.limit > 0 and self.window_s > 0

    def describe(self) -> str:
        return f"more than {counted(self.limit, 'send')} in {self.window_s} s"


def rule_for(project_settings: Mapping[str, Any] | None, settings: Settings) -> ThrottleRule:
    """The project's ``settings.throttle`` where it sets one, else the deployment default."""
    limit, window_s = settings.throttle_limit, settings.throttle_window_s
    override = (project_settings or {}).get("throttle")
    if isinstance(override, Mapping):
        raw_limit, raw_window = override.get("limit"), override.get("windowSeconds")
        if isinstance(raw_limit, int) and not isinstance(raw_limit, bool) and raw_limit >= 0:
            limit = raw_limit
        if isinstance(raw_window, int) and not isinstance(raw_window, bool) and raw_window > 0:
            window_s = raw_window
    return ThrottleRule(limit, window_s)


@dataclass(frozen=True)
class ThrottleCheck:
    """One send to check: whose window, under which rule, recorded under which member."""

    project_id: str
    user_id: str
    rule: ThrottleRule
    member: str = field(default_factory=lambda: uuid.uuid4().hex)  # the engine: event id


@dataclass(frozen=True)
class ThrottleDecision:
    allowed: bool
    count: int  # sends in the window, this one included when allowed
    retry_at_ms: int | None  # when the oldest send leaves the window (refused sends only)

    def __bool__(self) -> bool:
        return self.allowed


_OFF = ThrottleDecision(True, 0, None)


async def check_many(
    redis: Redis, keys: Keys, checks: Sequence[ThrottleCheck], now_ms: int
) -> list[ThrottleDecision]:
    """Check (and record) a batch of sends in one round trip, in order."""
    live = [i for i, c in enumerate(checks) if c.rule.enabled]
    decisions = [_OFF] * len(checks)
    if not live:
        return decisions
    windows = pipe(redis)
    for i in live:
        c = checks[i]
        window_ms = c.rule.window_s * 1000
        # EVAL, not a registered script: redis-py would precede every pipeline of
        # registered scripts with a SCRIPT EXISTS round trip; Redis caches the body anyway.
        windows.eval(_SLIDING_WINDOW, 1, keys.throttle(c.project_id, c.user_id),
                  now_ms, window_ms, c.rule.limit, c.member)
    replies = await windows.execute()
    for i, reply in zip(live, replies, strict=True):
        allowed, count, oldest = int(reply[0]), int(reply[1]), reply[2]
        retry_at = None
        if not allowed and oldest:
            retry_at = int(float(oldest)) + checks[i].rule.window_s * 1000
        decisions[i] = ThrottleDecision(bool(allowed), count, retry_at)
    return decisions


async def check(
    redis: Redis,
    keys: Keys,
    project_id: str,
    user_id: str,
    rule: ThrottleRule,
    now_ms: int,
    member: str | None = None,
) -> ThrottleDecision:
    request = ThrottleCheck(project_id, user_id, rule, member or uuid.uuid4().hex)
    return (await check_many(redis, keys, [request], now_ms))[0]


async def allow(
    redis: Redis,
    keys: Keys,
    project_id: str,
    user_id: str,
    limit: int,
    window_s: int,
    now_ms: int,
    member: str | None = None,
) -> bool:
    """Whether one more send to this user fits the window; records it when it does."""
    rule = ThrottleRule(limit, window_s)
    return (await check(redis, keys, project_id, user_id, rule, now_ms, member)).allowed


class WindowModel:
    """The throttle's meaning in a few lines, for tests: every allowed send is remembered
    and a send is allowed while fewer than ``limit`` allowed sends lie in ``(now - window,
    now]``. Assumes ``now`` never goes backwards, as one clock's readings do."""

    def __init__(self) -> None:
        self.allowed: dict[tuple[str, str], dict[str, int]] = {}

    def allow(self, project_id: str, user_id: str, rule: ThrottleRule, now_ms: int,
              member: str) -> bool:
        if not rule.enabled:
            return True
        window_ms = rule.window_s * 1000
        sends = self.allowed.setdefault((project_id, user_id), {})
        recent = {m: t for m, t in sends.items() if t > now_ms - window_ms}
        if member in recent:
            return True
        if len(recent) < rule.limit:
            sends[member] = now_ms
            return True
        return False
