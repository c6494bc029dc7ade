"""`SimulatorServer`: the HTTP providers and the SMTP server, started and stopped together.

async with SimulatorServer(seed=1) as sim:          # free ports by default
    resend.api_url = sim.base_url
    await sim.add_fault("error", "resend", times=1)
    ...
    assert (await sim.messages("resend"))[0]["acceptCount"] == 1
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import socket
import sys
from types import TracebackType
from typing import Any

from aiohttp import web

from notifkit.refusals import RefusingRunner
from notifkit.wording import bind_reason
from simulators.app import answer_refusal, create_app
from simulators.client import Op, SimulatorControl
from simulators.control import MAX_SEED
from simulators.httplog import quiet_unparseable_requests
from simulators.providers.smtp import TrackedSMTP, quiet_aiosmtpd_logs, smtp_factory
from simulators.records import DEFAULT_MAX_MESSAGES
from simulators.state import SimSettings, SimState

log = logging.getLogger("simulators")

# Held requests are released the moment shutdown starts; this only bounds a stuck handler.
SHUTDOWN_TIMEOUT_S = 2.0


class ListenError(OSError):
    """One of the two ports could not be bound; ``which`` says what to change, so a command
    line can name its own option for it: ``"port"`` (HTTP), ``"smtp_port"``, or ``"host"``
    when the address itself is the problem (it does not resolve, is not this machine's, or
    cannot be bound at all)."""

    def __init__(self, which: str, host: str, port: int, cause: OSError) -> None:
        super().__init__(cause.errno, f"cannot listen on {host}:{port}: {bind_reason(cause)}")
        # EINVAL: an address no socket binds (IPv4-mapped IPv6); EAFNOSUPPORT: its family is
        # not enabled on this machine. Neither is the port's doing.
        host_at_fault = isinstance(cause, socket.gaierror) or cause.errno in (
            errno.EADDRNOTAVAIL, errno.EINVAL, errno.EAFNOSUPPORT)
        self.which = "host" if host_at_fault else which

    def __str__(self) -> str:
        return str(self.strerror)


def _check_int(name: str, value: object, least: int, most: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if not least <= value <= most:
        raise ValueError(f"{name} must be {least}-{most}, got {value}")


class SimulatorServer(SimulatorControl):
    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        smtp_port: int | None = 0,
        seed: int = 0,
        max_messages: int = DEFAULT_MAX_MESSAGES,
    ) -> None:
        """`port`/`smtp_port` 0 bind free ports; `smtp_port=None` runs no SMTP server."""
        # Checked here, as the command line checks its options: a bad value surfaced only at
        # start(), from deep inside asyncio (OverflowError, "Servname not supported"), or was
        # taken silently (a string seed, a store of 0 messages).
        if not isinstance(host, str):
            raise TypeError(f"host must be a string, got {host!r}")
        if not host.strip():
            raise ValueError("host must not be empty (0.0.0.0 listens on every interface)")
        _check_int("port", port, 0, 65535)
        if smtp_port is not None:
            _check_int("smtp_port", smtp_port, 0, 65535)
        _check_int("seed", seed, 0, MAX_SEED)
        _check_int("max_messages", max_messages, 1, sys.maxsize)
        self.settings = SimSettings(
            host=host,
            port=port,
            smtp_port=smtp_port if smtp_port is not None else 0,
            seed=seed,
            max_messages=max_messages,
        )
        self._smtp_enabled = smtp_port is not None
        self.state = SimState(self.settings)
        self.port = 0
        self.smtp_port = 0
        self._runner: web.AppRunner | None = None
        self._smtp: asyncio.Server | None = None
        self._smtp_connections: set[TrackedSMTP] = set()

    @property
    def host(self) -> str:
        return self.settings.host

    @property
    def smtp_host(self) -> str:
        return self.settings.host

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        if self._runner is not None:
            # Starting again bound a second pair of ports and lost the first, which stayed
            # open after stop(); a nested `async with` would also stop it under the outer one.
            raise RuntimeError(f"this SimulatorServer is already running at {self.base_url}; "
                               "stop it first, or start another instance")
        # The last stop() set it to release held requests; left set, a server started again
        # would hold nothing (a latency rule answered at once, a timeout dropped at once).
        self.state.closing.clear()
        runner = RefusingRunner(
            create_app(self.state), answer=answer_refusal, access_log=None,
            shutdown_timeout=SHUTDOWN_TIMEOUT_S, logger=quiet_unparseable_requests(),
        )
        await runner.setup()
        self._runner = runner
        try:
            site = web.TCPSite(runner, self.host, self.settings.port)
            try:
                await site.start()
            except OSError as exc:
                raise ListenError("port", self.host, self.settings.port, exc) from exc
            self.port = int(runner.addresses[0][1])
            if self._smtp_enabled:
                quiet_aiosmtpd_logs()
                loop = asyncio.get_running_loop()
                factory = smtp_factory(self.state, "notifkit-sim.localhost", self._smtp_connections)
                try:
                    self._smtp = await loop.create_server(
                        factory, self.host, self.settings.smtp_port)
                except OSError as exc:
                    raise ListenError("smtp_port", self.host, self.settings.smtp_port,
                                      exc) from exc
                self.smtp_port = int(self._smtp.sockets[0].getsockname()[1])
        except BaseException:
            await self.stop()
            raise
        self.state.endpoints = {
            "baseUrl": self.base_url,
            "smtpHost": self.smtp_host if self._smtp_enabled else None,
            "smtpPort": self.smtp_port if self._smtp_enabled else None,
        }

    async def stop(self) -> None:
        """Release held requests, close SMTP sessions, then stop the HTTP server."""
        self.state.closing.set()
        if self._smtp is not None:
            self._smtp.close()
            for protocol in list(self._smtp_connections):
                if protocol.transport is not None:
                    protocol.transport.close()
            await self._smtp.wait_closed()
            self._smtp = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def drain_receipts(self, timeout_s: float = 30.0) -> None:
        """Wait until every scheduled receipt has been posted (or given up on)."""
        await self.state.receipts.drain(timeout_s)

    async def __aenter__(self) -> SimulatorServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _call(self, op: Op, payload: Any = None) -> Any:
        result = op.local(self.state, payload)
        # A JSON round trip gives callers exactly what the HTTP API would, and copies that
        # cannot alter the simulator's own records.
        return None if result is None else json.loads(json.dumps(result))
