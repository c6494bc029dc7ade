"""message_logs rows as the stages write them: once per (task, channel, attempt, kind), except
a wait decided again within one attempt, whose row says the latest decision."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from notifkit.codec import loads
from notifkit.db.logs import Kind, LogRow, Status, insert_logs
from notifkit.ids import uuid7

PROJECT = "00000000-0000-7000-8000-000000000001"


def _row(event_id: str, kind: Kind, detail: str, **fields: Any) -> LogRow:
    return LogRow(project_id=PROJECT, event_id=event_id, task_id=f"task-{event_id}",
                  user_id="u1", channel="sms", kind=kind, status=Status.SCHEDULED,
                  attempt=1, detail=detail, **fields)


async def _rows(db: asyncpg.Pool, event_id: str) -> list[tuple[str, str, dict[str, Any]]]:
    found = await db.fetch("SELECT kind, detail, metadata::text AS metadata FROM message_logs "
                           "WHERE event_id = $1 ORDER BY id", event_id)
    return [(r["kind"], r["detail"], loads(r["metadata"])) for r in found]


async def test_a_wait_decided_again_updates_its_row_to_the_latest_and_counts_them(
    db: asyncpg.Pool,
) -> None:
    event_id = uuid7()
    await insert_logs(db, [_row(event_id, Kind.RATE_LIMITED, "parked for 4.0 s",
                                metadata={"retryAfterSeconds": 4.0})])
    first_at = await db.fetchval("SELECT created_at FROM message_logs WHERE event_id = $1",
                                 event_id)
    await insert_logs(db, [_row(event_id, Kind.RATE_LIMITED, "parked for 3.9 s",
                                metadata={"retryAfterSeconds": 3.9})])
    await insert_logs(db, [_row(event_id, Kind.RATE_LIMITED, "parked for 2.5 s",
                                metadata={"retryAfterSeconds": 2.5})])
    assert await _rows(db, event_id) == [
        ("rate_limited", "parked for 2.5 s", {"retryAfterSeconds": 2.5, "repeats": 3})]
    # The row keeps its place in time: a walk over the log by time meets it once.
    assert await db.fetchval("SELECT created_at FROM message_logs WHERE event_id = $1",
                             event_id) == first_at


async def test_the_same_row_written_again_changes_nothing(db: asyncpg.Pool) -> None:
    # A stage that runs its entry again (a reclaim after a crash) writes the same row.
    event_id = uuid7()
    row = _row(event_id, Kind.DEFERRED, "deferred until 2030-01-01T07:00:00.000Z",
               metadata={"until": "2030-01-01T07:00:00.000Z"})
    for _ in range(3):
        await insert_logs(db, [row])
    assert await _rows(db, event_id) == [
        ("deferred", "deferred until 2030-01-01T07:00:00.000Z",
         {"until": "2030-01-01T07:00:00.000Z"})]


async def test_any_other_kinds_first_row_stands(db: asyncpg.Pool) -> None:
    event_id = uuid7()
    await insert_logs(db, [_row(event_id, Kind.FAILED, "HTTP 503")])
    await insert_logs(db, [_row(event_id, Kind.FAILED, "HTTP 500")])
    assert await _rows(db, event_id) == [("failed", "HTTP 503", {})]


async def test_one_batch_holding_a_key_twice_is_written_whole(db: asyncpg.Pool) -> None:
    """An ON CONFLICT that may update refuses a statement that meets one key twice; the batch
    keeps a key's first row, or a wait's last, and the rest of it is written."""
    event_id = uuid7()
    await insert_logs(db, [
        _row(event_id, Kind.FAILED, "first failure"),
        _row(event_id, Kind.RATE_LIMITED, "parked for 4.0 s"),
        _row(event_id, Kind.FAILED, "second failure"),
        _row(event_id, Kind.RATE_LIMITED, "parked for 1.0 s"),
        _row(event_id, Kind.QUEUED, "queued"),
    ])
    # (In any order: the waits go by a statement of their own within the one statement.)
    assert sorted(await _rows(db, event_id)) == [("failed", "first failure", {}),
                                                 ("queued", "queued", {}),
                                                 ("rate_limited", "parked for 1.0 s", {})]


async def test_a_wait_of_another_reason_does_not_overwrite_the_row(db: asyncpg.Pool) -> None:
    # A park on notifkit's own rate meeting the row of the provider's 429 at the same attempt.
    event_id = uuid7()
    await insert_logs(db, [_row(event_id, Kind.GENERATION_DEFERRED, "HTTP 429; parked for 6 s",
                                metadata={"reason": "rateLimited"})])
    await insert_logs(db, [_row(event_id, Kind.GENERATION_DEFERRED, "own rate; parked for 1 s",
                                metadata={"reason": "ownRate"})])
    assert await _rows(db, event_id) == [
        ("generation_deferred", "HTTP 429; parked for 6 s", {"reason": "rateLimited"})]


async def test_rows_already_there_take_no_lock_so_crossed_batches_cannot_deadlock(
    db: asyncpg.Pool,
) -> None:
    """Two transactions writing rows that exist already, in opposite orders (a reclaimed
    batch beside its slow first run, say): DO NOTHING locks nothing, so neither waits."""
    first, second = uuid7(), uuid7()
    a = _row(first, Kind.FAILED, "a")
    b = _row(second, Kind.SENT, "b")
    await insert_logs(db, [a, b])
    async with db.acquire() as one, db.acquire() as two, one.transaction(), two.transaction():
        await insert_logs(one, [a])
        await insert_logs(two, [b])
        await asyncio.wait_for(asyncio.gather(insert_logs(one, [b]), insert_logs(two, [a])),
                               timeout=10)
    assert len(await _rows(db, first)) == 1
    assert len(await _rows(db, second)) == 1
