"""The per-user throttle: the Redis sliding window against a plain in-memory model."""

from __future__ import annotations

import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.keys import Keys
from notifkit.throttle import (
    ThrottleCheck,
    ThrottleRule,
    allow,
    check,
    check_many,
    rule_for,
)


class WindowModel:
    """The throttle's meaning in a few lines, which the Redis window is checked against: every
    allowed send is remembered at the time it goes out, and a send due at ``at`` (now unless
    later) is allowed while fewer than ``limit`` allowed sends lie in ``(at - window, at +
    window)``, so that no window holds more than ``limit``. Assumes ``now`` never goes
    backwards, as one clock's readings do."""

    def __init__(self) -> None:
        self.allowed: dict[tuple[str, str], dict[str, int]] = {}

    def allow(self, project_id: str, user_id: str, rule: ThrottleRule, now_ms: int,
              member: str, at_ms: int | None = None) -> bool:
        if not rule.enabled:
            return True
        window_ms = rule.window_s * 1000
        at = max(now_ms, at_ms) if at_ms is not None else now_ms
        sends = self.allowed.setdefault((project_id, user_id), {})
        live = {m: t for m, t in sends.items() if t > now_ms - window_ms}
        if member in live:
            return True
        if sum(1 for t in live.values() if at - window_ms < t < at + window_ms) < rule.limit:
            sends[member] = at
            return True
        return False

    def busiest_window(self, project_id: str, user_id: str, rule: ThrottleRule) -> int:
        """The most allowed sends any one window holds: never more than the limit."""
        times = sorted(self.allowed.get((project_id, user_id), {}).values())
        window_ms = rule.window_s * 1000
        return max((sum(1 for t in times if end - window_ms < t <= end) for end in times),
                   default=0)


# Half-second steps land exactly on window edges (windows are whole seconds) often.
_ms = st.one_of(st.integers(0, 24).map(lambda n: n * 500), st.integers(0, 12_000))
# One step: (user, ms since the previous step, reuse an earlier task id?, how many sends at
# once, how far ahead of now they are due: mostly now, sometimes scheduled)
steps = st.lists(
    st.tuples(
        st.integers(0, 2),
        _ms,
        st.booleans(),
        st.integers(1, 3),
        st.one_of(st.just(0), _ms),
    ),
    min_size=1,
    max_size=60,
)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(limit=st.integers(1, 5), window_s=st.integers(1, 10), plan=steps)
async def test_redis_sliding_window_agrees_with_the_model(
    redis: Redis, namespace: str, limit: int, window_s: int,
    plan: list[tuple[int, int, bool, int, int]],
) -> None:
    """The Lua window must say exactly what the definition says (no window holds more than
    `limit` allowed sends, each counted at the time it goes out), including at the window's
    edge, for sends scheduled ahead, for several users whose windows must not leak into each
    other, for batches checked in one pipeline, and for a retried decision that must not
    count its task twice."""
    keys = Keys(namespace)
    project = uuid.uuid4().hex  # a fresh window per example
    rule = ThrottleRule(limit, window_s)
    model = WindowModel()
    now_ms = 1_780_000_000_000
    issued: list[str] = []
    for user_index, delta_ms, reuse, batch_size, ahead_ms in plan:
        now_ms += delta_ms
        user = f"user-{user_index}"
        batch: list[ThrottleCheck] = []
        for n in range(batch_size):
            member = issued[(delta_ms + n) % len(issued)] if reuse and issued else uuid.uuid4().hex
            issued.append(member)
            batch.append(ThrottleCheck(project, user, rule, member, now_ms + ahead_ms))
        decisions = await check_many(redis, keys, batch, now_ms)
        expected = [model.allow(project, user, rule, now_ms, c.member, c.at_ms) for c in batch]
        assert [d.allowed for d in decisions] == expected
    for user_index in range(3):
        assert model.busiest_window(project, f"user-{user_index}", rule) <= limit


async def test_scheduled_sends_count_when_they_go_out_not_when_accepted(
    redis: Redis, namespace: str
) -> None:
    """Reminders due on three different days do not crowd today's window; sends that all
    go out at one time (quiet hours ending) are throttled as the burst they will be."""
    keys = Keys(namespace)
    now = 1_780_000_000_000
    day, hour = 86_400_000, 3_600_000
    rule = ThrottleRule(limit=1, window_s=3600)
    for n in (1, 2, 3):
        assert await check(redis, keys, "p", "u", rule, now, f"day-{n}", at_ms=now + n * day)
    assert await check(redis, keys, "p", "u", rule, now, "now")  # today's window is empty
    # Two sends held until the same morning: the second would share its window
    morning = now + 10 * hour
    assert await check(redis, keys, "p", "u", rule, now, "held-1", at_ms=morning)
    late = await check(redis, keys, "p", "u", rule, now + 1_000, "held-2", at_ms=morning)
    assert not late.allowed
    assert late.retry_at_ms == morning + hour
    # The key lives until the last scheduled send has left its window.
    ttl_ms = await redis.pttl(keys.throttle("p", "u"))
    assert 3 * day < ttl_ms <= 3 * day + hour


