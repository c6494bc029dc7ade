"""Whether PostgreSQL can serve: what an error says about the server (rather than about the
statement or its data), and a probe that asks it.

A failure that :func:`unavailable` calls a server's state (unreachable, connections reset or
refused, out of connections, shutting down, a query cut off by its time limit) says nothing
against the work that met it; a constraint violation, a bad value or a bug does. The worker
(:mod:`notifkit.worker.outage`) asks :func:`answers` before it believes the first: a timeout
or a reset connection can also come from a statement of the work's own.

Nor does a :func:`lock_wait`: a statement that gave up waiting for a lock another session
held (a long migration, VACUUM FULL, an operator's LOCK TABLE in an open transaction). The
server answers all the while, so no probe can tell it from the work's own slowness; the
server's error says it instead.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import asyncpg

__all__ = ["UNAVAILABLE_SQLSTATE_CLASSES", "answers", "lock_wait", "rolled_back_for_another",
           "unavailable"]

# PostgreSQL error classes that describe the server's state, not the statement: connection
# exceptions (08), insufficient resources (53: too many connections, disk full), operator
# intervention (57: shutdown, cannot connect now, a statement cancelled by its time limit).
UNAVAILABLE_SQLSTATE_CLASSES = ("08", "53", "57")


def unavailable(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it was raised from, says PostgreSQL cannot serve right
    now. OSError covers a refused or reset connection and the pool's DatabaseUnavailable;
    TimeoutError a query or connection that outlived its limit; a bare asyncpg InterfaceError
    a connection closed under a query (its subclasses are about the client's own input)."""
    for cause in _causes(exc):
        if isinstance(cause, OSError | TimeoutError) or type(cause) is asyncpg.InterfaceError:
            return True
        if isinstance(cause, asyncpg.PostgresError):
            return _sqlstate(cause)[:2] in UNAVAILABLE_SQLSTATE_CLASSES
    return False


# lock_not_available: lock_timeout ended the wait (or a NOWAIT found the lock taken).
LOCK_NOT_AVAILABLE = "55P03"
# query_canceled: statement_timeout, or a cancel request, ended the statement.
QUERY_CANCELED = "57014"
# The context PostgreSQL gives a statement cancelled while it waited for another
# transaction's row: "while updating tuple (0,2) in relation "users"" (locking, deleting,
# inserting index tuple, checking uniqueness of tuple...). A wait for a table's lock has none.
_ROW_LOCK_WAIT = re.compile(r"\bwhile [a-z ]*tuple \(\d+,\d+\) in relation ")


def lock_wait(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it was raised from, is a statement that gave up
    waiting for a lock another session held: 55P03 (the connection's ``lock_timeout``), or
    57014 (``statement_timeout``) whose context names the row it waited for. A statement
    cut off while it worked, or the client's own time limit, says nothing of a lock (the
    pools' ``lock_timeout`` is below their query limit so that a lock wait ends as 55P03)."""
    for cause in _causes(exc):
        if isinstance(cause, asyncpg.PostgresError):
            state = _sqlstate(cause)
            return state == LOCK_NOT_AVAILABLE or (
                state == QUERY_CANCELED
                and _ROW_LOCK_WAIT.search(str(getattr(cause, "context", "") or "")) is not None)
    return False


# transaction_rollback: PostgreSQL ended the transaction for the sake of a concurrent one
# (40P01 deadlock_detected, 40001 serialization_failure).
TRANSACTION_ROLLBACK_CLASS = "40"


def rolled_back_for_another(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it was raised from, is PostgreSQL ending the
    transaction because of a concurrent one: a deadlock it was chosen to break, or a
    serialization failure. Nothing it did was kept, and the same work run again succeeds."""
    for cause in _causes(exc):
        if isinstance(cause, asyncpg.PostgresError):
            return _sqlstate(cause)[:2] == TRANSACTION_ROLLBACK_CLASS
    return False


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it was raised from, five deep at most."""
    cause: BaseException | None = exc
    for _ in range(5):
        if cause is None:
            return
        yield cause
        cause = cause.__cause__


def _sqlstate(exc: asyncpg.PostgresError) -> str:
    return str(getattr(exc, "sqlstate", "") or "")


# Probes that outlived their time, kept referenced until they end (see answers()).
_ABANDONED_PROBES: set[asyncio.Future[Any]] = set()


async def answers(pool: asyncpg.Pool, timeout_s: float) -> bool:
    """Whether PostgreSQL answers ``SELECT 1`` through ``pool`` within ``timeout_s``. The probe
    runs as a task of its own that is left behind, cancelled, when time is up: a query
    cancelled on a server that stopped answering (a partition, a frozen failover) waits for its
    connection to be given back to the pool, which waits for the server, so ``wait_for`` held
    its caller for as long as the stall lasted."""
    probe = asyncio.ensure_future(pool.fetchval("SELECT 1"))
    try:
        await asyncio.wait({probe}, timeout=timeout_s)
    finally:
        if not probe.done():
            probe.cancel()
            _ABANDONED_PROBES.add(probe)
            probe.add_done_callback(_forget_probe)
    return probe.done() and not probe.cancelled() and probe.exception() is None


def _forget_probe(probe: asyncio.Future[Any]) -> None:
    _ABANDONED_PROBES.discard(probe)
    if not probe.cancelled():
        probe.exception()  # retrieved: an abandoned probe's failure is no news
