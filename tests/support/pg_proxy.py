"""A TCP proxy to PostgreSQL that a test breaks and mends, for the two ways a server goes away:

    stall()    forwards nothing more in either direction and keeps every connection open (and
               accepts new ones, which hang the same way): a network partition, or a server
               frozen mid-failover, rather than one that refuses connections
    cut()      resets every open connection and refuses new ones: a server that went down
    restore()  ends either; new connections reach the server again

    async with PostgresProxy(settings) as proxy:
        proxied = proxy.settings   # ``settings`` with DATABASE_URL through the proxy

The scenarios' :class:`~scenarios.tcp_proxy.TcpProxy` with a stall added.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType
from urllib.parse import urlsplit

from notifkit.config import Settings
from scenarios.tcp_proxy import CHUNK_BYTES, TcpProxy


class PostgresProxy(TcpProxy):
    def __init__(self, settings: Settings) -> None:
        self._url = urlsplit(settings.database_url)
        super().__init__(self._url.hostname or "127.0.0.1", self._url.port or 5432)
        self._base = settings
        self.stalled = asyncio.Event()
        self._mended = asyncio.Event()  # set when the connections a stall held are reset

    @property
    def settings(self) -> Settings:
        """The settings it was made from, reaching PostgreSQL through this proxy."""
        user = self._url.username or "postgres"
        return self._base.replace(database_url=self._url._replace(
            netloc=f"{user}@127.0.0.1:{self.port}").geturl())

    def stall(self) -> None:
        self._mended.clear()
        self.stalled.set()

    def restore(self) -> None:
        """New connections reach the server again; stalled ones are reset."""
        super().restore()
        if self.stalled.is_set():
            self.stalled.clear()
            self._drop_all()
            self._mended.set()

    async def stop(self) -> None:
        self._mended.set()
        await super().stop()

    async def __aenter__(self) -> PostgresProxy:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while not self.down and (chunk := await reader.read(CHUNK_BYTES)):
                if self.stalled.is_set():
                    # Holds the connection and forwards nothing, until restore() or stop()
                    # resets it.
                    await self._mended.wait()
                    return
                writer.write(chunk)
                await writer.drain()
        with contextlib.suppress(Exception):
            writer.transport.abort()


class StallingRedisProxy(PostgresProxy):
    """The same proxy in front of Redis: ``settings`` has REDIS_URL through it."""

    def __init__(self, settings: Settings) -> None:
        self._redis = urlsplit(settings.redis_url)
        super().__init__(settings.replace(database_url=self._redis._replace(
            scheme="postgresql").geturl()))
        self._base = settings

    @property
    def settings(self) -> Settings:
        return self._base.replace(redis_url=self._redis._replace(
            netloc=f"127.0.0.1:{self.port}").geturl())
