"""The send path while PostgreSQL is away: stalled (it keeps connections open and answers
nothing) or down (it resets and refuses them), through a proxy the test breaks and mends."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.db.pool import QUERY_TIMEOUT_S
from notifkit.keys import Keys
from notifkit.server import REGISTRY, service_class
from notifkit.services.base import WorkerService
from notifkit.services.delivery import DeliveryService
from notifkit.services.engine import EngineService
from notifkit.services.enricher import EnricherService
from notifkit.services.events import EventsService
from notifkit.streams import decode, xadd
from notifkit.transports.base import Message, Outcome, SendResult
from notifkit.worker import Entry
from simulators import SimulatorServer
from tests.support.pg_proxy import PostgresProxy
from tests.support.streams import xrange

from .conftest import ServiceFactory
from .helpers import add_template, add_user, drain, send, timeline

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


def outage_settings(sim_settings: Settings) -> Settings:
    """Reclaim sweeps every 0.1 s: the attempt limit's worth of retry cycles fits in well
    under the outage the tests make."""
    return sim_settings.replace(reclaim_interval_s=0.1, reclaim_min_idle_s=0.1,
                                heartbeat_interval_s=0.1)


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Wait for ``check`` to hold; the deadline only turns a regression into a failure."""
    deadline = time.monotonic() + HANG_S
    while not await check():
        assert time.monotonic() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.02)


async def pending_total(redis: Redis, keys: Keys) -> int:
    total = 0
    for stream in keys.all_streams():
        if await redis.exists(stream):
            total += sum(int(g["pending"]) for g in await redis.xinfo_groups(stream))
    return total


async def test_workers_hold_their_work_through_a_postgres_outage_longer_than_every_retry(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, sim: SimulatorServer,
    sim_settings: Settings, caplog: pytest.LogCaptureFixture,
) -> None:
    """Every try during an outage counted against the entry's attempts, so an outage longer
    than the limit's worth of reclaim cycles dead-lettered all work in flight, with false
    notification:failed events. Now a worker whose batch meets the outage stops reading and
    reclaiming, gives the attempt back, and carries on once a probe gets an answer; a poison
    is still dead-lettered after exactly its attempt limit, for its own failure."""
    caplog.set_level(logging.INFO, logger="notifkit")
    settings = outage_settings(sim_settings)
    for i in range(15):
        await add_user(db, project, f"u{i:02d}", contacts=[("email", f"u{i:02d}@example.com")])
    await add_template(db, project, "t", {"email": {"subject": "s", "text": "t"}})
    async with PostgresProxy(settings) as proxy:
        stages = [cls(proxy.settings) for cls in (EnricherService, EngineService,
                                                   DeliveryService, EventsService)]
        enricher, engine, delivery = stages[:3]
        try:
            # Given work waiting at every stage: five tasks for delivery, five enriched
            # messages for the engine, five notifications for the enricher, and a poison for
            # each of the enricher and the engine
            for stage in stages:
                await stage.open()
            await send(redis, keys, db, project, "t", [f"u{i:02d}" for i in range(5)])
            await drain(enricher, engine)
            await send(redis, keys, db, project, "t", [f"u{i:02d}" for i in range(5, 10)])
            await drain(enricher)
            await send(redis, keys, db, project, "t", [f"u{i:02d}" for i in range(10, 15)])
            enricher_poison, engine_poison = str(uuid.uuid4()), str(uuid.uuid4())
            await xadd(redis, keys.inbound("normal"), {
                "eventId": enricher_poison, "projectId": project, "template": "t",
                "to": {"segment": "everyone"}, "priority": "normal", "segmentAfter": 12345,
            }, maxlen=10_000)
            await xadd(redis, keys.enriched("normal"), {
                "eventId": engine_poison, "projectId": project, "template": "t",
                "createdAt": "2026-01-01T00:00:00Z", "priority": "normal",
                "user": {"id": "u00"}, "contacts": {"email": ["u00@example.com"]},
                "preferences": {"quietHours": "never"}, "data": {},
            }, maxlen=10_000)

            # When PostgreSQL goes away as the workers start, for longer than the enricher's
            # five attempts' worth of reclaim cycles
            await proxy.cut()
            for stage in stages:
                await stage.worker.start()
            working = [enricher, engine, delivery]
            await until(lambda: _all_holding(working), "every stage with work held it")

            await until(lambda: _beats_say_why(redis, keys, working),
                        "every heartbeat says what its worker waits for")
            await asyncio.sleep(3 * (settings.enricher_max_attempts + 1)
                                * (settings.reclaim_interval_s + settings.reclaim_min_idle_s))
            assert await redis.xlen(keys.dlq) == 0
            proxy.restore()

            # Then every notification is delivered exactly once, nothing but the poisons is
            # dead-lettered, and each poison after exactly its attempt limit
            async def settled() -> bool:
                return (len(await sim.messages("resend")) == 15
                        and await redis.xlen(keys.dlq) == 2
                        and await pending_total(redis, keys) == 0)

            await until(settled, "everything delivered or dead-lettered")
        finally:
            for stage in stages:
                await stage.stop()

    messages = await sim.messages("resend")
    assert sorted(m["to"] for m in messages) == [f"u{i:02d}@example.com" for i in range(15)]
    assert all(m["acceptCount"] == 1 for m in messages)
    dlq = {r["payload"]["eventId"]: r for r in
           (json.loads(fields[b"data"]) for _id, fields in await xrange(redis, keys.dlq))}
    assert set(dlq) == {enricher_poison, engine_poison}
    assert dlq[enricher_poison]["attempts"] == settings.enricher_max_attempts
    assert dlq[engine_poison]["attempts"] == settings.max_attempts
    # each for its own failure, not the outage's
    assert dlq[enricher_poison]["error"].startswith("DataError: invalid input")
    assert dlq[engine_poison]["error"].startswith("AttributeError")
    starts = [r for r in caplog.records if getattr(r, "outage", None) == "start"]
    ends = [r for r in caplog.records if getattr(r, "outage", None) == "end"]
    assert sorted(r.service for r in starts) == sorted(r.service for r in ends)  # type: ignore[attr-defined]
    assert {r.service for r in starts} >= {"enricher", "engine", "delivery"}  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", sorted(REGISTRY))
