"""Fixtures for the send-path tests: real Redis and PostgreSQL (root conftest), a project,
and the pipeline's services, closed at the end of each test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import pytest

from notifkit.config import Settings
from notifkit.keys import Keys
from notifkit.services.base import Service

from .helpers import add_project


@pytest.fixture
def sp_settings(settings: Settings) -> Settings:
    """Failed entries are reclaimable at once, so run_until_idle drives the retry cycle."""
    return settings.replace(reclaim_min_idle_s=0.0, worker_concurrency=20, read_block_ms=50)


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
