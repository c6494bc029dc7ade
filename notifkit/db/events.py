"""What the events service writes: timeline rows, suppressions, and the lookup that ties a
provider's message id back to the task it belongs to. One statement per read batch each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg


@dataclass(slots=True)
class TimelineRow:
    """One ``message_logs`` row (see the table's comments for the meaning of each column)."""

    project_id: str
    event_id: str
    task_id: str
    user_id: str | None
    channel: str
    attempt: int
    kind: str
    status: str
    detail: str | None = None
    provider: str | None = None
    provider_message_id: str | None = None
    campaign_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    # Not a column. A dead_lettered row's: the attempts made before the DLQ replay that
    # started its round. Rows numbered above it belong to the same round.
    earlier_attempts: int = 0


# A dead-lettering reported by the worker and by delivery itself may count attempts
# differently; one dead_lettered row per task, channel and round (each DLQ replay starts a
# new one, whose rows are numbered after the earlier rounds') is enough.
_INSERT_TIMELINE = """
INSERT INTO message_logs (project_id, event_id, task_id, user_id, channel, attempt, kind,
                          status, detail, provider, provider_message_id, campaign_id, metadata)
SELECT u.project_id, u.event_id, u.task_id, u.user_id, u.channel, u.attempt, u.kind, u.status,
       u.detail, u.provider, u.provider_message_id, u.campaign_id, u.metadata
FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::text[], $6::int[], $7::text[],
            $8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::jsonb[],
            $14::int[])
     AS u(project_id, event_id, task_id, user_id, channel, attempt, kind, status, detail,
          provider, provider_message_id, campaign_id, metadata, earlier_attempts)
WHERE u.kind <> 'dead_lettered' OR NOT EXISTS (
    SELECT 1 FROM message_logs m
    WHERE m.project_id = u.project_id AND m.task_id = u.task_id AND m.channel = u.channel
      AND m.kind = 'dead_lettered' AND m.attempt > u.earlier_attempts)
ON CONFLICT (task_id, channel, attempt, kind) DO NOTHING
"""


async def insert_timeline(
    db: asyncpg.Pool | asyncpg.Connection, rows: Sequence[TimelineRow]
) -> None:
    if not rows:
        return
    await db.execute(
        _INSERT_TIMELINE,
        [r.project_id for r in rows], [r.event_id for r in rows], [r.task_id for r in rows],
        [r.user_id for r in rows], [r.channel for r in rows], [r.attempt for r in rows],
        [r.kind for r in rows], [r.status for r in rows], [r.detail for r in rows],
        [r.provider for r in rows], [r.provider_message_id for r in rows],
        [r.campaign_id for r in rows], [r.metadata for r in rows],
        [r.earlier_attempts for r in rows],
    )


@dataclass(frozen=True, slots=True)
class SentMessage:
    """The task a provider message id belongs to, as delivery recorded it."""

    task_id: str
    channel: str
    destination: str | None
    event_id: str | None  # None until delivery's 'sent' row exists
    user_id: str | None
    campaign_id: str | None
    attempt: int


# The outbox knows every destination's message id; the timeline's 'sent' row knows the event,
# user, campaign and attempt. A message id only in the timeline (a transport without an
# outbox row) is found there, whatever the provider is called; failing both, the task id a
# provider echoes back (our metadata) finds the task's 'sent' row. When the receipt echoes a
# task id, a record of another task with the same message id is not its message: provider ids
# can repeat (a simulator restarted with its seed, a provider reusing ids), and matching one
# would put the receipt on another user's timeline and suppress their address.
_RESOLVE = """
SELECT r.idx,
       COALESCE(o.task_id, l.task_id, t.task_id) AS task_id,
       COALESCE(o.channel, l.channel, t.channel) AS channel,
       o.destination,
       COALESCE(s.event_id, l.event_id, t.event_id)::text AS event_id,
       COALESCE(s.user_id, l.user_id, t.user_id) AS user_id,
       COALESCE(s.campaign_id, l.campaign_id, t.campaign_id) AS campaign_id,
       COALESCE(s.attempt, l.attempt, t.attempt, 0) AS attempt
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[]) WITH ORDINALITY
     AS r(project_id, provider, pmid, task_id, channel, idx)
LEFT JOIN LATERAL (
    SELECT task_id, channel, destination FROM delivery_outbox
    WHERE project_id = r.project_id AND provider = r.provider AND provider_message_id = r.pmid
      AND (r.task_id IS NULL OR task_id = r.task_id)
    ORDER BY created_at DESC
    LIMIT 1
) o ON true
LEFT JOIN LATERAL (
    SELECT event_id, user_id, campaign_id, attempt FROM message_logs
    WHERE o.task_id IS NOT NULL AND project_id = r.project_id AND task_id = o.task_id
      AND channel = o.channel AND kind = 'sent'
    ORDER BY attempt DESC
    LIMIT 1
) s ON true
LEFT JOIN LATERAL (
    SELECT task_id, channel, event_id, user_id, campaign_id, attempt FROM message_logs
    WHERE (o.task_id IS NULL OR s.event_id IS NULL)
      AND project_id = r.project_id AND provider_message_id = r.pmid
      AND (r.task_id IS NULL OR task_id = r.task_id)
    ORDER BY id DESC
    LIMIT 1
) l ON true
LEFT JOIN LATERAL (
    SELECT task_id, channel, event_id, user_id, campaign_id, attempt FROM message_logs
    WHERE (o.task_id IS NULL OR s.event_id IS NULL) AND l.task_id IS NULL
      AND r.task_id IS NOT NULL AND project_id = r.project_id AND task_id = r.task_id
      AND (r.channel IS NULL OR channel = r.channel) AND kind = 'sent'
    ORDER BY attempt DESC
    LIMIT 1
) t ON true
"""


@dataclass(frozen=True, slots=True)
class MessageLookup:
    """What a receipt says about the message it is about."""

    project_id: str
    provider: str
    provider_message_id: str
    task_id: str | None = None  # when the provider echoes the task id back
    channel: str | None = None


async def resolve_messages(
    db: asyncpg.Pool | asyncpg.Connection, lookups: Sequence[MessageLookup]
) -> list[SentMessage | None]:
    """For each lookup, the message it names, or None when notifkit has no record of it
    (yet)."""
    if not lookups:
        return []
    records = await db.fetch(
        _RESOLVE, [x.project_id for x in lookups], [x.provider for x in lookups],
        [x.provider_message_id for x in lookups], [x.task_id for x in lookups],
        [x.channel for x in lookups],
    )
    found: list[SentMessage | None] = [None] * len(lookups)
    for r in records:
        if r["task_id"] is None:
            continue
        found[r["idx"] - 1] = SentMessage(
            task_id=r["task_id"], channel=r["channel"], destination=r["destination"],
            event_id=r["event_id"], user_id=r["user_id"], campaign_id=r["campaign_id"],
            attempt=r["attempt"],
        )
    return found


# A task id names one project's task: rows of it under another project mean the receipt
# (from a provider account several projects share, which posts every event to each project's
# endpoint) is about that project's send, not one still to be recorded in this project.
_FOREIGN_TASKS = """
SELECT r.idx
FROM unnest($1::uuid[], $2::text[]) WITH ORDINALITY AS r(project_id, task_id, idx)
WHERE EXISTS (SELECT 1 FROM message_logs m
              WHERE m.task_id = r.task_id AND m.project_id <> r.project_id)
   OR EXISTS (SELECT 1 FROM delivery_outbox o
              WHERE o.task_id = r.task_id AND o.project_id <> r.project_id)
"""


async def foreign_tasks(
    db: asyncpg.Pool | asyncpg.Connection, tasks: Sequence[tuple[str, str]]
) -> set[int]:
    """Of ``(project_id, task_id)`` pairs, the indexes of those whose task is another
    project's."""
    if not tasks:
        return set()
    records = await db.fetch(_FOREIGN_TASKS, [t[0] for t in tasks], [t[1] for t in tasks])
    return {int(r["idx"]) - 1 for r in records}


@dataclass(frozen=True, slots=True)
class Suppression:
    project_id: str
    channel: str
    target: str
    reason: str  # bounce | complaint | unsubscribe | manual
    detail: str | None = None


_INSERT_SUPPRESSIONS = """
INSERT INTO suppressions (project_id, channel, target, reason, detail)
SELECT u.project_id, u.channel, u.target, u.reason, u.detail
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[])
     AS u(project_id, channel, target, reason, detail)
WHERE EXISTS (SELECT 1 FROM projects p WHERE p.id = u.project_id)
ON CONFLICT (project_id, channel, target) DO NOTHING
"""


async def insert_suppressions(
    db: asyncpg.Pool | asyncpg.Connection, rows: Sequence[Suppression]
) -> None:
    """Suppress addresses (the first reason recorded stays); rows of a deleted project are
    left out rather than failing the batch on the foreign key."""
    if not rows:
        return
    await db.execute(
        _INSERT_SUPPRESSIONS,
        [r.project_id for r in rows], [r.channel for r in rows], [r.target for r in rows],
        [r.reason for r in rows], [r.detail for r in rows],
    )
