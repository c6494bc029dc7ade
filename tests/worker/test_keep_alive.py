"""A worker keeps the entries it is still working on from other processes' reclaim sweeps.

Found by the crash_reclaim scenario: with RECLAIM_MIN_IDLE_SECONDS=1, a restarted delivery
process reclaimed six entries a live one was still sending (its batch had spent over a second
between the read and the provider call) and Twilio got those SMS twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.keys import Keys
from notifkit.worker import Entry, StreamWorker
from notifkit.worker import stream_worker as worker_module
from tests.support.waiting import until

if TYPE_CHECKING:
    from .conftest import Add, Pending, WorkerFactory


async def owner(redis: Redis, stream: str, group: str, entry_id: str) -> str | None:
    rows: Any = await redis.xpending_range(stream, group, min=entry_id, max=entry_id, count=1)
    return rows[0]["consumer"].decode() if rows else None


@dataclass
class Contest:
    """A worker whose batches wait for ``release`` and another process's reclaim sweeps,
    on one stream whose idle time is 1 s."""

    busy: StreamWorker
    other: StreamWorker
    stream: str
    release: asyncio.Event = field(default_factory=asyncio.Event)
    done: list[str] = field(default_factory=list)
    taken_over: list[str] = field(default_factory=list)

    async def sweep(self, seconds: float) -> None:
        """The other process sweeping for idle entries every 0.1 s for ``seconds``: idle
        time is wall time, so the sweep takes as long as it must."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await self.other.reclaim_once()
            await asyncio.sleep(0.1)


@pytest.fixture
def contest(make_worker: WorkerFactory, worker_settings: Settings, keys: Keys) -> Contest:
    stream = keys.enriched("normal")
    settings = worker_settings.replace(reclaim_min_idle_s=1.0, reclaim_interval_s=60.0)
    release = asyncio.Event()
    done: list[str] = []
    taken_over: list[str] = []

    async def slow(batch: list[Entry]) -> None:
        await release.wait()
        done.extend(e.id for e in batch)

    async def record(batch: list[Entry]) -> None:
        taken_over.extend(e.id for e in batch)

    busy = make_worker(slow, settings=settings, streams=[stream], consumer="engine-busy-1")
    other = make_worker(record, settings=settings, streams=[stream], consumer="engine-other-2")
    return Contest(busy, other, stream, release, done, taken_over)


async def test_a_slow_batch_is_not_taken_over_while_its_worker_lives(
    contest: Contest, redis: Redis, add: Add, pending: Pending,
) -> None:
    busy = contest.busy
    # Given a live worker whose batch takes far longer than RECLAIM_MIN_IDLE_SECONDS
    await busy.start()
    entry_id = await add(contest.stream, {"n": 1})
    await until(lambda: busy.in_flight == 1)

    # When another process sweeps for idle entries for 2.5 times that long
    await contest.sweep(2.5)

    # Then it took nothing: the entry is still the busy worker's, done once when it finishes
    assert contest.taken_over == []
    assert await owner(redis, contest.stream, busy.group, entry_id) == "engine-busy-1"
    contest.release.set()
    await until(lambda: busy.in_flight == 0)
    assert contest.done == [entry_id]
    assert await pending(contest.stream, busy.group) == 0


@pytest.fixture
async def holding(make_worker: WorkerFactory, worker_settings: Settings, keys: Keys,
                  add: Add) -> AsyncIterator[Callable[[int], Awaitable[StreamWorker]]]:
    """A worker (idle time 1 s) that took ``n`` new entries of enriched:normal and holds
    them in one batch until the test ends."""
    hold = asyncio.Event()

    async def stuck(batch: list[Entry]) -> None:
        await hold.wait()

    async def take(n: int) -> StreamWorker:
        stream = keys.enriched("normal")
        worker = make_worker(stuck, settings=worker_settings.replace(reclaim_min_idle_s=1.0),
                             streams=[stream], consumer="engine-first-1")
        await worker.ensure_groups()
        for i in range(n):
            await add(stream, {"n": i})
        await worker._read_new(block_ms=None)
        assert worker.in_flight == n
        return worker

    yield take
    hold.set()


async def test_an_entry_another_process_took_over_is_left_to_it(
    holding: Callable[[int], Awaitable[StreamWorker]], redis: Redis, keys: Keys,
) -> None:
    stream = keys.enriched("normal")
    first = await holding(1)
    [entry_id] = [entry.id for entry in first._in_flight.values()]
    # Given the entry taken over by another process (this one stalled past the idle time)
    await redis.xclaim(stream, first.group, "engine-second-2", 0, [entry_id], justid=True)

    # When the first worker touches what it still believes is its own
    touched = await first.keep_alive()

    # Then it touched nothing and the entry stays with the process that took it
    assert touched == 0
    assert await owner(redis, stream, first.group, entry_id) == "engine-second-2"


async def test_a_batch_stuck_past_the_limit_is_no_longer_kept(
    holding: Callable[[int], Awaitable[StreamWorker]], redis: Redis, keys: Keys,
) -> None:
    stream = keys.enriched("normal")
    one = await holding(2)
    kept, stale = sorted(one._in_flight.values(), key=lambda e: e.id)
    # Given one entry taken longer ago than KEEP_ALIVE_LIMIT idle times
    stale.taken_at -= worker_module.KEEP_ALIVE_LIMIT * one.settings.reclaim_min_idle_s + 1
    await asyncio.sleep(0.2)

    # When the worker keeps its entries alive
    touched = await one.keep_alive()

    # Then only the other one's idle time starts again
    assert touched == 1
    rows: Any = await redis.xpending_range(stream, one.group, min="-", max="+", count=10)
    idle = {r["message_id"].decode(): r["time_since_delivered"] for r in rows}
    assert idle[kept.id] < idle[stale.id]
    assert idle[stale.id] >= 200


async def test_a_stopping_worker_keeps_its_unfinished_batch_from_other_processes(
    contest: Contest, redis: Redis, add: Add, pending: Pending,
) -> None:
    """Found by running a fleet with RECLAIM_MIN_IDLE_SECONDS=5 and SHUTDOWN_GRACE_SECONDS=10:
    a delivery process finishing its batch after SIGTERM had its entries reclaimed by another
    one, and both sent the same e-mails over SMTP."""
    busy = contest.busy
    await busy.start()
    entry_id = await add(contest.stream, {"n": 1})
    await until(lambda: busy.in_flight == 1)

    # Given the worker stopping, its grace far longer than RECLAIM_MIN_IDLE_SECONDS, while
    # its batch is still running
    stopping = asyncio.create_task(busy.stop(grace_s=60.0))
    await until(lambda: busy._stopping.is_set())

    # When another process sweeps for idle entries for 2.5 times that idle time
    await contest.sweep(2.5)

    # Then it took nothing: the stopping worker finishes and acks the entry, done once
    assert contest.taken_over == []
    assert await owner(redis, contest.stream, busy.group, entry_id) == "engine-busy-1"
    contest.release.set()
    await stopping
    assert contest.done == [entry_id]
    assert await pending(contest.stream, busy.group) == 0
