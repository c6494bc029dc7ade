"""One Redis namespace and one PostgreSQL schema per test, removed afterwards.

The conftest fixtures ``namespace`` and ``db_schema`` are thin wrappers around these, so the
clean-up itself is tested (tests/integration/test_migrations.py).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import redis.asyncio as aioredis

from notifkit.db.migrate import migrate_connection
from scenarios.harness import unlink_namespace


@asynccontextmanager
async def isolated_namespace(redis_url: str) -> AsyncIterator[str]:
    """A namespace no other test uses; every ``{namespace}:*`` key is deleted afterwards."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    try:
        yield name
    finally:
        client = aioredis.Redis.from_url(redis_url)
        try:
            await unlink_namespace(client, name)
        finally:
            await client.aclose()


@asynccontextmanager
async def isolated_schema(database_url: str) -> AsyncIterator[str]:
    """A schema of its own, migrated to the latest version; dropped with everything in it.

    Migrating 0001 takes about 50 ms and dropping about 20 ms, so each test gets a fresh one.
    """
    schema = f"t_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(database_url)
    try:
        await migrate_connection(conn, schema)
        yield schema
    finally:
        try:
            # A test that left a transaction open makes this wait: fail its teardown, don't hang.
            await conn.execute("SET lock_timeout = '10s'")
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()
