"""A PostgreSQL session of a test's own, in the test's schema: another writer, or an
operator's psql, that holds locks while the code under test runs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg

from notifkit.config import Settings


@asynccontextmanager
async def schema_session(settings: Settings) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(settings.database_url)
    try:
        await conn.execute(f'SET search_path = "{settings.db_schema}"')
        yield conn
    finally:
        await conn.close()
