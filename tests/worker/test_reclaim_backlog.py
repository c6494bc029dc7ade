"""Reclaim sweeps under pressure. One that runs out of free slots comes back soon, not a whole
interval later; one that claims an entry whose batch settles meanwhile leaves it alone.

Found by the postgres_outage scenario: after a 3 s outage the entries that failed meanwhile
were retried one worker-capacity per RECLAIM_INTERVAL_SECONDS, so recovery took ~20 s (with the
production interval of 60 s, 10,000 pending entries would take over three hours).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import pytest
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.keys import Keys
from notifkit.worker import Entry

if TYPE_CHECKING:
    from .conftest import Add, Pending, WorkerFactory


async def test_a_sweep_cut_short_by_capacity_is_followed_soon_by_the_next(
    make_worker: WorkerFactory, worker_settings: Settings, redis: Redis, keys: Keys,
    add: Add, pending: Pending,
) -> None:
    # Given 20 entries left pending by a consumer that died, and a worker with 5 slots whose
    # batches hold their slots until released
    release = asyncio.Event()

    async def process(batch: list[Entry]) -> None:
        await release.wait()

    settings = worker_settings.replace(worker_concurrency=5, reclaim_interval_s=60.0,
                                       reclaim_min_idle_s=0.0)
    worker = make_worker(process, settings=settings, streams=[keys.enriched("normal")])
    await worker.ensure_groups()
    for n in range(20):
        await add(keys.enriched("normal"), {"n": n})
    await redis.xreadgroup(worker.group, "engine-gone-1", {keys.enriched("normal"): ">"},
                           count=20)

    # When a sweep fills every slot
    taken = await worker.reclaim_once()

    # Then it took what fitted, and the next sweep is due long before the interval is over
    assert taken == 5
    assert worker.next_reclaim_delay_s() < settings.reclaim_interval_s

    # And once a sweep finds nothing more to take, sweeps go back to the interval
    release.set()
    for _ in range(20):  # each round reclaims what fits once the previous batches finished
        if not await pending(keys.enriched("normal"), worker.group):
            break
        await worker.run_until_idle()
    assert await pending(keys.enriched("normal"), worker.group) == 0
    await worker.reclaim_once()
    assert worker.next_reclaim_delay_s() == settings.reclaim_interval_s


async def test_an_entry_settled_while_a_sweep_claims_it_is_not_processed_again(
    make_worker: WorkerFactory, keys: Keys, add: Add, pending: Pending,
) -> None:
    # Given an entry in flight, idle long enough for the sweep to claim it
    stream = keys.enriched("normal")
    processed: list[int] = []
    started, release = asyncio.Event(), asyncio.Event()

    async def process(batch: list[Entry]) -> None:
        processed.extend(e.payload["n"] for e in batch)
        started.set()
        await release.wait()

    worker = make_worker(process, streams=[stream])
    await worker.ensure_groups()
    await add(stream, {"n": 1})
    await worker._read_new(block_ms=None)
    await asyncio.wait_for(started.wait(), 5)

    # When its batch settles after the sweep's XAUTOCLAIM ran but before its reply is read
    real_xautoclaim = worker.redis.xautoclaim

    async def claim_then_let_the_batch_settle(*args: Any, **kwargs: Any) -> Any:
        reply = await real_xautoclaim(*args, **kwargs)
        release.set()
        await asyncio.gather(*list(worker._tasks))  # the batch settles
        assert not worker.in_flight
        return reply

    worker.redis.xautoclaim = claim_then_let_the_batch_settle  # type: ignore[method-assign]
    await asyncio.wait_for(worker.reclaim_once(), 5)
    await worker.run_until_idle(reclaim=False)

    # Then it was processed once, and nothing is left pending
    assert processed == [1]
    assert await pending(stream, worker.group) == 0


async def test_a_pending_entry_trimmed_away_is_reported_and_its_counter_deleted(
    make_worker: WorkerFactory, redis: Redis, keys: Keys, add: Add, pending: Pending,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An entry trimmed from its stream (MAXLEN) while pending can never be processed: the
    sweep that finds it gone says so and drops its attempt counter, instead of the work
    vanishing without a word and the counter staying for its TTL."""
    stream = keys.enriched("normal")

    async def process(batch: list[Entry]) -> None:
        pass

    worker = make_worker(process, streams=[stream])
    await worker.ensure_groups()
    entry_id = await add(stream, {"n": 1})
    await redis.xreadgroup(worker.group, "engine-host-killed-1", {stream: ">"}, count=1)
    counter = keys.attempts(worker.group, entry_id, stream)
    await redis.set(counter, 1, ex=7200)
    await redis.xtrim(stream, maxlen=0)

    with caplog.at_level(logging.WARNING, logger="notifkit.worker"):
        await worker.reclaim_once()

    assert await pending(stream, worker.group) == 0
    assert not await redis.exists(counter)
    [record] = [r for r in caplog.records if entry_id in r.getMessage()]
    assert "trimmed" in record.getMessage()
