"""What delivery writes besides the timeline: ``delivery_outbox`` and disabled contacts.

The outbox is how a reclaimed task knows what an earlier attempt did, per (task, channel,
destination):

    no row     never handed to a provider
    sending    claimed before the provider call and never confirmed: the call may have been
               accepted (a crash or a lost response). Resending is safe only where the
               provider honours the idempotency key; elsewhere it is the documented duplicate.
    sent       the provider accepted (provider_message_id): never sent again
    failed     the provider refused (4xx/5xx/429): nothing went out, resending is safe. A
               refusal after an attempt whose answer was lost leaves the row 'sending': that
               attempt may still have been accepted
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from notifkit.db.logs import LogRow, insert_logs, insert_rows_sql, log_columns
from notifkit.db.recipients import Executor

SENDING, SENT, FAILED = "sending", "sent", "failed"
# Why a destination is no longer sent to (Previous.blocked).
SUPPRESSED, DISABLED, REMOVED = "suppressed", "disabled", "removed"
OPTED_OUT = "opted_out"  # the user turned the channel or the task's topic off meanwhile

_CLAIM = """
WITH input AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::uuid[], $5::text[], $6::text[],
                         $7::text[])
        AS i(task_id, channel, destination, project_id, provider, user_id, topic)
), checked AS (
    -- What happened since the engine routed the task: a bounce or complaint suppressed the
    -- address, the user turned the channel or the topic off, a provider called the address
    -- invalid and the contact was disabled, or the contact (or the whole user) was erased
    -- while the task waited, e.g. for its sendAt. And what the outbox held before this
    -- claim: every part of one statement reads the table as it was when the statement began.
    --
    -- Every lookup is by a unique key, one row per destination: LATERAL ... LIMIT 1 keeps
    -- it an index probe however large the batch, where a join let the planner hash the
    -- whole outbox (a sequential scan of a table that only grows). OFFSET 0 keeps each
    -- EXISTS a plain subplan: without it PostgreSQL also plans a hashed variant of each,
    -- a third of this statement's planning time, which is most of its cost at low load.
    SELECT i.*,
           CASE WHEN EXISTS (SELECT 1 FROM suppressions s
                              WHERE s.project_id = i.project_id AND s.channel = i.channel
                                AND s.target = i.destination OFFSET 0) THEN 'suppressed'
                WHEN EXISTS (SELECT 1 FROM user_channel_preferences p
                              WHERE p.project_id = i.project_id AND p.user_id = i.user_id
                                AND p.channel = i.channel AND NOT p.enabled OFFSET 0)
                  OR EXISTS (SELECT 1 FROM user_topic_preferences t
                              WHERE t.project_id = i.project_id AND t.user_id = i.user_id
                                AND t.topic = i.topic AND NOT t.enabled OFFSET 0)
                     THEN 'opted_out'
                WHEN i.channel = 'inapp' THEN
                     CASE WHEN NOT EXISTS (SELECT 1 FROM users u
                                            WHERE u.project_id = i.project_id
                                              AND u.id = i.user_id OFFSET 0) THEN 'removed' END
                WHEN c.enabled IS NULL THEN 'removed'
                WHEN NOT c.enabled THEN 'disabled'
           END AS blocked,
           o.status AS before_status, o.provider_message_id AS before_message_id
      FROM input i
      -- user_contacts is unique on (project, user, channel, target).
      LEFT JOIN LATERAL (
          SELECT c.enabled FROM user_contacts c
           WHERE c.project_id = i.project_id AND c.user_id = i.user_id
             AND c.channel = i.channel AND c.target = i.destination
           LIMIT 1) c ON true
      -- delivery_outbox's key is (task, channel, destination).
      LEFT JOIN LATERAL (
          SELECT o.status, o.provider_message_id FROM delivery_outbox o
           WHERE o.task_id = i.task_id AND o.channel = i.channel
             AND o.destination = i.destination AND o.project_id = i.project_id
           LIMIT 1) o ON true
), claimed AS (
    INSERT INTO delivery_outbox (task_id, channel, destination, project_id, provider)
    SELECT task_id, channel, destination, project_id, provider FROM checked
     WHERE blocked IS NULL
    ON CONFLICT (task_id, channel, destination) DO UPDATE
       SET status = CASE WHEN delivery_outbox.status = 'sent' THEN 'sent' ELSE 'sending' END,
           provider = CASE WHEN delivery_outbox.status = 'sent' THEN delivery_outbox.provider
                           ELSE EXCLUDED.provider END,
           updated_at = now()
     WHERE delivery_outbox.project_id = EXCLUDED.project_id
    RETURNING 1
)
SELECT task_id, channel, destination, before_status AS status,
       before_message_id AS provider_message_id, blocked
  FROM checked
