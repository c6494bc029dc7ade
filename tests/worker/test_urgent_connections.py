"""A worker of priority streams keeps PostgreSQL connections for its critical batches: with a
low backlog every pooled connection is busy with low batches, and a critical batch must not
queue behind them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import asyncpg

from notifkit.config import Settings
from notifkit.keys import Keys
from notifkit.services.base import URGENT_CONNECTIONS, WorkerService
from notifkit.worker import Entry

if TYPE_CHECKING:
    from .conftest import Add


class _Probe(WorkerService):
    name = "engine"

    def __init__(self, settings: Settings, **options: Any) -> None:
        super().__init__(settings, **options)
        self.seen: list[tuple[str, asyncpg.Pool, int]] = []

    def streams(self) -> list[str]:
        return self.keys.enriched_all()

    async def process(self, batch: list[Entry]) -> None:
        pool = self.pool
        self.seen.append((batch[0].stream, pool, await pool.fetchval("SELECT 1")))


async def test_critical_batches_query_through_connections_of_their_own(
    settings: Settings, keys: Keys, add: Add,
) -> None:
    probe = _Probe(settings.replace(db_max_connections=1))
    try:
        await add(keys.enriched("low"), {"n": 1})
        await add(keys.enriched("critical"), {"n": 2})
        assert await probe.run_until_idle() == 2

        by_stream = {stream: pool for stream, pool, _one in probe.seen}
        urgent, shared = by_stream[keys.enriched("critical")], by_stream[keys.enriched("low")]
        assert urgent is not shared
        assert shared is probe.db
        assert urgent.get_max_size() == URGENT_CONNECTIONS
        assert all(one == 1 for _s, _p, one in probe.seen)
        assert probe.pool is probe.db  # outside any batch: the service's own pool
    finally:
        await probe.close()
