"""A critical entry never waits for a batch of low-priority work (CONTRACT §3.2).

Found by the priority_isolation scenario: with every slot busy on a low backlog, a critical
entry waited for a whole low batch to finish at every stage (~0.5 s end to end).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from notifkit.config import Settings
from notifkit.keys import Keys
from notifkit.worker import PRIORITY_RESERVE_DIVISOR, Entry, batch_stream

if TYPE_CHECKING:
    from .conftest import Add, WorkerFactory


async def test_a_critical_entry_is_taken_while_low_batches_hold_every_other_slot(
    make_worker: WorkerFactory, worker_settings: Settings, keys: Keys, add: Add,
) -> None:
    # Given a running worker whose low batches never finish until released, and a backlog of
    # low entries far larger than its capacity
    concurrency = 2 * PRIORITY_RESERVE_DIVISOR
    release = asyncio.Event()
    critical_seen = asyncio.Event()
    low_in_flight = 0

    async def process(batch: list[Entry]) -> None:
        nonlocal low_in_flight
        if any(e.payload["p"] == "critical" for e in batch):
            critical_seen.set()
            return
        low_in_flight += len(batch)
        await release.wait()

    worker = make_worker(process, settings=worker_settings.replace(
        worker_concurrency=concurrency, read_block_ms=50))
    for _ in range(5 * concurrency):
        await add(keys.enriched("low"), {"p": "low"})
    await worker.start()
    for _ in range(400):  # bounded wait until the low work fills what it may
        if low_in_flight >= concurrency - concurrency // PRIORITY_RESERVE_DIVISOR:
            break
        await asyncio.sleep(0.005)

    # When a critical entry arrives while every low batch is still running
    await add(keys.enriched("critical"), {"p": "critical"})

    # Then it is processed without any low batch finishing first
    await asyncio.wait_for(critical_seen.wait(), timeout=2.0)
    assert low_in_flight == concurrency - concurrency // PRIORITY_RESERVE_DIVISOR
    release.set()


async def test_a_read_that_drained_every_stream_is_followed_by_one_blocking_read(
    make_worker: WorkerFactory, worker_settings: Settings, keys: Keys, add: Add,
) -> None:
    # Given an idle worker on three priority streams, reads counted by how they were made
    reads: list[tuple[int, bool]] = []  # (streams read at once, blocking)
    seen: list[str] = []
    arrived = asyncio.Queue[str]()

    async def process(batch: list[Entry]) -> None:
        for e in batch:
            seen.append(e.payload["p"])
            arrived.put_nowait(e.payload["p"])

    worker = make_worker(process, settings=worker_settings.replace(read_block_ms=2000))
    real_xread = worker._xread

    async def counted(streams: dict[str, str], count: int, block_ms: int | None) -> list:  # type: ignore[type-arg]
        reads.append((len(streams), block_ms is not None))
        return await real_xread(streams, count, block_ms)

    worker._xread = counted  # type: ignore[method-assign]
    await worker.start()
    for _ in range(500):  # until the worker waits in its first blocking read
        if any(blocking for _n, blocking in reads):
            break
        await asyncio.sleep(0.01)

    # When single entries arrive one at a time on different streams
    for p in ("normal", "low", "critical", "normal"):
        await add(keys.enriched(p), {"p": p})
        assert await asyncio.wait_for(arrived.get(), 5) == p

    # Then each was taken by the blocking read on all three streams, with no round of
    # per-stream polls in between: the reply showed every stream empty.
    assert seen == ["normal", "low", "critical", "normal"]
    polls = [r for r in reads if not r[1]]
    assert polls == [(1, False)] * 3  # only the three before the very first blocking read
    assert all(r == (3, True) for r in reads if r[1])


async def test_entries_of_several_streams_read_together_form_one_batch_per_stream(
    make_worker: WorkerFactory, keys: Keys, add: Add,
) -> None:
    # Given entries already waiting on the critical and the low stream
    for n in range(3):
        await add(keys.enriched("low"), {"p": "low", "n": n})
    await add(keys.enriched("critical"), {"p": "critical", "n": 0})
    batches: list[list[str]] = []
    streams_seen: list[str | None] = []

    async def process(batch: list[Entry]) -> None:
        batches.append([e.payload["p"] for e in batch])
        streams_seen.append(batch_stream.get())

    # When one read takes them all
    worker = make_worker(process)
    await worker.run_until_idle()

    # Then the critical entry is a batch of its own, not one more entry of the low batch,
    # and each batch knows its stream
    assert batches == [["critical"], ["low", "low", "low"]]
    assert streams_seen == [keys.enriched("critical"), keys.enriched("low")]
