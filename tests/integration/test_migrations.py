"""Migrations, the data model and per-test isolation, against real PostgreSQL and Redis.

Every service migrates at start, so the runner must be a no-op when nothing is pending, safe
when several processes start at once, and confined to DB_SCHEMA. The model's constraints are
what the services' idempotent writes (ON CONFLICT ...) rely on, so they are asserted here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
import redis.asyncio as aioredis

from notifkit.config import Settings
from notifkit.db.migrate import (
    Migration,
    MigrationError,
    load_migrations,
    migrate,
    migrate_connection,
    migration_lock_key,
)
from notifkit.db.pool import connect, create_pool
from tests.support.isolation import isolated_namespace, isolated_schema

REPO_ROOT = Path(__file__).resolve().parents[2]

CONTRACT_TABLES = {
    "projects",
    "project_api_keys",
    "users",
    "user_contacts",
    "user_segments",
    "user_channel_preferences",
    "user_topic_preferences",
    "quiet_hours",
    "templates",
    "notifications",
    "message_logs",
    "suppressions",
    "delivery_outbox",
    "scheduled_payloads",
    "inapp_messages",
    "workflow_definitions",
    "workflow_instances",
    "workflow_steps",
    "workflow_waiters",
    "workflow_digests",
    "ai_usage",
}
# Tables that are not about one tenant; every other table, present or future, carries project_id.
UNTENANTED = {"projects", "schema_migrations"}


@pytest.fixture
async def fresh_schema(database_url: str) -> AsyncIterator[str]:
    """A schema name nobody has created yet; dropped afterwards if the test created it."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    yield schema
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


async def _tables(conn: asyncpg.Connection, schema: str) -> set[str]:
    rows = await conn.fetch(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = $1", schema
    )
    return {row["table_name"] for row in rows}


# ---------------------------------------------------------------------------------------------
# The runner


async def test_migrating_twice_applies_once_then_does_nothing(
    database_url: str, fresh_schema: str
) -> None:
    settings = Settings(database_url=database_url, db_schema=fresh_schema)
    messages: list[str] = []

    first = await migrate(settings, progress=messages.append)
    second = await migrate(settings, progress=messages.append)

    assert first == [m.name for m in load_migrations()]
    assert first[0] == "0001_initial"
    assert second == []
    assert any("Applied migration 0001_initial" in m for m in messages)
    # Each says it starts, before it runs: a long one is not mistaken for a hung process
    assert messages.index(f"Applying migration 0001_initial (1 of {len(first)}) to schema "
                          f"{fresh_schema!r}.") < next(
        i for i, m in enumerate(messages) if m.startswith("Applied migration 0001_initial"))
    assert "up to date" in messages[-1]
    conn = await connect(settings)
    try:
        rows = await conn.fetch("SELECT version, name FROM schema_migrations ORDER BY version")
    finally:
        await conn.close()
    assert [(r["version"], r["name"]) for r in rows] == [
        (m.version, m.name) for m in load_migrations()
    ]


