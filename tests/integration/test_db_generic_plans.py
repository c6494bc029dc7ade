"""The send path's pools keep generic plans, briefly, and those plans probe by key.

The enricher's, engine's and delivery's pools (``generic_plans=True``) skip planning at each
execution, most of what their statements cost PostgreSQL at moderate load. Two things keep
that safe: a prepared statement is dropped ``GENERIC_PLAN_LIFETIME_S`` after it was made, so
its plan is remade for a table that has grown since; and every statement those services run
has a generic plan that probes its tables by key once they are large, whatever the batch.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from notifkit.config import Settings
from notifkit.db.logs import (
    _INSERT_FIRST_OF_KIND,
    _RECIPIENT_TASK_ROWS,
    INSERT_ROWS,
    Kind,
    LogRow,
    Status,
    insert_rows_sql,
)
from notifkit.db.outbox import _CLAIM, DISABLE_CONTACTS_SQL, _settle_sql
from notifkit.db.pool import GENERIC_PLAN_LIFETIME_S, create_pool
from notifkit.db.recipients import _RECIPIENTS_SQL, SEGMENT_PAGE_SQL
from notifkit.db.routing import _ROUTING, QUIET_HOURS_SQL
from notifkit.ids import uuid7
from notifkit.server import REGISTRY, service_class
from notifkit.services.delivery.service import DeliveryService
from notifkit.services.engine.service import EngineService
from notifkit.services.enricher import EnricherService
from notifkit.transports.inapp import _INSERT as _INAPP_INSERT
from tests.support.plans import plan_of_cached_statement

GROWN = 30_000
_PROBE = "SELECT count(*) FROM notifications WHERE project_id = $1 AND id = ANY($2::uuid[])"


@pytest.fixture
async def generic_db(settings: Settings) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(settings, generic_plans=True)
    try:
        yield pool
    finally:
        await pool.close()


def test_only_the_send_path_stages_ask_for_generic_plans() -> None:
    generic = {name for name in REGISTRY if service_class(name).generic_plans}
    assert generic == {EnricherService.name, EngineService.name, DeliveryService.name}


async def _counts(conn: asyncpg.Connection, prefix: str) -> tuple[int, int]:
    row = await conn.fetchrow(
        "SELECT sum(generic_plans)::int, sum(custom_plans)::int FROM pg_prepared_statements "
        "WHERE statement LIKE $1", prefix + "%")
    return row[0], row[1]


async def test_a_generic_pool_plans_once_and_the_others_plan_every_time(
    db: asyncpg.Pool, generic_db: asyncpg.Pool,
) -> None:
    counts = {}
    for name, pool in (("generic", generic_db), ("custom", db)):
        async with pool.acquire() as conn:
            for _ in range(12):
                await conn.fetchval(_PROBE, uuid.uuid4(), [uuid7()])
            counts[name] = await _counts(conn, "SELECT count(*) FROM notifications")
    assert counts == {"generic": (12, 0), "custom": (0, 12)}


async def test_a_generic_plan_is_remade_for_the_table_as_it_has_grown(
    generic_db: asyncpg.Pool,
) -> None:
    project = uuid.uuid4()
    args_sql = f"'{project}'::uuid, ARRAY['{uuid7()}']::uuid[]"
    async with generic_db.acquire() as conn:
        # No analysis may come between: it would make every plan again by itself.
        await conn.execute("ALTER TABLE notifications SET (autovacuum_enabled = false)")
        await conn.execute("INSERT INTO projects (id, name) VALUES ($1, 'plans')", project)
        await conn.fetchval(_PROBE, project, [uuid7()])  # planned on an empty table
        await conn.execute(
            "INSERT INTO notifications (id, project_id, template_id, recipients_spec) "
            "SELECT gen_random_uuid(), $1, 'basic', '\"u\"' FROM generate_series(1, $2)",
            project, GROWN)
        stale = await plan_of_cached_statement(conn, _PROBE, args_sql)
        await asyncio.sleep(GENERIC_PLAN_LIFETIME_S + 0.5)
        await conn.fetchval(_PROBE, project, [uuid7()])
        fresh = await plan_of_cached_statement(conn, _PROBE, args_sql)
    # The plan made for the empty table reads all of the project's notifications to find
    # one (by scan or by another index), as it would for as long as it stayed.
    assert "notifications_pkey" not in stale, stale
    assert "Seq Scan on notifications" not in fresh, fresh
    assert "Index Cond: (id = ANY ($2))" in fresh.replace("(notifications.id", "(id"), fresh


async def _generic_plan(conn: asyncpg.Connection, sql: str) -> str:
    """The plan PostgreSQL keeps for ``sql`` when told to keep a generic one."""
    params = max(int(n) for n in re.findall(r"\$(\d+)", sql))
    async with conn.transaction():
        await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        await conn.execute(f"PREPARE generic_plan_probe AS {sql}")
        try:
            rows = await conn.fetch("EXPLAIN (COSTS OFF) EXECUTE generic_plan_probe("
                                    + ", ".join(["NULL"] * params) + ")")
        finally:
            await conn.execute("DEALLOCATE generic_plan_probe")
    return "\n".join(r[0] for r in rows)


_SEND_PATH: dict[str, tuple[str, tuple[str, ...]]] = {
    # what runs it: (the statement, the large tables it must not read whole)
    "enricher: recipients": (_RECIPIENTS_SQL, ("users", "user_contacts", "quiet_hours")),
    "enricher: a segment's page": (SEGMENT_PAGE_SQL, ("user_segments",)),
    "every stage: timeline rows": (INSERT_ROWS, ("message_logs",)),
    "every stage: timeline rows with a repeated wait": (insert_rows_sql(
        [LogRow("p", "e", "t", "u", "email", Kind.RATE_LIMITED, Status.THROTTLED)]),
        ("message_logs",)),
    "engine: routing": (_ROUTING, ("templates", "suppressions", "notifications")),
    "delivery: quiet hours": (QUIET_HOURS_SQL, ("quiet_hours", "users")),
    "delivery: outbox claim": (_CLAIM, ("delivery_outbox", "user_contacts", "suppressions",
                                        "users")),
    "delivery: settlement": (_settle_sql(1), ("delivery_outbox",)),
    "delivery: settlement with timeline rows": (
        insert_rows_sql([], f"settled AS ({_settle_sql(14)})"),
        ("delivery_outbox", "message_logs")),
    "delivery: contacts disabled": (DISABLE_CONTACTS_SQL, ("user_contacts",)),
    "delivery: a kind's first row": (_INSERT_FIRST_OF_KIND, ("message_logs",)),
    "delivery: a skipped recipient's rows": (_RECIPIENT_TASK_ROWS, ("message_logs",)),
    "delivery: an in-app message": (_INAPP_INSERT, ("users", "inapp_messages")),
}


@pytest.fixture
async def grown_db(db: asyncpg.Pool) -> asyncpg.Pool:
    """The schema with every table the send path reads large (GROWN rows each), analysed."""
    project = uuid.uuid4()
    async with db.acquire() as conn:
        await conn.execute("INSERT INTO projects (id, name) VALUES ($1, 'plans')", project)
        for fill in _FILLS:
            await conn.execute(fill, project, GROWN)
        await conn.execute("ANALYZE")
    return db


_FILLS = (
    "INSERT INTO users (project_id, id) SELECT $1, 'u' || g FROM generate_series(1, $2) g",
    "INSERT INTO user_contacts (project_id, user_id, channel, target) "
    "SELECT $1, 'u' || g, 'email', 'u' || g || '@example.com' FROM generate_series(1, $2) g",
    "INSERT INTO user_segments (project_id, segment, user_id) "
    "SELECT $1, 'beta', 'u' || g FROM generate_series(1, $2) g",
    "INSERT INTO quiet_hours (project_id, user_id, start_time, end_time) "
    "SELECT $1, 'u' || g, '22:00', '07:00' FROM generate_series(1, $2) g",
    "INSERT INTO delivery_outbox (task_id, channel, destination, project_id, provider) "
    "SELECT 'task-' || g, 'email', 'u' || g || '@example.com', $1, 'resend' "
    "FROM generate_series(1, $2) g",
    "INSERT INTO suppressions (project_id, channel, target, reason) "
    "SELECT $1, 'email', 's' || g || '@example.com', 'bounce' FROM generate_series(1, $2) g",
    "INSERT INTO notifications (id, project_id, template_id, recipients_spec) "
    "SELECT gen_random_uuid(), $1, 'basic', '\"u\"' FROM generate_series(1, $2)",
    "INSERT INTO templates (project_id, id, content) "
    "SELECT $1, 't' || g, '{}' FROM generate_series(1, $2) g",
    "INSERT INTO message_logs (project_id, event_id, task_id, user_id, channel, kind, status) "
    "SELECT $1, gen_random_uuid(), 'task-' || g, 'u' || g, 'email', 'sent', 'sent' "
    "FROM generate_series(1, $2) g",
    "INSERT INTO inapp_messages (project_id, user_id, task_id, event_id, content) "
    "SELECT $1, 'u' || g, 'task-' || g, gen_random_uuid(), '{}' FROM generate_series(1, $2) g",
)


@pytest.mark.parametrize("name", list(_SEND_PATH))
async def test_every_send_path_statement_keeps_a_plan_that_probes_by_key(
    grown_db: asyncpg.Pool, name: str,
) -> None:
    sql, tables = _SEND_PATH[name]
    async with grown_db.acquire() as conn:
        plan = await _generic_plan(conn, sql)
    for table in tables:
        assert f"Seq Scan on {table}" not in plan, plan
    assert "Hash Join" not in plan, plan
    assert "Merge Join" not in plan, plan
