"""PostgreSQL connections: one pool per service, every connection set up the same way.

Each connection gets ``search_path`` = ``DB_SCHEMA`` (so queries and migrations use unqualified
names) and codecs that turn ``json``/``jsonb`` into Python objects and back with
:mod:`notifkit.codec` (orjson when installed). The jsonb codec uses PostgreSQL's binary format
(a version byte ``1`` followed by the JSON text), which also lets ``copy_records_to_table``
write jsonb columns: a text-format codec would make COPY fail.

Pass Python objects (dicts, lists, strings, numbers) as json/jsonb parameters; a string is
stored as a JSON string, not parsed.

Connections also run with ``plan_cache_mode = force_custom_plan``. asyncpg prepares every
statement, and after five executions PostgreSQL may keep one generic plan for it. A generic
plan made while a table was small is a sequential scan, and it stays cached while the table
grows until autovacuum next analyzes it: on a new schema that took 50,000 notifications in a
few seconds, the enricher's status UPDATE scanned the whole table, over 100 ms a batch, and
critical sends waited behind it. Planning every execution has a price: at benchmark
saturation PostgreSQL spent about 0.07 ms more CPU per notification (0.64 against 0.55-0.60 ms,
two interleaved runs each), with no loss of throughput beyond the noise; at moderate load, where
batches are small, it is more (PostgreSQL used a seventh less CPU at 500/s offered with generic
plans, measured only). A plan a hundred times slower costs more than that.

The send path's own stages (enricher, engine, delivery) are the exception: their statements
are key probes and batch writes whose plans do not depend on the values they are given, and
at moderate load, where each batch is a notification or two, planning was 60 % of their
PostgreSQL time (0.26 ms to plan delivery's outbox claim against 0.08 ms to run it). Their
pools (``generic_plans=True``) run ``force_generic_plan`` and drop each prepared statement
``GENERIC_PLAN_LIFETIME_S`` after preparing it, so a plan is at most that old: made for the
tables as they are now, not as they were when the schema was new (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import asyncpg

from notifkit.codec import dumps as json_dumps
from notifkit.codec import loads as json_loads
from notifkit.config import DatabaseDsn, Settings, database_dsn
from notifkit.db.priority_pool import PriorityPool

__all__ = ["GENERIC_PLAN_LIFETIME_S", "LOCK_WAIT_SHARE", "POOL_CLOSE_TIMEOUT_S",
           "QUERY_TIMEOUT_S", "DatabaseUnavailable", "allow_lock_wait", "close_pool", "connect",
           "create_pool", "init_connection", "lock_timeout_ms"]

log = logging.getLogger("notifkit.db")

# The longest a query, or opening a connection for one, may take in every service's pool: a
# PostgreSQL that stops answering without closing its connections (a partition, a frozen
# failover, a lock held) then makes the query fail instead of holding its request or batch for
# as long as the stall lasts. asyncpg then spends as long again trying to cancel the query
# before it drops the connection, so a caller caught in a stall hears of it after about twice
# this. Every query a service makes in a request or a batch is bounded by the request's or
# batch's size (segments and rebuilds are read a page at a time), so 10 s is a stall, not
# work; the few whose cost grows with the data pass a longer ``timeout`` of their own.
QUERY_TIMEOUT_S = 10.0
# A pool with a query limit gives up a wait for a lock (``lock_timeout``) at this share of
# it. Cut off by the limit itself, a query that waited on a lock another session held (a
# long migration, VACUUM FULL, an operator's LOCK TABLE) failed with a bare TimeoutError
# while PostgreSQL answered every probe, so the worker counted the wait as the work's own
# failure; ended first by the server, it fails with 55P03, which says it was a lock, and
# the worker holds the work instead (notifkit/worker/outage.py).
LOCK_WAIT_SHARE = 0.8


class DatabaseUnavailable(ConnectionError):
    """PostgreSQL at ``DATABASE_URL`` could not be connected to (unreachable, unknown database or
    role, refused credentials, bad connection options). A :class:`ConnectionError`, so callers
    that handle an unreachable server keep doing so; the message names the setting."""


# What asyncpg raises when it cannot open a connection: OSError for the network, PostgresError
# for the server's refusal (unknown database or role, password), InterfaceError (and its
# ClientConfigurationError) and ValueError for options it cannot use.
_CONNECT_ERRORS = (OSError, asyncio.TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError,
                   ValueError)


def _unavailable(exc: BaseException) -> DatabaseUnavailable:
    # A timeout's own text is empty: without this the line ended in "PostgreSQL: ".
    reason = str(exc) or ("no answer in time (is a PostgreSQL server listening there?)"
                          if isinstance(exc, TimeoutError) else type(exc).__name__)
    return DatabaseUnavailable(f"DATABASE_URL: cannot connect to PostgreSQL: {reason}")


_POOL_FLOOR = "Failed to restore the pool connection floor"


class PoolFloorFilter(logging.Filter):
    """After PostgreSQL dropped a pool's connections, asyncpg retries opening one (after 1 s,
    2 s, ... up to 60 s) and logs each failed try as a warning with some 30 lines of traceback
    through its own connect code, for every pool: seven pools gave 28 of them in a 10 s
    outage. This filter makes each one line naming the setting and the cause."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and str(record.msg).startswith(_POOL_FLOOR):
            record.msg = ("Cannot reconnect to PostgreSQL (DATABASE_URL) to refill a "
                          "connection pool (%s: %s); asyncpg tries again after a growing "
                          "delay, at most 60 s.")
            record.args = (type(exc).__name__, str(exc) or "no detail")
            record.exc_info, record.exc_text = None, None
        return True


