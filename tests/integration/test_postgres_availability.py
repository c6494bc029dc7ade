"""What a PostgreSQL error says: the server cannot serve (a worker holds its work), or the
statement or its data is wrong (the work's own failure, which counts against its attempts).
Each error is one the real server or driver raises."""

from __future__ import annotations

import asyncpg
import pytest

from notifkit.config import Settings
from notifkit.db.availability import unavailable
from notifkit.db.pool import create_pool
from tests.support.pg_proxy import PostgresProxy


async def raised(pool: asyncpg.Pool, query: str, *args: object) -> BaseException:
    with pytest.raises(Exception) as caught:
        await pool.execute(query, *args)
    return caught.value


async def test_errors_of_the_statement_or_its_data_are_not_an_outage(db: asyncpg.Pool) -> None:
    await db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    await db.execute("INSERT INTO t VALUES (1)")
    for error in [
        await raised(db, "INSERT INTO t VALUES (1)"),            # unique violation
        await raised(db, "INSERT INTO t VALUES ($1)", "one"),    # bad parameter
        await raised(db, "SELECT 1 / 0"),                         # division by zero
        await raised(db, "SELECT nope FROM t"),                   # undefined column
        await raised(db, "SELECT '{'::jsonb"),                    # bad data
    ]:
        assert not unavailable(error), repr(error)


async def test_a_statement_cut_off_by_its_time_limit_is(db: asyncpg.Pool) -> None:
    async with db.acquire() as conn:
        await conn.execute("SET statement_timeout = 10")
        with pytest.raises(asyncpg.QueryCanceledError) as caught:
            await conn.execute("SELECT pg_sleep(1)")
        await conn.execute("RESET statement_timeout")
    assert unavailable(caught.value)


async def test_a_server_that_went_away_is(settings: Settings) -> None:
    async with PostgresProxy(settings) as proxy:
        pool = await create_pool(proxy.settings, max_size=1)
        try:
            await proxy.cut()
            reset = await raised(pool, "SELECT 1")       # the open connection, reset
            refused = await raised(pool, "SELECT 1")     # a new one, refused
        finally:
            pool.terminate()
    assert unavailable(reset), repr(reset)
    assert unavailable(refused), repr(refused)
    assert not unavailable(RuntimeError("batch failed"))
    wrapped = RuntimeError("could not load recipients")
    wrapped.__cause__ = refused
    assert unavailable(wrapped)
