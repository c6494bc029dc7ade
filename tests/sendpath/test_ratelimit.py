"""Provider token buckets in Redis: shared state, all-or-nothing across buckets."""

from __future__ import annotations

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