def quiet_pool_floor_warnings() -> None:
    """Install :class:`PoolFloorFilter` on asyncpg's pool logger (once)."""
    pool_log = logging.getLogger("asyncpg.pool")
    if not any(isinstance(f, PoolFloorFilter) for f in pool_log.filters):
        pool_log.addFilter(PoolFloorFilter())


_JSONB_VERSION = b"\x01"


def _encode_jsonb(value: Any) -> bytes:
    return _JSONB_VERSION + json_dumps(value)


def _decode_jsonb(data: bytes) -> Any:
    if data[:1] != _JSONB_VERSION:
        raise ValueError(f"unsupported jsonb binary format version {data[:1]!r}")
    return json_loads(data[1:])


async def init_connection(conn: asyncpg.Connection) -> None:
    """Install the json/jsonb codecs on one connection (pools do this for every connection)."""
    await conn.set_type_codec(
        "jsonb", schema="pg_catalog", encoder=_encode_jsonb, decoder=_decode_jsonb,
        format="binary",
    )
    await conn.set_type_codec(
        "json", schema="pg_catalog", encoder=json_dumps, decoder=json_loads, format="binary",
    )


def _connect_timeout(dsn: DatabaseDsn, limit_s: float | None) -> dict[str, Any]:
    """asyncpg's ``timeout`` for opening a connection: the URL's connect_timeout (0: no limit,
    as libpq), or ``limit_s`` when that is shorter; neither given, asyncpg's own 60 s."""
    given = dsn.connect_timeout_s
    if given is None:
        return {} if limit_s is None else {"timeout": limit_s}
    if given == 0:
        return {"timeout": limit_s}
    return {"timeout": given if limit_s is None else min(given, limit_s)}


def lock_timeout_ms(limit_s: float) -> int:
    """The ``lock_timeout`` of queries whose time limit is ``limit_s``."""
    return max(1, int(limit_s * LOCK_WAIT_SHARE * 1000))


async def allow_lock_wait(conn: asyncpg.Connection, limit_s: float) -> None:
    """In a transaction, let its lock waits last as long as a query with a limit of its own
    (``limit_s``, passed as ``timeout``) may take, instead of the pool's share of its own
    limit: a digest window's joiners rightly queue on its row for longer."""
    await conn.execute(f"SET LOCAL lock_timeout = {lock_timeout_ms(limit_s)}")


# Seconds a generic plan lives (generic_plans=True): long enough that planning is paid once
# per statement and connection every few thousand executions under load, short enough that a
# table filling up fast (tens of thousands of rows into a new schema) is soon planned for
# its new size.
GENERIC_PLAN_LIFETIME_S = 2


def _server_settings(settings: Settings, application_name: str,
                     query_limit_s: float | None = None,
                     generic_plans: bool = False) -> dict[str, str]:
    # DB_SCHEMA is validated as a lower-case identifier; quoting keeps words like "user" literal.
    server = {"search_path": f'"{settings.db_schema}"', "application_name": application_name,
              "plan_cache_mode": "force_generic_plan" if generic_plans
              else "force_custom_plan"}
    if query_limit_s is not None:
        server["lock_timeout"] = str(lock_timeout_ms(query_limit_s))
    return server


