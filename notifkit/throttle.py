"""Per-user throttle: a sliding window of sends in Redis, checked and recorded in one Lua call.

    throttle:{projectId}:user:{userId}   ZSET  member = what counts as one send (the engine
                                               passes the event id: one notification is one
                                               send on however many channels), score = when
                                               it goes out (ms: its due time, which is later
                                               than now for a scheduled or deferred send);
                                               expires one window after the latest of them

The rule: no window of ``window`` length may hold more than ``limit`` allowed sends. A send
due at ``at`` joins every window that contains ``at``, so it is allowed when fewer than
``limit`` sends lie in ``(at - window, at + window)``; for sends due now, with none scheduled
ahead, that is the familiar "fewer than ``limit`` in ``(now - window, now]``". A scheduled send
counts where it goes out, not when it was accepted: reminders for three different days do not
crowd today's window, and sends held by quiet hours, which all go out when the hours end, are
throttled as the burst they will be. An allowed send is recorded, a refused one is not (a
throttled send is not a send). The member makes the check idempotent: a retried decision for a
send that was already allowed is allowed again without counting twice.

A send canceled before anything of it went out to the user is no send: :func:`release`
takes its member out of the user's window (the cancel and the scheduler call it for the tasks
they drop), so it no longer crowds the window it was due in.

``limit == 0`` turns the throttle off. Limits come from the project's ``settings.throttle``
(``{"limit", "windowSeconds"}``), else the deployment's ``THROTTLE_LIMIT`` /
``THROTTLE_WINDOW_SECONDS`` (:func:`rule_for`). Who bypasses the throttle (critical sends) is
the caller's decision.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.keys import Keys
from notifkit.redis_pipe import pipe
from notifkit.wording import counted

# KEYS[1] the user's window. ARGV: now_ms, at_ms (the send's due time, >= now), window_ms,
# limit, member. Returns {allowed (0|1), sends in the windows around at_ms after this call,
# oldest score among them}. Nothing due at or after now can share a window with a send at or
# before now - window, so those leave.
_SLIDING_WINDOW = """
local key = KEYS[1]
local now = tonumber(ARGV[1])
local at = tonumber(ARGV[2])
local window = tonumber(ARGV[3])
local limit = tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
local low, high = '(' .. (at - window), '(' .. (at + window)
local allowed = 0
if redis.call('ZSCORE', key, ARGV[5]) then
  allowed = 1
elseif redis.call('ZCOUNT', key, low, high) < limit then
  redis.call('ZADD', key, at, ARGV[5])
  local latest = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
  redis.call('PEXPIRE', key, math.max(latest - now, 0) + window)
  allowed = 1
end
local oldest = redis.call('ZRANGE', key, low, high, 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
return {allowed, redis.call('ZCOUNT', key, low, high), oldest[2] or false}
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
    at_ms: int | None = None  # when the send goes out, if later than now


@dataclass(frozen=True)
class ThrottleDecision:
    allowed: bool
    count: int  # sends in the window, this one included when allowed
    retry_at_ms: int | None  # when the oldest send around it leaves (refused sends only)

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
        at_ms = max(now_ms, c.at_ms) if c.at_ms is not None else now_ms
        windows.eval(_SLIDING_WINDOW, 1, keys.throttle(c.project_id, c.user_id),
                     now_ms, at_ms, window_ms, c.rule.limit, c.member)
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
    at_ms: int | None = None,
) -> ThrottleDecision:
    request = ThrottleCheck(project_id, user_id, rule, member or uuid.uuid4().hex, at_ms)
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


async def release(redis: Redis, keys: Keys,
                  sends: Iterable[tuple[str, str, str]]) -> None:
    """Forget sends that will never go out, each ``(project_id, user_id, member)``: one
    pipelined ZREM per send, in one round trip."""
    batch = list(dict.fromkeys(sends))
    if not batch:
        return
    forget = redis.pipeline(transaction=False)  # not the hot path: redis-py's pipeline will do
    for project_id, user_id, member in batch:
        forget.zrem(keys.throttle(project_id, user_id), member)
    await forget.execute()
