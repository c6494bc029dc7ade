"""The scheduler: durable before visible, due tasks leave once, one poller, rebuild from
PostgreSQL. Every test drives time with an injected clock and drains with run_until_idle."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from typing import Any, cast

import asyncpg
import pytest
from redis.asyncio import Redis

from notifkit.clock import to_ms
from notifkit.config import Settings
from notifkit.db import scheduled as scheduled_db
from notifkit.keys import Keys, shard_of
from notifkit.services import scheduler as scheduler_module
from notifkit.streams import xadd

from .helpers import T0_MS, FakeClock, Schedule, SchedulerFactory, Sent, wipe_scheduler_state


async def pending_rows(db: asyncpg.Pool) -> dict[str, int]:
    rows = await db.fetch("SELECT task_id, due_at FROM scheduled_payloads")
    return {r["task_id"]: to_ms(r["due_at"]) for r in rows}


async def test_tasks_wait_for_their_due_time_and_leave_exactly_once(
    make_scheduler: SchedulerFactory, schedule: Schedule, outbound: Sent, clock: FakeClock,
    db: asyncpg.Pool, redis: Redis, keys: Keys,
) -> None:
    # Given tasks due over the next minute, on different priorities
    scheduler = make_scheduler()
    tasks = [
        await schedule(T0_MS + 10_000 * (i + 1), priority=("critical", "normal", "low")[i % 3])
        for i in range(6)
    ]
    # When the scheduler ingests them at T0
    await scheduler.run_until_idle()
    # Then each is durable in PostgreSQL and waits in its shard; nothing left yet
    assert await pending_rows(db) == {t["taskId"]: t["dueAt"] for t in tasks}
    for task in tasks:
        score = await redis.zscore(keys.scheduled_zset(task["taskId"]), task["taskId"])
        assert score == task["dueAt"]
    assert await outbound() == []

    # When time reaches the third due time
    clock.now_ms = T0_MS + 30_000
    assert await scheduler.run_until_idle() == 3
    # Then exactly the three due tasks left, each on its own priority stream, payload intact
    sent = await outbound()
    assert sorted(p["taskId"] for p in sent) == sorted(t["taskId"] for t in tasks[:3])
    for task in tasks[:3]:
        found: list[dict[str, Any] | None] = [*await outbound(task["payload"]["priority"])]
        [payload] = found or [None]
        assert payload == task["payload"]
    # And their rows are gone; the others wait on
    assert set(await pending_rows(db)) == {t["taskId"] for t in tasks[3:]}

    # When polling again at the same time nothing moves; later the rest move, once each
    assert await scheduler.run_until_idle() == 0
    clock.now_ms = T0_MS + 10**9
    await scheduler.run_until_idle()
    assert Counter(p["taskId"] for p in await outbound()) == {t["taskId"]: 1 for t in tasks}
    assert await pending_rows(db) == {}
    for shard in "0123456789abcdef":
        assert await redis.exists(keys.scheduled_shard(shard), keys.scheduled_payloads(shard),
                                  keys.scheduled_moved(shard)) == 0


async def test_the_record_of_a_scheduled_task_names_its_notification(
    make_scheduler: SchedulerFactory, schedule: Schedule, caplog: pytest.LogCaptureFixture,
) -> None:
    # It named the task and project only: the notification's other records could not be
    # joined to it by event_id.
    scheduler = make_scheduler()
    task = await schedule(T0_MS + 10_000, eventId=str(uuid.uuid4()))
    caplog.set_level(logging.DEBUG, logger="notifkit.scheduler")
    await scheduler.run_until_idle()
    [record] = [r for r in caplog.records if r.getMessage().startswith("Scheduled a task")]
    fields = vars(record)
    assert fields["task_id"] == task["taskId"]
    assert fields["event_id"] == task["payload"]["eventId"]
    assert fields["project_id"] == task["payload"]["projectId"]


async def test_a_task_is_durable_before_it_is_visible(
    make_scheduler: SchedulerFactory, schedule: Schedule, redis: Redis, keys: Keys,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given PostgreSQL refusing writes
    async def refuse(*_args: object, **_kw: object) -> set[str]:
        raise asyncpg.exceptions.CannotConnectNowError("the database is starting up")

    monkeypatch.setattr(scheduled_db, "upsert", refuse)
    scheduler = make_scheduler()
    task = await schedule(T0_MS)
    # When the scheduler reads the task
    await scheduler.ingest_until_idle(reclaim=False)
    # Then the task is not in Redis either, and its entry stays pending for a retry
    assert await redis.zscore(keys.scheduled_zset(task["taskId"]), task["taskId"]) is None
    summary = await redis.xpending(keys.scheduled, keys.group("scheduler"))
    assert summary["pending"] == 1


async def test_malformed_tasks_and_deleted_projects_are_acked_and_dropped(
    make_scheduler: SchedulerFactory, schedule: Schedule, redis: Redis, keys: Keys,
    outbound: Sent, clock: FakeClock, project_id: str, caplog: pytest.LogCaptureFixture,
) -> None:
    scheduler = make_scheduler()
    await xadd(redis, keys.scheduled, {"taskId": "t-1", "dueAt": "soon"}, maxlen=1000)
    await schedule(T0_MS, stream=keys.dlq)  # not a stream tasks return to
    # (named in the test's namespace: a scheduler that did move it leaves nothing behind)
    elsewhere = keys.outbound("normal").replace(":outbound:", ":elsewhere:")
    bad_stream = {"taskId": "t-2", "projectId": project_id, "dueAt": T0_MS, "stream": elsewhere,
                  "payload": {}}
    await xadd(redis, keys.scheduled, bad_stream, maxlen=1000)
    await schedule(T0_MS, project=str(uuid.uuid4()))  # no such project
    await schedule(T0_MS, project="not-a-uuid")
    await scheduler.run_until_idle()
    assert await outbound() == []
    # (a task for a stream tasks do not return to is never scheduled, so never moved there)
    assert await redis.xlen(keys.dlq) == 0
    assert await redis.exists(elsewhere) == 0
    summary = await redis.xpending(keys.scheduled, keys.group("scheduler"))
    assert summary["pending"] == 0
    # Each one acked unread is reported with its stream and entry
    reports = [r for r in caplog.records if r.getMessage().startswith("Acked a scheduled")]
    assert reports
    assert all(getattr(r, "stream", None) == keys.scheduled and getattr(r, "entry_id", None)
               for r in reports)


@pytest.mark.parametrize("due_ms", [10**16, -(10**15)])
async def test_a_due_time_no_calendar_holds_is_acked_alone_and_its_batch_goes_on(
    due_ms: int, make_scheduler: SchedulerFactory, schedule: Schedule, outbound: Sent,
    clock: FakeClock, redis: Redis, keys: Keys,
) -> None:
    """A dueAt past year 9999 (or before year 1) failed the batch's conversion to a time:
    the tasks read with it were retried with it and dead-lettered, though they were fine."""
    scheduler = make_scheduler()
    await schedule(T0_MS)
    await schedule(due_ms)
    await schedule(T0_MS)
    await scheduler.run_until_idle()
    assert len(await outbound()) == 2
    assert (await redis.xpending(keys.scheduled, keys.group("scheduler")))["pending"] == 0
    assert await redis.xlen(keys.dlq) == 0


async def test_scheduling_a_task_again_replaces_it(
    make_scheduler: SchedulerFactory, schedule: Schedule, outbound: Sent, clock: FakeClock,
    db: asyncpg.Pool,
) -> None:
    # Given a task scheduled, then scheduled again for later (a second 429, say)
    scheduler = make_scheduler()
    first = await schedule(T0_MS + 1_000, task_id="task-0001")
    await scheduler.run_until_idle()
    second = await schedule(T0_MS + 5_000, task_id="task-0001", note="second")
    await scheduler.run_until_idle()
    # Then only the second schedule counts
    clock.now_ms = T0_MS + 2_000
    assert await scheduler.run_until_idle() == 0
    clock.now_ms = T0_MS + 5_000
    assert await scheduler.run_until_idle() == 1
    assert [p.get("note") for p in await outbound()] == ["second"]
    assert first["taskId"] == second["taskId"]
    assert await pending_rows(db) == {}


async def test_a_task_parked_again_after_it_moved_keeps_its_new_row(
    make_scheduler: SchedulerFactory, schedule: Schedule, outbound: Sent, clock: FakeClock,
    db: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The moved row is deleted by (task, due time): a delivery that parks the same task again
    before the poller has cleaned up must not lose the new schedule."""
    scheduler = make_scheduler()
    forget = scheduler.forget_moved

    async def later() -> int:
        return 0

    # Given a task moved but whose row the poller has not deleted yet
    monkeypatch.setattr(scheduler, "forget_moved", later)
    await schedule(T0_MS, task_id="task-000a")
    assert await scheduler.run_until_idle() == 2  # ingested, moved
    # When it is parked again (a 429) and only then the cleanup runs
    await schedule(T0_MS + 30_000, task_id="task-000a", reason="rateLimited")
    await scheduler.ingest_until_idle()
    await forget()
    # Then the new row survives and the task leaves again at its new time
    assert await pending_rows(db) == {"task-000a": T0_MS + 30_000}
    monkeypatch.setattr(scheduler, "forget_moved", forget)
    clock.now_ms = T0_MS + 30_000
    assert await scheduler.run_until_idle() == 1
    assert len(await outbound()) == 2
    assert await pending_rows(db) == {}


