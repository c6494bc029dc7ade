"""Small builders for the send-path tests: projects, users, templates and inbound messages
written straight to PostgreSQL and Redis, and a pipeline drained with run_until_idle."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import asyncpg
from redis.asyncio import Redis

from notifkit.clock import utc_now_iso
from notifkit.ids import uuid7
from notifkit.keys import Keys
from notifkit.services.base import Service
from notifkit.streams import decode, xadd
from tests.support.streams import xrange


async def add_project(db: asyncpg.Pool, settings: Mapping[str, Any] | None = None) -> str:
    return str(await db.fetchval(
        "INSERT INTO projects (name, settings) VALUES ('test', $1) RETURNING id",
        dict(settings or {}),
    ))


async def add_user(
    db: asyncpg.Pool,
    project_id: str,
    user_id: str,
    *,
    contacts: Iterable[tuple[str, str]] = (),
    channels: Mapping[str, bool] | None = None,
    topics: Mapping[str, bool] | None = None,
    segments: Sequence[str] = (),
    attributes: Mapping[str, Any] | None = None,
    timezone: str | None = None,
    locale: str | None = None,
) -> None:
    await db.execute(
        "INSERT INTO users (project_id, id, attributes, timezone, locale) VALUES ($1, $2, $3, "
        "$4, $5)", project_id, user_id, dict(attributes or {}), timezone, locale,
    )
    for channel, target in contacts:
        await db.execute(
            "INSERT INTO user_contacts (project_id, user_id, channel, target) "
            "VALUES ($1, $2, $3, $4)", project_id, user_id, channel, target,
        )
    for channel, enabled in (channels or {}).items():
        await db.execute(
            "INSERT INTO user_channel_preferences VALUES ($1, $2, $3, $4)",
            project_id, user_id, channel, enabled,
        )
    for topic, enabled in (topics or {}).items():
        await db.execute(
            "INSERT INTO user_topic_preferences VALUES ($1, $2, $3, $4)",
            project_id, user_id, topic, enabled,
        )
    for segment in segments:
        await db.execute(
            "INSERT INTO user_segments VALUES ($1, $2, $3)", project_id, user_id, segment
        )


async def add_template(
    db: asyncpg.Pool,
    project_id: str,
    template_id: str,
    channels: Mapping[str, Any],
    *,
    topic: str | None = None,
    fallback: list[str] | None = None,
    ai: Mapping[str, Any] | None = None,
) -> None:
    await db.execute(
        "INSERT INTO templates (project_id, id, topic, content, fallback, ai) "
        "VALUES ($1, $2, $3, $4, $5, $6)",
        project_id, template_id, topic, dict(channels), fallback,
        dict(ai) if ai is not None else None,
    )


async def send(
    redis: Redis,
    keys: Keys,
    db: asyncpg.Pool,
    project_id: str,
    template: str,
    to: str | list[str] | dict[str, str],
    *,
    data: Mapping[str, Any] | None = None,
    channels: list[str] | None = None,
    priority: str = "normal",
    send_at: str | None = None,
    campaign_id: str | None = None,
    idempotency_key: str | None = None,
) -> str:
    """What the api does for POST /v1/notifications: a notifications row and an inbound entry."""
    event_id = uuid7()
    recipients: dict[str, Any]
    if isinstance(to, str):
        recipients = {"userId": to}
    elif isinstance(to, list):
        recipients = {"userIds": to}
    else:
        recipients = dict(to)
    await db.execute(
        "INSERT INTO notifications (id, project_id, template_id, priority, recipients_spec, "
        "data, channels, campaign_id, idempotency_key) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        event_id, project_id, template, priority, to, dict(data or {}), channels, campaign_id,
        idempotency_key,
    )
    await xadd(redis, keys.inbound(priority), {
        "eventId": event_id, "projectId": project_id, "template": template, "to": recipients,
        "data": dict(data or {}), "channels": channels, "priority": priority,
        "sendAt": send_at, "campaignId": campaign_id, "idempotencyKey": idempotency_key,
        "createdAt": utc_now_iso(),
    }, maxlen=1_000_000)
    return event_id


async def drain(*services: Service, max_rounds: int = 100) -> int:
    """Run each service until none of them finds work."""
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
    return [decode(fields) for _id, fields in await xrange(redis, stream)]


async def timeline(db: asyncpg.Pool, event_id: str) -> list[dict[str, Any]]:
    rows = await db.fetch(
        "SELECT task_id, user_id, channel, attempt, kind, status, detail, provider, "
        "provider_message_id, metadata FROM message_logs WHERE event_id = $1 ORDER BY id",
        event_id,
    )
    return [dict(r) for r in rows]
