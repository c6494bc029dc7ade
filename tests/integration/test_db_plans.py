"""Pooled connections plan each statement for the table as it is now, not as it was.

asyncpg prepares every statement, and PostgreSQL switches a prepared statement to a cached
generic plan after a few executions. Planned on an empty table, that plan is a sequential
scan, and it stays cached while the table grows: the enricher's status UPDATE took over 100 ms
per batch once 50,000 notifications had arrived in a few seconds (priority_isolation).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import asyncpg
import pytest

from notifkit.db.outbox import _CLAIM
from notifkit.db.recipients import _RECIPIENTS_SQL
from notifkit.db.workflows import OWNED_WINDOW_SQL
from notifkit.ids import uuid7
from notifkit.reconcile import _CANDIDATES, id_floor
from notifkit.services.api.routes.notifications import (
    FIRST_ROWS_SQL,
    MESSAGES_SQL,
    RECIPIENT_ROWS_SQL,
    RECIPIENT_STATUS_SQL,
)
from notifkit.services.api.routes.users import WAITING_SENDS_SQL
from tests.support.plans import plan_of_cached_statement

# A batch UPDATE by primary key, as the workers issue them.
_UPDATE = ("UPDATE notifications n SET status = 'processing', updated_at = now() "
           "FROM unnest($1::uuid[], $2::uuid[]) AS e(project_id, id) "
           "WHERE n.project_id = e.project_id AND n.id = e.id AND n.status = 'accepted'")


async def _update(conn: asyncpg.Connection, project: uuid.UUID) -> None:
    await conn.execute(_UPDATE, [project], [uuid7()])


async def test_a_statement_prepared_on_an_empty_table_uses_the_index_once_it_has_grown(
    db: asyncpg.Pool,
) -> None:
    project = uuid.uuid4()
    async with db.acquire() as conn:
        await conn.execute("INSERT INTO projects (id, name) VALUES ($1, 'plans')", project)
        # Past the executions after which PostgreSQL would settle on a generic plan.
        for _ in range(12):
            await _update(conn, project)
        await conn.execute(
            "INSERT INTO notifications (id, project_id, template_id, recipients_spec) "
            "SELECT gen_random_uuid(), $1, 'basic', '\"u\"' FROM generate_series(1, 20000)",
            project)
        await _update(conn, project)

        plan = await plan_of_cached_statement(
            conn, "UPDATE notifications n SET status = 'processing'",
            f"ARRAY['{project}']::uuid[], ARRAY['{uuid7()}']::uuid[]")
    assert "Index Scan using notifications_pkey" in plan, plan
    assert "Seq Scan on notifications" not in plan, plan


async def test_pooled_connections_never_settle_on_a_generic_plan(db: asyncpg.Pool) -> None:
    async with db.acquire() as conn:
        for _ in range(12):
            await conn.fetchval("SELECT count(*) FROM notifications WHERE id = $1", uuid7())
        generic, custom = await conn.fetchrow(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE 'SELECT count(*) FROM notifications WHERE id = %'")
    assert (generic, custom) == (0, 12)


# Rows in a grown table: enough that hashing all of it looks cheaper to the planner than a
# probe per row of a 400-row batch, as it did before the queries forced the probes.
GROWN = 30_000


async def _project_with_users(conn: asyncpg.Connection, users: int) -> uuid.UUID:
    """A new project with users u1..u{users}, analysed."""
    project = uuid.uuid4()
    await conn.execute("INSERT INTO projects (id, name) VALUES ($1, 'plans')", project)
    await conn.execute("INSERT INTO users (project_id, id) "
                       "SELECT $1, 'u' || g FROM generate_series(1, $2) g", project, users)
    await conn.execute("ANALYZE users")
    return project


async def test_the_delivery_claim_probes_the_outbox_by_key_however_large_the_batch(
    db: asyncpg.Pool,
) -> None:
    """A read batch of hundreds of destinations against an outbox of tens of thousands of
    rows: each destination is one index probe, never a scan of the whole outbox (a table
    that only grows) to hash-join it with the batch."""
    batch = 400
    async with db.acquire() as conn:
        project = await _project_with_users(conn, GROWN)
        await conn.execute(
            "INSERT INTO delivery_outbox (task_id, channel, destination, project_id, provider) "
            "SELECT 'task-' || g, 'email', 'u' || g || '@example.com', $1, 'resend' "
            "FROM generate_series(1, $2) g", project, GROWN)
        await conn.execute(
            "INSERT INTO user_contacts (project_id, user_id, channel, target) "
            "SELECT $1, 'u' || g, 'email', 'u' || g || '@example.com' "
            "FROM generate_series(1, $2) g", project, GROWN)
        await conn.execute("ANALYZE delivery_outbox, user_contacts")
        rows = await conn.fetch(
            "EXPLAIN (COSTS OFF) " + _CLAIM,
            [f"new-{n}" for n in range(batch)], ["email"] * batch,
            [f"u{n}@example.com" for n in range(batch)], [project] * batch,
            ["resend"] * batch, [f"u{n}" for n in range(batch)], [None] * batch)
    plan = "\n".join(r[0] for r in rows)
    assert "Seq Scan on delivery_outbox" not in plan, plan
    assert "Seq Scan on user_contacts" not in plan, plan


async def test_loading_a_batch_of_recipients_probes_users_by_key(db: asyncpg.Pool) -> None:
    """The enricher's recipient query for a large read batch: one primary-key probe per
    user, not a scan of every user of every project to hash-join them with the batch."""
    batch = 400
    async with db.acquire() as conn:
        project = await _project_with_users(conn, GROWN)
        rows = await conn.fetch("EXPLAIN (COSTS OFF) " + _RECIPIENTS_SQL,
                                [project] * batch, [f"u{n}" for n in range(batch)])
    plan = "\n".join(r[0] for r in rows)
    assert "Seq Scan on users" not in plan, plan


async def test_a_reconciliation_slice_reads_its_minute_of_notifications_by_primary_key(
    db: asyncpg.Pool,
) -> None:
    """The reconciliation looks at one minute of notifications at a time, on a table that
    only grows: a range of the primary key (ids are UUIDv7) and a timeline probe per row,
    never a scan of every notification or every timeline row."""
    base_ms = 1_780_000_000_000
    ids = [uuid7(base_ms + n * 1000) for n in range(GROWN)]  # one a second, over 8 hours
    async with db.acquire() as conn:
        project = uuid.uuid4()
        await conn.execute("INSERT INTO projects (id, name) VALUES ($1, 'plans')", project)
        await conn.execute(
            "INSERT INTO notifications (id, project_id, template_id, recipients_spec) "
            "SELECT id, $1, 'basic', '\"u\"' FROM unnest($2::uuid[]) id", project, ids)
        await conn.execute(
            "INSERT INTO message_logs (project_id, event_id, task_id, channel, kind, status) "
            "SELECT $1, id, id::text, '', k, k FROM unnest($2::uuid[]) id, "
            "unnest(ARRAY['accepted', 'processing']) k", project, ids)
        await conn.execute("ANALYZE notifications, message_logs")
        minute = base_ms + 3600_000
        rows = await conn.fetch("EXPLAIN (COSTS OFF) " + _CANDIDATES,
                                id_floor(minute), id_floor(minute + 60_000), 300.0)
    plan = "\n".join(r[0] for r in rows)
    assert "Seq Scan on notifications" not in plan, plan
    assert "Seq Scan on message_logs" not in plan, plan


async def _grown_project(conn: asyncpg.Connection, table: str, fill: str,
                         *args: object) -> uuid.UUID:
    """A new project whose rows ``fill`` (parameters: the project, then ``args``) adds to
    ``table``, analysed."""
    project = await _project_with_users(conn, 1)
    await conn.execute(fill, project, *args)
    await conn.execute(f"ANALYZE {table}")
    return project


@pytest.mark.parametrize("status", ["failed", "dead_lettered", "throttled"])
async def test_listing_a_projects_failures_reads_them_by_index(
    db: asyncpg.Pool, status: str
) -> None:
    """GET /v1/messages?status=failed on a timeline of a project that mostly succeeds: the
    failures are read from an index on the status, not found by reading every row of the
    project (a sequential scan of message_logs, a table that only grows)."""
    async with db.acquire() as conn:
        project = await _grown_project(
            conn, "message_logs",
            "INSERT INTO message_logs (project_id, event_id, task_id, channel, kind, status, "
            "created_at) SELECT $1, gen_random_uuid(), 'task-' || g, 'email', s, s, "
            "now() - g * interval '1 ms' FROM generate_series(1, $2) g, "
            "LATERAL (SELECT CASE WHEN g % 10000 = 0 THEN $3 ELSE 'sent' END AS s) k",
            GROWN * 4, status)
        sql = MESSAGES_SQL.format(where="project_id = $1 AND status = $2", limit="$3")
        rows = await conn.fetch("EXPLAIN (COSTS OFF) " + sql, project, status, 51)
    plan = "\n".join(r[0] for r in rows)
    assert "Seq Scan on message_logs" not in plan, plan
    assert any("Index Cond" in r[0] and "status" in r[0] for r in rows), plan


async def test_erasing_a_user_finds_their_scheduled_sends_by_index(db: asyncpg.Pool) -> None:
    """DELETE /v1/users/{userId} takes the user's waiting sends out of the scheduler: they
    are found by an index on (project, user), not by reading every waiting task."""
    async with db.acquire() as conn:
        project = await _grown_project(
            conn, "scheduled_payloads",
            "INSERT INTO scheduled_payloads (task_id, project_id, due_at, stream, payload) "
            "SELECT 'task-' || g, $1, now() + g * interval '1 s', 'x', "
            "jsonb_build_object('userId', 'u' || (g % 5000), 'eventId', gen_random_uuid()) "
            "FROM generate_series(1, $2) g", GROWN)
        rows = await conn.fetch("EXPLAIN (COSTS OFF) " + WAITING_SENDS_SQL, project, "u7")
    plan = "\n".join(r[0] for r in rows)
    assert "Seq Scan on scheduled_payloads" not in plan, plan


async def test_a_digest_owner_finds_its_window_by_index(db: asyncpg.Pool) -> None:
    """The owner of a digest window reads it back when the window ends, among every window
    ever opened (closed ones stay): by an index on the owner, not by a scan of them all."""
    async with db.acquire() as conn:
        project = await _grown_project(
            conn, "workflow_instances",
            "INSERT INTO workflow_instances (id, project_id, workflow_id, user_id, steps) "
            "SELECT gen_random_uuid(), $1, 'digest', 'u' || g, '[]' "
            "FROM generate_series(1, $2) g", GROWN)
        await conn.execute(
            "INSERT INTO workflow_digests (project_id, workflow_id, user_id, step_index, "
            "step_path, owner_instance_id, window_ends_at, closed_at) "
            "SELECT project_id, workflow_id, user_id, 0, '0', id, now(), now() "
            "FROM workflow_instances WHERE project_id = $1", project)
        await conn.execute("ANALYZE workflow_digests")
        owner = await conn.fetchval(
            "SELECT id FROM workflow_instances WHERE project_id = $1 LIMIT 1", project)
        rows = await conn.fetch("EXPLAIN (COSTS OFF) " + OWNED_WINDOW_SQL, project, owner, "0")
    plan = "\n".join(r[0] for r in rows)
    assert "Seq Scan on workflow_digests" not in plan, plan


async def test_a_notifications_recipients_and_status_are_read_by_the_event_index(
    db: asyncpg.Pool,
) -> None:
    """GET /v1/notifications/{eventId} of a large send among a project's many others: its
    page of recipients, their rows and the statuses of all of them are read by index (the
    event's rows, each recipient's by its key), never by a scan of every row ever logged."""
    event = uuid7()
    async with db.acquire() as conn:
        project = await _grown_project(
            conn, "message_logs",
            # 20,000 rows of the event (4,000 recipients of 5 rows), 100,000 of 2,000 others.
            "INSERT INTO message_logs (project_id, event_id, task_id, user_id, channel, "
            "attempt, kind, status, created_at) "
            "SELECT $1, CASE WHEN g <= 4000 THEN $2 ELSE ('00000000-0000-7000-8000-' || "
            "lpad((g % 2000)::text, 12, '0'))::uuid END, 'task-' || g, 'u' || g, 'email', 1, "
            "k.kind, k.status, now() - interval '1 hour' + (k.step * 25000 + g) * interval '1 ms' "
            "FROM generate_series(1, 24000) g, (VALUES (0, 'queued', 'processing'), "
            "(1, 'sent', 'sent'), (2, 'delivered', 'delivered'), (3, 'opened', 'delivered'), "
            "(4, 'clicked', 'delivered')) AS k(step, kind, status)", event)
        firsts = await conn.fetch("EXPLAIN (COSTS OFF) " + FIRST_ROWS_SQL, project, event,
                                  str(event), datetime.min.replace(tzinfo=UTC), 0, 10_001)
        tasks = [f"task-{g}" for g in range(1, 4001)]
        rows = await conn.fetch("EXPLAIN (COSTS OFF) " + RECIPIENT_ROWS_SQL, project, event,
                                tasks, ["email"] * len(tasks))
        statuses = await conn.fetch("EXPLAIN (COSTS OFF) " + RECIPIENT_STATUS_SQL, project,
                                    event, str(event))
    first_plan, rows_plan, status_plan = ("\n".join(r[0] for r in p)
                                          for p in (firsts, rows, statuses))
    for plan in (first_plan, rows_plan, status_plan):
        assert "Seq Scan on message_logs" not in plan, plan
    # A page walks the event's rows in order and probes each recipient by key: nothing of it
    # hashes every row of the event, whatever the page's size.
    assert "Index Scan using message_logs_event_idx" in first_plan, first_plan
    for plan in (first_plan, rows_plan):
        assert "Hash" not in plan, plan
        assert "message_logs_task_id_channel_attempt_kind_key" in plan, plan
    assert "message_logs_event_idx" in status_plan, status_plan