async def test_a_full_window_refuses_until_the_oldest_send_leaves_it(
    redis: Redis, namespace: str
) -> None:
    keys = Keys(namespace)
    t0 = 1_780_000_000_000
    rule = ThrottleRule(limit=2, window_s=60)
    first = await check(redis, keys, "p", "u", rule, t0, "task-1")
    assert (first.allowed, first.count, first.retry_at_ms) == (True, 1, None)
    assert await check(redis, keys, "p", "u", rule, t0 + 1_000, "task-2")
    refused = await check(redis, keys, "p", "u", rule, t0 + 2_000, "task-3")
    assert not refused.allowed
    assert refused.count == 2
    assert refused.retry_at_ms == t0 + 60_000
    # The same task asking again is not a new send.
    assert (await check(redis, keys, "p", "u", rule, t0 + 3_000, "task-2")).count == 2
    # At t0 + 60 s the first send is exactly one window old and no longer counts.
    assert await allow(redis, keys, "p", "u", 2, 60, t0 + 60_000, "task-3")
    ttl_ms = await redis.pttl(keys.throttle("p", "u"))
    assert 0 < ttl_ms <= 60_000
    # Another user and another project have windows of their own.
    assert await allow(redis, keys, "p", "someone-else", 2, 60, t0 + 60_000)
    assert await allow(redis, keys, "other-project", "u", 2, 60, t0 + 60_000)


async def test_sends_exactly_one_window_apart_never_share_a_window(
    redis: Redis, namespace: str
) -> None:
    """Windows are half-open: a send due exactly one window after another (or before it) is
    in no window with it, for scheduled sends too, where nothing has been trimmed yet."""
    keys = Keys(namespace)
    now = 1_780_000_000_000
    hour = 3_600_000
    rule = ThrottleRule(limit=1, window_s=3600)
    at = now + 5 * hour
    assert await check(redis, keys, "p", "u", rule, now, "middle", at_ms=at)
    assert await check(redis, keys, "p", "u", rule, now, "after", at_ms=at + hour)
    assert await check(redis, keys, "p", "u", rule, now, "before", at_ms=at - hour)
    assert not await check(redis, keys, "p", "u", rule, now, "inside", at_ms=at + hour - 1)


async def test_an_overdue_send_counts_when_it_goes_out_now(
    redis: Redis, namespace: str
) -> None:
    """A send whose due time passed while it waited (a backlog, a scheduler catching up)
    goes out now, so it counts now: recorded at its old due time, more than a window ago, it
    was trimmed at once and the next send went out beside it over the limit."""
    keys = Keys(namespace)
    now = 1_780_000_000_000
    rule = ThrottleRule(limit=1, window_s=60)
    assert await check(redis, keys, "p", "u", rule, now, "overdue", at_ms=now - 120_000)
    second = await check(redis, keys, "p", "u", rule, now + 1_000, "next")
    assert (second.allowed, second.count, second.retry_at_ms) == (False, 1, now + 60_000)


async def test_limit_zero_is_off_and_touches_nothing(redis: Redis, namespace: str) -> None:
    keys = Keys(namespace)
    for _ in range(5):
        assert await allow(redis, keys, "p", "u", 0, 60, 1_000)
    assert await redis.exists(keys.throttle("p", "u")) == 0


def test_project_settings_override_the_deployment_default() -> None:
    defaults = Settings(throttle_limit=10, throttle_window_s=3600)
    assert rule_for(None, defaults) == ThrottleRule(10, 3600)
    assert rule_for({}, defaults) == ThrottleRule(10, 3600)
    assert rule_for({"throttle": {"limit": 3, "windowSeconds": 60}}, defaults) == ThrottleRule(
        3, 60
    )
    assert rule_for({"throttle": {"limit": 0}}, defaults) == ThrottleRule(0, 3600)
    assert not rule_for({"throttle": {"limit": 0}}, defaults).enabled
    assert rule_for({"throttle": {"limit": "x", "windowSeconds": -1}}, defaults) == ThrottleRule(
        10, 3600
    )
    assert not rule_for(None, Settings()).enabled  # THROTTLE_LIMIT defaults to 0: off
    # A JSON true is no count, and a window of 0 s would turn the project's throttle off:
    # each falls back to the deployment's value
    assert rule_for({"throttle": {"limit": True, "windowSeconds": True}}, defaults) \
        == ThrottleRule(10, 3600)
    assert rule_for({"throttle": {"limit": 3, "windowSeconds": 0}}, defaults) \
        == ThrottleRule(3, 3600)
