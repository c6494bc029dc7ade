"""A lean HTTP/1.1 keep-alive client for the load generator, on bare asyncio protocols.

The generator shares two cores with everything it measures, and aiohttp's client spends about
a third of a millisecond of CPU per request (its session, timer and payload machinery). In
production the callers run elsewhere, so every microsecond the generator spends here is taken
from the system under test. This client does only what the benchmark needs: POST a pre-encoded
body on a kept-alive connection, one request at a time per connection, and read a response
framed by ``Content-Length`` (aiohttp's server frames every JSON response so). Anything else (a
chunked or unframed response, a connection lost mid-reply) is an error and closes the
connection.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import cast

_HEADER_END = b"\r\n\r\n"


class HttpError(Exception):
    """The request got no usable response."""


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.reusable = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have the same methods.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        end = self.buffer.find(_HEADER_END)
        if end < 0:
            return
        head = bytes(self.buffer[:end]).lower()
        length = _content_length(head)
        if length is None:
            self._fail(HttpError("response without Content-Length"))
            return
        start = end + len(_HEADER_END)
        if len(self.buffer) < start + length:
            return
        body = bytes(self.buffer[start:start + length])
        del self.buffer[:start + length]
        if b"\r\nconnection: close" in head:
            self.reusable = False
        try:
            status = int(head[9:12])
        except ValueError:
            self._fail(HttpError("unreadable status line"))
            return
        self.waiter = None
        waiter.set_result((status, body))

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        self._fail(HttpError(f"connection lost: {exc}"))

    def _fail(self, error: HttpError) -> None:
        self.reusable = False
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)
        if self.transport is not None:
            self.transport.close()


def _content_length(head: bytes) -> int | None:
    at = head.find(b"\r\ncontent-length:")
    if at < 0:
        return None
    end = head.find(b"\r\n", at + 2)
    value = head[at + 17:] if end < 0 else head[at + 17:end]
    try:
        return int(value.strip())
    except ValueError:
        return None


class RawHttpClient:
    """POSTs to one path of one host over up to ``max_connections`` kept-alive connections."""

    def __init__(self, host: str, port: int, path: str, headers: dict[str, str],
                 timeout_s: float = 60.0) -> None:
        self.host = host
        self.port = port
        lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        self._head = ("\r\n".join(lines) + "\r\nContent-Length: ").encode()
        self.timeout_s = timeout_s
        self._idle: deque[_Connection] = deque()
        self._open: set[_Connection] = set()

    async def post(self, body: bytes) -> tuple[int, bytes]:
        conn = self._idle.pop() if self._idle else await self._connect()
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[tuple[int, bytes]] = loop.create_future()
        conn.waiter = waiter
        assert conn.transport is not None
        conn.transport.write(b"".join((self._head, str(len(body)).encode(), _HEADER_END,
                                       body)))
        timer = loop.call_later(self.timeout_s, conn._fail, HttpError("timed out"))
        try:
            return await waiter
        finally:
            timer.cancel()
            if conn.reusable:
                self._idle.append(conn)
            else:
                self._open.discard(conn)

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        _transport, conn = await loop.create_connection(_Connection, self.host, self.port)
        self._open.add(conn)
        return conn

    def close(self) -> None:
        for conn in self._open:
            if conn.transport is not None:
                conn.transport.close()
        self._open.clear()
        self._idle.clear()
