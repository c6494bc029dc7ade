"""Reconciliation: an accepted notification whose XADD never happened (the API died between
its INSERT and its XADD) is settled as failed, from what its stream holds; one whose entry is
on the stream, one the pipeline already took (a scheduled send) and one the stream can no
longer tell about are left alone. Real Redis and PostgreSQL; the rows are made ten minutes
old, past the grace period, instead of waiting for it (and Redis is made to have kept its data
since long before them)."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from notifkit.clock import now_ms
from notifkit.config import Settings
from notifkit.db.pool import create_pool
from notifkit.db.workflows import record_notification
from notifkit.ids import uuid7
from notifkit.keys import Keys
from notifkit.messages import InboundMessage
from notifkit.ratelimit import TokenBuckets
from notifkit.reconcile import Pass, Reconciler, id_ms
from notifkit.services.api.admission import Admission
from notifkit.services.engine import EngineService
from notifkit.services.enricher import EnricherService
from notifkit.streams import encode, xadd

from .helpers import SchedulerFactory
from .pipeline import EMAIL, add_template, add_user, drain, timeline

AGE = timedelta(minutes=10)


def _now_ms() -> int:
    return int(datetime.now(UTC).timestamp() * 1000)


def _message(project_id: str, *, send_at: str | None = None) -> InboundMessage:
    return {"eventId": uuid7(_now_ms() - int(AGE.total_seconds() * 1000)),
            "projectId": project_id, "template": "code", "to": {"userId": "u1"},
            "data": {"code": "42"}, "channels": None, "priority": "normal", "sendAt": send_at,
            "campaignId": None, "idempotencyKey": None,
            "createdAt": "2026-12-01T00:00:00.000Z"}


@pytest.fixture(autouse=True)
async def _redis_kept_its_data(settings: Settings, redis: Redis) -> None:
    await redis.set(Keys(settings.namespace).reconcile_since, 0)


class Api:
    """The API's accept path, and the crash that cuts it between INSERT and XADD."""

    def __init__(self, settings: Settings, redis: Redis, db: asyncpg.Pool) -> None:
        self.db = db
        self.admission = Admission(settings, Keys(settings.namespace), redis, db,
                                   TokenBuckets(redis))

    async def accept(self, message: InboundMessage) -> str:
        await self.admission.accept(message)
        return await self._aged(message)

    async def crash_before_xadd(self, message: InboundMessage) -> str:
        """The rows are committed; the process dies before the XADD."""
        results: list[BaseException | None] = [None]
        await self.admission._insert([message], results)
        assert results == [None]
        return await self._aged(message)

    async def _aged(self, message: InboundMessage) -> str:
        await self.db.execute("UPDATE notifications SET created_at = created_at - $2::interval "
                              "WHERE id = $1", message["eventId"], AGE)
        return message["eventId"]


class Counted:
    """A reconciler's ``run_once`` that counts its passes."""

    def __init__(self, reconciler: Reconciler) -> None:
        self.run_once = reconciler.run_once
        self.passes = 0

    async def __call__(self, *args: Any, **kwargs: Any) -> Pass:
        self.passes += 1
        return await self.run_once(*args, **kwargs)


async def _project(db: asyncpg.Pool, name: str) -> str:
    return str(await db.fetchval("INSERT INTO projects (name) VALUES ($1) RETURNING id", name))


def _reconciler(settings: Settings, redis: Redis, db: asyncpg.Pool) -> Reconciler:
    return Reconciler(settings, Keys(settings.namespace), redis, db)


async def _kinds(db: asyncpg.Pool, event_id: str) -> list[tuple[str, str, str]]:
    return [(r["kind"], r["status"], r["channel"]) for r in await timeline(db, event_id)]


