"""Fixtures for the scheduling tests: a project row, an injectable clock, scheduler services
that are always stopped, and helpers to put tasks on streams and read them back."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.keys import Keys
from notifkit.services.events import EventsService
from notifkit.services.scheduler import SchedulerService
from notifkit.streams import decode, xadd
from simulators import SimulatorServer
from tests.support.streams import xrange

from .helpers import FakeClock, Schedule, SchedulerFactory, Sent, scheduled_task


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def keys(settings: Settings) -> Keys:
    return Keys(settings.namespace)


@pytest.fixture
async def project_id(db: asyncpg.Pool) -> str:
    return str(await db.fetchval("INSERT INTO projects (name) VALUES ('scheduling') RETURNING id"))


@pytest.fixture
async def make_scheduler(
    settings: Settings, clock: FakeClock
) -> AsyncIterator[SchedulerFactory]:
    made: list[SchedulerService] = []

    def factory(name: str = "a", **options: Any) -> SchedulerService:
        options.setdefault("clock", clock)
        service = SchedulerService(
            options.pop("settings", settings), consumer=f"scheduler-{name}", **options
        )
        made.append(service)
        return service

    yield factory
    for service in made:
        await service.stop()


@pytest.fixture
def schedule(redis: Redis, keys: Keys, project_id: str) -> Schedule:
    """XADD a ScheduledTask to ``notifkit:stream:scheduled``; returns it."""

    async def _schedule(due_ms: int, **options: Any) -> dict[str, Any]:
        task = scheduled_task(keys, options.pop("project", project_id), due_ms, **options)
        await xadd(redis, keys.scheduled, task, maxlen=100_000)
        return task

    return _schedule


@pytest.fixture
def outbound(redis: Redis, keys: Keys) -> Sent:
    """Every payload on the outbound streams (all, or the priorities named), oldest first."""

    async def _outbound(*priorities: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for priority in priorities or ("critical", "normal", "low"):
            out.extend(decode(f) for _id, f in await xrange(redis, keys.outbound(priority)))
        return out

    return _outbound


@pytest.fixture
async def make_events(settings: Settings) -> AsyncIterator[Callable[..., EventsService]]:
    made: list[EventsService] = []

    def factory(**options: Any) -> EventsService:
        service = EventsService(options.pop("settings", settings), consumer="events-test",
                                **options)
        made.append(service)
        return service

    yield factory
    for service in made:
        await service.stop()


@pytest.fixture
async def sim() -> AsyncIterator[SimulatorServer]:
    async with SimulatorServer(seed=1) as server:
        yield server
