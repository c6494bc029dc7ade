"""A TCP proxy to Redis that breaks the connection carrying an XADD, in one of two places.

    "reply"    the command reaches Redis, which runs it; its reply is dropped and the
               connection reset: the client cannot know the command ran
    "request"  the command never reaches Redis; the connection is reset

Only the first connection that carries an XADD (a plain one or inside a script) is broken, so
the handshake and every other command pass; with ``every=True``, each one is until
:meth:`heal` (a client that sends the command again on a new connection meets the same fault).
``refuse_after`` makes the proxy refuse every new connection once it has broken one: Redis
then looks unreachable, as after a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Literal

CHUNK_BYTES = 64 * 1024

Mode = Literal["reply", "request"]


class BreakingProxy:
    def __init__(self, target_host: str, target_port: int, mode: Mode, *,
                 refuse_after: bool = False, every: bool = False) -> None:
        self.target = (target_host, target_port)
        self.mode = mode
        self.refuse_after = refuse_after
        self.every = every
        self.healed = False
        self.broken = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"redis://127.0.0.1:{port}/0"

    def heal(self) -> None:
        """Break nothing more."""
        self.healed = True

    async def __aenter__(self) -> BreakingProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *_exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _serve(self, client_r: asyncio.StreamReader,
                     client_w: asyncio.StreamWriter) -> None:
        if self.refuse_after and self.broken.is_set():
            client_w.transport.abort()
            return
        server_r, server_w = await asyncio.open_connection(*self.target)
        self._writers |= {client_w, server_w}
        doomed = asyncio.Event()  # this connection carried the XADD to break

        async def upstream() -> None:
            while data := await client_r.read(CHUNK_BYTES):
                if b"XADD" in data.upper() and self._breaks():
                    self.broken.set()
                    if self.mode == "request":
                        break
                    doomed.set()
                server_w.write(data)
                await server_w.drain()

        async def downstream() -> None:
            while data := await server_r.read(CHUNK_BYTES):
                if doomed.is_set():
                    return  # Redis ran it and answered; the client never hears
                client_w.write(data)
                await client_w.drain()

        tasks = [asyncio.create_task(upstream()), asyncio.create_task(downstream())]
        with contextlib.suppress(Exception):
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        for writer in (client_w, server_w):
            writer.transport.abort()
            self._writers.discard(writer)

    def _breaks(self) -> bool:
        if self.healed:
            return False
        return self.every or not self.broken.is_set()
