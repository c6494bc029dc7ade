"""``ApiService``: the HTTP API as a notifkit service, served on ``settings.host``/``port``.

With ``port=0`` the operating system picks a free port; :attr:`ApiService.port` holds the one
actually bound once :meth:`start` returns (tests and ``notifkit dev`` rely on it).
"""

from __future__ import annotations

import errno
import logging
import socket
from typing import Any, ClassVar

from aiohttp import web

from notifkit.config import ConfigError, Settings
from notifkit.services.api.app import create_app
from notifkit.services.base import Service

log = logging.getLogger("notifkit.api")

SHUTDOWN_TIMEOUT_S = 5.0


class ApiService(Service):
    name: ClassVar[str] = "api"

    def __init__(self, settings: Settings, **options: Any) -> None:
        super().__init__(settings, **options)
        self.port: int | None = None
        self.app: web.Application | None = None
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("the api service has not been started")
        host = self.settings.host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        await self.open()
        self.app = create_app(self.settings, redis=self.redis, db=self.pool)
        runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
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
                setting, f"cannot listen on {self.settings.host}:{self.settings.port} "
                f"(HOST:PORT): {exc.strerror or exc}"
            ) from exc
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = _bound_port(runner, self.settings.port)
        log.info("The API is listening on %s:%d.", self.settings.host, self.port)

    async def stop(self) -> None:
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