async def create_pool(
    settings: Settings,
    *,
    min_size: int = 1,
    max_size: int | None = None,
    application_name: str = "notifkit",
    urgent: Callable[[], bool] | None = None,
    command_timeout: float | None = None,
    acquire_timeout: float | None = None,
    generic_plans: bool = False,
) -> PriorityPool:
    """A pool of at most ``max_size`` (default ``DB_MAX_CONNECTIONS``) prepared connections;
    when every connection is busy, tasks for which ``urgent()`` is true get the next one.
    ``command_timeout``: seconds a query, or opening a connection, may take before it fails
    with ``TimeoutError`` (None: queries have no limit, a connection asyncpg's 60 s); a shorter
    ``connect_timeout`` in DATABASE_URL bounds opening a connection. With a limit, a wait for
    a lock ends sooner, at ``LOCK_WAIT_SHARE`` of it, as 55P03 (lock_not_available).
    ``acquire_timeout``: seconds a caller may wait for a free connection (opening one
    included) before it fails with ``TimeoutError`` (None: no limit). ``generic_plans``:
    statements keep one generic plan for ``GENERIC_PLAN_LIFETIME_S`` instead of being planned
    at every execution (see the module's docstring for when that is right)."""
    size = settings.db_max_connections if max_size is None else max_size
    quiet_pool_floor_warnings()
    dsn = database_dsn(settings.database_url)
    # asyncpg.create_pool's own defaults, on the subclass it cannot be told to build.
    pool = PriorityPool(
        dsn.url,
        min_size=min(min_size, size),
        max_size=size,
        max_queries=50_000,
        max_cached_statement_lifetime=GENERIC_PLAN_LIFETIME_S if generic_plans else 300,
        max_inactive_connection_lifetime=300.0,
        loop=None,
        connection_class=asyncpg.Connection,
        record_class=asyncpg.Record,
        server_settings=_server_settings(settings, application_name, command_timeout,
                                         generic_plans),
        init=init_connection,
        reset=_keep_session,
        urgent=urgent,
        acquire_timeout=acquire_timeout,
        command_timeout=command_timeout,
        **_connect_timeout(dsn, command_timeout),
    )
    try:
        await pool
    except _CONNECT_ERRORS as exc:
        raise _unavailable(exc) from exc
    return pool


# How long closing a pool may wait for the server to see its connections off. A healthy server
# takes a round trip; one that stalled (a partition, a frozen failover) never answered, and
# each connection's goodbye waited for the query limit and then raised TimeoutError out of the
# service's stop: a SIGTERM took 52 s against a 10 s grace, with a traceback per service.
POOL_CLOSE_TIMEOUT_S = 1.0


async def close_pool(pool: asyncpg.Pool, timeout_s: float = POOL_CLOSE_TIMEOUT_S) -> None:
    """Close ``pool`` gracefully, or, if the server does not see it off within ``timeout_s``
    (or the close fails), drop its connections (a reset): a stop goes on either way. With
    no time left (a stop past its grace), they are dropped at once."""
    if timeout_s <= 0:
        pool.terminate()
        return
    try:
        async with asyncio.timeout(timeout_s):
            await pool.close()
    except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        pool.terminate()
        log.info("PostgreSQL did not see a pool's connections off within %g s (%s); they were "
                 "dropped instead.", timeout_s, type(exc).__name__)


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Release a connection to its pool without asyncpg's reset query (advisory unlock, CLOSE
    ALL, UNLISTEN, RESET ALL): one round trip per acquire that buys nothing here, since notifkit
    leaves no session state on pooled connections. An open transaction is still rolled back
    (asyncpg does that before calling this)."""


async def connect(settings: Settings, *, application_name: str = "notifkit") -> asyncpg.Connection:
    """One connection set up like a pool's (search_path and codecs); the caller closes it.
    Its queries have no time limit: migrations run on it, and one that rewrites a large table,
    or waits for another process's migration lock, can rightly take minutes."""
    dsn = database_dsn(settings.database_url)
    try:
        conn: asyncpg.Connection = await asyncpg.connect(
            dsn.url, server_settings=_server_settings(settings, application_name),
            **_connect_timeout(dsn, None),
        )
    except _CONNECT_ERRORS as exc:
        raise _unavailable(exc) from exc
    try:
        await init_connection(conn)
    except BaseException:
        await conn.close()
        raise
    return conn