async def test_a_notification_never_enqueued_fails_with_its_reason_and_an_enqueued_one_stays(
    settings: Settings, redis: Redis, db: asyncpg.Pool,
) -> None:
    # Given project A's send whose API died before the XADD, and project B's send enqueued
    a, b = await _project(db, "a"), await _project(db, "b")
    api = Api(settings, redis, db)
    enqueued = await api.accept(_message(b))
    orphan = await api.crash_before_xadd(_message(a))
    # And an entry on the stream naming the orphan's id for another project: not its entry
    forged: dict[str, object] = {**_message(b), "eventId": orphan}
    await xadd(redis, Keys(settings.namespace).inbound("normal"), forged, maxlen=1000)

    # When the reconciliation runs past the grace period
    done = await _reconciler(settings, redis, db).run_once()

    # Then the orphan is failed, on its own project's timeline, with the reason
    assert (done.failed, done.in_stream, done.undecided) == ([orphan], [enqueued], [])
    assert await _kinds(db, orphan) == [("accepted", "accepted", ""), ("failed", "failed", "")]
    failed = await db.fetchrow("SELECT project_id::text, detail, metadata FROM message_logs "
                               "WHERE event_id = $1 AND kind = 'failed'", orphan)
    assert failed["project_id"] == a
    assert "never enqueued" in failed["detail"]
    assert failed["metadata"] == {"reason": "never_enqueued"}
    # And the enqueued one is untouched
    assert await _kinds(db, enqueued) == [("accepted", "accepted", "")]
    # And a second pass looks at neither again
    again = await _reconciler(settings, redis, db).run_once()
    assert (again.failed, again.in_stream, again.undecided) == ([], [], [])


async def test_an_enqueued_notification_redis_lost_with_its_data_is_not_called_never_enqueued(
    settings: Settings, redis: Redis, db: asyncpg.Pool,
) -> None:
    """A Redis restarted without persistence comes back empty, and the workers' MKSTREAM makes
    fresh streams that have lost nothing since they were made: they cannot tell about an entry
    from before. A send answered 202 must not be settled as never enqueued."""
    # Given a send accepted (answered 202, its entry on the stream)
    keys = Keys(settings.namespace)
    accepted = await Api(settings, redis, db).accept(_message(await _project(db, "a")))
    # And Redis losing all its data, then a worker making its group again
    stream = keys.inbound("normal")
    await redis.delete(stream, keys.reconcile_cursor, keys.reconcile_since)
    await redis.xgroup_create(stream, "notifkit:group:enricher", id="0", mkstream=True)

    # When the reconciliation runs past the grace period
    done = await _reconciler(settings, redis, db).run_once()

    # Then the send is left as it is, not failed
    assert (done.failed, done.in_stream, done.undecided) == ([], [], [accepted])
    assert await _kinds(db, accepted) == [("accepted", "accepted", "")]


async def test_a_slice_slower_than_the_pools_query_limit_still_settles(
    settings: Settings, redis: Redis, db: asyncpg.Pool,
) -> None:
    """A slice is a minute of traffic, its cost grows with the send rate, and the cursor only
    moves on past a slice read whole: cut at the scheduler pool's query limit, one slow slice
    would stop reconciliation for good. The slice query has a limit of its own (a lock makes
    it wait here; the pool's limit is 0.2 s)."""
    project = await _project(db, "a")
    orphan = await Api(settings, redis, db).crash_before_xadd(_message(project))
    pool = await create_pool(settings, command_timeout=0.2)
    try:
        async with db.acquire() as conn, conn.transaction():
            await conn.execute("LOCK TABLE notifications IN ACCESS EXCLUSIVE MODE")
            reconciling = asyncio.create_task(_reconciler(settings, redis, pool).run_once())
            await asyncio.sleep(1.0)
        done = await asyncio.wait_for(reconciling, 30)
    finally:
        await pool.close()
    assert done.failed == [orphan]