"""


@dataclass(frozen=True)
class Claim:
    task_id: str
    channel: str
    destination: str
    project_id: str
    provider: str
    user_id: str
    topic: str | None = None  # the template's, whose preference may have been turned off


@dataclass(frozen=True)
class Previous:
    """What the outbox held before this attempt claimed the row (status None = no row), and
    why the destination may no longer be sent to ('suppressed', 'opted_out' when the user
    turned the channel or topic off, 'disabled', or 'removed' when the contact or user was
    erased; such a row is not claimed)."""

    status: str | None
    provider_message_id: str | None
    blocked: str | None = None


async def claim(db: Executor, claims: Sequence[Claim]) -> dict[tuple[str, str, str], Previous]:
    """Mark every (task, channel, destination) 'sending' (a 'sent' row stays 'sent') and
    answer what each held before; one query for the batch. A destination suppressed or
    disabled since the task was routed is answered ``blocked`` and not claimed."""
    if not claims:
        return {}
    rows = await db.fetch(
        _CLAIM,
        [c.task_id for c in claims], [c.channel for c in claims],
        [c.destination for c in claims], [c.project_id for c in claims],
        [c.provider for c in claims], [c.user_id for c in claims],
        [c.topic for c in claims],
    )
    return {
        (r["task_id"], r["channel"], r["destination"]): Previous(
            r["status"], r["provider_message_id"], r["blocked"])
        for r in rows
    }


def _settle_sql(first: int) -> str:
    a, b, c, d, e = (f"${n}" for n in range(first, first + 5))
    return ("UPDATE delivery_outbox o SET status = u.status, "
            "provider_message_id = coalesce(u.provider_message_id, o.provider_message_id), "
            "updated_at = now() "
            f"FROM unnest({a}::text[], {b}::text[], {c}::text[], {d}::text[], {e}::text[]) "
            "AS u(task_id, channel, destination, status, provider_message_id) "
            "WHERE o.task_id = u.task_id AND o.channel = u.channel "
            "AND o.destination = u.destination AND o.status <> 'sent'")


def _settle_columns(rows: Sequence[tuple[str, str, str, str, str | None]]) -> list[list[Any]]:
    return [[r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
            [r[3] for r in rows], [r[4] for r in rows]]


async def settle(
    db: Executor, rows: Sequence[tuple[str, str, str, str, str | None]]
) -> None:
    """Record outcomes: (task id, channel, destination, status, provider message id).
    A 'sent' row is never changed back."""
    if rows:
        await db.execute(_settle_sql(1), *_settle_columns(rows))


async def settle_and_log(
    db: Executor, rows: Sequence[tuple[str, str, str, str, str | None]],
    logs: Sequence[LogRow],
) -> None:
    """:func:`settle` and :func:`~notifkit.db.logs.insert_logs` in one statement, so one
    commit: a batch's outcomes and its timeline rows land together."""
    if not rows or not logs:
        await settle(db, rows)
        await insert_logs(db, logs)
        return
    columns = log_columns(logs)
    await db.execute(insert_rows_sql(logs, f"settled AS ({_settle_sql(len(columns) + 1)})"),
                     *columns, *_settle_columns(rows))


DISABLE_CONTACTS_SQL = (
    "UPDATE user_contacts c SET enabled = false, disabled_reason = u.reason, "
    "disabled_at = now() "
    "FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[]) "
    "AS u(project_id, channel, target, reason) "
    "WHERE c.project_id = u.project_id AND c.channel = u.channel "
    "AND c.target = u.target AND c.enabled")


async def disable_contacts(
    db: Executor, contacts: Sequence[tuple[str, str, str, str]]
) -> None:
    """Disable (project id, channel, target, reason) addresses for every user who has them."""
    if not contacts:
        return
    await db.execute(
        DISABLE_CONTACTS_SQL,
        [c[0] for c in contacts], [c[1] for c in contacts], [c[2] for c in contacts],
        [c[3] for c in contacts],
    )
