"""Provisional dedup marks through the worker, on real Redis (CONTRACT §4).

A mark holds its owner (the stream entry that claimed it), so: a failed attempt gives its
marks back; a retry of the same entry, even after a crash left the mark behind, may proceed;
a different entry with the same key is a duplicate; a DLQ replay acts as the original.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, cast

import pytest
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.dedup import Dedup, engine_key
from notifkit.keys import Keys
from notifkit.worker import Entry

if TYPE_CHECKING:
    from .conftest import Add, Payloads, Pending, WorkerFactory

WAIT_S = 10.0


class Sender:
    """An engine-like stage: claims ``engine_key(eventId, userId, email)`` for each entry,
    skips duplicates, then "sends". The payload steers it: ``failFirst`` fails attempt 1,
    ``hang`` never finishes attempt 1."""

    def __init__(self, redis: Redis, settings: Settings) -> None:
        self.dedup = Dedup(redis, Keys(settings.namespace), "engine", settings.idempotency_ttl_s)
        self.claims: list[tuple[str, int, bool]] = []  # (entry id, attempt, allowed)
        self.sent: list[str] = []
        self.hanging = asyncio.Event()

    @staticmethod
    def key_of(payload: dict[str, Any]) -> str:
        return engine_key(payload["eventId"], payload["userId"], "email")

    async def __call__(self, batch: list[Entry]) -> None:
        allowed = await self.dedup.claim_many([(e, self.key_of(e.payload), None) for e in batch])
        for entry, ok in zip(batch, allowed, strict=True):
            self.claims.append((entry.id, entry.attempt, ok))
            if not ok:
                continue  # a duplicate: acked without sending
            if entry.attempt == 1 and entry.payload.get("hang"):
                self.hanging.set()
                await asyncio.Event().wait()
            if entry.attempt == 1 and entry.payload.get("failFirst"):
                entry.fail(RuntimeError("provider timeout"))
                continue
            self.sent.append(entry.id)


@pytest.fixture
def sender(redis: Redis, worker_settings: Settings) -> Sender:
    return Sender(redis, worker_settings)


@pytest.mark.parametrize("who", ["stage", "worker"])
async def test_a_failed_attempt_releases_its_mark_and_the_retry_claims_it(
    make_worker: WorkerFactory, redis: Redis, keys: Keys, add: Add, pending: Pending,
    sender: Sender, who: str,
) -> None:
    stream = keys.enriched("normal")
    payload = {"eventId": "ev-1", "userId": "u-1", "failFirst": True}
    mark = keys.processed("engine", Sender.key_of(payload))
    worker = make_worker(sender, **claimed_by(who, sender))
    entry_id = await add(stream, payload)

    # When the first attempt claims the mark and then fails
    await worker.run_until_idle(reclaim=False)

    # Then the mark is gone again
    assert sender.claims == [(entry_id, 1, True)]
    assert await redis.exists(mark) == 0

    # And the retry claims it afresh, sends, and leaves the mark in place (owned by the entry)
    await worker.run_until_idle()
    assert sender.claims == [(entry_id, 1, True), (entry_id, 2, True)]
    assert sender.sent == [entry_id]
    assert cast(bytes, await redis.get(mark)).decode() == f"{stream}/{entry_id}"
    assert 0 < await redis.ttl(mark) <= 3600
    assert await pending(stream, worker.group) == 0


def claimed_by(who: str, sender: Sender) -> dict[str, Any]:
    """The worker's options for a mark claimed by the stage itself (``Dedup.claim_many``), or
    by the worker in the round trip that counts the attempt (``claim_key``, as the enricher
    and delivery claim theirs)."""
    if who == "stage":
        return {}
    return {"claim_key": lambda _stream, payload: sender.dedup.mark_of(Sender.key_of(payload))}


@pytest.mark.parametrize("who", ["stage", "worker"])
async def test_a_crash_after_claiming_does_not_swallow_the_retry(
    make_worker: WorkerFactory, redis: Redis, keys: Keys, add: Add, pending: Pending,
    sender: Sender, who: str,
) -> None:
    # Given a worker that claimed the mark and then died before acking (stopped with no
    # grace: its batch is cancelled, nothing is released or acked)
    stream = keys.enriched("normal")
    payload = {"eventId": "ev-2", "userId": "u-2", "hang": True}
    mark = keys.processed("engine", Sender.key_of(payload))
    crashed = make_worker(sender, consumer="engine-host-a-1", **claimed_by(who, sender))
    entry_id = await add(stream, payload)
    await crashed.start()
    await asyncio.wait_for(sender.hanging.wait(), WAIT_S)
    await crashed.stop(grace_s=0)
    assert cast(bytes, await redis.get(mark)).decode() == f"{stream}/{entry_id}"
    assert await pending(stream, crashed.group) == 1

    # When another worker reclaims the entry
    survivor = make_worker(sender, consumer="engine-host-b-1", **claimed_by(who, sender))
    await survivor.run_until_idle()

    # Then the retry finds its own mark, proceeds and sends: the entry is not its own duplicate
    assert sender.claims == [(entry_id, 1, True), (entry_id, 2, True)]
    assert sender.sent == [entry_id]
    assert await pending(stream, crashed.group) == 0


async def test_a_second_delivery_of_the_same_content_is_suppressed(
    make_worker: WorkerFactory, keys: Keys, add: Add, pending: Pending, sender: Sender,
) -> None:
    # Given the same notification enqueued twice (two entries, same dedup key), once on
    # each of two priorities, and handled by two different workers
    payload = {"eventId": "ev-3", "userId": "u-3"}
    first_id = await add(keys.enriched("normal"), payload)
    await make_worker(sender, consumer="engine-host-a-1").run_until_idle()
    second_id = await add(keys.enriched("low"), payload)
    other = make_worker(sender, consumer="engine-host-b-1")
    await other.run_until_idle()

    # Then it is sent once; the second entry is recognised as a duplicate and acked
    assert sender.claims == [(first_id, 1, True), (second_id, 1, False)]
    assert sender.sent == [first_id]
    assert other.stats.processed == 1
    for stream in keys.enriched_all():
        assert await pending(stream, other.group) == 0


async def test_two_entries_with_one_key_in_the_same_batch_send_once(
    make_worker: WorkerFactory, add: Add, keys: Keys, sender: Sender,
) -> None:
    payload = {"eventId": "ev-4", "userId": "u-4"}
    first_id = await add(keys.enriched("normal"), payload)
    second_id = await add(keys.enriched("normal"), payload)

    await make_worker(sender).run_until_idle()

    assert sender.claims == [(first_id, 1, True), (second_id, 1, False)]
    assert sender.sent == [first_id]


async def test_a_dlq_replay_acts_as_the_original_owner_of_its_marks(
    make_worker: WorkerFactory, redis: Redis, worker_settings: Settings, keys: Keys,
    add: Add, payloads: Payloads, pending: Pending, sender: Sender,
) -> None:
    # Given an entry that claimed its mark, crashed on its only allowed attempt, and was
    # dead-lettered by the sweep with the mark still held
    stream = keys.enriched("normal")
    payload = {"eventId": "ev-5", "userId": "u-5", "hang": True}
    mark = keys.processed("engine", Sender.key_of(payload))
    one_try = worker_settings.replace(max_attempts=1)
    crashed = make_worker(sender, settings=one_try, consumer="engine-host-a-1")
    entry_id = await add(stream, payload)
    await crashed.start()
    await asyncio.wait_for(sender.hanging.wait(), WAIT_S)
    await crashed.stop(grace_s=0)
    sweeper = make_worker(sender, settings=one_try, consumer="engine-host-b-1")
    await sweeper.run_until_idle()
    [dead] = await payloads(keys.dlq)
    assert dead["entryId"] == entry_id
    assert dead["replayOf"] == f"{stream}/{entry_id}"
    assert await redis.exists(mark) == 1

    # When it is replayed (a new entry carrying `_replayOf`) ...
    replay_id = await add(stream, {**dead["payload"], "hang": False,
                                   "_replayOf": dead["replayOf"]})
    # ... and, separately, something else claims the same key under another owner
    impostor_id = await add(stream, {**dead["payload"], "hang": False,
                                     "_replayOf": f"{stream}/0-1"})
    await sweeper.run_until_idle()

    # Then the replay may proceed and sends; the impostor is a duplicate
    assert (replay_id, 1, True) in sender.claims
    assert (impostor_id, 1, False) in sender.claims
    assert sender.sent == [replay_id]
    assert await pending(stream, sweeper.group) == 0