async def test_an_older_copy_of_a_task_read_again_leaves_its_later_schedule_alone(
    make_scheduler: SchedulerFactory, schedule: Schedule, outbound: Sent, clock: FakeClock,
    db: asyncpg.Pool,
) -> None:
    """A scheduler that dies before acking an entry has it read again a reclaim later, by
    which time the task may have moved, met a 429 and been parked for the provider's
    Retry-After: the old copy's earlier due time must not send it before then."""
    scheduler = make_scheduler()
    # Given a task parked until T0+30 s (the provider's Retry-After)
    await schedule(T0_MS + 30_000, task_id="task-000b", note="parked")
    await scheduler.ingest_until_idle()
    # When an older copy of it, due at T0+1 s, is read again
    await schedule(T0_MS + 1_000, task_id="task-000b", note="stale")
    await scheduler.ingest_until_idle()
    # Then the task still waits for T0+30 s, as the parked copy says
    assert await pending_rows(db) == {"task-000b": T0_MS + 30_000}
    clock.now_ms = T0_MS + 29_000
    assert await scheduler.run_until_idle() == 0
    assert await outbound() == []
    clock.now_ms = T0_MS + 30_000
    assert await scheduler.run_until_idle() == 1
    assert [p.get("note") for p in await outbound()] == ["parked"]


