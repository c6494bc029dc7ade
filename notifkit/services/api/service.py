"""``ApiService``: the HTTP API as a notifkit service, served on ``settings.host``/``port``.

With ``port=0`` the operating system picks a free port; :attr:`ApiService.port` holds the one
actually bound once :meth:`start` returns (tests and ``notifkit dev`` rely on it). Like every
stream consumer, a running API beats under ``notif:health:api-{hostname}-{pid}``, with the
requests it is answering as ``inFlight``, so ``/health`` shows each API process too.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import time
from typing import Any, ClassVar

from aiohttp import web
from redis.exceptions import RedisError

from notifkit.clock import utc_now_iso
from notifkit.config import ADDRESS_SETTINGS, ConfigError, Settings, local_url
from notifkit.db.pool import QUERY_TIMEOUT_S
from notifkit.services.api.app import create_app
from notifkit.services.api.errors import ApiRunner
from notifkit.services.api.state import IN_FLIGHT
from notifkit.services.base import Service
from notifkit.tasks import cancel_and_wait
from notifkit.wording import bind_reason, host_port
from notifkit.worker import (
    consumer_name,
    heartbeat_failure,
    next_beat_in,
    remove_heartbeat,
    write_heartbeat,
)

log = logging.getLogger("notifkit.api")

SHUTDOWN_TIMEOUT_S = 5.0


class ApiService(Service):
    name: ClassVar[str] = "api"
    # A request waits at most this long for a free PostgreSQL connection, then answers 503
    # (Retry-After: 1). While PostgreSQL stalls, each connection is held some 20 s by a query
    # timing out and being cancelled, and requests queued behind them without a limit waited
    # longer the more of them there were (54 s seen in a 55 s stall).
    acquire_timeout_s: ClassVar[float | None] = QUERY_TIMEOUT_S

    def __init__(self, settings: Settings, **options: Any) -> None:
        super().__init__(settings, **options)
        self.port: int | None = None
        self.app: web.Application | None = None
        self._runner: web.AppRunner | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self.consumer = consumer_name(self.name)

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("the api service has not been started")
        return local_url(self.settings.host, self.port)

    async def start(self) -> None:
        await self.open()
        self.app = create_app(self.settings, redis=self.redis, db=self.pool)
        runner = ApiRunner(self.app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
        await runner.setup()
        site = web.TCPSite(runner, self.settings.host, self.settings.port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            # A name that does not resolve, or an address this machine does not have, is the
            # HOST setting's fault; a port in use or not allowed is PORT's.
            setting = ("HOST" if isinstance(exc, socket.gaierror)
                       or exc.errno == errno.EADDRNOTAVAIL else "PORT")
            raise ConfigError(
                setting, f"cannot listen on {host_port(self.settings.host, self.settings.port)} "
                f"{ADDRESS_SETTINGS}: {bind_reason(exc)}"
            ) from exc
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = _bound_port(runner, self.settings.port)
        log.info("The API is listening on %s.", host_port(self.settings.host, self.port))
        failed = False
        try:
            await self.beat()  # listed by /health as soon as start() returns
        except (RedisError, OSError):
            failed = True  # tried again soon, not after a whole interval
        self._heartbeat = asyncio.create_task(self._heartbeat_loop(failed),
                                              name=f"{self.consumer}:heartbeat")

    async def beat(self) -> None:
        in_flight = self.app[IN_FLIGHT].count if self.app is not None else 0
        beat = {"service": self.name, "consumer": self.consumer, "host": socket.gethostname(),
                "pid": os.getpid(), "lastBeat": utc_now_iso(), "inFlight": in_flight,
                "ts": time.time()}
        await write_heartbeat(self.redis, self.keys, self.consumer, beat,
                              self.settings.heartbeat_ttl_s)

    async def _heartbeat_loop(self, failed: bool) -> None:
        while True:
            await asyncio.sleep(next_beat_in(self.settings.heartbeat_interval_s, failed))
            try:
                await self.beat()
                failed = False
            except (RedisError, OSError) as exc:
                failed = True
                log.warning("Heartbeat failed (%s); trying again.", heartbeat_failure(exc),
                            extra={"service": self.name})

    async def stop(self) -> None:
        if self._heartbeat is not None:
            await cancel_and_wait(self._heartbeat)
            self._heartbeat = None
            await self.last_redis_call(remove_heartbeat(self.redis, self.keys, self.consumer))
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            log.info("The API has stopped listening.")
        await self.close()


def _bound_port(runner: web.AppRunner, requested: int) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return requested
