"""Priority fill and bounded in-flight work (CONTRACT §3.1–3.2)."""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING

from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.keys import Keys
from notifkit.worker import Entry

if TYPE_CHECKING:
    from .conftest import Add, Pending, WorkerFactory


async def test_critical_entries_added_after_a_low_backlog_are_in_the_first_batch(
    make_worker: WorkerFactory, keys: Keys, add: Add, pending: Pending,
) -> None:
    # Given 200 low entries, then 2 normal and 3 critical ones
    batches: list[list[str]] = []

    async def process(batch: list[Entry]) -> None:
        batches.append([e.payload["p"] for e in batch])

    worker = make_worker(process, concurrency=10)
    for _ in range(200):
        await add(keys.enriched("low"), {"p": "low"})
    for _ in range(2):
        await add(keys.enriched("normal"), {"p": "normal"})
    for _ in range(3):
        await add(keys.enriched("critical"), {"p": "critical"})

    # When the worker drains
    await worker.run_until_idle()

    # Then the first read is filled critical first, then normal, then low, and dispatched
    # as one batch per stream in that order
    assert batches[:3] == [["critical"] * 3, ["normal"] * 2, ["low"] * 5]
    assert all(len(batch) <= 10 for batch in batches)
    assert sum(len(batch) for batch in batches) == 205
    for stream in keys.enriched_all():
        assert await pending(stream, worker.group) == 0


async def test_a_critical_entry_arriving_mid_backlog_jumps_the_queue(
    make_worker: WorkerFactory, keys: Keys, add: Add,
) -> None:
    # Given a worker busy with a low backlog
    batches: list[list[str]] = []

    async def process(batch: list[Entry]) -> None:
        if not batches:  # while the first low batch is being worked on, a critical one arrives
            await add(keys.enriched("critical"), {"p": "critical"})
        batches.append([e.payload["p"] for e in batch])

    worker = make_worker(process, concurrency=10)
    for _ in range(100):
        await add(keys.enriched("low"), {"p": "low"})

    await worker.run_until_idle()

    # Then the very next read takes it first, ahead of the remaining 90 low entries, as a
    # batch of its own
    assert batches[0] == ["low"] * 10
    assert batches[1] == ["critical"]
    assert batches[2] == ["low"] * 9


async def test_in_flight_work_never_exceeds_worker_concurrency(
    make_worker: WorkerFactory, redis: Redis, worker_settings: Settings, keys: Keys,
    add: Add, pending: Pending,
) -> None:
    # Given a running worker with capacity 7 and a reclaim sweep that runs all the time, a
    # backlog on every priority, and entries left pending by a consumer that died
    concurrency = 7
    settings = worker_settings.replace(
        worker_concurrency=concurrency, reclaim_interval_s=0.01, reclaim_min_idle_s=0.0,
        read_block_ms=20,
    )
    inside = 0
    max_inside = 0
    processed: set[tuple[str, str]] = set()
    rng = random.Random(7)

    async def process(batch: list[Entry]) -> None:
        nonlocal inside, max_inside
        inside += len(batch)
        max_inside = max(max_inside, inside)
        try:
            for _ in range(rng.randint(1, 4)):  # batches of uneven length, overlapping
                await asyncio.sleep(0.001)
        finally:
            inside -= len(batch)
        processed.update((e.stream, e.id) for e in batch)

    worker = make_worker(process, settings=settings)
    await worker.ensure_groups()
    total = 0
    for priority in ("critical", "normal", "low"):
        for n in range(60):
            await add(keys.enriched(priority), {"n": n})
            total += 1
    # a dead consumer took 20 entries of each priority and never acked them
    await redis.xreadgroup(
        worker.group, "engine-gone-1", dict.fromkeys(keys.enriched_all(), ">"), count=20
    )

    # When it runs until every entry has been processed
    await worker.start()
    for _ in range(2000):  # bounded wait for the condition, a few ms per turn
        if len(processed) >= total:
            break
        await asyncio.sleep(0.005)
    await worker.stop()

    # Then every entry was processed and at no moment were more than 7 in flight
    assert len(processed) == total
    assert max_inside <= concurrency
    assert worker.stats.max_in_flight <= concurrency
    for stream in keys.enriched_all():
        assert await pending(stream, worker.group) == 0
