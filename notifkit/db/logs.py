"""The timeline: ``message_logs`` rows written by the pipeline, in batches.

Every pipeline decision is one row; rows are inserted with ``ON CONFLICT (task_id, channel,
attempt, kind)``, so a stage that runs an entry twice records nothing twice. A wait decided
again within one attempt (REPEATABLE_KINDS: parked again on notifkit's own rate, held again
for quiet hours that changed) updates its row instead: its detail and metadata become the
latest decision's, and ``metadata.repeats`` counts the decisions (the row keeps its first
time, so a walk over the log by time meets it once).
``status`` is the recipient+channel status after the row (the API's status values).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import asyncpg

from notifkit.codec import json_text


class Status(StrEnum):
    ACCEPTED = "accepted"
    PROCESSING = "processing"
    SCHEDULED = "scheduled"
    SENT = "sent"
    DELIVERED = "delivered"
    FAILED = "failed"
    SKIPPED = "skipped"
    SUPPRESSED = "suppressed"
    THROTTLED = "throttled"
    DEAD_LETTERED = "dead_lettered"


class Kind(StrEnum):
    SKIPPED = "skipped"
    SUPPRESSED = "suppressed"
    THROTTLED = "throttled"
    DEFERRED = "deferred"
    # Parked by notifkit's own per-provider bucket: not an attempt, so the provider 429 the
    # same attempt may meet next needs a row of another kind (rows are unique per
    # task, channel, attempt and kind).
    RATE_LIMITED = "rate_limited"
    SCHEDULED = "scheduled"
    QUEUED = "queued"
    SENT = "sent"
    FAILED = "failed"
    DEAD_LETTERED = "dead_lettered"
    # An operator sent the dead-lettered work back (POST /v1/dlq/{id}/replay): it is in
    # progress again, whatever terminal row came before.
    REPLAYED = "replayed"
    # POST /v1/notifications/{eventId}/cancel took the task out of the scheduler, or the
    # scheduler refused it for a canceled notification (status skipped: not a new status).
    CANCELED = "canceled"
    # The ai service's, about writing the content: apart from delivery's kinds, since both
    # number their attempts from 1 and rows are unique per (task, channel, attempt, kind).
    # The enricher's, about the whole notification, when its recipients take more than one
    # page: the first page's row says more follow, the last page's that every recipient is
    # enriched. Between the two the notification is in progress, whatever its first pages'
    # recipients reached.
    FANOUT = "fanout"
    FANNED_OUT = "fanned_out"
    GENERATION_DEFERRED = "generation_deferred"
    GENERATION_FAILED = "generation_failed"


# Kinds a stage may decide again within one attempt, each time with a new "until": the row
# says the latest. Every other kind's first row stands.
REPEATABLE_KINDS = frozenset({Kind.RATE_LIMITED, Kind.DEFERRED, Kind.GENERATION_DEFERRED})


@dataclass(slots=True)
class LogRow:
    project_id: str
    event_id: str
    task_id: str
    user_id: str | None
    channel: str  # '' for a row about the whole event or recipient
    kind: Kind
    status: Status
    attempt: int = 0
    detail: str | None = None
    provider: str | None = None
    provider_message_id: str | None = None
    campaign_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


# One statement for the whole batch, the rows as parallel arrays: PostgreSQL plans and starts
# it once, where an executemany of N rows is N executions (each planned afresh under
# plan_cache_mode = force_custom_plan). metadata travels as JSON text: an array of jsonb would
# take a JSON list for a nested array. Its parameters are the 13 arrays of log_columns ($1 to
# $13); a statement that does more in the same commit puts a data-modifying WITH before it
# (insert_rows_sql).
_COLUMNS = """project_id, event_id, task_id, user_id, channel, attempt, kind, status, detail,
           provider, provider_message_id, campaign_id, metadata"""
_ROWS = """unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::text[], $6::integer[],
            $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], $12::text[],
            $13::text[]) AS r (""" + _COLUMNS + ")"
_SELECT = """SELECT r.project_id, r.event_id, r.task_id, r.user_id, r.channel, r.attempt, r.kind,
       r.status, r.detail, r.provider, r.provider_message_id, r.campaign_id, r.metadata::jsonb"""
_KEY = "(task_id, channel, attempt, kind)"
INSERT_ROWS = f"""
INSERT INTO message_logs ({_COLUMNS})
{_SELECT}
FROM {_ROWS}
ON CONFLICT {_KEY} DO NOTHING
"""
_REPEATABLE = ", ".join(f"'{kind.value}'" for kind in sorted(REPEATABLE_KINDS))
# A batch holding a repeated wait: its other rows as INSERT_ROWS has them (DO NOTHING takes
# no lock on a row already there, so replays of overlapping batches cannot deadlock), the
# waits updating their row, only for a decision of the same reason (a park on notifkit's own
# rate does not overwrite a provider's 429 of the same attempt) and only when it says
# something new (the same row written again by a reclaimed entry changes nothing).
_INSERT_WITH_WAITS = f"""
r AS (SELECT * FROM {_ROWS}),
others AS (
  INSERT INTO message_logs ({_COLUMNS})
  {_SELECT} FROM r WHERE r.kind NOT IN ({_REPEATABLE})
  ON CONFLICT {_KEY} DO NOTHING
)
INSERT INTO message_logs ({_COLUMNS})
{_SELECT} FROM r WHERE r.kind IN ({_REPEATABLE})
ORDER BY r.task_id, r.channel, r.attempt, r.kind
ON CONFLICT {_KEY} DO UPDATE
SET detail = EXCLUDED.detail,
    metadata = EXCLUDED.metadata || jsonb_build_object(
        'repeats', COALESCE((message_logs.metadata ->> 'repeats')::integer, 1) + 1)
WHERE message_logs.metadata ->> 'reason' IS NOT DISTINCT FROM EXCLUDED.metadata ->> 'reason'
  AND (message_logs.detail, message_logs.metadata - 'repeats')
      IS DISTINCT FROM (EXCLUDED.detail, EXCLUDED.metadata)
"""


def insert_rows_sql(rows: Sequence[LogRow], before: str | None = None) -> str:
    """The statement that writes ``rows`` (as ``log_columns`` gives them), after ``before``,
    a data-modifying ``name AS (...)`` to run in the same commit."""
    if any(row.kind in REPEATABLE_KINDS for row in rows):
        return "WITH " + (f"{before}, " if before else "") + _INSERT_WITH_WAITS
    return (f"WITH {before} " if before else "") + INSERT_ROWS


# The same row, unless its task+channel already has a row of its kind at any attempt.
_INSERT_FIRST_OF_KIND = """
INSERT INTO message_logs (project_id, event_id, task_id, user_id, channel, attempt, kind,
                          status, detail, provider, provider_message_id, campaign_id, metadata)
SELECT $1::uuid, $2::uuid, $3::text, $4::text, $5::text, $6::integer, $7::text, $8::text,
       $9::text, $10::text, $11::text, $12::text, $13::jsonb
WHERE NOT EXISTS (SELECT 1 FROM message_logs
                  WHERE task_id = $3::text AND channel = $5::text AND kind = $7::text)
ON CONFLICT (task_id, channel, attempt, kind) DO NOTHING
"""


async def insert_logs(db: asyncpg.Pool | asyncpg.Connection, rows: Sequence[LogRow]) -> None:
    """Write a read batch's rows in one statement."""
    if rows:
        await db.execute(insert_rows_sql(rows), *log_columns(rows))


async def insert_one(db: asyncpg.Pool | asyncpg.Connection, row: LogRow) -> int | None:
    """Write one row; its id, or None when the same row was there already (a repeated wait
    updates its row, and so answers its id)."""
    value = await db.fetchval(insert_rows_sql([row]) + " RETURNING id", *log_columns([row]))
    return int(value) if value is not None else None


async def insert_first_of_kind(db: asyncpg.Pool | asyncpg.Connection,
                               rows: Sequence[LogRow]) -> None:
    """Write each row only if its task+channel has no row of the same kind yet, whatever the
    attempt: for an outcome an earlier attempt may already have recorded (a retry that finds
    its task sent by a process that died before acking it)."""
    if rows:
        await db.executemany(_INSERT_FIRST_OF_KIND, [_args(r) for r in rows])


def log_columns(rows: Sequence[LogRow]) -> list[list[Any]]:
    """The rows as the 13 arrays insert_rows_sql's statements take. A batch holding a repeated
    wait has one row per key: an ON CONFLICT that may update fails on a key it meets twice,
    so the first row of a key stands (as DO NOTHING has it), or a wait's last."""
    rows = _one_per_key(rows)
    return [[r.project_id for r in rows], [r.event_id for r in rows],
            [r.task_id for r in rows], [r.user_id for r in rows], [r.channel for r in rows],
            [r.attempt for r in rows], [r.kind.value for r in rows],
            [r.status.value for r in rows], [r.detail for r in rows],
            [r.provider for r in rows], [r.provider_message_id for r in rows],
            [r.campaign_id for r in rows], [json_text(r.metadata) for r in rows]]


def _one_per_key(rows: Sequence[LogRow]) -> Sequence[LogRow]:
    if len(rows) < 2 or not any(row.kind in REPEATABLE_KINDS for row in rows):
        return rows
    kept: dict[tuple[str, str, int, str], LogRow] = {}
    for row in rows:
        key = (row.task_id, row.channel, row.attempt, row.kind)
        if key not in kept or row.kind in REPEATABLE_KINDS:
            kept[key] = row
    return rows if len(kept) == len(rows) else list(kept.values())


def _args(r: LogRow) -> tuple[Any, ...]:
    return (r.project_id, r.event_id, r.task_id, r.user_id, r.channel, r.attempt, r.kind.value,
            r.status.value, r.detail, r.provider, r.provider_message_id, r.campaign_id,
            r.metadata)


# The rows of some recipients' tasks (not the notification's own rows), by recipient: each
# (project, event, user) as three parallel arrays.
_RECIPIENT_TASK_ROWS = """
SELECT l.project_id::text AS project_id, l.event_id::text AS event_id, l.user_id, l.task_id,
       l.kind, l.status, l.attempt
FROM unnest($1::uuid[], $2::uuid[], $3::text[]) AS r (project_id, event_id, user_id)
JOIN message_logs l ON l.project_id = r.project_id AND l.event_id = r.event_id
                   AND l.user_id = r.user_id
WHERE l.channel <> ''
"""


async def recipient_task_rows(db: asyncpg.Pool | asyncpg.Connection,
                              recipients: Sequence[tuple[str, str, str]]) -> list[asyncpg.Record]:
    """Every task row of these recipients, each ``(project_id, event_id, user_id)``."""
    if not recipients:
        return []
    return list(await db.fetch(_RECIPIENT_TASK_ROWS, [r[0] for r in recipients],
                               [r[1] for r in recipients], [r[2] for r in recipients]))
