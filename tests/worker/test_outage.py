"""A worker whose dependency (PostgreSQL, here a stand-in the test switches off and on) is
away holds its work: it stops reading and reclaiming, gives back the attempts the outage cost,
and carries on when a probe gets an answer. A failure that only looks like an outage (the
probe gets its answer) counts as any other (notifkit/worker/outage.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import asyncpg
import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from notifkit.config import Settings
from notifkit.db.availability import lock_wait, unavailable
from notifkit.keys import Keys
from notifkit.worker import Dependency, Entry
from notifkit.worker.scripts import GIVE_BACK_ATTEMPTS

if TYPE_CHECKING:
    from .conftest import Add, Payloads, WorkerFactory

HANG_S = 30.0  # only turns a regression into a failure


class Store:
    """A dependency the test takes away and brings back; batches fail while it is away."""

    def __init__(self) -> None:
        self.up = True
        self.probes = 0
        self.tries = 0
        self.done: list[str] = []

    async def answers(self, _timeout_s: float) -> bool:
        self.probes += 1
        return self.up

    def dependency(self) -> Dependency:
        return Dependency("PostgreSQL", "DATABASE_URL", unavailable, self.answers)

    async def process(self, batch: list[Entry]) -> None:
        self.tries += 1
        if not self.up:
            raise ConnectionRefusedError(111, "Connection refused")
        self.done += [e.id for e in batch]


async def until(check: Callable[[], bool | Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + HANG_S
    while True:
        result = check()
        if result if isinstance(result, bool) else await result:
            return
        assert time.monotonic() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.01)


@pytest.fixture
def store() -> Store:
    return Store()


@pytest.fixture
def stream(keys: Keys) -> str:
    return keys.enriched("normal")


async def test_an_outage_holds_the_work_and_costs_no_attempt(
    make_worker: WorkerFactory, store: Store, stream: str, redis: Redis, keys: Keys, add: Add,
    payloads: Payloads, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="notifkit.worker")
    # Given a worker whose store is away, with entries reclaimable as soon as they fail
    worker = make_worker(store.process, streams=[stream], dependency=store.dependency())
    store.up = False
    first = await add(stream, {"n": 1})

    # When its batch fails on the outage, and more work arrives meanwhile
    await worker.start()
    await until(lambda: worker.outage is not None and worker.outage.holding, "the hold")
    later = await add(stream, {"n": 2})
    probes = store.probes
    await until(lambda: store.probes >= probes + 5, "five more probes")

    # Then nothing more is tried or reclaimed, the attempt is given back, and the heartbeat
    # says why the worker does nothing
    assert store.tries == 1
    assert worker.stats.failed == worker.stats.reclaimed == 0
    assert await redis.get(keys.attempts(keys.group("engine"), first, stream)) == b"0"
    assert await redis.get(keys.attempts(keys.group("engine"), later, stream)) is None
    await worker.beat()
    beat = await redis.get(keys.health(worker.consumer))
    assert beat is not None
    assert b"waiting for PostgreSQL (DATABASE_URL) to answer again" in beat

    # And once the store answers again both entries are done, once each, none dead-lettered
    store.up = True
    await until(lambda: sorted(store.done) == sorted([first, later]), "both entries done")
    await until(lambda: not worker.outage or not worker.outage.holding, "the hold ended")
    assert await payloads(keys.dlq) == []
    assert len(store.done) == 2
    # One line when the outage began and one when it ended, however many probes came between
    phases = [getattr(r, "outage", None) for r in caplog.records]
    assert [p for p in phases if p] == ["start", "end"]


async def test_the_heartbeat_says_at_once_when_an_outage_holds_the_work_and_when_it_ends(
    make_worker: WorkerFactory, store: Store, stream: str, redis: Redis, keys: Keys, add: Add,
    worker_settings: Settings,
) -> None:
    """The beat after an outage ended could still say the worker waited for PostgreSQL, and
    /health stayed degraded until the next one, an interval later. With an interval of an
    hour, only a beat at the change itself can show it here."""
    slow = worker_settings.replace(heartbeat_interval_s=3600.0, heartbeat_ttl_s=14_400)
    worker = make_worker(store.process, streams=[stream], dependency=store.dependency(),
                         settings=slow)
    store.up = False
    await add(stream, {"n": 1})
    await worker.start()

    async def says_it_waits() -> bool:
        return b"waiting for PostgreSQL" in (await redis.get(keys.health(worker.consumer))
                                             or b"")

    await until(says_it_waits, "a beat saying the worker waits")
    store.up = True
    await until(lambda: len(store.done) == 1, "the entry done")

    async def says_it_works() -> bool:
        return not await says_it_waits()

    await until(says_it_works, "a beat saying the wait is over")


@pytest.mark.parametrize(("error", "probes"), [
    # a timeout of the work's own, while the store answers every probe
    (TimeoutError(), 3),
    # an error of the work itself: not even a probe
    (ValueError("invalid input for query argument $1"), 0),
])
async def test_a_failure_that_is_no_outage_counts(
    make_worker: WorkerFactory, store: Store, stream: str, keys: Keys, add: Add,
    payloads: Payloads, error: Exception, probes: int,
) -> None:
    # Given a batch that fails on its own while the store answers
    async def failing(batch: list[Entry]) -> None:
        raise error

    worker = make_worker(failing, streams=[stream], dependency=store.dependency())
    await add(stream, {"n": 1})

    # When the worker drains the stream
    await worker.run_until_idle()

    # Then each try counted: the entry is dead-lettered after exactly its attempts
    assert store.probes == probes
    assert worker.stats.failed == 3
    [dead] = await payloads(keys.dlq)
    assert dead["attempts"] == 3
    assert worker.outage is not None
    assert not worker.outage.holding


async def test_a_worker_stopped_during_an_outage_reads_again_when_started(
    make_worker: WorkerFactory, store: Store, stream: str, add: Add,
) -> None:
    # Given a worker stopped while an outage held it
    worker = make_worker(store.process, streams=[stream], dependency=store.dependency())
    store.up = False
    first = await add(stream, {"n": 1})
    await worker.start()
    await until(lambda: worker.outage is not None and worker.outage.holding, "the hold")
    await worker.stop(grace_s=0)

    # When it is started again once the store is back, it works again (no probe of the
    # stopped run is left to end that outage)
    store.up = True
    await worker.start()
    later = await add(stream, {"n": 2})
    await until(lambda: sorted(store.done) == sorted([first, later]), "both entries done")


class LockedStore(Store):
    """A store that answers every probe, but whose tables a lock held elsewhere keeps the
    batches waiting on until the test releases it: PostgreSQL's lock_timeout ends each wait."""

    def __init__(self) -> None:
        super().__init__()
        self.locked = False

    def dependency(self) -> Dependency:
        return Dependency("PostgreSQL", "DATABASE_URL", unavailable, self.answers, lock_wait)

    async def process(self, batch: list[Entry]) -> None:
        self.tries += 1
        if self.locked:
            raise asyncpg.LockNotAvailableError("canceling statement due to lock timeout")
        self.done += [e.id for e in batch]