async def test_every_service_limits_its_queries(settings: Settings, name: str) -> None:
    """Only the api and delivery limited their queries: a stalled PostgreSQL held the other
    services' batches, and the stream slots they filled, for as long as the stall lasted."""
    cls = service_class(name)
    assert cls.query_timeout_s == QUERY_TIMEOUT_S
    service = cls(settings)
    await service.open()
    try:
        assert service.db is not None
        assert service.db._connect_kwargs["command_timeout"] == QUERY_TIMEOUT_S
        assert service.db._connect_kwargs["timeout"] == QUERY_TIMEOUT_S
    finally:
        await service.close()


@pytest.mark.parametrize("name", sorted(REGISTRY))
async def test_a_service_stopped_while_postgres_stalls_stops_without_an_error(
    sim_settings: Settings, name: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A SIGTERM while PostgreSQL stalled took 52 s with the default 10 s grace, and logged
    "Stopping the ... service failed" with a traceback for five of the eight services: closing
    the pool waited, connection by connection, for a goodbye the server never answered, until
    the query limit raised TimeoutError out of the service's stop. A pool that does not close
    at once is now dropped (its connections reset), and the stop goes on."""
    cls = service_class(name)
    monkeypatch.setattr(cls, "query_timeout_s", 1.0)
    async with PostgresProxy(sim_settings.replace(port=0, host="127.0.0.1")) as proxy:
        service = cls(proxy.settings)
        await service.start()
        assert service.db is not None
        await service.db.execute("SELECT 1")  # a connection is open when the stall begins
        proxy.stall()
        # Bounded only so a regression fails instead of hanging.
        await asyncio.wait_for(service.stop(), HANG_S)
        assert service.db is None


async def test_enricher_and_engine_batches_caught_in_a_postgres_stall_end_as_an_outage(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, sim_settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The enricher's and engine's queries had no time limit, so a PostgreSQL that stopped
    answering without closing its connections held their batches for as long as the stall
    lasted, and the outage handling never began. Their queries now end at the pool's limit
    (1 s here), as an outage: the work is held, costs no attempt, and goes on after."""
    for cls in (EnricherService, EngineService):
        assert cls.query_timeout_s == QUERY_TIMEOUT_S
        monkeypatch.setattr(cls, "query_timeout_s", 1.0)
    settings = outage_settings(sim_settings)
    await add_user(db, project, "u1", contacts=[("email", "u1@example.com")])
    await add_user(db, project, "u2", contacts=[("email", "u2@example.com")])
    await add_template(db, project, "t", {"email": {"subject": "s", "text": "t"}})
    async with PostgresProxy(settings) as proxy:
        enricher, engine = EnricherService(proxy.settings), EngineService(proxy.settings)
        stages = [enricher, engine]
        try:
            # Given an enriched message waiting for the engine and a send for the enricher
            for stage in stages:
                await stage.open()
            await send(redis, keys, db, project, "t", "u1")
            await drain(enricher)
            await send(redis, keys, db, project, "t", "u2")
            [(enriched_id, _f)] = await xrange(redis, keys.enriched("normal"))
            inbound_id = (await xrange(redis, keys.inbound("normal")))[-1][0]

            # When PostgreSQL stops answering, keeping its connections open, as they read
            proxy.stall()
            for stage in stages:
                await stage.worker.start()

            # Then each batch ends while the stall lasts, as an outage that holds the work,
            # says so in the heartbeat and gives the attempt back
            await until(lambda: _all_holding(stages), "both stages held their work")

            await until(lambda: _beats_say_why(redis, keys, stages),
                        "every heartbeat says what its worker waits for")
            for service, stream, entry_id in (("enricher", keys.inbound("normal"), inbound_id),
                                              ("engine", keys.enriched("normal"), enriched_id)):
                counter = keys.attempts(keys.group(service), entry_id.decode(), stream)
                assert await redis.get(counter) in (None, b"0")
            assert await pending_total(redis, keys) == 2

            # And when it answers again, both messages go on to delivery, nothing dead-lettered
            proxy.restore()

            async def delivered() -> bool:
                return (await redis.xlen(keys.outbound("normal")) == 2
                        and await pending_total(redis, keys) == 0)

            await until(delivered, "both messages reached delivery's stream")
        finally:
            proxy.restore()  # a stage cannot stop while its connections stall
            for stage in stages:
                await stage.stop()
    assert await redis.xlen(keys.dlq) == 0


class GatedEmail:
    """An e-mail transport whose sends wait at a gate the test opens: the test knows the
    provider has been called, and acts before it answers."""

    channel = "email"
    provider = "gated"
    idempotent = True
    rate_per_s = None

    def __init__(self) -> None:
        self.called = asyncio.Event()
        self.gate = asyncio.Event()
        self.calls = 0

    async def open(self, ctx: Any) -> None:
        return None

    async def close(self) -> None:
        return None

    async def send(self, message: Message) -> SendResult:
        self.calls += 1
        self.called.set()
        await self.gate.wait()
        return SendResult(Outcome.SENT, f"id-{self.calls}", "accepted", 200)


async def test_a_delivery_try_that_reached_the_provider_counts_though_postgres_failed_after(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim_settings: Settings,
) -> None:
    """An outage gives back the attempts it cost, but only those that provably did nothing
    irreversible: a send the provider accepted before PostgreSQL failed did happen, so that
    try counts (and the outage still stops the worker)."""
    settings = outage_settings(sim_settings)
    # Given a task waiting for delivery
    await add_user(db, project, "u1", contacts=[("email", "u1@example.com")])
    await add_template(db, project, "t", {"email": {"subject": "s", "text": "t"}})
    event_id = await send(redis, keys, db, project, "t", "u1")
    await drain(await services(EnricherService), await services(EngineService))
    [(entry_id, _fields)] = await xrange(redis, keys.outbound("normal"))
    counter = keys.attempts(keys.group("delivery"), entry_id.decode(), keys.outbound("normal"))
    transport = GatedEmail()
    async with PostgresProxy(settings) as proxy:
        delivery = DeliveryService(proxy.settings, transports=[transport])
        await delivery.open()
        try:
            await delivery.worker.start()

            # When PostgreSQL goes away while the provider is being called, and the provider
            # then accepts
            await asyncio.wait_for(transport.called.wait(), HANG_S)
            await proxy.cut()
            transport.gate.set()

            # Then the worker holds, but the try counts: the provider was called
            await until(lambda: _all_holding([delivery]), "delivery held its work")
            assert await redis.get(counter) == b"1"
            proxy.restore()

            async def sent() -> bool:
                return any(r["kind"] == "sent" for r in await timeline(db, event_id))

            await until(sent, "the task was recorded sent")
        finally:
            await delivery.stop()
    # The acceptance was never recorded, so the retry sent again, as the task's second attempt.
    assert transport.calls == 2
    assert [r["attempt"] for r in await timeline(db, event_id) if r["kind"] == "sent"] == [2]


async def _beats_say_why(redis: Redis, keys: Keys, stages: Sequence[WorkerService]) -> bool:
    """Whether every stage's heartbeat says it waits for PostgreSQL."""
    beats = [json.loads(await redis.get(keys.health(s.worker.consumer)) or "{}") for s in stages]
    return all("waiting for PostgreSQL (DATABASE_URL)" in b.get("readError", "") for b in beats)


async def _all_holding(stages: Sequence[WorkerService]) -> bool:
    return all(s.worker.outage is not None and s.worker.outage.holding for s in stages)
