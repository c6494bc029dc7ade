"""In-app messages: a row in ``inapp_messages`` plus a notification on the user's inbox
channel (``notif:channel:inbox:{projectId}:{userId}``), which the api turns into server-sent
events. ``task_id`` is unique, so delivering a task twice stores (and announces) one message.
"""

from __future__ import annotations

import logging
from datetime import UTC
from typing import Any

import asyncpg
from redis.exceptions import RedisError

from notifkit import codec
from notifkit.transports.base import Message, Outcome, SendResult, TransportContext

log = logging.getLogger("notifkit.transports.inapp")

# Stored only while the user exists, holding their row until the insert commits: a user
# erased after delivery's check (DELETE /v1/users/{id} erases the inbox in the same
# transaction as the row) would otherwise keep a message nobody's inbox erases, which a user
# created again under the id would read as theirs.
_INSERT = """
INSERT INTO inapp_messages (project_id, user_id, task_id, event_id, content)
SELECT u.project_id, u.id, $3::text, $4::uuid, $5::jsonb
  FROM users u WHERE u.project_id = $1::uuid AND u.id = $2::text
  FOR KEY SHARE
ON CONFLICT (task_id) DO NOTHING
RETURNING id::text AS id, created_at
"""


_SCRIPT_SCHEMES = ("javascript:", "vbscript:", "data:")


def unsafe_url(value: Any) -> bool:
    """Whether a link would run script where an inbox renders it (browsers ignore case,
    surrounding spaces and control characters inside the scheme)."""
    if not isinstance(value, str):
        return False
    compact = "".join(ch for ch in value if ch > " ").lower()
    return compact.startswith(_SCRIPT_SCHEMES)


class InAppTransport:
    channel: str = "inapp"
    provider: str = "inapp"
    idempotent: bool = True
    rate_per_s: float | None = None

    def __init__(self) -> None:
        self._ctx: TransportContext | None = None

    async def open(self, ctx: TransportContext) -> None:
        if ctx.db is None:
            raise RuntimeError("the in-app transport needs the PostgreSQL pool")
        self._ctx = ctx

    async def close(self) -> None:
        self._ctx = None

    async def send(self, message: Message) -> SendResult:
        ctx = self._ctx
        if ctx is None or ctx.db is None:
            raise RuntimeError("the in-app transport is not open")
        content: dict[str, Any] = dict(message.content)
        if unsafe_url(content.get("url")):
            # An inbox renders the link: a script URL (from the template or the send's data)
            # would run in the recipient's app. The message goes out without it.
            log.warning("Dropped an in-app link with a script scheme.", extra=_ids(message))
            content["url"] = None
        try:
            row = await ctx.db.fetchrow(_INSERT, message.project_id, message.user_id,
                                        message.task_id, message.event_id, content)
            if row is None:  # delivered before, or the user is gone
                existing = await ctx.db.fetchval(
                    "SELECT id::text FROM inapp_messages WHERE task_id = $1 AND project_id = $2",
                    message.task_id, message.project_id,
                )
                if existing is None:
                    return SendResult(Outcome.INVALID_RECIPIENT,
                                      detail="no user: erased after the task was queued; "
                                             "not sent", removed=True)
                # The stored message stands, announced already.
                return SendResult(Outcome.SENT, existing, "already stored")
        except (asyncpg.PostgresError, OSError) as exc:
            return SendResult(Outcome.RETRY, detail=f"could not store the message: {exc}")
        item = {
            "id": row["id"], "userId": message.user_id, "taskId": message.task_id,
            "eventId": message.event_id, "content": content, "read": False, "readAt": None,
            # As GET /v1/users/{userId}/inbox writes it: UTC, milliseconds.
            "createdAt": row["created_at"].astimezone(UTC).isoformat(
                timespec="milliseconds").replace("+00:00", "Z"),
        }
        try:
            await ctx.redis.publish(
                ctx.keys.inbox_channel(message.project_id, message.user_id), codec.dumps(item)
            )
        except (RedisError, OSError) as exc:
            # The message is stored, so the inbox lists it; only the live push is lost.
            log.warning("Stored an in-app message but could not announce it (%s); open inbox "
                        "streams will not show it until reloaded.", exc, extra=_ids(message))
        return SendResult(Outcome.SENT, row["id"], "stored")


def _ids(message: Message) -> dict[str, str | None]:
    return {"event_id": message.event_id, "task_id": message.task_id,
            "project_id": message.project_id}
