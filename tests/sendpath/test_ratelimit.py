"""Provider token buckets in Redis: shared state, all-or-nothing across buckets."""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from notifkit.keys import Keys
from notifkit.ratelimit import Bucket, TokenBuckets


async def test_a_bucket_allows_its_burst_then_says_how_long_to_wait(
    redis: Redis, keys: Keys
) -> None:
    bucket = Bucket(keys.provider_bucket("twilio", "_all"), rate_per_s=2.0, burst=2.0)
    # Two processes share the bucket through Redis.
    first, second = TokenBuckets(redis), TokenBuckets(redis)

    assert await first.take([bucket]) == 0.0
    assert await second.take([bucket]) == 0.0
    wait_s = await first.take([bucket])

    # The third send must wait for the next token: at most half a second at 2 per second.
    assert 0.0 < wait_s <= 0.5


async def test_a_short_bucket_takes_nothing_from_the_others(redis: Redis, keys: Keys) -> None:
    provider = Bucket(keys.provider_bucket("resend", "_all"), rate_per_s=100.0, burst=100.0)
    project = Bucket(keys.provider_bucket("resend", "p1"), rate_per_s=1.0, burst=1.0)
    buckets = TokenBuckets(redis)

    assert await buckets.take([provider, project]) == 0.0
    assert await buckets.take([provider, project]) > 0.0  # the project's bucket is empty

    # The provider bucket lost one token (the first send), not two.
    tokens = float(await redis.hget(provider.key, "tokens") or 0)
    assert 98.9 <= tokens <= 99.1
    assert 0 < await redis.pttl(provider.key) <= 2000


async def test_an_extreme_bucket_still_answers_within_ten_years(
    redis: Redis, keys: Keys
) -> None:
    # A huge burst at the slowest rate: its TTL (burst / rate) and a starved bucket's wait
    # would pass what Redis reads as an integer, and every take would fail.
    ten_years_s = 10 * 365 * 24 * 3600
    huge = Bucket(keys.api_rate("p-huge"), rate_per_s=0.001, burst=1e23)
    buckets = TokenBuckets(redis)
    assert await buckets.take([huge]) == 0.0
    assert 0 < await redis.pttl(huge.key) <= ten_years_s * 1000
    starved = Bucket(keys.api_rate("p-starved"), rate_per_s=1e-300, burst=1.0)
    assert await buckets.take([starved]) == 0.0
    assert 0 < await buckets.take([starved]) <= ten_years_s
    # ... and so would the turns it hands out, one token (10^300 s) apart.
    for _ in range(3):
        assert 0 < await buckets.take([starved], queue=True) <= ten_years_s
    assert 0 < await redis.pttl(starved.key) <= ten_years_s * 1000


async def test_no_bucket_means_no_limit(redis: Redis) -> None:
    assert await TokenBuckets(redis).take([]) == 0.0


async def test_take_many_answers_as_one_take_per_request_in_order(
    redis: Redis, keys: Keys
) -> None:
    shared = Bucket(keys.api_rate("p1"), rate_per_s=1.0, burst=3.0)
    other = Bucket(keys.api_rate("p2"), rate_per_s=1.0, burst=1.0)
    buckets = TokenBuckets(redis)

    # Five requests on a bucket of three, one on another bucket, one with no limit at all,
    # in one round trip.
    waits = await buckets.take_many([[shared]] * 5 + [[other], []])

    assert waits[:3] == [0.0, 0.0, 0.0]
    assert all(0.0 < w <= 2.0 for w in waits[3:5])
    assert waits[5:] == [0.0, 0.0]
    # The refused requests took nothing: the bucket holds what three takes left.
    tokens = float(await redis.hget(shared.key, "tokens") or -1)
    assert 0.0 <= tokens < 0.1


async def test_callers_that_come_back_get_turns_one_token_apart(
    redis: Redis, keys: Keys
) -> None:
    bucket = Bucket.per_second(keys.provider_bucket("twilio", "p1"), 0.1)  # 1 in 10 s
    buckets = TokenBuckets(redis)
    assert await buckets.take([bucket], queue=True) == 0.0

    # Four callers short of tokens are each told their own turn, a token's time after the
    # one before, not all the next token (when one would get it and three be short again).
    waits = [await buckets.take([bucket], queue=True) for _ in range(4)]
    for turn, wait_s in enumerate(waits, start=1):
        assert 10 * turn - 5 < wait_s <= 10 * turn, waits

    # A refused caller that is not coming back (the API's admission), or whose turn has
    # come, is told when the next token is there, and takes no turn from those waiting.
    assert 5 < await buckets.take([bucket]) <= 10
    assert 45 < await buckets.take([bucket], queue=True) <= 50
    assert 5 < await buckets.take_soon([bucket], 1.0, turn_came=True) <= 10
    # The turns live as long as they are owed (to 60 s), and a refill time (10 s) past that.
    assert 60_000 < await redis.pttl(bucket.key) <= 71_000


async def test_a_crowd_waiting_for_tokens_asks_about_twice_each(
    redis: Redis, keys: Keys
) -> None:
    bucket = Bucket.per_second(keys.provider_bucket("twilio", "p1"), 20.0)
    buckets = TokenBuckets(redis)
    asked = 0
    take = buckets.take

    async def counted(bs: Sequence[Bucket], cost: float = 1.0, queue: bool = False) -> float:
        nonlocal asked
        asked += 1
        return await take(bs, cost, queue)

    buckets.take = counted  # type: ignore[method-assign,assignment]

    # Forty sends at once on a bucket of twenty a second: all are let through in turn ...
    results = await asyncio.gather(*(buckets.take_soon([bucket], 5.0) for _ in range(40)))
    assert results == [0.0] * 40
    # ... twenty at once and twenty waiting, each of which asked twice (refused, then taken
    # at its turn), where waking all waiting at each next token made them ask 250 times.
    assert asked <= 2 * 40, asked


