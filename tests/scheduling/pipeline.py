"""Builders for tests that run the scheduling rules through the real pipeline: users,
templates and sends written as the api writes them, services drained with run_until_idle."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import asyncpg
from redis.asyncio import Redis

from notifkit.ids import uuid7
from notifkit.keys import Keys
from notifkit.services.base import Service
from notifkit.streams import decode, xadd
from notifkit.worker import utc_now_iso

EMAIL = {"subject": "Hello {{ user.id }}", "text": "Your code is {{ data.code }}."}
SMS = {"text": "Code {{ data.code }}"}


async def add_user(
    db: asyncpg.Pool, project_id: str, user_id: str, *,
    contacts: Iterable[tuple[str, str]] = (), timezone: str | None = None,
    quiet: tuple[str, str] | None = None,
) -> None:
    await db.execute("INSERT INTO users (project_id, id, timezone) VALUES ($1, $2, $3)",
                     project_id, user_id, timezone)
    for channel, target in contacts:
        await db.execute("INSERT INTO user_contacts (project_id, user_id, channel, target) "
                         "VALUES ($1, $2, $3, $4)", project_id, user_id, channel, target)
    if quiet is not None:
        await db.execute("INSERT INTO quiet_hours VALUES ($1, $2, $3::text::time, $4::text::time)",
                         project_id, user_id, *quiet)


async def add_template(db: asyncpg.Pool, project_id: str, template_id: str,
                       channels: Mapping[str, Any]) -> None:
    await db.execute("INSERT INTO templates (project_id, id, content) VALUES ($1, $2, $3)",
                     project_id, template_id, dict(channels))


async def set_project_settings(db: asyncpg.Pool, project_id: str,
                               settings: Mapping[str, Any]) -> None:
    await db.execute("UPDATE projects SET settings = $2 WHERE id = $1", project_id,
                     dict(settings))


async def send(redis: Redis, keys: Keys, db: asyncpg.Pool, project_id: str, template: str,
               user_id: str, *, priority: str = "normal", send_at: str | None = None) -> str:
    """What POST /v1/notifications does: a notifications row and an inbound entry."""
    event_id = uuid7()
    await db.execute(
        "INSERT INTO notifications (id, project_id, template_id, priority, recipients_spec, "
        "data) VALUES ($1, $2, $3, $4, $5, $6)",
        event_id, project_id, template, priority, user_id, {"code": "42"},
    )
    await xadd(redis, keys.inbound(priority), {
        "eventId": event_id, "projectId": project_id, "template": template,
        "to": {"userId": user_id}, "data": {"code": "42"}, "channels": None,
        "priority": priority, "sendAt": send_at, "campaignId": None, "idempotencyKey": None,
        "createdAt": utc_now_iso(),
    }, maxlen=1_000_000)
    return event_id


async def drain(*services: Service, max_rounds: int = 50) -> int:
    total = 0
    for _ in range(max_rounds):
        done = 0
        for service in services:
            done += await service.run_until_idle()
        total += done
        if not done:
            return total
    raise AssertionError(f"the pipeline did not become idle in {max_rounds} rounds")


async def entries(redis: Redis, stream: str) -> list[dict[str, Any]]:
    return [decode(fields) for _id, fields in await redis.xrange(stream)]


async def timeline(db: asyncpg.Pool, event_id: str) -> list[dict[str, Any]]:
    rows = await db.fetch(
        "SELECT task_id, channel, attempt, kind, status, detail, metadata FROM message_logs "
        "WHERE event_id = $1 ORDER BY id", event_id)
    return [dict(r) for r in rows]
