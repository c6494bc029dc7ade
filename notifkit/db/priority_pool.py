"""A connection pool that serves urgent waiters first.

A worker of priority streams (critical / normal / low) shares one pool of
``DB_MAX_CONNECTIONS`` between its batches. asyncpg hands a free connection to whoever asked
first, so with a low backlog a critical batch queued behind every low batch already waiting:
100-140 ms a stage with two connections. :class:`PriorityPool` puts a gate with one permit per
connection in front of asyncpg's own queue and hands a returned permit to an urgent waiter
before any other, so a critical batch waits at most for one statement or transaction that
already holds a connection, and the process still opens no more than ``DB_MAX_CONNECTIONS``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Generator
from types import TracebackType
from typing import Any

import asyncpg

__all__ = ["PriorityGate", "PriorityPool"]


def _never() -> bool:
    return False


class PriorityGate:
    """``permits`` holders at a time; a released permit goes to the longest-waiting urgent
    waiter, then to the longest-waiting other one."""

    def __init__(self, permits: int) -> None:
        self._free = permits
        self._urgent: deque[asyncio.Future[None]] = deque()
        self._normal: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return sum(not f.done() for f in self._urgent) + sum(not f.done() for f in self._normal)

    async def acquire(self, urgent: Callable[[], bool]) -> None:
        # A permit is handed straight to a waiter on release, so a free one means nobody waits.
        if self._free:
            self._free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        (self._urgent if urgent() else self._normal).append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed over just as the wait was cancelled: pass it on
            raise

    def release(self) -> None:
        for queue in (self._urgent, self._normal):
            while queue:
                waiter = queue.popleft()
                if not waiter.done():  # a cancelled waiter stays queued until it comes up
                    waiter.set_result(None)
                    return
        self._free += 1


class _Acquire:
    """What :meth:`PriorityPool.acquire` returns: awaitable, or an async context manager that
    releases the connection on exit, like asyncpg's own."""

    __slots__ = ("_conn", "_pool", "_timeout")

    def __init__(self, pool: PriorityPool, timeout: float | None) -> None:
        self._pool = pool
        self._timeout = timeout
        self._conn: Any = None

    async def _get(self) -> Any:
        if self._timeout is None:
            return await self._pool._take()
        return await asyncio.wait_for(self._pool._take(), self._timeout)

    def __await__(self) -> Generator[Any, None, Any]:
        return self._get().__await__()

    async def __aenter__(self) -> Any:
        self._conn = await self._get()
        return self._conn

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        conn, self._conn = self._conn, None
        await self._pool.release(conn)


class PriorityPool(asyncpg.Pool):  # type: ignore[misc]
    """An asyncpg pool whose waiters are served urgent first; ``urgent()`` tells, for the
    task asking, whether it is. Every other method (``fetch``, ``execute``, ...) acquires
    through :meth:`acquire`, so they queue the same way."""

    def __init__(self, *args: Any, urgent: Callable[[], bool] | None = None,
                 acquire_timeout: float | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._gate = PriorityGate(kwargs["max_size"])
        self._urgent = urgent or _never
        # How long an acquire without a ``timeout`` of its own may wait for a connection
        # (None: as long as it takes); ``fetch``, ``execute``... acquire that way too.
        self._acquire_timeout = acquire_timeout
        self._held: set[int] = set()  # ids of the connections handed out through the gate

    def acquire(self, *, timeout: float | None = None) -> _Acquire:  # type: ignore[override]
        return _Acquire(self, self._acquire_timeout if timeout is None else timeout)

    async def _take(self) -> Any:
        await self._gate.acquire(self._urgent)
        try:
            conn = await super().acquire()
        except BaseException:
            self._gate.release()
            raise
        self._held.add(id(conn))
        return conn

    async def release(
        self, connection: Any, *, timeout: float | None = None,  # noqa: ASYNC109 (asyncpg)
    ) -> None:
        held = id(connection) in self._held
        self._held.discard(id(connection))
        try:
            await super().release(connection, timeout=timeout)
        finally:
            if held:
                self._gate.release()

    @property
    def waiting(self) -> int:
        """Tasks waiting for a connection."""
        return self._gate.waiting