async def test_one_poll_forgets_every_task_it_moved_however_many_share_a_shard(
    make_scheduler: SchedulerFactory, schedule: Schedule, outbound: Sent, clock: FakeClock,
    db: asyncpg.Pool,
) -> None:
    """A poll moves every due task, page after page; it must delete every moved row too, not
    one page per shard (random task ids put more than a page in one shard now and then)."""
    # Given three pages' worth of due tasks, all in shard "a"
    scheduler = make_scheduler(batch_size=7)
    tasks = [await schedule(T0_MS + i, task_id=f"task-{i:03d}a") for i in range(20)]
    await scheduler.ingest_until_idle()
    # When one poll runs after they are all due
    clock.now_ms = T0_MS + 1_000
    assert await scheduler.poll_once() == 20
    # Then every one left once and no row of them is left behind
    assert Counter(p["taskId"] for p in await outbound()) == {t["taskId"]: 1 for t in tasks}
    assert await pending_rows(db) == {}


async def test_only_the_lock_holder_polls(
    make_scheduler: SchedulerFactory, schedule: Schedule, outbound: Sent, clock: FakeClock,
    redis: Redis, keys: Keys,
) -> None:
    a, b = make_scheduler("a"), make_scheduler("b")
    for i in range(20):
        await schedule(T0_MS + 1 + i)
    # Given scheduler a polling first: it holds the lock
    await a.run_until_idle()
    assert a.holds_lock
    assert cast(bytes, await redis.get(keys.scheduler_lock)).decode() == a.token
    clock.now_ms = T0_MS + 100
    # When b polls, it moves nothing, however many tasks are due
    assert await b.run_until_idle() == 0
    assert not b.holds_lock
    assert await outbound() == []
    # And a moves them all
    assert await a.run_until_idle() == 20
    # When a stops, it releases the lock and b takes over at its next poll
    await a.stop()
    assert await redis.exists(keys.scheduler_lock) == 0
    await schedule(T0_MS + 50)
    assert await b.run_until_idle() == 2  # one ingested + one moved
    assert b.holds_lock
    assert len(await outbound()) == 21