@pytest.mark.slow
async def test_two_processes_migrating_at_once_both_succeed(
    database_url: str, fresh_schema: str
) -> None:
    """Given the migration lock held, when two processes start migrating, both queue on it;
    once it is released exactly one applies the migrations and the other finds nothing to do."""
    key = migration_lock_key(fresh_schema)
    holder = await asyncpg.connect(database_url)
    processes: list[asyncio.subprocess.Process] = []
    try:
        await holder.execute("SELECT pg_advisory_lock($1)", key)
        env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "DB_SCHEMA": fresh_schema,
            "PYTHONPATH": str(REPO_ROOT),
        }
        for _ in range(2):
            processes.append(
                await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "notifkit", "migrate", cwd=REPO_ROOT, env=env,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                )
            )
        # Both must be blocked on the lock before it is released, or the test proves nothing.
        classid, objid = (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF
        async with asyncio.timeout(30):
            while True:
                waiting = await holder.fetchval(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                    "AND classid = $1 AND objid = $2 AND objsubid = 1",
                    classid, objid,
                )
                if waiting == 2:
                    break
                exited = [p for p in processes if p.returncode is not None]
                assert not exited, "a migrating process exited before the lock was released"
                await asyncio.sleep(0.02)
        await holder.execute("SELECT pg_advisory_unlock($1)", key)

        outputs = await asyncio.gather(*(p.communicate() for p in processes))
    finally:
        for p in processes:
            if p.returncode is None:
                p.kill()
                await p.wait()
        await holder.close()

    for p, (_out, err) in zip(processes, outputs, strict=True):
        assert p.returncode == 0, err.decode()
    # `migrate` logs the names it applied: exactly one process names the first migration.
    reports = [err.decode() for _, err in outputs]
    assert sum("Applied migration 0001_initial" in report for report in reports) == 1, reports
    conn = await asyncpg.connect(database_url)
    try:
        counts = await conn.fetch(
            f'SELECT version, count(*) AS n FROM "{fresh_schema}".schema_migrations '
            "GROUP BY version"
        )
    finally:
        await conn.close()
    assert {r["version"]: r["n"] for r in counts} == {m.version: 1 for m in load_migrations()}


async def test_with_json_logs_migrate_writes_one_json_record_a_line(
    database_url: str, fresh_schema: str
) -> None:
    """Given LOG_FORMAT=json, `migrate` writes nothing but records: its summary too, which it
    used to print as a plain line on stdout."""
    env = {**os.environ, "DATABASE_URL": database_url, "DB_SCHEMA": fresh_schema,
           "LOG_FORMAT": "json", "PYTHONPATH": str(REPO_ROOT)}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "notifkit", "migrate", cwd=REPO_ROOT, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    assert out == b""
    records = [json.loads(line) for line in err.decode().splitlines()]
    first = load_migrations()[0].name
    assert any(r["msg"].startswith(f"Applying migration {first} (1 of ") for r in records)
    assert records[-1]["msg"].startswith("Done: applied ")


async def test_a_failing_migration_rolls_back_and_names_itself(
    database_url: str, fresh_schema: str
) -> None:
    good = Migration(1, "0001_good", "CREATE TABLE good (id int);")
    bad = Migration(2, "0002_bad", "CREATE TABLE half (id int); SELECT no_such_function();")
    conn = await asyncpg.connect(database_url)
    try:
        with pytest.raises(MigrationError, match="0002_bad"):
            await migrate_connection(conn, fresh_schema, migrations=[good, bad])
        assert await _tables(conn, fresh_schema) == {"good", "schema_migrations"}
        versions = await conn.fetch(f'SELECT version FROM "{fresh_schema}".schema_migrations')
        assert [r["version"] for r in versions] == [1]
        # The lock was released: another run can proceed at once.
        assert await conn.fetchval(
            "SELECT pg_try_advisory_lock($1)", migration_lock_key(fresh_schema)
        )
    finally:
        await conn.close()


async def test_a_long_migration_says_it_is_still_at_work_until_it_ends(
    database_url: str, fresh_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One line before and one after said nothing for the minutes an index on a large table
    takes, which looks like a hung process."""
    # (notifkit.db.migrate the attribute is the function: the module is found by name)
    monkeypatch.setattr(sys.modules["notifkit.db.migrate"], "PROGRESS_INTERVAL_S", 0.01)
    blocker = await asyncpg.connect(database_url)
    conn = await asyncpg.connect(database_url)
    said: list[str] = []
    still = asyncio.Event()
    stack = contextlib.ExitStack()

    def progress(message: str) -> None:
        said.append(message)
        if "Still applying" in message:
            still.set()

    try:
        # Given a migration that cannot finish while another session holds a lock it needs
        await blocker.execute("SELECT pg_advisory_lock(424242)")
        slow = Migration(1, "0001_slow", "SELECT pg_advisory_xact_lock(424242);")
        run = asyncio.ensure_future(
            migrate_connection(conn, fresh_schema, migrations=[slow], progress=progress))
        stack.callback(run.cancel)
        # Then, while it runs, the runner says it is still applying it, naming it
        await asyncio.wait_for(still.wait(), timeout=30)
        assert any("0001_slow" in line and "Still applying" in line for line in said), said
        assert not run.done()
        # And once it ends, the progress lines stop and the usual summary follows
        await blocker.execute("SELECT pg_advisory_unlock(424242)")
        assert await run == ["0001_slow"]
        assert said[-1].startswith("Applied migration 0001_slow")
        assert not [t for t in asyncio.all_tasks() if t.get_name() == "migration-progress"]
    finally:
        stack.close()
        await blocker.close()
        await conn.close()


@pytest.mark.parametrize("newest", [0, 1, 2, 3], ids=lambda n: f"from-head-minus-{n + 1}")
async def test_an_upgrade_keeps_the_rows_written_before_it_and_serves_them(
    database_url: str, fresh_schema: str, newest: int
) -> None:
    """The latest migrations, applied to a schema holding sends, timelines and workflow
    instances written before them: nothing written before is lost or changed, and the
    queries of this release (the keyed-send lookup 0018 indexes, an instance's dead_letter
    0017 adds) work on the old rows."""
    from notifkit.services.api.admission import _KEYED_SENDS

    every = load_migrations()
    conn = await asyncpg.connect(database_url)
    try:
        # Given a schema one to four migrations behind, with rows in it
        await migrate_connection(conn, fresh_schema, migrations=every[: -(newest + 1)])
        project = await conn.fetchval("INSERT INTO projects (name) VALUES ('p') RETURNING id")
        event = uuid.uuid4()
        await conn.execute(
            "INSERT INTO notifications (id, project_id, template_id, recipients_spec, "
            "idempotency_key) VALUES ($1, $2, 't', '\"u1\"', 'order-1')", event, project)
        await conn.execute(
            "INSERT INTO message_logs (project_id, event_id, task_id, channel, kind, status) "
            "VALUES ($1, $2, $3, '', 'accepted', 'accepted')", project, event, str(event))
        await conn.execute(
            "INSERT INTO workflow_definitions (project_id, id, steps) VALUES ($1, 'w', '[]')",
            project)
        instance = await conn.fetchval(
            "INSERT INTO workflow_instances (project_id, workflow_id, user_id, steps, status) "
            "VALUES ($1, 'w', 'u1', '[]', 'waiting') RETURNING id", project)
        before = {t: await conn.fetch(f"SELECT * FROM {t} ORDER BY 1") for t in (
            "projects", "notifications", "message_logs", "workflow_instances")}
        # When the rest are applied
        applied = await migrate_connection(conn, fresh_schema)
        assert applied == [m.name for m in every[-(newest + 1):]]
        # Then every row reads as it did, the new columns empty
        for table, rows in before.items():
            after = await conn.fetch(f"SELECT * FROM {table} ORDER BY 1")
            old = [dict(row) for row in rows]
            assert [{k: r[k] for k in o} for r, o in zip(after, old, strict=True)] == old, table
        assert await conn.fetchval(
            "SELECT dead_letter FROM workflow_instances WHERE id = $1", instance) is None
        # And the send's key is found as the API looks it up after Redis lost its data
        found = await conn.fetch(_KEYED_SENDS, [project], ["order-1"], [2**53], 86400)
        assert [r["id"] for r in found] == [str(event)]
    finally:
        await conn.close()


def test_migration_files_must_be_named_and_numbered_uniquely(tmp_path: Path) -> None:
    (tmp_path / "0001_a.sql").write_text("SELECT 1;")
    (tmp_path / "0002_b.sql").write_text("SELECT 2;")
    assert [m.name for m in load_migrations(tmp_path)] == ["0001_a", "0002_b"]

    (tmp_path / "0002_c.sql").write_text("SELECT 3;")
    with pytest.raises(MigrationError, match="version 2"):
        load_migrations(tmp_path)

    (tmp_path / "0002_c.sql").unlink()
    (tmp_path / "3_bad-name.sql").write_text("SELECT 4;")
    with pytest.raises(MigrationError, match=r"NNNN_name\.sql"):
        load_migrations(tmp_path)


@pytest.mark.slow
async def test_custom_schema_holds_every_table_and_public_stays_empty(database_url: str) -> None:
    """In a database of its own, so objects other users create in `public` cannot interfere."""
    dbname = f"nk_t_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(database_url)
    try:
        await admin.execute(f'CREATE DATABASE "{dbname}"')
        parts = urlsplit(database_url)
        url = urlunsplit(parts._replace(path=f"/{dbname}"))
        settings = Settings(database_url=url, db_schema="notifkit_app")
        public_before = await _public_objects(url)

        assert await migrate(settings) == [m.name for m in load_migrations()]

        conn = await asyncpg.connect(url)
        try:
            assert await _tables(conn, "notifkit_app") >= CONTRACT_TABLES | {"schema_migrations"}
        finally:
            await conn.close()
        assert await _public_objects(url) == public_before
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        await admin.close()


async def _public_objects(url: str) -> set[str]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            """
            SELECT 'rel:' || relname AS name FROM pg_class
             WHERE relnamespace = 'public'::regnamespace
            UNION ALL
            SELECT 'proc:' || proname FROM pg_proc WHERE pronamespace = 'public'::regnamespace
            UNION ALL
            SELECT 'type:' || typname FROM pg_type WHERE typnamespace = 'public'::regnamespace
            """
        )
    finally:
        await conn.close()
    return {row["name"] for row in rows}


# ---------------------------------------------------------------------------------------------
# The data model


async def test_every_contract_table_exists(db: asyncpg.Pool, db_schema: str) -> None:
    async with db.acquire() as conn:
        assert await _tables(conn, db_schema) >= CONTRACT_TABLES | {"schema_migrations"}


async def test_tenant_tables_lead_every_key_and_index_with_project_id(
    db: asyncpg.Pool, db_schema: str
) -> None:
    """Tenant scoping by convention: project_id NOT NULL everywhere, first in composite keys."""
    async with db.acquire() as conn:
        tables = await _tables(conn, db_schema)
        columns = await conn.fetch(
            "SELECT table_name, is_nullable FROM information_schema.columns "
            "WHERE table_schema = $1 AND column_name = 'project_id'",
            db_schema,
        )
        indexes = await conn.fetch(
            """
            SELECT t.relname AS table_name, i.relname AS index_name,
                   array_agg(a.attname ORDER BY k.ord) AS columns
              FROM pg_index x
              JOIN pg_class i ON i.oid = x.indexrelid
              JOIN pg_class t ON t.oid = x.indrelid
              JOIN LATERAL unnest(x.indkey) WITH ORDINALITY AS k(attnum, ord) ON true
              JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum
             WHERE t.relnamespace = $1::regnamespace
             GROUP BY t.relname, i.relname
            """,
            db_schema,
        )
    tenant_tables = {r["table_name"] for r in columns}
    assert tenant_tables == tables - UNTENANTED
    assert all(r["is_nullable"] == "NO" for r in columns)
    misplaced = [
        (r["index_name"], r["columns"])
        for r in indexes
        if "project_id" in r["columns"] and r["columns"][0] != "project_id"
    ]
    assert misplaced == []


async def _project(conn: asyncpg.Connection) -> uuid.UUID:
    project_id: uuid.UUID = await conn.fetchval(
        "INSERT INTO projects (name, settings) VALUES ($1, $2) RETURNING id",
        "acme", {"throttle": {"limit": 5, "windowSeconds": 60}},
    )
    return project_id


async def test_message_logs_record_each_task_channel_attempt_kind_once(db: asyncpg.Pool) -> None:
    async with db.acquire() as conn:
        project = await _project(conn)
        row = (project, uuid.uuid4(), "task-1", "user-1", "email", 1, "sent", "sent")
        insert = (
            "INSERT INTO message_logs (project_id, event_id, task_id, user_id, channel, attempt, "
            "kind, status) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
        )
        await conn.execute(insert, *row)
        with pytest.raises(asyncpg.UniqueViolationError):
            await conn.execute(insert, *row)
        # Writers rely on ON CONFLICT to make replays harmless.
        await conn.execute(insert + " ON CONFLICT (task_id, channel, attempt, kind) DO NOTHING",
                           *row)
        await conn.execute(insert, *row[:5], 2, "sent", "sent")  # the next attempt is new
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute(insert, *row[:6], "sent", "not-a-status")
        assert await conn.fetchval("SELECT count(*) FROM message_logs") == 2


async def test_unique_addresses_suppressions_and_keys(db: asyncpg.Pool) -> None:
    async with db.acquire() as conn:
        project = await _project(conn)
        await conn.execute("INSERT INTO users (project_id, id) VALUES ($1, 'u1')", project)
        contact = ("INSERT INTO user_contacts (project_id, user_id, channel, target) "
                   "VALUES ($1, 'u1', 'email', 'a@example.com')")
        await conn.execute(contact, project)
        with pytest.raises(asyncpg.UniqueViolationError):
            await conn.execute(contact, project)

        suppression = ("INSERT INTO suppressions (project_id, channel, target, reason) "
                       "VALUES ($1, 'email', 'a@example.com', 'bounce')")
        await conn.execute(suppression, project)
        with pytest.raises(asyncpg.UniqueViolationError):
            await conn.execute(suppression, project)
        other = await _project(conn)
        await conn.execute(suppression, other)  # unique per project, not across projects

        key = ("INSERT INTO project_api_keys (project_id, key_hash, role) "
               "VALUES ($1, repeat('a', 64), $2)")
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute(key, project, "admin")
        await conn.execute(key, project, "send")
        with pytest.raises(asyncpg.UniqueViolationError):
            await conn.execute(key, other, "full")


async def test_deleting_a_user_erases_profile_contacts_and_preferences(db: asyncpg.Pool) -> None:
    async with db.acquire() as conn:
        project = await _project(conn)
        await conn.execute("INSERT INTO users (project_id, id) VALUES ($1, 'u1')", project)
        await conn.execute(
            "INSERT INTO user_contacts (project_id, user_id, channel, target) "
            "VALUES ($1, 'u1', 'sms', '+15550001111')", project)
        await conn.execute(
            "INSERT INTO user_segments (project_id, user_id, segment) VALUES ($1, 'u1', 'beta')",
            project)
        await conn.execute(
            "INSERT INTO user_channel_preferences VALUES ($1, 'u1', 'sms', false)", project)
        await conn.execute(
            "INSERT INTO user_topic_preferences VALUES ($1, 'u1', 'marketing', false)", project)
        await conn.execute(
            "INSERT INTO quiet_hours VALUES ($1, 'u1', '22:00', '07:00')", project)

        await conn.execute("DELETE FROM users WHERE project_id = $1 AND id = 'u1'", project)

        for table in ("user_contacts", "user_segments", "user_channel_preferences",
                      "user_topic_preferences", "quiet_hours"):
            assert await conn.fetchval(f"SELECT count(*) FROM {table}") == 0, table


async def test_deleting_a_project_deletes_its_sends_outbox_timeline_and_ai_usage_rows(
    db: asyncpg.Pool, database_url: str, db_schema: str
) -> None:
    """Those tables have no per-row foreign key (0009), but a project's deletion still takes
    its sends with it, also from a session whose search_path is not notifkit's schema: no row
    of it is left behind that nothing could reach or remove."""
    async with db.acquire() as conn:
        gone, kept = await _project(conn), await _project(conn)
        for project in (gone, kept):
            await conn.execute(
                "INSERT INTO notifications (id, project_id, template_id, recipients_spec) "
                "VALUES (gen_random_uuid(), $1, 'welcome', '\"u1\"')", project)
            await conn.execute(
                "INSERT INTO delivery_outbox (task_id, channel, destination, project_id, "
                "provider) VALUES ($1, 'sms', '+15550001111', $2, 'twilio')",
                str(project), project)
            await conn.execute(
                "INSERT INTO message_logs (project_id, event_id, task_id, user_id, channel, "
                "kind, status) VALUES ($1, gen_random_uuid(), $2, 'u1', 'sms', 'sent', 'sent')",
                project, str(project))
            await conn.execute(
                "INSERT INTO ai_usage (task_id, project_id, model) VALUES ($1, $2, 'gpt-4o')",
                str(project), project)
    outsider = await asyncpg.connect(database_url)  # search_path: public
    try:
        await outsider.execute(f'DELETE FROM "{db_schema}".projects WHERE id = $1', gone)
    finally:
        await outsider.close()
    async with db.acquire() as conn:
        for table in ("notifications", "delivery_outbox", "message_logs", "ai_usage"):
            left = await conn.fetch(f"SELECT project_id FROM {table}")
            assert [r["project_id"] for r in left] == [kept], table


async def test_workflow_idempotency_and_one_open_digest_window(db: asyncpg.Pool) -> None:
    async with db.acquire() as conn:
        project = await _project(conn)
        trigger = (
            "INSERT INTO workflow_instances (project_id, workflow_id, user_id, steps, "
            "idempotency_key) VALUES ($1, 'onboarding', 'u1', $2, $3) "
            "ON CONFLICT (project_id, idempotency_key) DO NOTHING RETURNING id"
        )
        first = await conn.fetchval(trigger, project, [{"type": "wait", "seconds": 1}], "k1")
        assert first is not None
        assert await conn.fetchval(trigger, project, [], "k1") is None
        second = await conn.fetchval(trigger, project, [], None)
        third_instance = await conn.fetchval(trigger, project, [], None)
        # Without a key every trigger is a new instance (NULLs never conflict).
        assert None not in (second, third_instance)
        assert second != third_instance

        digest = (
            "INSERT INTO workflow_digests (project_id, workflow_id, user_id, step_index, "
            "step_path, owner_instance_id, items, window_ends_at) "
            "VALUES ($1, 'onboarding', 'u1', 2, '2', $2, $3, now() + interval '1 hour') "
            "ON CONFLICT (project_id, workflow_id, user_id, step_path) WHERE closed_at IS NULL "
            "DO UPDATE SET items = workflow_digests.items || EXCLUDED.items "
            "RETURNING owner_instance_id, items"
        )
        owner, _ = await conn.fetchrow(digest, project, first, [{"data": {"n": 1}}])
        again = await conn.fetchrow(digest, project, second, [{"data": {"n": 2}}])
        assert again["owner_instance_id"] == owner == first
        assert again["items"] == [{"data": {"n": 1}}, {"data": {"n": 2}}]
        # Once the owner closes the window, the next arrival opens a new one.
        await conn.execute("UPDATE workflow_digests SET closed_at = now()")
        third = await conn.fetchrow(digest, project, third_instance, [{"data": {"n": 3}}])
        assert third["owner_instance_id"] == third_instance
        assert third["items"] == [{"data": {"n": 3}}]


# ---------------------------------------------------------------------------------------------
# The pool


async def test_pool_connections_use_the_schema_and_decode_json(
    settings: Settings, db: asyncpg.Pool
) -> None:
    assert db.get_max_size() == settings.db_max_connections
    async with db.acquire() as conn:
        assert await conn.fetchval("SELECT current_schema()") == settings.db_schema
        project = await _project(conn)
        stored = await conn.fetchval("SELECT settings FROM projects WHERE id = $1", project)
        assert stored == {"throttle": {"limit": 5, "windowSeconds": 60}}
        assert await conn.fetchval("SELECT $1::json", {"a": [1, "ü"]}) == {"a": [1, "ü"]}


async def test_copy_writes_jsonb_through_the_pool(settings: Settings) -> None:
    """Batch writers use COPY; the jsonb codec must be binary or COPY refuses jsonb columns."""
    pool = await create_pool(settings, max_size=1)
    try:
        async with pool.acquire() as conn:
            project = await _project(conn)
            event = uuid.uuid4()
            records = [
                (project, event, f"task-{i}", "u1", "email", 0, "opened", "delivered",
                 {"url": f"https://example.com/{i}"})
                for i in range(100)
            ]
            await conn.copy_records_to_table(
                "message_logs",
                records=records,
                columns=["project_id", "event_id", "task_id", "user_id", "channel", "attempt",
                         "kind", "status", "metadata"],
            )
            metadata = await conn.fetchval(
                "SELECT metadata FROM message_logs WHERE task_id = 'task-7'"
            )
    finally:
        await pool.close()
    assert metadata == {"url": "https://example.com/7"}


# ---------------------------------------------------------------------------------------------
# Per-test isolation (what the `namespace` and `db_schema` fixtures do)


async def test_isolated_schema_is_migrated_then_dropped(database_url: str) -> None:
    async with isolated_schema(database_url) as schema:
        conn = await asyncpg.connect(database_url)
        try:
            assert await _tables(conn, schema) >= CONTRACT_TABLES | {"schema_migrations"}
            await conn.execute(f'INSERT INTO "{schema}".projects (name) VALUES ($1)', "x")
        finally:
            await conn.close()
    conn = await asyncpg.connect(database_url)
    try:
        assert await conn.fetchval("SELECT to_regnamespace($1)", schema) is None
    finally:
        await conn.close()


async def test_isolated_namespace_deletes_its_keys_and_nobody_elses(
    redis: aioredis.Redis, redis_url: str
) -> None:
    outsider = f"t-outsider-{uuid.uuid4().hex[:8]}:kept"
    await redis.set(outsider, b"1")
    try:
        async with isolated_namespace(redis_url) as name:
            await redis.mset({f"{name}:k{i}": b"v" for i in range(1200)})
            await redis.xadd(f"{name}:notifkit:stream:dlq", {"data": b"{}"})
        assert [key async for key in redis.scan_iter(match=f"{name}:*")] == []
        assert await redis.get(outsider) == b"1"
    finally:
        await redis.delete(outsider)


async def test_the_model_comments_say_where_a_sends_status_and_a_digest_key_are(
    db: asyncpg.Pool,
) -> None:
    """Whoever reads the data model from its comments (the README sends them there) finds
    what the columns hold: notifications.status stays as accepted and the send's status is
    read from message_logs; digest windows are unique per step path, not step index."""
    async with db.acquire() as conn:
        status = await conn.fetchval(
            "SELECT col_description('notifications'::regclass, attnum) FROM pg_attribute "
            "WHERE attrelid = 'notifications'::regclass AND attname = 'status'")
        table = await conn.fetchval("SELECT obj_description('notifications'::regclass)")
        digests = await conn.fetchval("SELECT obj_description('workflow_digests'::regclass)")
    assert status is not None
    assert "message_logs" in status, status
    assert "summary of the whole send" not in table, table
    assert "user_id, step_path)" in digests, digests
    assert "step_index)" not in digests, digests
