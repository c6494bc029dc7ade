"""A worker of priority streams shares one pool of ``DB_MAX_CONNECTIONS`` between its batches,
and a critical batch waiting for a connection gets the next one freed, ahead of low batches
that asked before it (CONTRACT §7: each service opens one pool of that size)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from notifkit.config import Settings
from notifkit.db.pool import create_pool
from notifkit.db.priority_pool import PriorityGate, PriorityPool
from notifkit.keys import Keys
from notifkit.services.base import WorkerService
from notifkit.worker import Entry
from tests.support.waiting import until

if TYPE_CHECKING:
    from .conftest import Add


class _Probe(WorkerService):
    """Holds the one connection with the first batch until ``release`` is set, so every later
    batch has to wait for it; records the order in which batches got a connection."""

    name = "engine"

    def __init__(self, settings: Settings, **options: Any) -> None:
        super().__init__(settings, **options)
        self.order: list[str] = []
        self.holding = asyncio.Event()
        self.release = asyncio.Event()

    def streams(self) -> list[str]:
        return self.keys.enriched_all()

    async def process(self, batch: list[Entry]) -> None:
        async with self.pool.acquire() as conn:
            self.order.append(batch[0].stream)
            if len(self.order) == 1:
                self.holding.set()
                await self.release.wait()
            assert await conn.fetchval("SELECT 1") == 1


def _waiting(pool: PriorityPool, n: int) -> Callable[[], bool]:
    return lambda: pool.waiting == n


async def test_a_critical_batch_gets_the_next_connection_before_earlier_low_ones(
    settings: Settings, keys: Keys, add: Add,
) -> None:
    probe = _Probe(settings.replace(db_max_connections=1))
    await probe.start()
    try:
        pool = probe.pool
        await add(keys.enriched("low"), {"n": 0})
        await asyncio.wait_for(probe.holding.wait(), 10)
        for n in range(1, 4):  # one at a time, so each is a batch of its own
            await add(keys.enriched("low"), {"n": n})
            await until(_waiting(pool, n))
        await add(keys.enriched("critical"), {"n": 9})
        await until(lambda: pool.waiting == 4)
        probe.release.set()
        await until(lambda: len(probe.order) == 5)
        low, critical = keys.enriched("low"), keys.enriched("critical")
        assert probe.order == [low, critical, low, low, low]
        assert pool.get_size() == 1  # the service's one pool; nothing beside it
    finally:
        probe.release.set()
        await probe.stop()


async def test_the_critical_waiter_is_served_first_on_one_pooled_connection(
    settings: Settings,
) -> None:
    urgent_tasks: set[asyncio.Task[Any] | None] = set()
    pool = await create_pool(settings, max_size=1,
                             urgent=lambda: asyncio.current_task() in urgent_tasks)
    order: list[str] = []

    async def query(label: str) -> None:
        async with pool.acquire() as conn:
            order.append(label)
            await conn.fetchval("SELECT 1")

    try:
        held = await pool.acquire()
        low = [asyncio.create_task(query(f"low{n}")) for n in range(3)]
        await until(lambda: pool.waiting == 3)
        critical = asyncio.create_task(query("critical"))
        urgent_tasks.add(critical)
        await until(lambda: pool.waiting == 4)
        await pool.release(held)
        await asyncio.gather(*low, critical)
        assert order == ["critical", "low0", "low1", "low2"]
        assert pool.get_size() == 1  # no connection beyond DB_MAX_CONNECTIONS
    finally:
        await pool.close()


async def test_pool_methods_queue_through_the_gate_and_release_their_permit(
    settings: Settings,
) -> None:
    pool = await create_pool(settings, max_size=2)

    async def take() -> Any:
        return await pool.acquire()

    try:
        results = await asyncio.gather(*(pool.fetchval("SELECT $1::int", n) for n in range(20)))
        assert results == list(range(20))
        # Every permit came back: two connections can be held at once again, a third waits.
        first, second = await pool.acquire(), await pool.acquire()
        third = asyncio.create_task(take())
        await until(lambda: pool.waiting == 1)
        assert not third.done()
        await pool.release(first)
        conn = await asyncio.wait_for(third, 10)
        await pool.release(conn)
        await pool.release(second)
        await pool.release(second)  # a second release of one connection frees no permit
        assert pool.waiting == 0
        held = [await pool.acquire(), await pool.acquire()]
        extra = asyncio.create_task(take())
        await until(lambda: pool.waiting == 1)
        for conn in held:
            await pool.release(conn)
        await pool.release(await asyncio.wait_for(extra, 10))
    finally:
        await pool.close()


async def test_a_cancelled_waiter_passes_its_turn_on() -> None:
    gate = PriorityGate(1)
    await gate.acquire(lambda: False)
    cancelled = asyncio.create_task(gate.acquire(lambda: True))
    later = asyncio.create_task(gate.acquire(lambda: False))
    await until(lambda: gate.waiting == 2)
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    gate.release()
    await asyncio.wait_for(later, 10)  # the cancelled waiter was skipped

    # Handed the permit, then cancelled before it ran: it passes the permit on.
    handed = asyncio.create_task(gate.acquire(lambda: True))
    after = asyncio.create_task(gate.acquire(lambda: False))
    await until(lambda: gate.waiting == 2)
    gate.release()
    handed.cancel()
    await asyncio.gather(handed, return_exceptions=True)
    assert handed.cancelled()
    await asyncio.wait_for(after, 10)
