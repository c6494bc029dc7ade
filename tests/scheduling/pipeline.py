"""Builders for tests that run the scheduling rules through the real pipeline: users,
templates and sends written as the api writes them, services drained with run_until_idle."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import asyncpg
from redis.asyncio import Redis

from notifkit.clock import utc_now_iso
from notifkit.config import EmailSettings, Settings, WebhookSecrets
from notifkit.ids import uuid7
from notifkit.keys import Keys
from notifkit.streams import xadd
from tests.sendpath.helpers import drain, entries, timeline

EMAIL = {"subject": "Hello {{ user.id }}", "text": "Your code is {{ data.code }}."}
SMS = {"text": "Code {{ data.code }}"}

# Draining and reading back are the send path's helpers; these builders add what the
# scheduling rules need (time zones, quiet hours, project throttles).
__all__ = ["EMAIL", "SMS", "add_template", "add_user", "drain", "entries", "send",
           "set_project_settings", "simulated_resend", "timeline"]

RESEND_WEBHOOK_SECRET = "resend-webhook-secret-for-tests"


def simulated_resend(settings: Settings, base_url: str) -> Settings:
    """An API on a free port that sends e-mail through Resend at ``base_url`` (a simulator)
    and takes its signed webhooks."""
    return settings.replace(
        host="127.0.0.1", port=0,
        email=EmailSettings(transport="resend", from_addr="notifkit <no-reply@example.com>",
                            resend_api_key="re_test", resend_base_url=base_url),
        webhooks=WebhookSecrets(resend=RESEND_WEBHOOK_SECRET),
    )


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