async def test_a_lock_held_elsewhere_holds_the_work_and_costs_no_attempt(
    make_worker: WorkerFactory, stream: str, redis: Redis, keys: Keys, add: Add,
    payloads: Payloads, caplog: pytest.LogCaptureFixture,
) -> None:
    """A wait on a lock held by another session (a migration, VACUUM FULL, an operator's
    LOCK TABLE) ended at the pool's limit while PostgreSQL answered every probe, so each try
    counted and healthy entries were dead-lettered. The lock is the work's outage, not its
    failure: the worker holds the work, gives the attempt back and tries again later."""
    caplog.set_level(logging.INFO, logger="notifkit.worker")
    store = LockedStore()
    # Given a worker whose batches wait on a lock held elsewhere
    worker = make_worker(store.process, streams=[stream], dependency=store.dependency())
    store.locked = True
    entry = await add(stream, {"n": 1})

    # When the lock is held for more tries than the entry has attempts
    await worker.start()
    await until(lambda: store.tries > worker.max_attempts + 1, "more tries than attempts")
    # Read between two tries: a try's count is given back once it has met the lock.
    await until(lambda: worker.stats.held == store.tries, "the last try given back")

    # Then no try counted, nothing was dead-lettered, and the heartbeat says what it waits for
    assert await redis.get(keys.attempts(keys.group("engine"), entry, stream)) in (None, b"0")
    assert worker.stats.failed == 0
    assert await payloads(keys.dlq) == []
    assert store.probes == 0  # the server said why itself: nothing to ask
    await worker.beat()
    beat = await redis.get(keys.health(worker.consumer))
    assert beat is not None
    assert b"waiting for a lock held in PostgreSQL (DATABASE_URL)" in beat
    assert b"LockNotAvailableError" in beat

    # And once the lock is released the entry is done, once, and the heartbeat is clear
    store.locked = False
    await until(lambda: store.done == [entry], "the entry done")
    assert await payloads(keys.dlq) == []

    async def beat_clear() -> bool:
        await worker.beat()
        return b"readError" not in (await redis.get(keys.health(worker.consumer)) or b"")

    await until(beat_clear, "the heartbeat no longer names the lock")
    # One line when the wait began and one when it ended, however many tries came between
    phases = [getattr(r, "outage", None) for r in caplog.records]
    assert [p for p in phases if p] == ["start", "end"]
    assert [getattr(r, "reason", None) for r in caplog.records
            if getattr(r, "outage", None)] == ["lock", "lock"]