async def test_a_poller_that_lost_its_lock_moves_nothing(
    make_scheduler: SchedulerFactory, schedule: Schedule, outbound: Sent, clock: FakeClock,
    redis: Redis, keys: Keys,
) -> None:
    a, b = make_scheduler("a"), make_scheduler("b")
    await schedule(T0_MS)
    await a.run_until_idle()  # takes the lock and moves the task
    stale = a.token
    assert stale is not None
    # Given a's lock expired while a was paused, and b took it
    await redis.delete(keys.scheduler_lock)
    assert await b.acquire_lock()
    await schedule(T0_MS)
    await b.ingest_until_idle()
    # When a, still believing it polls, runs the move with its old token
    assert await a.move_due(T0_MS) == []
    # Then it moved nothing and knows it lost the lock; renewal never steals it back
    assert not a.holds_lock
    assert not await a.acquire_lock()
    assert len(await outbound()) == 1
    assert len(await b.move_due(T0_MS)) == 1


async def test_the_lock_is_held_with_the_configured_ttl(
    make_scheduler: SchedulerFactory, settings: object, redis: Redis, keys: Keys,
) -> None:
    scheduler = make_scheduler()
    assert await scheduler.acquire_lock()
    ttl_ms = await redis.pttl(keys.scheduler_lock)
    assert 0 < ttl_ms <= 30_000
    await redis.pexpire(keys.scheduler_lock, 50)
    assert await scheduler.acquire_lock()  # renewal restores the full TTL
    assert await redis.pttl(keys.scheduler_lock) > 50
    await scheduler.release_lock()
    assert await redis.exists(keys.scheduler_lock) == 0


async def test_shards_lost_with_redis_are_rebuilt_from_postgres(
    make_scheduler: SchedulerFactory, schedule: Schedule, outbound: Sent, clock: FakeClock,
    redis: Redis, keys: Keys, db: asyncpg.Pool,
) -> None:
    # Given 40 tasks waiting, 10 of them already sent
    scheduler = make_scheduler(batch_size=7)  # small pages and move batches
    tasks = [await schedule(T0_MS + 1_000 * (i + 1)) for i in range(40)]
    await scheduler.run_until_idle()
    clock.now_ms = T0_MS + 10_000
    assert await scheduler.run_until_idle() == 10
    # When Redis loses every scheduler key (a restart without persistence)
    await wipe_scheduler_state(redis, keys)
    # Then the next poll rebuilds the shards from PostgreSQL and the rest leave once each
    clock.now_ms = T0_MS + 10**9
    await scheduler.run_until_idle()
    assert await redis.exists(keys.scheduled_ready) == 1
    assert Counter(p["taskId"] for p in await outbound()) == {t["taskId"]: 1 for t in tasks}
    assert await pending_rows(db) == {}