async def test_an_idle_bucket_refills_to_its_burst_and_no_further(
    redis: Redis, keys: Keys
) -> None:
    # Given a bucket of 2 at 1 a second, left alone for a minute (its last take moved back,
    # on the Redis server's clock the script reads)
    bucket = Bucket(keys.api_rate("p-idle"), rate_per_s=1.0, burst=2.0)
    buckets = TokenBuckets(redis)
    assert await buckets.take([bucket]) == 0.0
    seconds, micros = await redis.time()
    await redis.hset(bucket.key, mapping={"ts": seconds * 1000 + micros // 1000 - 60_000})

    # Then it holds its burst, not the 60 tokens a minute at its rate would make
    assert await buckets.take([bucket]) == 0.0
    assert await buckets.take([bucket]) == 0.0
    assert await buckets.take([bucket]) > 0.0


@pytest.mark.parametrize("rate", [0.0, -1.0, math.inf, math.nan])
async def test_a_bucket_without_a_finite_positive_rate_limits_nothing(
    redis: Redis, keys: Keys, rate: float
) -> None:
    # Such a bucket limits nothing and is never sent to Redis: a rate of 0 made every wait
    # ten years, and Lua reads no infinity or NaN.
    bucket = Bucket(keys.api_rate("p-unlimited"), rate_per_s=rate, burst=1.0)
    buckets = TokenBuckets(redis)
    for _ in range(3):
        assert await buckets.take([bucket]) == 0.0
    assert await buckets.take_many([[bucket], [bucket]]) == [0.0, 0.0]
    assert await redis.exists(bucket.key) == 0


@pytest.mark.parametrize(("answers", "outcome", "waits"), [
    # A bucket another process keeps draining answers a short wait again and again: the
    # send is parked once the waits add up past max_wait_s, not held by its worker for ever.
    ([0.1, 0.1, 0.1, 0.0], 0.1, [0.1, 0.1]),
    # Waits adding up to exactly max_wait_s are within it (binary fractions: no rounding).
    ([0.125, 0.125, 0.0], 0.0, [0.125, 0.125]),
])
async def test_take_soon_waits_in_process_no_longer_than_it_is_given(
    redis: Redis, monkeypatch: pytest.MonkeyPatch,
    answers: list[float], outcome: float, waits: list[float],
) -> None:
    replies = iter(answers)
    slept: list[float] = []

    async def take(_buckets: object, cost: float = 1.0, queue: bool = False) -> float:
        return next(replies)

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    buckets = TokenBuckets(redis)
    monkeypatch.setattr(buckets, "take", take)
    monkeypatch.setattr(asyncio, "sleep", sleep)
    assert await buckets.take_soon([], max_wait_s=0.25) == outcome
    assert slept == waits


@pytest.mark.parametrize("rate", [3.0, 0.7, 7.5])
async def test_a_rate_whose_token_time_is_no_whole_number_of_ms_still_hands_out_turns(
    redis: Redis, keys: Keys, rate: float
) -> None:
    # A token every 1000 / 3 ms: the turns the script hands out and the TTL it derives from
    # them fall between milliseconds, and PEXPIRE takes whole ones only ("value is not an
    # integer or out of range"), so every send short of a token failed its attempt.
    bucket = Bucket.per_second(keys.provider_bucket("resend", "p-odd"), rate)
    buckets = TokenBuckets(redis)
    waits = [await buckets.take([bucket], queue=True) for _ in range(math.ceil(rate) + 3)]
    assert waits[:math.floor(rate) or 1] == [0.0] * (math.floor(rate) or 1)
    turns = [w for w in waits if w > 0]
    assert turns == sorted(turns), waits
    assert len(turns) >= 3, waits
    assert await redis.pttl(bucket.key) > 0
    # A take that finds its tokens while such a turn is still owed keeps the key alive as
    # long as the turn: the same fraction of a millisecond.
    await redis.hset(bucket.key, "tokens", str(bucket.burst))
    assert await buckets.take([bucket]) == 0.0
    [wait_s] = await buckets.take_many([[bucket]])  # in one pipeline, as the API asks
    assert 0.0 <= wait_s <= 1 / rate + 0.01
    assert await redis.pttl(bucket.key) > 0


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None,
          max_examples=60)
@given(rate=st.floats(0.001, 100_000),  # what the API's rateLimits takes
       takes=st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=8))
async def test_every_rate_the_api_takes_hands_out_waits_and_keeps_its_bucket(
    redis: Redis, keys: Keys, rate: float, takes: list[tuple[bool, bool]]
) -> None:
    """Whatever the rate: every take answers a wait (no Redis error from the script's
    arithmetic, as a PEXPIRE of a fraction of a millisecond was), alone or in the API's
    pipeline, and the bucket's key is kept, never left without an expiry or dropped."""
    bucket = Bucket.per_second(keys.provider_bucket("resend", uuid.uuid4().hex), rate)
    buckets = TokenBuckets(redis)
    for queue, pipelined in takes:
        if pipelined:
            [wait_s] = await buckets.take_many([[bucket]])
        else:
            wait_s = await buckets.take([bucket], queue=queue)
        assert wait_s >= 0.0
        assert await redis.pttl(bucket.key) > 0
