"""The send path while a lock held by another session (a long migration, VACUUM FULL, an
operator's LOCK TABLE in an open transaction) keeps a stage's queries waiting past their
limit: PostgreSQL answers, so it is no outage of the server, but the work is no more at fault
than in one. It is held without counting the attempt, and goes through once the lock is
released; a failure of the work's own still counts."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

import asyncpg
import pytest
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.keys import Keys
from notifkit.server import REGISTRY, service_class
from notifkit.services.enricher import EnricherService
from tests.support.sessions import schema_session
from tests.support.streams import xrange

from .helpers import add_template, add_user, send
from .test_postgres_outage import outage_settings, pending_total, until

# The stage's query limit in these tests (QUERY_TIMEOUT_S, 10 s, in service).
LIMIT_S = 1.0


@pytest.fixture
async def holder(settings: Settings) -> AsyncIterator[asyncpg.Connection]:
    """A session of its own in the test's schema, as an operator's psql would be."""
    async with schema_session(settings) as conn:
        yield conn


async def test_the_enricher_holds_a_send_while_a_lock_on_its_table_outlasts_its_limit(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, sim_settings: Settings,
    holder: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each try waited for the lock until the query limit cut it off, the SELECT 1 probe
    answered, so the timeout counted as the send's own failure: a lock held for the
    enricher's attempts' worth of tries dead-lettered a healthy send."""
    caplog.set_level(logging.INFO, logger="notifkit")
    monkeypatch.setattr(EnricherService, "query_timeout_s", LIMIT_S)
    settings = outage_settings(sim_settings).replace(enricher_max_attempts=2)
    await add_user(db, project, "u1", contacts=[("email", "u1@example.com")])
    await add_template(db, project, "t", {"email": {"subject": "s", "text": "t"}})
    # Given a send waiting for the enricher, and a session holding a lock on the table it reads
    await send(redis, keys, db, project, "t", "u1")
    [(entry_id, _fields)] = await xrange(redis, keys.inbound("normal"))
    counter = keys.attempts(keys.group("enricher"), entry_id.decode(), keys.inbound("normal"))
    lock = holder.transaction()
    await lock.start()
    await holder.execute("LOCK TABLE users IN ACCESS EXCLUSIVE MODE")
    enricher = EnricherService(settings)
    await enricher.open()
    stats = enricher.worker.stats
    try:
        # When the lock is held for more tries than the send has attempts
        await enricher.worker.start()
        async def tried_past_its_attempts() -> bool:
            return (stats.held + stats.failed > settings.enricher_max_attempts
                    or stats.dead_lettered > 0)

        await until(tried_past_its_attempts, "more tries than the send has attempts")

        # Then none of them counted, nothing was dead-lettered, and the heartbeat says why
        assert stats.failed == stats.dead_lettered == 0
        assert await redis.get(counter) in (None, b"0")
        await enricher.worker.beat()
        beat = json.loads(await redis.get(keys.health(enricher.worker.consumer)) or "{}")
        assert "waiting for a lock held in PostgreSQL (DATABASE_URL)" in beat["readError"]

        # And once the lock is released the send goes on to the engine, exactly once
        await lock.rollback()

        async def enriched() -> bool:
            return (await redis.xlen(keys.enriched("normal")) == 1
                    and await pending_total(redis, keys) == 0)

        await until(enriched, "the send enriched")
    finally:
        if not holder.is_closed() and holder.is_in_transaction():
            await lock.rollback()
        await enricher.stop()
    assert stats.processed == 1
    assert stats.failed == stats.dead_lettered == 0
    assert await redis.xlen(keys.dlq) == 0
    assert await redis.xlen(keys.enriched("normal")) == 1
    phases = [(r.outage, r.reason) for r in caplog.records  # type: ignore[attr-defined]
              if getattr(r, "outage", None)]
    assert phases == [("start", "lock"), ("end", "lock")]


async def test_a_constraint_violation_still_counts_though_lock_waits_do_not(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, sim_settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only a wait on a lock is spared: a row the table refuses is the send's own failure,
    dead-lettered after exactly its attempts, with its error."""
    monkeypatch.setattr(EnricherService, "query_timeout_s", LIMIT_S)
    settings = outage_settings(sim_settings).replace(enricher_max_attempts=2)
    await add_template(db, project, "t", {"email": {"subject": "s", "text": "t"}})
    # Given a send whose timeline row (an unknown user's) the table refuses
    await db.execute("ALTER TABLE message_logs ADD CONSTRAINT no_poison "
                     "CHECK (user_id IS DISTINCT FROM 'poison')")
    event_id = await send(redis, keys, db, project, "t", "poison")
    enricher = EnricherService(settings)
    await enricher.open()
    try:
        # When the enricher works on it
        await enricher.worker.start()

        async def dead() -> bool:
            return await redis.xlen(keys.dlq) == 1 and await pending_total(redis, keys) == 0

        await until(dead, "the send dead-lettered")
    finally:
        await enricher.stop()
    # Then each try counted, and the DLQ names the violation
    [(_id, fields)] = await xrange(redis, keys.dlq)
    record = json.loads(fields[b"data"])
    assert record["payload"]["eventId"] == event_id
    assert record["attempts"] == settings.enricher_max_attempts
    assert record["error"].startswith("CheckViolationError")
    assert enricher.worker.stats.held == 0



@pytest.mark.parametrize("name", sorted(REGISTRY))
async def test_every_service_gives_up_a_lock_wait_before_its_query_limit(
    settings: Settings, name: str,
) -> None:
    """So that a wait on a lock ends as 55P03, which says so, instead of as the limit's bare
    timeout, which the worker could only judge by a probe that answers."""
    service = service_class(name)(settings)
    await service.open()
    try:
        assert service.db is not None
        assert service.db._connect_kwargs["server_settings"]["lock_timeout"] == "8000"
        assert await service.db.fetchval("SHOW lock_timeout") == "8s"
    finally:
        await service.close()