async def test_a_failure_of_the_work_during_a_lock_wait_still_counts(
    make_worker: WorkerFactory, stream: str, keys: Keys, add: Add, payloads: Payloads,
) -> None:
    # Given a worker waiting out a lock, and an entry that fails on its own data meanwhile
    store = LockedStore()

    async def process(batch: list[Entry]) -> None:
        for entry in batch:  # each entry fails alone, as the enricher's do
            if entry.payload.get("poison"):
                entry.fail(asyncpg.CheckViolationError('new row violates check constraint "c"'))
            elif store.locked:
                entry.fail(asyncpg.LockNotAvailableError("canceling statement due to lock "
                                                         "timeout"))

    worker = make_worker(process, streams=[stream], dependency=store.dependency())
    store.locked = True
    await add(stream, {"n": 1})
    await worker.start()
    await until(lambda: worker.stats.held >= 1, "a lock wait held")
    poison = await add(stream, {"poison": True})

    # Then the poison's tries count, and it is dead-lettered after exactly its attempts, while
    # the entry waiting on the lock is still held
    async def dead() -> bool:
        return len(await payloads(keys.dlq)) == 1

    await until(dead, "the poison dead-lettered")
    [record] = await payloads(keys.dlq)
    assert record["entryId"] == poison
    assert record["attempts"] == worker.max_attempts
    assert record["error"].startswith("CheckViolationError")
    assert worker.stats.dead_lettered == 1


async def test_redis_lost_while_a_batch_is_recorded_is_a_warning_and_the_entry_is_retried(
    make_worker: WorkerFactory, stream: str, add: Add, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis going away between a batch's work and its ack is an outage, not a bug: one
    warning naming it, no traceback, and the entry stays pending for the retry."""
    caplog.set_level(logging.INFO, logger="notifkit.worker")
    done: list[str] = []

    async def process(batch: list[Entry]) -> None:
        done.extend(e.id for e in batch)

    worker = make_worker(process, streams=[stream])
    settle = worker._settle
    failures = [RedisConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")]

    async def settle_once_refused(*args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return await settle(*args, **kwargs)

    monkeypatch.setattr(worker, "_settle", settle_once_refused)
    entry = await add(stream, {"n": 1})

    await worker.start()
    await until(lambda: done.count(entry) >= 2, "the entry retried")

    records = [r for r in caplog.records if "outcome of a batch" in r.getMessage()]
    assert len(records) == 1
    assert records[0].levelno == logging.WARNING
    assert records[0].exc_info is None
    assert "Connection refused" in records[0].getMessage()


async def test_giving_back_an_attempt_leaves_a_counter_already_gone_gone(
    redis: Redis, keys: Keys,
) -> None:
    """A counter deleted by an ack (another process settled the entry) or expired before the
    attempt is given back stays gone: a DECR would bring it back at -1, with no TTL."""
    stream = keys.enriched("normal")
    kept = keys.attempt_counters("notifkit:group:engine", "1-0", stream)[0]
    gone = keys.attempt_counters("notifkit:group:engine", "2-0", stream)[0]
    await redis.set(kept, 2, ex=3600)
    given: Any = await redis.eval(GIVE_BACK_ATTEMPTS, 2, kept, gone)  # type: ignore[misc]
    assert given == 1
    assert await redis.get(kept) == b"1"
    assert await redis.exists(gone) == 0