async def test_a_long_rebuild_reports_its_progress(
    make_scheduler: SchedulerFactory, schedule: Schedule, redis: Redis, keys: Keys,
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A rebuild of millions of waiting tasks (Redis lost its data) holds every sendAt back
    # until it ends, and said nothing between its first record and its last.
    monkeypatch.setattr(scheduler_module, "REBUILD_PROGRESS_S", 0.0)  # every page reports
    scheduler = make_scheduler(batch_size=7)
    for i in range(20):
        await schedule(T0_MS + 1_000 * (i + 1))
    await scheduler.run_until_idle()
    await wipe_scheduler_state(redis, keys)
    caplog.set_level(logging.INFO, logger="notifkit.scheduler")
    # Only this rebuild's records: a scheduler another test left running on the same loop
    # logs through the same logger.
    mine = TaskRecords()
    logging.getLogger("notifkit.scheduler").addHandler(mine)
    try:
        assert await scheduler.rebuild() == 20
    finally:
        logging.getLogger("notifkit.scheduler").removeHandler(mine)
    progress = [m for m in mine.messages if m.startswith("Rebuilding the scheduler's shards")]
    assert progress == [
        "Rebuilding the scheduler's shards: 7 waiting tasks read from PostgreSQL so far, "
        "7 re-added.",
        "Rebuilding the scheduler's shards: 14 waiting tasks read from PostgreSQL so far, "
        "14 re-added.",
        "Rebuilding the scheduler's shards: 20 waiting tasks read from PostgreSQL so far, "
        "20 re-added.",
    ]


async def test_a_rebuild_skips_tasks_already_moved(
    make_scheduler: SchedulerFactory, schedule: Schedule, outbound: Sent, clock: FakeClock,
    redis: Redis, keys: Keys, db: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A task moved whose row is not yet deleted (the poller died in between) is in its
    shard's moved set; a rebuild must not send it again."""
    scheduler = make_scheduler()
    tasks = [await schedule(T0_MS + 1_000 * (i + 1)) for i in range(10)]
    await scheduler.run_until_idle()

    async def never() -> int:
        return 0

    monkeypatch.setattr(scheduler, "forget_moved", never)
    clock.now_ms = T0_MS + 5_000
    assert await scheduler.run_until_idle() == 5
    assert len(await pending_rows(db)) == 10  # rows of moved tasks still there
    # When the shards and the marker are lost but the moved sets survive
    await wipe_scheduler_state(redis, keys, keep_moved=True)
    monkeypatch.undo()
    clock.now_ms = T0_MS + 10**9
    await scheduler.run_until_idle()
    assert Counter(p["taskId"] for p in await outbound()) == {t["taskId"]: 1 for t in tasks}
    assert await pending_rows(db) == {}


async def test_a_shard_entry_whose_payload_vanished_is_restored_from_postgres(
    make_scheduler: SchedulerFactory, schedule: Schedule, outbound: Sent, clock: FakeClock,
    redis: Redis, keys: Keys,
) -> None:
    scheduler = make_scheduler()
    task = await schedule(T0_MS)
    await scheduler.ingest_until_idle()  # ingested, not polled yet
    # Given the payload hash lost (evicted, or deleted by hand) while the zset kept the task
    await redis.delete(keys.scheduled_payloads(shard_of(task["taskId"])))
    # When it is due, the poll restores it from PostgreSQL and the next one sends it
    await scheduler.run_until_idle()
    await scheduler.run_until_idle()
    assert [p["taskId"] for p in await outbound()] == [task["taskId"]]


async def test_a_parked_task_waits_for_the_retry_after(
    make_scheduler: SchedulerFactory, schedule: Schedule, outbound: Sent, clock: FakeClock,
) -> None:
    """The scheduler's half of 429 parking: delivery parks a task until the provider's
    Retry-After; it must not come back a millisecond early, and must come back."""
    scheduler = make_scheduler()
    retry_after_ms = 30_000
    parked = await schedule(T0_MS + retry_after_ms, reason="rateLimited", parkCount=1)
    await scheduler.run_until_idle()
    for step_ms in (1, 10_000, 29_999):
        clock.now_ms = T0_MS + step_ms
        await scheduler.run_until_idle()
        assert await outbound() == []
    clock.now_ms = T0_MS + retry_after_ms
    await scheduler.run_until_idle()
    assert await outbound() == [parked["payload"]]


async def test_many_due_tasks_move_in_bounded_batches(
    make_scheduler: SchedulerFactory, schedule: Schedule, outbound: Sent, clock: FakeClock,
    redis: Redis, keys: Keys,
) -> None:
    scheduler = make_scheduler(batch_size=5)
    ids = [uuid.uuid4().hex for _ in range(300)]
    for i, task_id in enumerate(ids):
        await schedule(T0_MS - i, task_id=task_id)
    assert await scheduler.run_until_idle() == 600  # 300 ingested, 300 moved in one poll
    assert Counter(p["taskId"] for p in await outbound()) == dict.fromkeys(ids, 1)


async def test_a_task_whose_stream_refuses_it_stays_scheduled(
    make_scheduler: SchedulerFactory, schedule: Schedule, outbound: Sent, redis: Redis,
    keys: Keys, db: asyncpg.Pool,
) -> None:
    scheduler = make_scheduler()
    # Given the target stream's name taken by a key of another type (XADD fails: WRONGTYPE)
    await redis.set(keys.outbound("low"), "not a stream")
    refused = await schedule(T0_MS, priority="low")
    fine = await schedule(T0_MS, priority="normal")
    await scheduler.run_until_idle()
    # Then the other task leaves and the refused one still waits, durable
    assert [p["taskId"] for p in await outbound("normal")] == [fine["taskId"]]
    assert await redis.zscore(keys.scheduled_zset(refused["taskId"]), refused["taskId"])
    assert set(await pending_rows(db)) == {refused["taskId"]}
    # When the stream can take it again, it leaves
    await redis.delete(keys.outbound("low"))
    await scheduler.run_until_idle()
    assert [p["taskId"] for p in await outbound("low")] == [refused["taskId"]]


async def test_a_corrupt_payload_is_replaced_from_postgres(
    make_scheduler: SchedulerFactory, schedule: Schedule, outbound: Sent, redis: Redis,
    keys: Keys,
) -> None:
    scheduler = make_scheduler()
    task = await schedule(T0_MS)
    await scheduler.ingest_until_idle()
    await redis.hset(keys.scheduled_payloads(shard_of(task["taskId"])), task["taskId"], "junk")
    await scheduler.run_until_idle()
    await scheduler.run_until_idle()
    assert await outbound() == [task["payload"]]


class TaskRecords(logging.Handler):
    """The messages logged by the task that created it."""

    def __init__(self) -> None:
        super().__init__()
        self.task = asyncio.current_task()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if asyncio.current_task() is self.task:
            self.messages.append(record.getMessage())


async def test_the_last_copy_of_a_task_in_one_read_batch_wins(
    make_scheduler: SchedulerFactory, schedule: Schedule, outbound: Sent, clock: FakeClock,
    db: asyncpg.Pool,
) -> None:
    # Given a task scheduled twice before the scheduler reads either (parked again, later)
    scheduler = make_scheduler()
    await schedule(T0_MS + 1_000, task_id="task-000c", note="first")
    await schedule(T0_MS + 5_000, task_id="task-000c", note="second")
    # When both are read in one batch
    await scheduler.ingest_until_idle()
    # Then the task waits as the second says
    assert await pending_rows(db) == {"task-000c": T0_MS + 5_000}
    clock.now_ms = T0_MS + 5_000
    assert await scheduler.run_until_idle() == 1
    assert [p.get("note") for p in await outbound()] == ["second"]


async def test_a_cancel_takes_no_task_of_another_project(
    make_scheduler: SchedulerFactory, schedule: Schedule, redis: Redis, keys: Keys,
) -> None:
    # Given a project's task waiting in its shard
    scheduler = make_scheduler()
    task = await schedule(T0_MS + 60_000)
    await scheduler.ingest_until_idle()
    # When another project's cancel names its id
    taken = await scheduler_module.cancel_waiting(redis, keys, str(uuid.uuid4()),
                                                  [task["taskId"]])
    # Then it is not taken: it waits on
    assert taken == set()
    assert await scheduler_module.waiting_tasks(redis, keys, [task["taskId"]]) \
        == {task["taskId"]}


async def test_a_rebuild_adds_a_task_moved_before_at_another_due_time(
    make_scheduler: SchedulerFactory, schedule: Schedule, redis: Redis, keys: Keys,
    db: asyncpg.Pool, clock: FakeClock,
) -> None:
    """A task moved (its moved-set member still there) and parked again for later waits
    under its new due time: only a member of that same due time says it already left."""
    scheduler = make_scheduler()
    task = await schedule(T0_MS + 30_000, task_id="task-000d")
    await scheduler.ingest_until_idle()
    shard = shard_of(task["taskId"])
    member = scheduler_module.moved_member(task["projectId"], task["taskId"])
    await redis.zadd(keys.scheduled_moved(shard), {member: T0_MS})
    await redis.zrem(keys.scheduled_shard(shard), task["taskId"])
    rows = await scheduled_db.by_task_ids(db, [task["taskId"]])

    assert await scheduler.add_rows(rows) == 1
    assert await redis.zscore(keys.scheduled_shard(shard), task["taskId"]) == T0_MS + 30_000
    # And a member of the same due time does say so
    await redis.zrem(keys.scheduled_shard(shard), task["taskId"])
    await redis.zadd(keys.scheduled_moved(shard), {member: T0_MS + 30_000})
    assert await scheduler.add_rows(rows) == 0


def test_reconciliation_runs_at_least_once_a_minute(make_scheduler: SchedulerFactory,
                                                    settings: Settings) -> None:
    # A quarter of the grace period, but never less often than once a minute
    assert make_scheduler(settings=settings.replace(reconcile_grace_s=8.0)) \
        .reconcile_interval_s == 2.0
    assert make_scheduler(settings=settings.replace(reconcile_grace_s=3600.0)) \
        .reconcile_interval_s == 60.0
