"""Test fixtures: real Redis and PostgreSQL, one isolated namespace and schema per test.

Where the services come from is decided once per session, in this order (see
``tests/support/services.py``): ``NOTIFKIT_TEST_REDIS_URL`` / ``NOTIFKIT_TEST_DATABASE_URL``,
testcontainers when a Docker engine answers, the local default ports, an embedded server.
With ``CI`` set a missing service stops the run; otherwise tests that need it are skipped.

Fixtures:

    redis_url, database_url   (session) URLs of the chosen services
    namespace                 a fresh NOTIFKIT_NAMESPACE; its keys are deleted afterwards
    redis                     redis.asyncio.Redis on redis_url (bytes replies), closed afterwards
    db_schema                 a fresh, migrated schema; dropped afterwards
    settings                  Settings on all of the above, with fast reclaim and heartbeats
    db                        an asyncpg pool from notifkit.db.create_pool(settings)

Hypothesis profiles: ``dev`` (default) and ``ci`` (with ``CI`` set); ``HYPOTHESIS_PROFILE``
chooses explicitly.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import asyncpg
import pytest
import redis.asyncio as aioredis
from hypothesis import settings as hypothesis_settings

from notifkit.config import Settings
from notifkit.db.pool import create_pool
from tests.support.isolation import isolated_namespace, isolated_schema
from tests.support.services import (
    POSTGRES,
    REDIS,
    Service,
    ServiceUnavailable,
    is_ci,
    real_probes,
    redact,
    require,
    select,
)

hypothesis_settings.register_profile("dev", max_examples=50, deadline=None)
hypothesis_settings.register_profile(
    "ci",
    max_examples=300,
    derandomize=True,
    deadline=None,
    print_blob=True,
)
hypothesis_settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if is_ci(os.environ) else "dev")
)

_chosen: dict[str, str] = {}


def _service_url(request: pytest.FixtureRequest, service: Service) -> str:
    selection = select(service, os.environ, real_probes())
    try:
        started = require(selection, os.environ)
    except ServiceUnavailable as exc:
        _chosen[service.label] = "missing"
        if exc.fatal:
            pytest.exit(str(exc), returncode=1)
        pytest.skip(str(exc))
    if started.stop is not None:
        request.addfinalizer(started.stop)
    _chosen[service.label] = f"{started.source} ({redact(started.url)})"
    return started.url


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _chosen:
        used = ", ".join(f"{label}: {how}" for label, how in _chosen.items())
        terminalreporter.write_line(f"test services: {used}")


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest) -> str:
    return _service_url(request, REDIS)


@pytest.fixture(scope="session")
def database_url(request: pytest.FixtureRequest) -> str:
    return _service_url(request, POSTGRES)


@pytest.fixture
async def namespace(redis_url: str) -> AsyncIterator[str]:
    """A namespace no other test uses; every ``{namespace}:*`` key is deleted afterwards."""
    async with isolated_namespace(redis_url) as name:
        yield name


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url, decode_responses=False)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def db_schema(database_url: str) -> AsyncIterator[str]:
    """A schema of its own, migrated to the latest version; dropped with everything in it."""
    async with isolated_schema(database_url) as schema:
        yield schema


@pytest.fixture
def settings(redis_url: str, database_url: str, namespace: str, db_schema: str) -> Settings:
    return Settings(
        redis_url=redis_url,
        database_url=database_url,
        namespace=namespace,
        db_schema=db_schema,
        reclaim_interval_s=0.2,
        reclaim_min_idle_s=0.2,
        heartbeat_interval_s=0.2,
        admin_key="test-admin-key-0123456789",
        secret="test-secret-0123456789abcdef",
        log_format="text",
    )


@pytest.fixture
async def db(settings: Settings) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(settings)
    try:
        yield pool
    finally:
        await pool.close()
