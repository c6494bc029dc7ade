"""Fixtures for the send-path tests: real Redis and PostgreSQL (root conftest), a project,
and the pipeline's services, closed at the end of each test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import pytest

from notifkit.config import EmailSettings, PushSettings, Settings, SmsSettings
from notifkit.keys import Keys
from notifkit.services.base import Service
from simulators import SimulatorServer
from tests.api.conftest import Api, running_api

from .helpers import add_project


@pytest.fixture
def sp_settings(settings: Settings) -> Settings:
    """Failed entries are reclaimable at once, so run_until_idle drives the retry cycle."""
    return settings.replace(reclaim_min_idle_s=0.0, worker_concurrency=20, read_block_ms=50)


@pytest.fixture
async def sim() -> AsyncIterator[SimulatorServer]:
    async with SimulatorServer(seed=1) as server:
        yield server


def simulated(settings: Settings, sim: SimulatorServer, *, email: str = "resend") -> Settings:
    """``settings`` with every provider pointed at the simulator and a short provider timeout
    (a lost response costs half a second)."""
    return settings.replace(
        provider_timeout_s=0.5,
        email=EmailSettings(
            transport=email, from_addr="notifkit <no-reply@example.com>",
            resend_api_key="re_test", resend_base_url=sim.base_url,
            sendgrid_api_key="SG.test", sendgrid_base_url=sim.base_url,
            smtp_url=f"smtp://{sim.smtp_host}:{sim.smtp_port}",
        ),
        sms=SmsSettings(account_sid="AC" + "1" * 32, auth_token="twilio-token",
                        from_number="+15559990000", base_url=sim.base_url),
        push=PushSettings(project_id="notifkit-test", access_token="fcm-token",
                          base_url=sim.base_url),
    )


@pytest.fixture
def sim_settings(sp_settings: Settings, sim: SimulatorServer) -> Settings:
    return simulated(sp_settings, sim)


@pytest.fixture
async def api(sim_settings: Settings) -> AsyncIterator[Api]:
    """The HTTP API on the simulator settings, with a rate no test reaches."""
    settings = sim_settings.replace(api_rate_per_second=10_000.0, api_rate_burst=10_000)
    async with running_api(settings) as api:
        yield api


@pytest.fixture
def keys(sp_settings: Settings) -> Keys:
    return Keys(sp_settings.namespace)


@pytest.fixture
async def project(db: asyncpg.Pool) -> str:
    return await add_project(db)


ServiceFactory = Callable[..., Any]


@pytest.fixture
async def services(sp_settings: Settings) -> AsyncIterator[ServiceFactory]:
    """``services(EnricherService, settings=..., **options)`` -> an opened service."""
    made: list[Service] = []

    async def factory(cls: type[Service], settings: Settings | None = None,
                      **options: Any) -> Any:
        service = cls(settings or sp_settings, **options)
        await service.open()
        made.append(service)
        return service

    yield factory
    for service in reversed(made):
        await service.close()
