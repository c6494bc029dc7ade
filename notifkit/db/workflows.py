"""Workflow queries: definitions, instances, step rows, waiters and digest windows.

Every function takes a connection (or pool) and the caller's times (``now``), so the service's
clock, not PostgreSQL's, decides when a wait is over. Instance ids are globally unique UUIDv7s;
lookups by instance id add ``project_id`` whenever the caller knows it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeAlias

import asyncpg

from notifkit.db.pool import allow_lock_wait

Conn: TypeAlias = asyncpg.Connection | asyncpg.Pool

# ``canceled``: POST /v1/workflow-instances/{id}/cancel ended it (cancel_instance).
TERMINAL_STATUSES: tuple[str, ...] = ("completed", "stopped", "failed", "digested", "canceled")


@dataclass
class Instance:
    id: str
    project_id: str
    workflow_id: str
    user_id: str
    status: str
    current_step: int
    cursor: str | None
    steps: list[dict[str, Any]]
    trigger_data: dict[str, Any]
    wake_at: datetime | None
    created_at: datetime

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL_STATUSES


@dataclass
class StepRow:
    index: int
    path: str
    type: str
    status: str
    output: Any
    started_at: datetime
    finished_at: datetime | None


@dataclass
class Waiter:
    id: str
    step_index: int
    expires_at: datetime
    resolved_at: datetime | None
    resolved_by: str | None
    event: Any


@dataclass
class DigestWindow:
    id: str
    owner_instance_id: str
    window_ends_at: datetime
    items: list[dict[str, Any]]
    closed_at: datetime | None


_INSTANCE_COLUMNS = """id::text, project_id::text, workflow_id, user_id, status, current_step,
    cursor, steps, trigger_data, wake_at, created_at"""


def _instance(row: asyncpg.Record | None) -> Instance | None:
    return Instance(*row.values()) if row is not None else None


# -- definitions ------------------------------------------------------------------------------


async def get_definition(conn: Conn, project_id: str, workflow_id: str) -> list[Any] | None:
    steps: list[Any] | None = await conn.fetchval(
        "SELECT steps FROM workflow_definitions WHERE project_id = $1 AND id = $2",
        project_id, workflow_id,
    )
    return steps


# -- instances --------------------------------------------------------------------------------


async def get_instance(
    conn: Conn, instance_id: str, project_id: str | None = None
) -> Instance | None:
    if project_id is None:
        row = await conn.fetchrow(
            f"SELECT {_INSTANCE_COLUMNS} FROM workflow_instances WHERE id = $1", instance_id
        )
    else:
        row = await conn.fetchrow(
            f"SELECT {_INSTANCE_COLUMNS} FROM workflow_instances WHERE id = $1 "
            "AND project_id = $2", instance_id, project_id,
        )
    return _instance(row)


async def create_instance(
    conn: Conn, *, instance_id: str, project_id: str, workflow_id: str, user_id: str,
    data: dict[str, Any], now: datetime, idempotency_key: str | None = None,
) -> Instance | None:
    """The instance a trigger names, created from the current definition if the API has not
    written it; None when the workflow does not exist."""
    await conn.execute(
        """INSERT INTO workflow_instances
               (id, project_id, workflow_id, user_id, status, steps, trigger_data,
                idempotency_key, created_at, updated_at)
           SELECT $1, project_id, id, $3, 'pending', steps, $4, $5, $6, $6
             FROM workflow_definitions WHERE project_id = $2 AND id = $7
           ON CONFLICT DO NOTHING""",
        instance_id, project_id, user_id, data, idempotency_key, now, workflow_id,
    )
    return await get_instance(conn, instance_id, project_id)


async def insert_triggered(
    pool: asyncpg.Pool, *, instance_id: str, project_id: str, workflow_id: str, user_id: str,
    steps: list[Any], data: dict[str, Any], idempotency_key: str | None, key_window_s: int,
) -> bool:
    """Insert the pending instance a trigger (the API's) starts; False when
    ``idempotency_key`` already names an instance started within the last ``key_window_s``.

    An instance older than that gives the key up (its ``idempotency_key`` set NULL) in the
    transaction that inserts the new one. The unique (project_id, idempotency_key) then does
    the rest: concurrent triggers with the key queue on the old row's lock or on the new
    row's insertion, and whichever comes second inserts nothing. Times are PostgreSQL's, the
    clock that stamped ``created_at``."""
    async with pool.acquire() as conn, conn.transaction():
        if idempotency_key is not None:
            await conn.execute(
                """UPDATE workflow_instances SET idempotency_key = NULL
                    WHERE project_id = $1 AND idempotency_key = $2
                      AND created_at <= now() - make_interval(secs => $3)""",
                project_id, idempotency_key, key_window_s,
            )
        inserted = await conn.fetchval(
            """INSERT INTO workflow_instances
                   (id, project_id, workflow_id, user_id, status, steps, trigger_data,
                    idempotency_key)
               VALUES ($1, $2, $3, $4, 'pending', $5, $6, $7)
               ON CONFLICT (project_id, idempotency_key) DO NOTHING RETURNING true""",
            instance_id, project_id, workflow_id, user_id, steps, data, idempotency_key,
        )
    return bool(inserted)


async def keyed_instance(
    conn: Conn, project_id: str, idempotency_key: str, within_s: int | None = None,
) -> Instance | None:
    """The instance that holds ``idempotency_key`` (None when none does); with ``within_s``,
    only one started within the last ``within_s`` seconds (PostgreSQL's clock, as
    insert_triggered): an older one holds its key only until a new trigger takes it over."""
    row = await conn.fetchrow(
        f"SELECT {_INSTANCE_COLUMNS} FROM workflow_instances "
        "WHERE project_id = $1 AND idempotency_key = $2 "
        "AND ($3::float8 IS NULL OR created_at > now() - make_interval(secs => $3))",
        project_id, idempotency_key, within_s,
    )
    return _instance(row)


class InstanceCanceled(Exception):
    """The instance was canceled (through the API) while a runner held it: the runner's
    write was refused, and it stops where it is."""


async def set_state(
    conn: Conn, instance: Instance, *, status: str, cursor: str | None, current_step: int,
    wake_at: datetime | None, now: datetime,
) -> None:
    """Move the instance on; raises InstanceCanceled, writing nothing, when it was canceled
    meanwhile (a runner that loaded it before the cancel must not bring it back)."""
    # A run moving it on clears a dead-lettered entry's mark: the instance carries on after
    # all, and only a failure of that entry is for a DLQ replay to undo.
    moved = await conn.fetchval(
        """UPDATE workflow_instances
              SET status = $3, cursor = $4, current_step = $5, wake_at = $6, updated_at = $7,
                  dead_letter = NULL
            WHERE id = $1 AND project_id = $2 AND status <> 'canceled' RETURNING true""",
        instance.id, instance.project_id, status, cursor, current_step, wake_at, now,
    )
    if not moved:
        instance.status = "canceled"
        raise InstanceCanceled(instance.id)
    instance.status, instance.cursor, instance.current_step = status, cursor, current_step
    instance.wake_at = wake_at


async def check_not_canceled(conn: asyncpg.Connection, instance: Instance) -> None:
    """In a transaction about to record a send: raise InstanceCanceled if the instance was
    canceled, else hold its row until the commit, so a cancel either comes first (and
    nothing is sent) or waits for the send to be recorded."""
    status = await conn.fetchval(
        "SELECT status FROM workflow_instances WHERE id = $1 AND project_id = $2 FOR UPDATE",
        instance.id, instance.project_id,
    )
    if status == "canceled":
        instance.status = "canceled"
        raise InstanceCanceled(instance.id)


async def cancel_open_steps(conn: Conn, project_id: str, instance_id: str) -> None:
    """A canceled instance's unfinished step rows end ``canceled``."""
    await conn.execute(
        """UPDATE workflow_steps SET status = 'canceled', finished_at = now()
            WHERE instance_id = $1 AND project_id = $2 AND status IN ('running', 'waiting')""",
        instance_id, project_id,
    )


async def cancel_instance(conn: asyncpg.Connection, project_id: str, instance_id: str) -> bool:
    """Cancel an instance that has not finished; False when it had (or does not exist). In
    one transaction: the instance ends ``canceled``, its open waiter is resolved (an event
    wakes nothing), the step it was on ends ``canceled``, and a digest window it owns is
    closed, so later triggers open a new one. A runner holding it stops at its next write
    (set_state); its timer, when it fires, finds it finished."""
    async with conn.transaction():
        canceled = await conn.fetchval(
            """UPDATE workflow_instances SET status = 'canceled', wake_at = NULL,
                      updated_at = now()
                WHERE id = $1 AND project_id = $2 AND NOT (status = ANY($3::text[]))
            RETURNING true""",
            instance_id, project_id, list(TERMINAL_STATUSES),
        )
        if not canceled:
            return False
        await conn.execute(
            """UPDATE workflow_waiters SET resolved_at = now(), resolved_by = 'canceled'
                WHERE instance_id = $1 AND project_id = $2 AND resolved_at IS NULL""",
            instance_id, project_id,
        )
        await cancel_open_steps(conn, project_id, instance_id)
        await conn.execute(
            """UPDATE workflow_digests SET closed_at = now()
                WHERE project_id = $2 AND owner_instance_id = $1 AND closed_at IS NULL""",
            instance_id, project_id,
        )
    return True


async def fail_dead_lettered(conn: Conn, instance_id: str, error: str, now: datetime) -> bool:
    """Mark an instance that has not finished ``failed`` because an entry of it was
    dead-lettered, keeping ``error`` and the status it had (for a DLQ replay); False when it
    had finished (or is unknown)."""
    # Its open digest windows close with it (one statement: the pool may be the caller's
    # connection), as a cancel closes them: the user's later triggers would otherwise join a
    # window whose owner sends nothing until someone replays the dead letter, perhaps never.
    # A replay sends what the closed window holds (Runner._digest).
    done = await conn.fetchval(
        """WITH failed AS (
               UPDATE workflow_instances
                  SET dead_letter = jsonb_build_object('error', $2::text, 'status', status),
                      status = 'failed', updated_at = $3
                WHERE id = $1 AND NOT (status = ANY($4::text[]))
            RETURNING id, project_id),
           closed AS (
               UPDATE workflow_digests d SET closed_at = $3
                 FROM failed
                WHERE d.project_id = failed.project_id AND d.owner_instance_id = failed.id
                  AND d.closed_at IS NULL)
           SELECT EXISTS (SELECT 1 FROM failed)""",
        instance_id, error, now, list(TERMINAL_STATUSES),
    )
    return bool(done)


async def reopen_dead_lettered(conn: Conn, instance_id: str, now: datetime) -> bool:
    """Put an instance failed by a dead-lettered entry back in the status it had, as the
    entry is replayed; False when it was not failed that way."""
    done = await conn.fetchval(
        """UPDATE workflow_instances
              SET status = dead_letter->>'status', dead_letter = NULL, updated_at = $2
            WHERE id = $1 AND status = 'failed' AND dead_letter IS NOT NULL RETURNING true""",
        instance_id, now,
    )
    return bool(done)


async def sleeping_instances(
    conn: Conn, limit: int, after: tuple[datetime, str] | None = None,
) -> list[tuple[str, str, datetime]]:
    """(instance id, cursor, wake_at) of up to ``limit`` waiting instances, ordered by
    (wake_at, id) and starting after ``after``: pages through them to rebuild the timer set."""
    if after is None:
        rows = await conn.fetch(
            """SELECT id::text, cursor, wake_at FROM workflow_instances
                WHERE wake_at IS NOT NULL AND status = 'waiting'
                ORDER BY wake_at, id LIMIT $1""",
            limit,
        )
    else:
        rows = await conn.fetch(
            """SELECT id::text, cursor, wake_at FROM workflow_instances
                WHERE wake_at IS NOT NULL AND status = 'waiting'
                  AND (wake_at, id) > ($2, $3::uuid)
                ORDER BY wake_at, id LIMIT $1""",
            limit, after[0], after[1],
        )
    return [(r[0], r[1] or "", r[2]) for r in rows]


# -- step rows --------------------------------------------------------------------------------


async def step_rows(conn: Conn, instance: Instance) -> dict[str, StepRow]:
    rows = await conn.fetch(
        """SELECT step_index, path, type, status, output, started_at, finished_at
             FROM workflow_steps WHERE instance_id = $1 AND project_id = $2
            ORDER BY step_index""",
        instance.id, instance.project_id,
    )
    return {r["path"]: StepRow(*r.values()) for r in rows}


async def start_step(
    conn: Conn, instance: Instance, path: str, step_type: str, now: datetime
) -> StepRow:
    """The step's row, created as ``running`` with the next execution index if new."""
    row = await conn.fetchrow(
        """WITH ins AS (
               INSERT INTO workflow_steps
                   (instance_id, step_index, path, project_id, type, status, started_at)
               SELECT $1, COALESCE(MAX(step_index) + 1, 0), $3, $2, $4, 'running', $5
                 FROM workflow_steps WHERE instance_id = $1
               ON CONFLICT (instance_id, path) DO NOTHING
               RETURNING step_index, path, type, status, output, started_at, finished_at)
           SELECT * FROM ins
           UNION ALL
           SELECT step_index, path, type, status, output, started_at, finished_at
             FROM workflow_steps WHERE instance_id = $1 AND path = $3""",
        instance.id, instance.project_id, path, step_type, now,
    )
    assert row is not None
    return StepRow(*row.values())


async def update_step(
    conn: Conn, instance: Instance, row: StepRow, *, status: str, output: Any,
    finished_at: datetime | None,
) -> None:
    await conn.execute(
        """UPDATE workflow_steps SET status = $4, output = $5, finished_at = $6
            WHERE instance_id = $1 AND project_id = $2 AND path = $3""",
        instance.id, instance.project_id, row.path, status, output, finished_at,
    )
    row.status, row.output, row.finished_at = status, output, finished_at


# -- waiters ----------------------------------------------------------------------------------


async def open_waiter(
    conn: Conn, instance: Instance, row: StepRow, event_name: str, expires_at: datetime,
    now: datetime,
) -> Waiter:
    await conn.execute(
        """INSERT INTO workflow_waiters
               (project_id, instance_id, user_id, event_name, step_index, path, expires_at,
                created_at)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
           ON CONFLICT (instance_id, step_index) DO NOTHING""",
        instance.project_id, instance.id, instance.user_id, event_name, row.index, row.path,
        expires_at, now,
    )
    waiter = await get_waiter(conn, instance, row)
    assert waiter is not None
    return waiter


async def get_waiter(conn: Conn, instance: Instance, row: StepRow) -> Waiter | None:
    found = await conn.fetchrow(
        """SELECT id::text, step_index, expires_at, resolved_at, resolved_by, event
             FROM workflow_waiters
            WHERE instance_id = $1 AND project_id = $2 AND step_index = $3""",
        instance.id, instance.project_id, row.index,
    )
    return Waiter(*found.values()) if found is not None else None


# An event that happened before a wait began does not count for it, even when it is read
# after (a backlog of events). The margin is for times stamped by other clocks: providers'
# receipts (SendGrid's in whole seconds) and other hosts.
EVENT_BEFORE_WAIT_GRACE_S = 1.0


async def resolve_waiters(
    conn: Conn, *, project_id: str, user_id: str, event_name: str, event: dict[str, Any],
    resolved_by: str, now: datetime, occurred_at: datetime | None = None,
) -> list[str]:
    """Resolve the user's open waiters for ``event_name`` that were open when the event
    happened (``occurred_at``, else ``now``): begun by then (give or take
    EVENT_BEFORE_WAIT_GRACE_S) and not yet expired; returns their instance ids. An event seen before
    (``resolved_by`` already on some waiter: a retried entry or a repeated forward) resolves
    nothing new and returns the instances it resolved then."""
    rows = await conn.fetch(
        """WITH earlier AS (
               SELECT instance_id FROM workflow_waiters
                WHERE project_id = $1 AND resolved_by = $5),
           fresh AS (
               UPDATE workflow_waiters SET resolved_at = $4, resolved_by = $5, event = $6
                WHERE project_id = $1 AND user_id = $2 AND event_name = $3
                  AND resolved_at IS NULL AND expires_at > $7
                  AND created_at <= $7 + make_interval(secs => $8)
                  AND NOT EXISTS (SELECT 1 FROM earlier)
            RETURNING instance_id)
           SELECT instance_id::text FROM earlier
           UNION SELECT instance_id::text FROM fresh""",
        project_id, user_id, event_name, now, resolved_by, event, occurred_at or now,
        EVENT_BEFORE_WAIT_GRACE_S,
    )
    return sorted({r[0] for r in rows})


async def resolve_timeout(conn: Conn, waiter: Waiter, now: datetime) -> bool:
    """Time the waiter out unless an event won first; True when the timeout won."""
    won = await conn.fetchval(
        """UPDATE workflow_waiters SET resolved_at = $2, resolved_by = 'timeout'
            WHERE id = $1 AND resolved_at IS NULL RETURNING true""",
        waiter.id, now,
    )
    return bool(won)


# -- digest windows ---------------------------------------------------------------------------

# The time limit of the queries that read or write a window's items, in place of the pool's
# (QUERY_TIMEOUT_S): a window holds every trigger of its user in it, each join rewrites and
# returns the whole array, and joiners queue on the window's row, so a busy user's join can
# rightly take longer than a stall is allowed to, and cut at 10 s it failed until
# dead-lettered.
DIGEST_QUERY_TIMEOUT_S = 120.0


async def allow_window_lock_waits(conn: asyncpg.Connection) -> None:
    """In a transaction, let a wait for a window's row last as long as its queries may: the
    pool's connections give up a lock wait well before (notifkit.db.pool.LOCK_WAIT_SHARE of
    its 10 s), and a busy user's joiners rightly queue on the row for longer."""
    await allow_lock_wait(conn, DIGEST_QUERY_TIMEOUT_S)


async def join_digest(
    conn: Conn, instance: Instance, path: str, step_index: int, item: dict[str, Any],
    window_ends_at: datetime, now: datetime,
) -> DigestWindow:
    """Open the user's window for this step, or add ``item`` to the open one (once per
    instance: a retried join finds its item already there, known by its ``instanceId`` so
    that an item stored with fewer fields, before a field was added, still counts)."""
    row = await conn.fetchrow(
        """INSERT INTO workflow_digests
               (project_id, workflow_id, user_id, step_index, step_path, owner_instance_id,
                items, window_ends_at, created_at)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
           ON CONFLICT (project_id, workflow_id, user_id, step_path) WHERE closed_at IS NULL
           DO UPDATE SET items = CASE WHEN workflow_digests.items
                                           @> jsonb_build_array(jsonb_build_object(
                                                  'instanceId', $6::text))
                                      THEN workflow_digests.items
                                      ELSE workflow_digests.items || EXCLUDED.items END
        RETURNING id::text, owner_instance_id::text, window_ends_at, items, closed_at""",
        instance.project_id, instance.workflow_id, instance.user_id, step_index, path,
        instance.id, [item], window_ends_at, now, timeout=DIGEST_QUERY_TIMEOUT_S,
    )
    assert row is not None
    return DigestWindow(*row.values())


# The latest window an instance opened at a step (index workflow_digests_owner_idx).
OWNED_WINDOW_SQL = """SELECT id::text, owner_instance_id::text, window_ends_at, items, closed_at
     FROM workflow_digests
    WHERE project_id = $1 AND owner_instance_id = $2 AND step_path = $3
    ORDER BY created_at DESC LIMIT 1"""


async def owned_window(conn: Conn, instance: Instance, path: str) -> DigestWindow | None:
    row = await conn.fetchrow(OWNED_WINDOW_SQL, instance.project_id, instance.id, path,
                              timeout=DIGEST_QUERY_TIMEOUT_S)
    return DigestWindow(*row.values()) if row is not None else None


# -- users and the send's notification row ------------------------------------------------------


async def get_user(conn: Conn, project_id: str, user_id: str) -> dict[str, Any]:
    """What templates and branch expressions see as ``user`` (a bare id if unknown)."""
    row = await conn.fetchrow(
        "SELECT attributes, timezone, locale FROM users WHERE project_id = $1 AND id = $2",
        project_id, user_id,
    )
    if row is None:
        return {"id": user_id, "attributes": {}, "timezone": None, "locale": None}
    return {"id": user_id, "attributes": row[0] or {}, "timezone": row[1], "locale": row[2]}


async def template_exists(conn: Conn, project_id: str, template_id: str) -> bool:
    """Whether a send or digest step's template is still there (it may be deleted after the
    workflow naming it was saved)."""
    return bool(await conn.fetchval(
        "SELECT true FROM templates WHERE project_id = $1 AND id = $2", project_id, template_id,
    ))


async def record_notification(
    conn: Conn, *, event_id: str, project_id: str, template: str, priority: str,
    user_id: str, data: dict[str, Any], channels: list[str] | None, idempotency_key: str,
    now: datetime,
) -> None:
    """The notifications row and ``accepted`` timeline row of a workflow's send, so
    ``GET /v1/notifications/{id}`` knows it like a send made through the API."""
    await conn.execute(
        """INSERT INTO notifications
               (id, project_id, template_id, priority, status, recipients_spec, data, channels,
                idempotency_key, created_at, updated_at)
           VALUES ($1, $2, $3, $4, 'accepted', $5, $6, $7, $8, $9, $9)
           ON CONFLICT (id) DO NOTHING""",
        event_id, project_id, template, priority, user_id, data, channels, idempotency_key, now,
    )
    await conn.execute(
        """INSERT INTO message_logs
               (project_id, event_id, task_id, user_id, channel, attempt, kind, status, detail,
                created_at)
           VALUES ($1, $2, $3, $4, '', 0, 'accepted', 'accepted', $5, $6)
           ON CONFLICT (task_id, channel, attempt, kind) DO NOTHING""",
        project_id, event_id, event_id, user_id, "sent by a workflow step", now,
    )
