"""Provisional dedup marks (CONTRACT §4) on a real Redis (``SET NX GET``, TTLs, the release
script).

The worker-level behaviour (released on failure, kept across a crash, replay) is tested on a
real Redis in tests/worker/test_dedup_with_worker.py; here: who may claim a mark, its TTL,
and that releasing is compare-and-delete.
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from notifkit.dedup import Dedup
from notifkit.keys import Keys
from notifkit.worker import Entry
from notifkit.worker.scripts import RELEASE_MARKS

STREAM = Keys("ns").enriched("normal")  # names an entry's owner; never read


def entry(entry_id: str, **payload: object) -> Entry:
    return Entry(STREAM, entry_id, dict(payload), attempt=1)


@pytest.fixture
def keys(namespace: str) -> Keys:
    return Keys(namespace)


@pytest.fixture
def dedup(redis: Redis, keys: Keys) -> Dedup:
    return Dedup(redis, keys, "engine", ttl_s=3600)


def test_an_entry_owns_its_marks_by_stream_and_id_or_by_what_it_replays() -> None:
    assert entry("1-0").owner == f"{STREAM}/1-0"
    assert entry("9-0", _replayOf=f"{STREAM}/1-0").owner == f"{STREAM}/1-0"
    assert entry("9-0", _replayOf=42).owner == f"{STREAM}/9-0"  # not a string: ignored


async def test_the_first_claim_wins_and_records_the_mark_on_the_entry(
    dedup: Dedup, redis: Redis, keys: Keys
) -> None:
    mark = keys.processed("engine", "k1")
    first = entry("1-0")
    assert await dedup.claim(first, "k1") is True
    assert first.marks == [mark]
    assert await redis.get(mark) == f"{STREAM}/1-0".encode()
    assert 3590 < await redis.ttl(mark) <= 3600


async def test_another_entry_with_the_same_key_is_a_duplicate(
    dedup: Dedup, redis: Redis, keys: Keys
) -> None:
    mark = keys.processed("engine", "k1")
    await dedup.claim(entry("1-0"), "k1")
    second = entry("2-0")
    assert await dedup.claim(second, "k1") is False
    assert second.marks == []  # nothing of its own to release if it fails
    assert await redis.get(mark) == f"{STREAM}/1-0".encode()


async def test_the_same_entry_claiming_again_may_proceed(dedup: Dedup, keys: Keys) -> None:
    # A reclaimed retry is a new Entry object for the same stream entry.
    await dedup.claim(entry("1-0"), "k1")
    retry = Entry(STREAM, "1-0", {}, attempt=2, reclaimed=True)
    assert await dedup.claim(retry, "k1") is True
    assert retry.marks == [keys.processed("engine", "k1")]


async def test_a_replay_may_proceed_and_an_impostor_may_not(dedup: Dedup) -> None:
    await dedup.claim(entry("1-0"), "k1")
    assert await dedup.claim(entry("9-0", _replayOf=f"{STREAM}/1-0"), "k1") is True
    assert await dedup.claim(entry("9-1", _replayOf=f"{STREAM}/5-0"), "k1") is False


async def test_claim_many_answers_per_claim_in_order(
    dedup: Dedup, redis: Redis, keys: Keys
) -> None:
    mark = keys.processed("engine", "k1")
    a, b, c = entry("1-0"), entry("2-0"), entry("3-0")
    assert await dedup.claim_many([]) == []
    assert await dedup.claim_many([(a, "k1", None), (b, "k1", None), (c, "k2", 60)]) == [
        True, False, True,
    ]
    assert (a.marks, b.marks, c.marks) == ([mark], [], [keys.processed("engine", "k2")])
    assert 0 < await redis.ttl(keys.processed("engine", "k2")) <= 60


async def test_a_caller_key_window_overrides_the_default(
    redis: Redis, keys: Keys
) -> None:
    enricher = Dedup(redis, keys, "enricher", ttl_s=3600)
    await enricher.claim(entry("1-0"), "p1:abc", ttl_s=24 * 3600)
    assert 24 * 3600 - 10 < await redis.ttl(keys.processed("enricher", "p1:abc")) <= 86400


async def test_extend_lengthens_a_mark_but_never_shortens_it(
    dedup: Dedup, redis: Redis, keys: Keys
) -> None:
    mark = keys.processed("engine", "k1")
    await dedup.claim(entry("1-0"), "k1")
    await dedup.extend("k1", 7200)
    assert 7190 < await redis.ttl(mark) <= 7200
    await dedup.extend("k1", 60)
    assert await redis.ttl(mark) > 7000
    await dedup.extend("missing", 60)  # no mark, nothing to extend
    assert await redis.exists(keys.processed("engine", "missing")) == 0


def test_an_unknown_stage_is_refused(redis: Redis) -> None:
    with pytest.raises(ValueError, match="unknown dedup stage"):
        Dedup(redis, Keys(), "sender", ttl_s=60)


@pytest.mark.parametrize("by", ["worker", "dedup"])
async def test_release_deletes_only_marks_the_entry_still_owns(
    dedup: Dedup, redis: Redis, keys: Keys, by: str
) -> None:
    mark = keys.processed("engine", "k1")
    # Given an entry that claimed two marks, one of which has since expired and been claimed
    # by another entry
    failing = entry("1-0")
    await dedup.claim_many([(failing, "k1", None), (failing, "k2", None)])
    await redis.delete(keys.processed("engine", "k2"))
    await dedup.claim(entry("2-0"), "k2")

    # When the failing entry's marks are released, by the worker's script or by
    # Dedup.release (a task parked, not failed)
    if by == "worker":
        release = redis.register_script(RELEASE_MARKS)
        assert await release(keys=failing.marks, args=[failing.owner]) == 1
    else:
        await dedup.release(failing)
        assert failing.marks == []

    # Then only its own mark is gone; the other entry's claim stands
    assert await redis.exists(mark) == 0
    assert await redis.get(keys.processed("engine", "k2")) == f"{STREAM}/2-0".encode()


async def test_the_workers_claim_answers_only_for_the_mark_it_claimed(
    dedup: Dedup, redis: Redis, keys: Keys
) -> None:
    """The answer the worker got while counting the attempt is reused for that mark alone:
    another key the stage claims for the same entry is still asked of Redis."""
    await dedup.claim(entry("1-0"), "taken")
    mine = entry("2-0")
    mine.claimed = (keys.processed("engine", "counted"), True)
    assert await dedup.claim_many([(mine, "counted", None), (mine, "taken", None)]) \
        == [True, False]
    assert mine.marks == []  # the worker recorded its own mark; the duplicate adds none
    assert await redis.get(keys.processed("engine", "counted")) is None  # not asked again


async def test_extend_leaves_a_mark_without_expiry_as_it_is(
    dedup: Dedup, redis: Redis, keys: Keys
) -> None:
    """A mark that never expires already lasts long enough: extending it gives it no TTL."""
    mark = keys.processed("engine", "k-forever")
    await redis.set(mark, f"{STREAM}/1-0")
    await dedup.extend("k-forever", 60)
    assert await redis.ttl(mark) == -1
