"""Whether PostgreSQL can serve: what an error says about the server (rather than about the
statement or its data), and a probe that asks it.

A failure that :func:`unavailable` calls a server's state (unreachable, connections reset or
refused, out of connections, shutting down, a query cut off by its time limit) says nothing
against the work that met it; a constraint violation, a bad value or a bug does. The worker
(:mod:`notifkit.worker.outage`) asks :func:`answers` before it believes the first: a timeout
or a reset connection can also come from a statement of the work's own.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

__all__ = ["UNAVAILABLE_SQLSTATE_CLASSES", "answers", "unavailable"]

# PostgreSQL error classes that describe the server's state, not the statement: connection
# exceptions (08), insufficient resources (53: too many connections, disk full), operator
# intervention (57: shutdown, cannot connect now, a statement cancelled by its time limit).
UNAVAILABLE_SQLSTATE_CLASSES = ("08", "53", "57")


def unavailable(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it was raised from, says PostgreSQL cannot serve right
    now. OSError covers a refused or reset connection and the pool's DatabaseUnavailable;
    TimeoutError a query or connection that outlived its limit; a bare asyncpg InterfaceError
    a connection closed under a query (its subclasses are about the client's own input)."""
    seen = 0
    cause: BaseException | None = exc
    while cause is not None and seen < 5:
        if isinstance(cause, OSError | TimeoutError) or type(cause) is asyncpg.InterfaceError:
            return True
        if isinstance(cause, asyncpg.PostgresError):
            return str(getattr(cause, "sqlstate", "") or "")[:2] in UNAVAILABLE_SQLSTATE_CLASSES
        cause = cause.__cause__
        seen += 1
    return False


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
