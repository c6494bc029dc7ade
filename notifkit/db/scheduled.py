"""``scheduled_payloads``: the durable copy of every task waiting in the scheduler's shards.

The scheduler upserts a read batch's tasks before adding them to Redis (in the transaction
that locks their notifications' rows to see whether one was canceled), deletes the rows of
tasks it has moved (matching the due time that was moved, so a task parked again since keeps
its new row), and pages through the table to rebuild the shards after Redis lost them.

Task ids are globally unique; every statement still names the project, as all tenant queries
do. Paging for a rebuild is the one scan across projects: the scheduler serves all of them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from notifkit.clock import from_ms, to_ms


@dataclass(frozen=True, slots=True)
class ScheduledRow:
    task_id: str
    project_id: str
    due_ms: int
    priority: str
    stream: str
    payload: dict[str, Any]


_UPSERT = """
INSERT INTO scheduled_payloads (task_id, project_id, due_at, priority, stream, payload)
SELECT u.task_id, u.project_id, u.due_at, u.priority, u.stream, u.payload
FROM unnest($1::text[], $2::uuid[], $3::timestamptz[], $4::text[], $5::text[], $6::jsonb[])
     AS u(task_id, project_id, due_at, priority, stream, payload)
WHERE EXISTS (SELECT 1 FROM projects p WHERE p.id = u.project_id)
ON CONFLICT (task_id) DO UPDATE
SET project_id = EXCLUDED.project_id, due_at = EXCLUDED.due_at,
    priority = EXCLUDED.priority, stream = EXCLUDED.stream, payload = EXCLUDED.payload
WHERE scheduled_payloads.due_at <= EXCLUDED.due_at
RETURNING task_id
"""


async def upsert(db: asyncpg.Pool | asyncpg.Connection, rows: Sequence[ScheduledRow]) -> set[str]:
    """Write a batch (task ids must be distinct) in one statement; returns the task ids
    written. Tasks of projects that no longer exist are left out rather than failing the
    batch on the foreign key, and so is a task whose row is due later than this copy: a
    task is only ever scheduled again for later (parked after a 429), so an earlier copy is
    an old entry read again (a scheduler that died before acking it), and taking it would
    send the task before the provider's Retry-After."""
    if not rows:
        return set()
    records = await db.fetch(
        _UPSERT,
        [r.task_id for r in rows],
        [r.project_id for r in rows],
        [from_ms(r.due_ms) for r in rows],
        [r.priority for r in rows],
        [r.stream for r in rows],
        [r.payload for r in rows],
    )
    return {record["task_id"] for record in records}


async def waiting_later(db: asyncpg.Pool | asyncpg.Connection,
                        task_ids: Collection[str]) -> set[str]:
    """Of ``task_ids``, those whose row exists: after :func:`upsert` left them out, the
    ones a later schedule of the same task waits for (the rest belong to no project)."""
    if not task_ids:
        return set()
    records = await db.fetch(
        "SELECT task_id FROM scheduled_payloads WHERE task_id = ANY($1::text[])", list(task_ids))
    return {record["task_id"] for record in records}


_LOCK_CANCELED = """
SELECT n.id::text AS id, n.canceled_at IS NOT NULL AS canceled
FROM notifications n
JOIN unnest($1::uuid[], $2::uuid[]) AS t(project_id, event_id)
  ON n.id = t.event_id AND n.project_id = t.project_id
ORDER BY n.id
FOR SHARE OF n
"""


async def lock_canceled(conn: asyncpg.Connection, events: Collection[tuple[str, str]]) -> set[str]:
    """Lock the notifications rows of (project id, event id) pairs FOR SHARE until the
    transaction ends; returns the event ids among them that are canceled.

    Every row is locked, canceled or not: a cancel updates its row FOR UPDATE, so it waits
    for this transaction (whose tasks are in their shards when it commits, where the cancel
    takes them out), or this lock waits for the cancel and reads the canceled row. A row
    filtered out by its old, uncanceled version would not be waited for."""
    if not events:
        return set()
    records = await conn.fetch(_LOCK_CANCELED, [e[0] for e in events], [e[1] for e in events])
    return {r["id"] for r in records if r["canceled"]}


_DELETE_MOVED = """
DELETE FROM scheduled_payloads s
USING unnest($1::uuid[], $2::text[], $3::timestamptz[]) AS m(project_id, task_id, due_at)
WHERE s.task_id = m.task_id AND s.project_id = m.project_id AND s.due_at = m.due_at
"""


async def delete_moved(
    db: asyncpg.Pool | asyncpg.Connection, moved: Sequence[tuple[str, str, int]]
) -> int:
    """Delete the rows of moved tasks, given as (project id, task id, due ms); a row whose due
    time differs belongs to a newer schedule of the same task and stays."""
    if not moved:
        return 0
    status: str = await db.execute(
        _DELETE_MOVED,
        [m[0] for m in moved],
        [m[1] for m in moved],
        [from_ms(m[2]) for m in moved],
    )
    return int(status.rsplit(" ", 1)[-1])


_PAGE = """
SELECT task_id, project_id::text AS project_id, due_at, priority, stream, payload
FROM scheduled_payloads
WHERE task_id > $1
ORDER BY task_id
LIMIT $2
"""


async def pages(db: asyncpg.Pool, page_size: int) -> AsyncIterator[list[ScheduledRow]]:
    """Every row, ``page_size`` at a time, in task-id order (keyset paging: memory stays
    bounded however many tasks wait, and so does each query, which is why a rebuild keeps the
    pool's query limit)."""
    after = ""
    while True:
        records = await db.fetch(_PAGE, after, page_size)
        if not records:
            return
        yield [_row(r) for r in records]
        after = records[-1]["task_id"]
        if len(records) < page_size:
            return


_BY_IDS = """
SELECT task_id, project_id::text AS project_id, due_at, priority, stream, payload
FROM scheduled_payloads
WHERE task_id = ANY($1::text[])
"""


async def by_task_ids(db: asyncpg.Pool, task_ids: Sequence[str]) -> list[ScheduledRow]:
    """The rows of some tasks (the scheduler restores shard entries whose payload went
    missing); looked up by their globally unique ids."""
    if not task_ids:
        return []
    return [_row(r) for r in await db.fetch(_BY_IDS, list(task_ids))]


def _row(record: asyncpg.Record) -> ScheduledRow:
    return ScheduledRow(
        task_id=record["task_id"],
        project_id=record["project_id"],
        due_ms=to_ms(record["due_at"]),
        priority=record["priority"],
        stream=record["stream"],
        payload=record["payload"],
    )
