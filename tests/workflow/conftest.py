"""Fixtures for the workflow and AI tests: a project, a controllable clock, the provider
simulators, workflow services that are always stopped, and helpers that play the API and
events services' part (storing a definition, XADDing triggers and custom events) and read
what the workflow sent."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.ids import uuid7
from notifkit.keys import Keys
from notifkit.services.workflow import WorkflowService
from notifkit.streams import decode, xadd
from simulators import SimulatorServer
from tests.api.conftest import Api, Project, running_api
from tests.support.streams import xrange


@dataclass
class FakeClock:
    """Seconds since the epoch, moved only by the test."""

    now_s: float = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def sim() -> AsyncIterator[SimulatorServer]:
    async with SimulatorServer(seed=1, smtp_port=None) as server:
        yield server


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[Api]:
    """The HTTP API, with room for every request a test makes."""
    chosen = settings.replace(api_rate_per_second=10_000.0, api_rate_burst=10_000)
    async with running_api(chosen) as api:
        yield api


@pytest.fixture
async def project(api: Api, db: asyncpg.Pool) -> Project:
    """A project made through the API, with e-mail templates hello, bye and digest."""
    made = await api.project()
    await db.execute(
        "INSERT INTO templates (project_id, id, content) VALUES ($1, 'hello', $2), "
        "($1, 'bye', $2), ($1, 'digest', $2)", made.id,
        {"email": {"subject": "s", "text": "t"}},
    )
    return made


@pytest.fixture
def keys(settings: Settings) -> Keys:
    return Keys(settings.namespace)


@pytest.fixture
async def project_id(db: asyncpg.Pool) -> str:
    value: str = await db.fetchval(
        "INSERT INTO projects (name) VALUES ('workflow tests') RETURNING id::text"
    )
    return value


ServiceFactory = Callable[..., WorkflowService]


@pytest.fixture
async def make_service(
    settings: Settings, clock: FakeClock
) -> AsyncIterator[ServiceFactory]:
    made: list[WorkflowService] = []

    def factory(**options: Any) -> WorkflowService:
        options.setdefault("clock", clock)
        service = WorkflowService(options.pop("settings", settings), **options)
        made.append(service)
        return service

    yield factory
    for service in made:
        await service.stop()


@dataclass
class Flow:
    """Plays the API and events services: definitions, triggers and custom events."""

    db: asyncpg.Pool
    redis: Redis
    keys: Keys
    project_id: str
    clock: FakeClock

    async def define(self, workflow_id: str, steps: list[dict[str, Any]]) -> None:
        # The API saves no workflow naming a template that does not exist: each one named is
        # created (unless it is already there) with content for e-mail.
        await self.db.execute(
            "INSERT INTO templates (project_id, id, content) SELECT $1, id, $3 "
            "FROM unnest($2::text[]) AS t(id) ON CONFLICT (project_id, id) DO NOTHING",
            self.project_id, sorted(named_templates(steps)),
            {"email": {"subject": "{{ data }}", "text": "{{ data }}"}},
        )
        await self.db.execute(
            """INSERT INTO workflow_definitions (project_id, id, steps) VALUES ($1, $2, $3)
               ON CONFLICT (project_id, id) DO UPDATE SET steps = EXCLUDED.steps""",
            self.project_id, workflow_id, steps,
        )

    async def trigger(
        self, workflow_id: str, user_id: str, data: dict[str, Any] | None = None,
        *, create_row: bool = True,
    ) -> str:
        """As POST /v1/workflows/{id}/trigger: a pending instance row, then the message."""
        instance_id = uuid7()
        if create_row:
            await self.db.execute(
                """INSERT INTO workflow_instances
                       (id, project_id, workflow_id, user_id, status, steps, trigger_data)
                   SELECT $1, project_id, id, $3, 'pending', steps, $4
                     FROM workflow_definitions WHERE project_id = $2 AND id = $5""",
                instance_id, self.project_id, user_id, data or {}, workflow_id,
            )
        await xadd(self.redis, self.keys.workflow_inbound, {
            "type": "trigger", "projectId": self.project_id, "workflowId": workflow_id,
            "instanceId": instance_id, "userId": user_id, "data": data or {},
        }, 10_000)
        return instance_id

    async def event(
        self, name: str, user_id: str, data: dict[str, Any] | None = None,
        event_id: str | None = None,
    ) -> str:
        """As the events service forwarding POST /v1/events, stamped with the clock's time as
        the API stamps it; returns the event's id."""
        event_id = event_id or uuid7()
        at = datetime.fromtimestamp(self.clock(), UTC).isoformat(timespec="milliseconds")
        await xadd(self.redis, self.keys.workflow_inbound, {
            "type": "event", "projectId": self.project_id, "name": name, "userId": user_id,
            "data": data or {}, "at": at.replace("+00:00", "Z"), "eventId": event_id,
        }, 10_000)
        return event_id

    async def sent(self) -> list[dict[str, Any]]:
        """Every InboundMessage the workflow service wrote, oldest first."""
        out: list[tuple[tuple[int, ...], dict[str, Any]]] = []
        for stream in self.keys.inbound_all():
            for entry_id, fields in await xrange(self.redis, stream):
                order = tuple(int(part) for part in entry_id.decode().split("-"))
                out.append((order, decode(fields)))
        return [message for _order, message in sorted(out, key=lambda pair: pair[0])]

    async def instance(self, instance_id: str) -> dict[str, Any]:
        row = await self.db.fetchrow(
            "SELECT status, current_step, cursor FROM workflow_instances WHERE id = $1",
            instance_id,
        )
        assert row is not None
        return dict(row)

    async def steps(self, instance_id: str) -> list[dict[str, Any]]:
        rows = await self.db.fetch(
            """SELECT step_index, path, type, status, output, started_at, finished_at
                 FROM workflow_steps WHERE instance_id = $1 ORDER BY step_index""",
            instance_id,
        )
        return [dict(r) for r in rows]


@pytest.fixture
def flow(db: asyncpg.Pool, redis: Redis, keys: Keys, project_id: str, clock: FakeClock) -> Flow:
    return Flow(db, redis, keys, project_id, clock)


def named_templates(steps: list[dict[str, Any]]) -> set[str]:
    """The templates a definition's send and digest steps name, in branches too."""
    found = {step["template"] for step in steps if isinstance(step.get("template"), str)}
    for step in steps:
        for arm in ("then", "else"):
            if isinstance(step.get(arm), list):
                found |= named_templates(step[arm])
    return found


def templates_of(messages: list[dict[str, Any]], user_id: str) -> list[str]:
    return [m["template"] for m in messages if m["to"] == {"userId": user_id}]

