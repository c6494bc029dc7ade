"""What a PostgreSQL error says: the server cannot serve (a worker holds its work), or the
statement or its data is wrong (the work's own failure, which counts against its attempts).
Each error is one the real server or driver raises."""

from __future__ import annotations

import asyncpg
import pytest

from notifkit.config import Settings
from notifkit.db.availability import lock_wait, unavailable
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


async def test_a_wait_on_a_lock_held_elsewhere_is_a_lock_wait_not_an_error_of_the_work(
    db: asyncpg.Pool, settings: Settings,
) -> None:
    """What PostgreSQL says when a statement waited on a lock another session held: 55P03
    (lock_timeout), or 57014 (statement_timeout) naming the row it waited for."""
    await db.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
    await db.execute("INSERT INTO t VALUES (1, 1)")
    holder = await asyncpg.connect(settings.database_url)
    await holder.execute(f'SET search_path = "{settings.db_schema}"')
    waits: list[BaseException] = []
    try:
        for held, setting in (("LOCK TABLE t IN ACCESS EXCLUSIVE MODE", "lock_timeout"),
                              ("UPDATE t SET v = 2 WHERE id = 1", "lock_timeout"),
                              ("UPDATE t SET v = 2 WHERE id = 1", "statement_timeout")):
            async with holder.transaction():
                await holder.execute(held)
                async with db.acquire() as conn, conn.transaction():
                    await conn.execute(f"SET LOCAL {setting} = 50")
                    with pytest.raises(asyncpg.PostgresError) as caught:
                        await conn.execute("UPDATE t SET v = 3 WHERE id = 1")
                waits.append(caught.value)
    finally:
        await holder.close()
    assert [e.sqlstate for e in waits] == ["55P03", "55P03", "57014"]  # type: ignore[attr-defined]
    for error in waits:
        assert lock_wait(error), repr(error)
        wrapped = RuntimeError("could not record the batch")
        wrapped.__cause__ = error
        assert lock_wait(wrapped)
    # A statement cut off while it worked, and the work's own errors, waited on no lock
    async with db.acquire() as conn:
        await conn.execute("SET statement_timeout = 10")
        with pytest.raises(asyncpg.QueryCanceledError) as slow:
            await conn.execute("SELECT pg_sleep(1)")
        await conn.execute("RESET statement_timeout")
    assert not lock_wait(slow.value)
    for error in [await raised(db, "INSERT INTO t VALUES (1, 1)"),   # unique violation
                  await raised(db, "SELECT '{'::jsonb"), TimeoutError()]:
        assert not lock_wait(error), repr(error)


async def test_a_pools_lock_waits_end_before_its_query_limit(
    db: asyncpg.Pool, settings: Settings,
) -> None:
    """A pool's connections give up a lock wait before the query limit would cut the query
    off (which says nothing of why it took long), so a wait on a lock says so itself."""
    await db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    pool = await create_pool(settings, command_timeout=1.0)
    holder = await asyncpg.connect(settings.database_url)
    try:
        lock_timeout = await pool.fetchval("SHOW lock_timeout")
        assert lock_timeout == "800ms"
        await holder.execute(f'SET search_path = "{settings.db_schema}"')
        async with holder.transaction():
            await holder.execute("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(asyncpg.LockNotAvailableError):
                await pool.execute("INSERT INTO t VALUES (1)")
        # A pool without a query limit waits on locks as long as it takes, as before
        unlimited = await create_pool(settings)
        try:
            assert await unlimited.fetchval("SHOW lock_timeout") == "0"
        finally:
            await unlimited.close()
    finally:
        await holder.close()
        await pool.close()
