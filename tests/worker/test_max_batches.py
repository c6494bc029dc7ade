"""``max_batches``: a stage that only talks to Redis and PostgreSQL keeps few batches in flight,
so entries that arrive meanwhile wait for the next read and go in one larger batch.
``max_batch_size``: delivery cuts a backlog into several batches that run side by side."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest

from notifkit.keys import Keys
from notifkit.worker import PRIORITY_RESERVE_DIVISOR, Entry, StreamWorker
from notifkit.worker import stream_worker as worker_module

if TYPE_CHECKING:
    from .conftest import Add, Pending, WorkerFactory


def record_reads(worker: StreamWorker) -> list[list[Any]]:
    """The arguments of every read command the worker sends from now on, in order."""
    reads: list[list[Any]] = []
    real_call = worker._call_rejoining

    async def recording_call(args: list[Any]) -> Any:
        reads.append(args)
        return await real_call(args)

    worker._call_rejoining = recording_call  # type: ignore[method-assign]
    return reads


async def test_entries_arriving_while_the_only_batch_runs_form_one_next_batch(
    make_worker: WorkerFactory, keys: Keys, add: Add, pending: Pending,
) -> None:
    stream = keys.enriched("normal")
    batches: list[list[int]] = []
    running = 0
    most_running = 0
    first_started = asyncio.Event()
    release_first = asyncio.Event()

    async def process(batch: list[Entry]) -> None:
        nonlocal running, most_running
        running += 1
        most_running = max(most_running, running)
        batches.append([e.payload["n"] for e in batch])
        if len(batches) == 1:
            first_started.set()
            await release_first.wait()
        running -= 1

    worker = make_worker(process, streams=[stream], concurrency=50, max_batches=1)
    await worker.start()
    await add(stream, {"n": 0})
    await asyncio.wait_for(first_started.wait(), 5)

    # While the first batch runs, nine more entries arrive: with room for 49 more entries but
    # no room for another batch, the worker does not read them yet.
    for n in range(1, 10):
        await add(stream, {"n": n})
    await asyncio.sleep(0.2)
    assert batches == [[0]]

    release_first.set()
    for _ in range(100):
        if sum(len(b) for b in batches) == 10 and await pending(stream, worker.group) == 0:
            break
        await asyncio.sleep(0.05)
    assert batches == [[0], list(range(1, 10))]
    assert most_running == 1


async def test_without_max_batches_new_entries_start_at_once(
    make_worker: WorkerFactory, keys: Keys, add: Add,
) -> None:
    stream = keys.enriched("normal")
    started = asyncio.Event()
    release = asyncio.Event()
    batches: list[list[int]] = []

    async def process(batch: list[Entry]) -> None:
        batches.append([e.payload["n"] for e in batch])
        started.set()
        await release.wait()

    worker = make_worker(process, streams=[stream], concurrency=50)
    await worker.start()
    await add(stream, {"n": 0})
    await asyncio.wait_for(started.wait(), 5)
    await add(stream, {"n": 1})
    for _ in range(100):
        if len(batches) == 2:
            break
        await asyncio.sleep(0.02)
    release.set()
    assert batches == [[0], [1]]


async def test_max_batch_size_splits_a_backlog_into_batches_that_run_together(
    make_worker: WorkerFactory, keys: Keys, add: Add, pending: Pending,
) -> None:
    stream = keys.outbound("normal")
    running = 0
    most_running = 0
    sizes: list[int] = []
    all_started = asyncio.Event()

    async def process(batch: list[Entry]) -> None:
        nonlocal running, most_running
        running += 1
        most_running = max(most_running, running)
        sizes.append(len(batch))
        if len(sizes) == 3:
            all_started.set()
        await asyncio.wait_for(all_started.wait(), 5)  # each batch waits for the others
        running -= 1

    for n in range(7):
        await add(stream, {"n": n})
    worker = make_worker(process, streams=[stream], concurrency=10, max_batch_size=3)
    await worker.start()
    await asyncio.wait_for(all_started.wait(), 5)
    for _ in range(100):
        if await pending(stream, worker.group) == 0:
            break
        await asyncio.sleep(0.02)

    # Ten slots, three per batch: the backlog of seven runs as 3 + 3 + 1, all at once
    assert sizes == [3, 3, 1]
    assert most_running == 3
    assert await pending(stream, worker.group) == 0


async def test_the_limit_is_per_priority_stream_so_critical_entries_never_wait_for_low_ones(
    make_worker: WorkerFactory, keys: Keys, add: Add, pending: Pending,
) -> None:
    # Given a worker of the three priority streams keeping one batch in flight per stream,
    # busy with a batch of low entries that does not end yet
    low, critical = keys.enriched("low"), keys.enriched("critical")
    seen: list[list[str]] = []
    low_started, release_low = asyncio.Event(), asyncio.Event()
    critical_done, second_low_done = asyncio.Event(), asyncio.Event()

    async def process(batch: list[Entry]) -> None:
        names = [e.payload["n"] for e in batch]
        seen.append(names)
        if names == ["low-1"]:
            low_started.set()
            await release_low.wait()
        elif names == ["crit"]:
            critical_done.set()
        elif names == ["low-2"]:
            second_low_done.set()

    worker = make_worker(process, streams=keys.enriched_all(), concurrency=50, max_batches=1)
    await worker.start()
    await add(low, {"n": "low-1"})
    await asyncio.wait_for(low_started.wait(), 5)

    # When a second low entry and then a critical one arrive
    await add(low, {"n": "low-2"})
    await add(critical, {"n": "crit"})

    # Then the critical one is processed while the low batch runs, and the second low entry
    # is not even read until that batch ends
    await asyncio.wait_for(critical_done.wait(), 5)
    assert seen == [["low-1"], ["crit"]]
    assert await pending(low, worker.group) == 1
    release_low.set()
    await asyncio.wait_for(second_low_done.wait(), 5)
    assert seen == [["low-1"], ["crit"], ["low-2"]]


async def test_a_stage_of_one_batch_per_stream_reads_every_stream_in_one_command(
    make_worker: WorkerFactory, keys: Keys, add: Add, pending: Pending,
) -> None:
    # Given a stage of one batch per stream, with work on the normal and low streams only
    streams = keys.enriched_all()
    seen: list[tuple[str, list[int]]] = []

    async def process(batch: list[Entry]) -> None:
        seen.append((batch[0].stream, [e.payload["n"] for e in batch]))

    worker = make_worker(process, streams=streams, concurrency=50, max_batches=1)
    reads = record_reads(worker)
    await worker.ensure_groups()
    await add(keys.enriched("normal"), {"n": 1})
    await add(keys.enriched("low"), {"n": 2})

    # When it reads
    taken = await worker._read_new(block_ms=None)

    # Then one command asked every stream, in priority order, and each stream got its batch
    assert taken == 2
    assert len(reads) == 1
    assert [str(arg) for arg in reads[0][3:6]] == streams
    await worker.run_until_idle(reclaim=False)
    assert sorted(seen) == sorted([(keys.enriched("normal"), [1]), (keys.enriched("low"), [2])])
    assert [await pending(s, worker.group) for s in streams] == [0, 0, 0]


async def test_one_read_fills_the_slots_from_critical_first_then_normal_then_low(
    make_worker: WorkerFactory, keys: Keys, add: Add,
) -> None:
    # Given backlogs on all three streams, more than the free slots together (CONTRACT §3.2)
    critical, normal, low = keys.enriched_all()
    for n in range(40):
        await add(low, {"n": n})
    for n in range(40):
        await add(critical, {"n": n})
    for n in range(10):
        await add(normal, {"n": n})
    taken_by: dict[str, int] = {}

    async def process(batch: list[Entry]) -> None:
        taken_by[batch[0].stream] = taken_by.get(batch[0].stream, 0) + len(batch)

    worker = make_worker(process, streams=keys.enriched_all(), concurrency=50, max_batches=1)
    await worker.ensure_groups()

    # When it reads once
    taken = await worker._read_new(block_ms=None)
    await asyncio.gather(*list(worker._tasks))

    # Then every critical entry was taken, normal ones filled what was left but the slots
    # kept for critical work, and no low entry took a slot
    reserve = 50 // PRIORITY_RESERVE_DIVISOR
    assert taken == 40 + (50 - 40 - reserve)
    assert taken_by == {critical: 40, normal: 50 - 40 - reserve}


async def test_the_streams_a_read_just_left_empty_are_not_polled_again_at_once(
    make_worker: WorkerFactory, keys: Keys, add: Add, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a stage of one batch per stream, its other streams polled every LANE_POLL_S while a
    # batch runs (made long here, so that only a poll made at once could be seen)
    monkeypatch.setattr(worker_module, "LANE_POLL_S", 30.0)
    started, release = asyncio.Event(), asyncio.Event()

    async def process(batch: list[Entry]) -> None:
        started.set()
        await release.wait()

    worker = make_worker(process, streams=keys.enriched_all(), concurrency=50, max_batches=1)
    calls = record_reads(worker)
    await worker.start()
    for _ in range(500):  # until the worker waits in a blocking read on every stream
        if calls and "BLOCK" in calls[-1]:
            break
        await asyncio.sleep(0.01)
    reads_before = len(calls)

    # When one entry arrives and that read takes it, leaving every stream empty
    await add(keys.enriched("normal"), {"n": 1})
    await asyncio.wait_for(started.wait(), 5)
    for _ in range(20):  # let the read loop run its course while the batch is in flight
        await asyncio.sleep(0.005)

    # Then the streams it just read are not asked again while the batch runs
    assert len(calls) == reads_before
    release.set()
    await worker.stop(grace_s=5)