async def test_a_notification_the_pipeline_took_is_left_alone_even_once_its_entry_is_trimmed(
    settings: Settings, redis: Redis, db: asyncpg.Pool,
) -> None:
    # Given a send scheduled for tomorrow, taken by the enricher and the engine
    project = await _project(db, "a")
    await add_user(db, project, "u1", contacts=[("email", "u1@example.com")])
    await add_template(db, project, "code", {"email": EMAIL})
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    scheduled = await Api(settings, redis, db).accept(_message(project, send_at=tomorrow))
    enricher, engine = EnricherService(settings), EngineService(settings)
    try:
        await drain(enricher, engine)
    finally:
        await enricher.close()
        await engine.close()
    before = await _kinds(db, scheduled)
    assert ("scheduled", "scheduled", "email") in before
    # And its inbound entry trimmed away
    await redis.xtrim(Keys(settings.namespace).inbound("normal"), maxlen=0,
                      approximate=False)

    done = await _reconciler(settings, redis, db).run_once()

    assert (done.failed, done.in_stream, done.undecided) == ([], [], [])
    assert await _kinds(db, scheduled) == before


async def test_a_notification_the_trimmed_stream_cannot_tell_about_is_left_and_logged(
    settings: Settings, redis: Redis, db: asyncpg.Pool,
) -> None:
    # Given an orphan, and a stream trimmed past its time
    project = await _project(db, "a")
    api = Api(settings, redis, db)
    orphan = await api.crash_before_xadd(_message(project))
    stream = Keys(settings.namespace).inbound("normal")
    for _ in range(3):
        await api.accept(_message(project))
    await redis.xtrim(stream, maxlen=1, approximate=False)

    done = await _reconciler(settings, redis, db).run_once()

    # (the enqueued ones trimmed away cannot be told about either)
    assert done.failed == []
    assert orphan in done.undecided
    assert await _kinds(db, orphan) == [("accepted", "accepted", "")]


async def test_a_workflow_send_is_left_to_its_instance(
    settings: Settings, redis: Redis, db: asyncpg.Pool,
) -> None:
    # Given a workflow step's send recorded, its XADD not made yet (the step is redone)
    project = await _project(db, "a")
    event_id = uuid7(_now_ms() - int(AGE.total_seconds() * 1000))
    async with db.acquire() as conn:
        await record_notification(
            conn, event_id=event_id, project_id=project, template="code", priority="normal",
            user_id="u1", data={}, channels=None, idempotency_key="wf:i:0",
            now=datetime.now(UTC) - AGE)

    done = await _reconciler(settings, redis, db).run_once()

    assert (done.failed, done.in_stream, done.undecided) == ([], [], [])
    assert await _kinds(db, event_id) == [("accepted", "accepted", "")]


async def test_only_the_scheduler_holding_the_poll_lock_reconciles(
    settings: Settings, redis: Redis, db: asyncpg.Pool, make_scheduler: SchedulerFactory,
) -> None:
    # Given an orphan, and two running schedulers that reconcile every quarter second
    project = await _project(db, "a")
    orphan = await Api(settings, redis, db).crash_before_xadd(_message(project))
    quick = settings.replace(reconcile_grace_s=1.0)
    schedulers = [make_scheduler(name, settings=quick, clock=now_ms)
                  for name in ("a", "b")]
    counters = {id(s): Counted(s.reconciler) for s in schedulers}
    for scheduler in schedulers:
        scheduler.reconciler.run_once = counters[id(scheduler)]  # type: ignore[method-assign]
        await scheduler.start()

    # When the orphan is settled
    deadline = time.monotonic() + 10
    while not await db.fetchval("SELECT count(*) FROM message_logs WHERE event_id = $1 "
                                "AND kind = 'failed'", orphan):
        assert time.monotonic() < deadline, "the orphan was never settled"
        await asyncio.sleep(0.05)

    # Then the lock holder did it, and the other scheduler never ran a pass
    holders = [s for s in schedulers if s.holds_lock]
    others = [s for s in schedulers if not s.holds_lock]
    assert len(holders) == len(others) == 1
    assert counters[id(holders[0])].passes >= 1
    assert counters[id(others[0])].passes == 0


