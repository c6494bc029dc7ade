"""Pipelines for the hot path: redis-py's connections and wire protocol, without its
per-call machinery.

A call through redis-py's client costs about 60 µs of CPU besides its round trip: the
blocking pool's condition and timeout, the retry wrapper, observability hooks and event
dispatch. Every stage pays it several times per batch (read, attempt counters, dedup marks,
emit and ack), and at low load a batch is one or two entries, so it is most of what a
notification costs. :class:`Pipe` sends the same commands over the same kind of connection
with none of that: it keeps a few connections of the client's own pool aside, counted as in
use by that pool, so the pool's ``max_connections`` still bounds the total and closing the
client closes them.

Semantics are those of a redis-py pipeline: replies in order, raw (no response callbacks, so
use it only for commands whose raw reply is what the caller wants), the first error reply
raised after every reply was read. There is no MULTI/EXEC mode: what must be atomic goes in
one script call (see the worker's settle script), which, unlike MULTI, stops at a refusal.
A connection that fails or is interrupted mid-call (a cancelled task) is closed, never
reused with a reply still unread. A call that fails on a connection that sat idle (Redis
restarted meanwhile) is sent once more on a new one, as redis-py's retry does. A connection
error or timeout after the commands were written is :class:`ReplyLost`: Redis may have run
them, and a caller for whom that matters must find out before it undoes anything.
"""

from __future__ import annotations

import asyncio
import collections
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from notifkit.stop_signals import cancel_requested

__all__ = ["Pipe", "ReplyLost", "ReplyTimedOut", "pipe"]

Command = tuple[Any, ...]

_RETRYABLE = (RedisConnectionError, RedisTimeoutError, OSError)


class ReplyLost(RedisConnectionError):
    """The commands went out but their replies did not all come back (the connection broke or
    timed out while they were read): some or all of them may have run."""


class ReplyTimedOut(ReplyLost, RedisTimeoutError):
    """:class:`ReplyLost` to a timeout, still a timeout to callers that tell them apart."""


