"""NotifkitServer: run any subset of the eight services in this process.

    async with NotifkitServer(services=["api", "delivery"], redis_url=..., database_url=...):
        ...

Processes started with different service lists against the same Redis and PostgreSQL form one
system. Each service owns its connections, so the same code serves a laptop and a fleet.
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import importlib
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from notifkit import metrics_store
from notifkit.config import (
    SERVICES,
    ConfigError,
    Settings,
    UnknownArgument,
    parse_services,
    uses_development_secret,
)
from notifkit.keys import Keys
from notifkit.log import service_context
from notifkit.messages import CHANNELS
from notifkit.services.base import Service, open_redis
from notifkit.stop_signals import cancel_requested
from notifkit.transports.base import Transport

log = logging.getLogger("notifkit.server")

# Service name -> "module:class". Imported only when the service is asked for.
REGISTRY: dict[str, str] = {
    "api": "notifkit.services.api.service:ApiService",
    "enricher": "notifkit.services.enricher:EnricherService",
    "engine": "notifkit.services.engine:EngineService",
    "delivery": "notifkit.services.delivery:DeliveryService",
    "scheduler": "notifkit.services.scheduler:SchedulerService",
    "ai": "notifkit.services.ai:AiService",
    "workflow": "notifkit.services.workflow:WorkflowService",
    "events": "notifkit.services.events:EventsService",
}


def service_class(name: str) -> type[Service]:
    if name not in REGISTRY:
        raise ConfigError("NOTIFKIT_SERVICES", f"unknown service {name!r}")
    module_name, _, class_name = REGISTRY[name].partition(":")
    module = importlib.import_module(module_name)
    cls: type[Service] = getattr(module, class_name)
    return cls


def resolve_services(services: str | Iterable[str] | None) -> tuple[str, ...]:
    if services is None:
        return SERVICES
    if isinstance(services, str):
        return parse_services(services, "services")
    # Any other iterable of names; a bare number or bytes failed inside a join with a
    # TypeError that named nothing.
    if isinstance(services, (bytes, bytearray)) or not isinstance(services, Iterable):
        raise ConfigError("services", f"must be a list of service names, got {services!r}")
    names = list(services)
    for name in names:
        if not isinstance(name, str):
            raise ConfigError("services", f"service names are strings, got {name!r}")
    return parse_services(",".join(names), "services")


def check_transports(transports: Sequence[Any] | None) -> list[Transport]:
    """The transports given in code, refused before anything starts: checked only when the
    delivery service started, after the schema was migrated (and never without it), and a
    string was taken as one transport per character."""
    if transports is None:
        return []
    if isinstance(transports, (str, bytes, bytearray, Mapping)) or not isinstance(
            transports, Iterable):
        raise ConfigError("transports", f"must be a list of transports, got {transports!r}")
    checked: list[Transport] = []
    for transport in transports:
        if not isinstance(transport, Transport):
            raise ConfigError("transports", f"{transport!r} is not a notifkit transport "
                              "(channel, provider, idempotent, rate_per_s, open, close, send)")
        if transport.channel not in CHANNELS:
            raise ConfigError("transports", f"{transport!r} has channel "
                              f"{transport.channel!r}; choose from {', '.join(CHANNELS)}")
        # Checked here, not at the first send: a provider that is no name or a rate that is
        # no number of sends a second failed every send of the channel at delivery time.
        if not isinstance(transport.provider, str) or not transport.provider:
            raise ConfigError("transports", f"{transport!r} has provider "
                              f"{transport.provider!r}; it must be a name")
        rate = transport.rate_per_s
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float))
                                 or not (math.isfinite(rate) and rate >= 0)):
            raise ConfigError("transports", f"{transport!r} has rate_per_s {rate!r}; it "
                              "must be None or 0 (no limit), or sends a second")
        # A built-in transport's own arguments, by the rules their variables follow: a base
        # URL of ftp:// or a key with a line break failed every send, into the DLQ.
        check = getattr(transport, "check_arguments", None)
        if callable(check):
            check()
        # One per channel: the later replaced the earlier without a word.
        if any(other.channel == transport.channel for other in checked):
            raise ConfigError("transports", f"two transports for channel "
                              f"{transport.channel!r}; give one per channel")
        checked.append(transport)
    return checked


class NotifkitServer:
    """Starts the chosen services (default: all), owns their lifecycles."""

    def __init__(
        self,
        services: str | Sequence[str] | None = None,
        *,
        settings: Settings | None = None,
        redis_url: str | None = None,
        database_url: str | None = None,
        auto_migrate: bool | None = None,
        worker_concurrency: int | None = None,
        transports: Sequence[Any] | None = None,
        **overrides: Any,
    ) -> None:
        if settings is not None and not isinstance(settings, Settings):
            raise ConfigError("settings", f"must be a notifkit Settings, got {settings!r}")
        _check_setting_names(overrides)
        for key, value in (
            ("redis_url", redis_url),
            ("database_url", database_url),
            ("auto_migrate", auto_migrate),
            ("worker_concurrency", worker_concurrency),
        ):
            if value is not None:
                overrides[key] = value
        if services is not None:
            overrides["services"] = resolve_services(services)
        if settings is None:
            # Through from_env, so a value given here is derived from as its variable would be
            # (NOTIFKIT_SIMULATOR_URL points the transports at the simulators, PORT the links).
            self.settings = Settings.from_env(**overrides)
        else:
            # Derived as well: simulator_url= beside settings= pointed nothing at them.
            self.settings = settings.derive(**overrides)
        self.transports = check_transports(transports)
        self.services: dict[str, Service] = {}
        self._started = False
        self._metrics_redis: Redis | None = None
        self._metrics_flusher: asyncio.Task[None] | None = None
        # The start in progress, a task of its own so that stop() can abandon it.
        self._starting: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._started:
            return
        if self._starting is None:
            self._starting = asyncio.create_task(self._start(), name="notifkit start")
        starting = self._starting
        try:
            # Not shielded: a caller that cancels its start (a timeout, the CLI at a SIGTERM)
            # cancels the start itself, which stops whatever it had started.
            await starting
        except asyncio.CancelledError:
            # stop() abandoned the start: the server is stopped, as asked, and the start ends
            # without an error. A cancellation of the caller's own task goes on.
            if not starting.cancelled() or cancel_requested():
                raise
        finally:
            if self._starting is starting and starting.done():
                self._starting = None

    async def _start(self) -> None:
        # Every service needs Redis: refuse an unreachable one before creating tables, so a
        # wrong REDIS_URL leaves no schema behind where nothing will run.
        await _require_redis(self.settings)
        if self.settings.auto_migrate:
            from notifkit.db.migrate import migrate

            await migrate(self.settings)
        elif any(service_class(name).needs_db for name in self.settings.services):
            # Before any service starts: a worker creates its consumer groups and reads entries
            # as it starts, and would take them into its pending list (or ack them) in a
            # process about to refuse to run; an api would already be listening.
            await _require_migrated(self.settings)
        started: list[Service] = []
        try:
            for name in self.settings.services:
                cls = service_class(name)
                service = cls(self.settings, transports=self.transports)
                # Stopped with the others if its own start fails part-way: a worker it already
                # started (the workflow service starts its loop, then rebuilds its timers) kept
                # the process alive after the failure was reported.
                started.append(service)
                # Its tasks, started here, write records naming it (library loggers included).
                with service_context(name):
                    await service.start()
                self.services[name] = service
        except BaseException:
            for service in reversed(started):
                await _stop_quietly(service)
            self.services.clear()
            raise
        self._started = True
        # Only api processes serve /metrics: every process adds its counts to Redis for them.
        self._metrics_redis = open_redis(self.settings, max_connections=2)
        self._metrics_flusher = asyncio.create_task(
            metrics_store.run_flusher(self._metrics_redis, Keys(self.settings.namespace)))
        if uses_development_secret(self.settings):
            log.warning("NOTIFKIT_SECRET is not set: unsubscribe links and outgoing webhooks are "
                        "signed with the public development secret, so anyone can forge them. "
                        "Set NOTIFKIT_SECRET (16 characters or more) in production.")
        log.info("notifkit is running: %s.", ", ".join(self.settings.services))

    async def stop(self) -> None:
        # Upstream first, so nothing new is produced for services already stopped; within one
        # grace period for the process, not one per service (eight of them in turn took a
        # multiple of SHUTDOWN_GRACE_SECONDS while PostgreSQL stalled).
        deadline = asyncio.get_running_loop().time() + self.settings.shutdown_grace_s
        starting = self._starting
        if starting is not None and not starting.done():
            # A start in progress: it would go on to start the services after this stop
            # returned (or add them behind its back), running with nothing left to stop them.
            # Cancelled, it stops what it had started.
            starting.cancel()
            await asyncio.wait({starting})
        for service in list(self.services.values()):
            service.stop_deadline = deadline
            await _stop_quietly(service)
        self.services.clear()
        if self._metrics_redis is not None:
            if self._metrics_flusher is not None:
                await metrics_store.stop_flusher(self._metrics_flusher, self._metrics_redis,
                                                 Keys(self.settings.namespace))
            await self._metrics_redis.aclose()
        self._metrics_redis = self._metrics_flusher = None
        self._started = False

    def service(self, name: str) -> Service:
        return self.services[name]

    async def run_until_idle(self, *, max_rounds: int = 1000) -> int:
        """Run every started service until none finds work. For tests and scenarios."""
        total = 0
        for _ in range(max_rounds):
            done = 0
            for service in self.services.values():
                done += await service.run_until_idle()
            total += done
            if not done:
                break
        return total

    async def __aenter__(self) -> NotifkitServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


# Keyword arguments of NotifkitServer that are Settings fields.
_SETTING_NAMES = frozenset(f.name for f in dataclasses.fields(Settings) if f.init)


def _check_setting_names(overrides: Mapping[str, Any]) -> None:
    """Refuse a keyword that is no setting, naming the closest one: it failed as a TypeError
    about ``Settings.__init__``, and ``env`` went through to ``Settings.from_env``."""
    for name in overrides:
        if name not in _SETTING_NAMES:
            close = difflib.get_close_matches(name, sorted(_SETTING_NAMES), n=1)
            hint = (f"; did you mean {close[0]!r}?" if close else
                    " (its keyword arguments are the fields of notifkit.config.Settings)")
            raise UnknownArgument(name, f"NotifkitServer() takes no such argument{hint}")


class RedisUnavailable(RedisConnectionError, ConnectionError):
    """Redis at ``REDIS_URL`` could not be reached at start. Both redis-py's and Python's
    ``ConnectionError``, so callers that handle either keep doing so, and ``except
    ConnectionError`` catches it as it catches PostgreSQL's ``DatabaseUnavailable``; the
    message names the setting, as that one's does."""


async def _require_redis(settings: Settings) -> None:
    client = open_redis(settings, max_connections=1)
    try:
        await client.ping()
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(
            f"REDIS_URL: cannot connect to Redis: {exc or type(exc).__name__}") from exc
    finally:
        await client.aclose()


async def _require_migrated(settings: Settings) -> None:
    """Without AUTO_MIGRATE, refuse to start on a schema that lacks migrations: an api alone
    queries nothing at start, so it would answer /health and fail every other request."""
    from notifkit.db.migrate import MigrationError, unapplied

    missing = await unapplied(settings)
    if missing:
        raise MigrationError(
            f"schema {settings.db_schema!r} lacks {len(missing)} of notifkit's migrations "
            f"({missing[0]} first); run 'python -m notifkit migrate' or start with "
            "AUTO_MIGRATE=true")


async def _stop_quietly(service: Service) -> None:
    try:
        await service.stop()
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("Stopping the %s service failed; carrying on with the others.",
                      service.name)