async def test_a_pass_cut_off_by_a_stalled_postgresql_names_the_timeout(
    settings: Settings, make_scheduler: SchedulerFactory, caplog: pytest.LogCaptureFixture,
) -> None:
    """A PostgreSQL that stops answering ends a pass with a TimeoutError, whose text is empty:
    the warning names the error instead of saying "failed ()"."""
    scheduler = make_scheduler(settings=settings.replace(reconcile_grace_s=1.0),
                               clock=now_ms)

    async def stalled(*_args: Any, **_kwargs: Any) -> Pass:
        raise TimeoutError

    scheduler.reconciler.run_once = stalled  # type: ignore[method-assign]
    caplog.set_level(logging.WARNING, logger="notifkit.scheduler")
    await scheduler.start()

    deadline = time.monotonic() + 10
    while not any("reconciliation pass failed" in r.getMessage() for r in caplog.records):
        assert time.monotonic() < deadline, "no pass failed"
        await asyncio.sleep(0.05)
    warning = next(r.getMessage() for r in caplog.records
                   if "reconciliation pass failed" in r.getMessage())
    assert "failed (TimeoutError)" in warning


async def test_a_notification_inside_its_grace_period_is_settled_by_a_later_pass(
    settings: Settings, redis: Redis, db: asyncpg.Pool,
) -> None:
    """Passes read up to the grace horizon and no further: a slice read past it finds a
    young orphan too young to settle, and the cursor moving on past it never came back."""
    # Given an orphan whose id is 290 s old, created (by PostgreSQL's clock) just now
    grace = settings.replace(reconcile_grace_s=300.0)
    project = await _project(db, "a")
    now = _now_ms()
    message = _message(project)
    message["eventId"] = orphan = uuid7(now - 290_000)
    results: list[BaseException | None] = [None]
    await Api(settings, redis, db).admission._insert([message], results)
    assert results == [None]
    reconciler = _reconciler(grace, redis, db)

    # When passes run while it is inside its grace period (a first pass, then another 5 s
    # later, whose horizon moved less than a slice)
    for at in (now, now + 5_000):
        done = await reconciler.run_once(now_ms=at)
        assert (done.failed, done.in_stream, done.undecided) == ([], [], [])
    # And a pass once it is past it
    await db.execute("UPDATE notifications SET created_at = created_at - $2::interval "
                     "WHERE id = $1", orphan, AGE)
    done = await reconciler.run_once(now_ms=now + 20_000)

    # Then that pass settles it
    assert done.failed == [orphan]


async def test_an_entry_stamped_by_a_redis_clock_behind_the_apis_is_found(
    settings: Settings, redis: Redis, db: asyncpg.Pool,
) -> None:
    """Event ids carry the API host's clock, stream ids Redis's: an entry XADDed when
    Redis's clock read 30 s behind the API's is still the notification's entry, not proof
    that it was never enqueued."""
    project = await _project(db, "a")
    api = Api(settings, redis, db)
    message = _message(project)
    event_id = await api.crash_before_xadd(message)
    await redis.xadd(Keys(settings.namespace).inbound("normal"),
                     encode(dict(message)), id=f"{id_ms(event_id) - 30_000}-0")

    done = await _reconciler(settings, redis, db).run_once()

    assert (done.failed, done.in_stream, done.undecided) == ([], [event_id], [])
    assert await _kinds(db, event_id) == [("accepted", "accepted", "")]


async def test_a_pass_stops_as_soon_as_its_scheduler_is_no_longer_the_leader(
    settings: Settings, redis: Redis, db: asyncpg.Pool,
) -> None:
    # Given an orphan, and a scheduler that lost the poll lock before its pass began
    orphan = await Api(settings, redis, db).crash_before_xadd(_message(await _project(db, "a")))
    keys = Keys(settings.namespace)

    # Then the pass settles nothing and leaves the cursor where it was, for the new leader
    done = await _reconciler(settings, redis, db).run_once(still_leader=lambda: False)
    assert (done.failed, done.in_stream, done.undecided) == ([], [], [])
    assert await redis.get(keys.reconcile_cursor) is None
    assert await _kinds(db, orphan) == [("accepted", "accepted", "")]
    # And the next leader's pass settles it
    assert (await _reconciler(settings, redis, db).run_once()).failed == [orphan]
