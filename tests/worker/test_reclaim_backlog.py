"""A reclaim sweep that runs out of free slots comes back soon, not a whole interval later.

Found by the postgres_outage scenario: after a 3 s outage the entries that failed meanwhile
were retried one worker-capacity per RECLAIM_INTERVAL_SECONDS, so recovery took ~20 s (with the
production interval of 60 s, 10,000 pending entries would take over three hours).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

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