class _Lane:
    """Connections of one pool kept aside for :class:`Pipe` (LIFO, so few stay warm).

    They are counted in the pool's in-use set: the pool's ``max_connections`` bounds them
    and the pool's ``disconnect()`` (closing the client) closes them. The lane owns at most
    half of the pool, so the client's own commands always have connections left; a call
    that finds the lane's share busy waits for one of them to come back.
    """

    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool
        self.idle: list[AbstractConnection] = []
        self.owned = 0
        self.limit = max(1, int(getattr(pool, "max_connections", 2)) // 2)
        self.timeout_s = float(getattr(pool, "timeout", None) or 10.0)
        self.waiters: collections.deque[asyncio.Future[AbstractConnection | None]] = (
            collections.deque())

    def _in_use(self) -> set[AbstractConnection]:
        in_use: set[AbstractConnection] = self.pool._in_use_connections
        return in_use

    def _room(self) -> bool:
        pool = self.pool
        total = len(self._in_use()) + len(pool._available_connections)
        return self.owned < self.limit and total < pool.max_connections

    async def take(self) -> tuple[AbstractConnection, bool]:
        """(connection, reused: it sat idle before this call)."""
        deadline = None
        while True:
            in_use = self._in_use()
            while self.idle:
                conn = self.idle.pop()
                if conn in in_use:  # not closed with the pool meanwhile
                    return conn, True
                self.owned -= 1
            if self._room():
                conn = self.pool.make_connection()  # type: ignore[no-untyped-call]
                in_use.add(conn)
                self.owned += 1
                try:
                    await conn.connect()
                except BaseException:
                    self._drop(conn)
                    raise
                if cancel_requested():
                    self.give_back(conn, healthy=True)  # the new connection itself is sound
                    raise asyncio.CancelledError
                return conn, False
            loop = asyncio.get_running_loop()
            deadline = deadline or loop.time() + self.timeout_s
            waiter: asyncio.Future[AbstractConnection | None] = loop.create_future()
            self.waiters.append(waiter)
            try:
                async with asyncio.timeout_at(deadline):
                    handed = await waiter
            except BaseException as exc:
                # Woken and interrupted at once: pass on what this call was handed.
                if waiter.done() and not waiter.cancelled():
                    if (given := waiter.result()) is not None:
                        self.give_back(given, healthy=True)
                    else:
                        self._wake(None)
                else:
                    waiter.cancel()
                if isinstance(exc, TimeoutError):
                    raise RedisConnectionError("No connection available.") from None
                raise
            if handed is not None:
                return handed, True
            # None: a connection was dropped, so there is room to open one.

    def give_back(self, conn: AbstractConnection, *, healthy: bool) -> None:
        if not healthy:
            self._drop(conn)
            conn._close()  # type: ignore[no-untyped-call]  # synchronous: this may run in a cancelled task
            self._wake(None)
            return
        if conn not in self._in_use():  # the pool was closed meanwhile
            self.owned -= 1
            self._wake(None)
            return
        if not self._wake(conn):
            self.idle.append(conn)

    def _drop(self, conn: AbstractConnection) -> None:
        self._in_use().discard(conn)
        self.owned -= 1

    def _wake(self, handed: AbstractConnection | None) -> bool:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(handed)
                return True
        return False


_lanes: weakref.WeakKeyDictionary[ConnectionPool, _Lane] = weakref.WeakKeyDictionary()


def _lane(redis: Redis) -> _Lane:
    pool = redis.connection_pool
    lane = _lanes.get(pool)
    if lane is None:
        lane = _lanes[pool] = _Lane(pool)
    return lane


class Pipe:
    """Commands queued as argument tuples, sent in one write, replies read in order."""

    __slots__ = ("_redis", "commands")

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self.commands: list[Command] = []

    def __len__(self) -> int:
        return len(self.commands)

    # -- the commands the hot path sends (raw replies equal redis-py's for these) --------
    def command(self, *args: Any) -> Pipe:
        self.commands.append(args)
        return self

    def xadd(self, stream: str, fields: Mapping[Any, Any], *, maxlen: int | None = None,
             approximate: bool = True) -> Pipe:
        args: list[Any] = ["XADD", stream]
        if maxlen is not None:
            args += ["MAXLEN", "~" if approximate else "=", maxlen]
        args.append("*")
        for name, value in fields.items():
            args += [name, value]
        self.commands.append(tuple(args))
        return self

    def xack(self, stream: str, group: str, *ids: str) -> Pipe:
        self.commands.append(("XACK", stream, group, *ids))
        return self

    def eval(self, script: str, numkeys: int, *keys_and_args: Any) -> Pipe:
        self.commands.append(("EVAL", script, numkeys, *keys_and_args))
        return self

    def delete(self, *names: str) -> Pipe:
        self.commands.append(("DEL", *names))
        return self

    def set(self, name: str, value: Any, *, ex: int | None = None, nx: bool = False,
            get: bool = False) -> Pipe:
        args: list[Any] = ["SET", name, value]
        if ex is not None:
            args += ["EX", ex]
        if nx:
            args.append("NX")
        if get:
            args.append("GET")
        self.commands.append(tuple(args))
        return self

    # -- sending ----------------------------------------------------------------------
    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        if not self.commands:
            return []
        lane = _lane(self._redis)
        written = [False]  # set once some attempt began writing the commands
        try:
            try:
                return await self._once(lane, raise_on_error, written)
            except _StaleConnection:
                # The connection had died while idle (a Redis restart, say). redis-py retries
                # such failures; so do we, once, on a new connection.
                pass
            try:
                return await self._once(lane, raise_on_error, written)
            except _StaleConnection as again:
                raise again.cause from None
        except _RETRYABLE as exc:
            if written[0] and not isinstance(exc, ReplyLost):
                lost = ReplyTimedOut if isinstance(exc, RedisTimeoutError) else ReplyLost
                raise lost(str(exc)) from exc
            raise

    async def _once(self, lane: _Lane, raise_on_error: bool, written: list[bool]) -> list[Any]:
        conn, reused = await lane.take()
        healthy = False
        try:
            written[0] = True
            replies = await self._call(conn)
            healthy = True
        except _RETRYABLE as exc:
            if reused:
                raise _StaleConnection(exc) from exc
            raise
        finally:
            lane.give_back(conn, healthy=healthy)
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, ResponseError):
                    raise reply
        return replies

    async def _call(self, conn: AbstractConnection) -> list[Any]:
        await conn.send_packed_command(pack(self.commands), check_health=False)
        if cancel_requested():
            raise asyncio.CancelledError  # replies are owed: the connection is closed
        return [await _read(conn) for _ in self.commands]


# Headers of the common lengths, built once: formatting one per argument was the packer's
# largest cost.
_ARRAY_HEADERS = [b"*%d\r\n" % n for n in range(256)]
_BULK_HEADERS = [b"$%d\r\n" % n for n in range(4096)]


def pack(commands: Iterable[Command]) -> bytes:
    """The commands in the Redis protocol, in one buffer.

    redis-py's packer walks every argument through its encoder and re-joins the buffer once
    per argument: about a seventh of a pipeline stage's CPU at saturation. The encoding is
    the same (str as UTF-8, int and float by ``repr``, bool refused).
    """
    out: list[bytes] = []
    append = out.append
    for args in commands:
        count = len(args)
        append(_ARRAY_HEADERS[count] if count < 256 else b"*%d\r\n" % count)
        for arg in args:
            kind = type(arg)
            if kind is str:
                data = arg.encode()
            elif kind is bytes:
                data = arg
            else:
                data = _encode(arg)
            size = len(data)
            append(_BULK_HEADERS[size] if size < 4096 else b"$%d\r\n" % size)
            append(data)
            append(b"\r\n")
    return b"".join(out)


def _encode(arg: Any) -> bytes:
    if isinstance(arg, bytes):
        return arg
    if isinstance(arg, str):
        return arg.encode()
    if isinstance(arg, int | float) and not isinstance(arg, bool):
        return repr(arg).encode()
    if isinstance(arg, bytearray | memoryview):
        return bytes(arg)
    raise DataError(f"Invalid input of type: {type(arg).__name__!r}. Convert to bytes, str, "
                    "int or float first.")


async def _read(conn: AbstractConnection) -> Any:
    try:
        return await conn.read_response()
    except ResponseError as exc:  # a reply like any other: the stream stays in step
        return exc


class _StaleConnection(Exception):
    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def pipe(redis: Redis) -> Pipe:
    return Pipe(redis)
