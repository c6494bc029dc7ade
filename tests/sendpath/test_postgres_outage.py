"""The send path while PostgreSQL is away: stalled (it keeps connections open and answers
nothing) or down (it resets and refuses them), through a proxy the test breaks and mends."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.db.pool import QUERY_TIMEOUT_S
from notifkit.keys import Keys
from notifkit.services.delivery import DeliveryService
from notifkit.services.engine import EngineService
from notifkit.services.enricher import EnricherService
from notifkit.streams import decode
from notifkit.worker import Entry
from simulators import SimulatorServer
from tests.support.pg_proxy import PostgresProxy
from tests.support.streams import xrange

from .conftest import ServiceFactory
from .helpers import add_template, add_user, drain, send

# Bounds a regression so it fails instead of hanging; never reached when the code is right.
HANG_S = 60.0


async def test_a_delivery_batch_caught_in_a_postgres_stall_fails_instead_of_hanging(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Delivery's queries had no time limit: a PostgreSQL that stopped answering without
    closing its connections held a batch, and every slot it filled, for as long as the stall
    lasted. Its pool now limits each query (QUERY_TIMEOUT_S, as the api's does; 1 s here)."""
    assert DeliveryService.query_timeout_s == QUERY_TIMEOUT_S
    monkeypatch.setattr(DeliveryService, "query_timeout_s", 1.0)
    # Given a task waiting for delivery, and a delivery service reaching PostgreSQL through a
    # proxy
    await add_user(db, project, "u1", contacts=[("email", "u1@example.com")])
    await add_template(db, project, "t", {"email": {"subject": "s", "text": "t"}})
    await send(redis, keys, db, project, "t", "u1")
    await drain(await services(EnricherService), await services(EngineService))
    [(entry_id, fields)] = await xrange(redis, keys.outbound("normal"))
    async with PostgresProxy(sim_settings) as proxy:
        delivery = await services(DeliveryService, proxy.settings)

        # When PostgreSQL stops answering while the batch runs
        proxy.stall()
        batch = [Entry(keys.outbound("normal"), entry_id.decode(), decode(fields), attempt=1)]
        running = asyncio.create_task(delivery.process(batch))
        done, _ = await asyncio.wait({running}, timeout=HANG_S)

        # Then the batch fails with the query's timeout, and nothing was sent
        assert running in done, "the batch was still waiting for a stalled PostgreSQL"
        assert isinstance(running.exception(), TimeoutError)
        assert await sim.messages("resend") == []
        delivery.pool.terminate()  # its connections are stalled: closing them would wait
