"""A TCP proxy a scenario controls: forwards to a server until told to cut, then drops every
open connection and refuses new ones (accepts and closes at once) until restored.

    proxy = TcpProxy("127.0.0.1", 5432)
    await proxy.start()          # proxy.port is where clients connect
    await proxy.cut()            # the server looks unreachable
    proxy.restore()
    await proxy.stop()
"""

from __future__ import annotations

import asyncio
import contextlib

from scenarios.processes import free_port

CHUNK_BYTES = 64 * 1024


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, port: int | None = None) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.port = port or free_port()
        self.down = False
        self.refused = 0  # connections refused while cut
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self._drop_all()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def cut(self) -> None:
        self.down = True
        self._drop_all()
        await asyncio.sleep(0)

    def restore(self) -> None:
        self.down = False

    def _drop_all(self) -> None:
        for writer in list(self._writers):
            transport = writer.transport
            with contextlib.suppress(Exception):
                transport.abort()  # a reset, as when the server's host goes away
        self._writers.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down:
            self.refused += 1
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target_host,
                                                                 self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                self._writers.discard(w)
                with contextlib.suppress(Exception):
                    w.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while not self.down:
                data = await reader.read(CHUNK_BYTES)
                if not data:
                    break
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.transport.abort()
