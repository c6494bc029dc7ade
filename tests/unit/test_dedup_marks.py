"""Provisional dedup marks (CONTRACT §4), the pure logic on fakeredis.

The worker-level behaviour (released on failure, kept across a crash, replay) is tested on a
real Redis in tests/worker/test_dedup_with_worker.py; here: who may claim a mark, its TTL,
and that releasing is compare-and-delete.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import fakeredis
import pytest

from notifkit.dedup import Dedup
from notifkit.keys import Keys
from notifkit.worker import Entry
from notifkit.worker.scripts import RELEASE_MARKS

STREAM = "ns:notifkit:stream:enriched:normal"


def entry(entry_id: str, **payload: object) -> Entry:
    return Entry(STREAM, entry_id, dict(payload), attempt=1)


@pytest.fixture
async def fake() -> AsyncIterator[fakeredis.FakeAsyncRedis]:
    client = fakeredis.FakeAsyncRedis()
    yield client
    await client.aclose()


@pytest.fixture
def dedup(fake: fakeredis.FakeAsyncRedis) -> Dedup:
    return Dedup(fake, Keys("ns"), "engine", ttl_s=3600)


MARK = "ns:notif:processed:engine:k1"


def test_an_entry_owns_its_marks_by_stream_and_id_or_by_what_it_replays() -> None:
    assert entry("1-0").owner == f"{STREAM}/1-0"
    assert entry("9-0", _replayOf=f"{STREAM}/1-0").owner == f"{STREAM}/1-0"
    assert entry("9-0", _replayOf=42).owner == f"{STREAM}/9-0"  # not a string: ignored


async def test_the_first_claim_wins_and_records_the_mark_on_the_entry(
    dedup: Dedup, fake: fakeredis.FakeAsyncRedis
) -> None:
    first = entry("1-0")
    assert await dedup.claim(first, "k1") is True
    assert first.marks == [MARK]
    assert await fake.get(MARK) == f"{STREAM}/1-0".encode()
    assert 3590 < await fake.ttl(MARK) <= 3600


async def test_another_entry_with_the_same_key_is_a_duplicate(
    dedup: Dedup, fake: fakeredis.FakeAsyncRedis
) -> None:
    await dedup.claim(entry("1-0"), "k1")
    second = entry("2-0")
    assert await dedup.claim(second, "k1") is False
    assert second.marks == []  # nothing of its own to release if it fails
    assert await fake.get(MARK) == f"{STREAM}/1-0".encode()


async def test_the_same_entry_claiming_again_may_proceed(dedup: Dedup) -> None:
    # A reclaimed retry is a new Entry object for the same stream entry.
    await dedup.claim(entry("1-0"), "k1")
    retry = Entry(STREAM, "1-0", {}, attempt=2, reclaimed=True)
    assert await dedup.claim(retry, "k1") is True
    assert retry.marks == [MARK]


async def test_a_replay_may_proceed_and_an_impostor_may_not(dedup: Dedup) -> None:
    await dedup.claim(entry("1-0"), "k1")
    assert await dedup.claim(entry("9-0", _replayOf=f"{STREAM}/1-0"), "k1") is True
    assert await dedup.claim(entry("9-1", _replayOf=f"{STREAM}/5-0"), "k1") is False


async def test_claim_many_answers_per_claim_in_order(
    dedup: Dedup, fake: fakeredis.FakeAsyncRedis
) -> None:
    a, b, c = entry("1-0"), entry("2-0"), entry("3-0")
    assert await dedup.claim_many([]) == []
    assert await dedup.claim_many([(a, "k1", None), (b, "k1", None), (c, "k2", 60)]) == [
        True, False, True,
    ]
    assert (a.marks, b.marks, c.marks) == ([MARK], [], ["ns:notif:processed:engine:k2"])
    assert 0 < await fake.ttl("ns:notif:processed:engine:k2") <= 60


async def test_a_caller_key_window_overrides_the_default(
    fake: fakeredis.FakeAsyncRedis,
) -> None:
    enricher = Dedup(fake, Keys("ns"), "enricher", ttl_s=3600)
    await enricher.claim(entry("1-0"), "p1:abc", ttl_s=24 * 3600)
    assert 24 * 3600 - 10 < await fake.ttl("ns:notif:processed:enricher:p1:abc") <= 86400


async def test_extend_lengthens_a_mark_but_never_shortens_it(
    dedup: Dedup, fake: fakeredis.FakeAsyncRedis
) -> None:
    await dedup.claim(entry("1-0"), "k1")
    await dedup.extend("k1", 7200)
    assert 7190 < await fake.ttl(MARK) <= 7200
    await dedup.extend("k1", 60)
    assert await fake.ttl(MARK) > 7000
    await dedup.extend("missing", 60)  # no mark, nothing to extend
    assert await fake.exists("ns:notif:processed:engine:missing") == 0


def test_an_unknown_stage_is_refused(fake: fakeredis.FakeAsyncRedis) -> None:
    with pytest.raises(ValueError, match="unknown dedup stage"):
        Dedup(fake, Keys(), "sender", ttl_s=60)


async def test_release_deletes_only_marks_the_entry_still_owns(
    dedup: Dedup, fake: fakeredis.FakeAsyncRedis
) -> None:
    # Given an entry that claimed two marks, one of which has since expired and been claimed
    # by another entry
    release = fake.register_script(RELEASE_MARKS)
    failing = entry("1-0")
    await dedup.claim_many([(failing, "k1", None), (failing, "k2", None)])
    await fake.delete("ns:notif:processed:engine:k2")
    await dedup.claim(entry("2-0"), "k2")

    # When the failing entry releases its marks
    released = await release(keys=failing.marks, args=[failing.owner])

    # Then only its own mark is gone; the other entry's claim stands
    assert released == 1
    assert await fake.exists(MARK) == 0
    assert await fake.get("ns:notif:processed:engine:k2") == f"{STREAM}/2-0".encode()
