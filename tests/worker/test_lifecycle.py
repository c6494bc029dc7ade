"""Start, heartbeat and graceful stop (CONTRACT §3.7), and the consumer name (§2)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from notifkit.config import Settings
from notifkit.keys import Keys
from notifkit.worker import Entry, consumer_name, remove_heartbeat, stream_worker, write_heartbeat
from tests.support.waiting import until, until_async

if TYPE_CHECKING:
    from .conftest import Add, Pending, WorkerFactory

WAIT_S = 10.0


class Gate:
    """A processor that records what it was given, says so, and waits until opened."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.opened = asyncio.Event()
        self.seen: list[str] = []
        self.finished: list[str] = []

    async def __call__(self, batch: list[Entry]) -> None:
        self.seen.extend(e.id for e in batch)
        self.entered.set()
        await self.opened.wait()
        self.finished.extend(e.id for e in batch)


def test_consumer_name_is_service_hostname_pid() -> None:
    assert consumer_name("delivery") == f"delivery-{socket.gethostname()}-{os.getpid()}"


async def test_a_started_worker_keeps_a_heartbeat_with_a_ttl_and_its_in_flight_count(
    make_worker: WorkerFactory, redis: Redis, keys: Keys, add: Add,
) -> None:
    # Given a running worker holding 3 entries
    gate = Gate()
    worker = make_worker(gate, service="delivery", streams=keys.outbound_all())
    assert worker.consumer == f"delivery-{socket.gethostname()}-{os.getpid()}"
    for n in range(3):
        await add(keys.outbound("normal"), {"n": n})
    await worker.start()
    await asyncio.wait_for(gate.entered.wait(), WAIT_S)

    # Then its heartbeat soon says so, and expires on its own if the process dies
    health = keys.health(worker.consumer)
    beat: dict[str, object] = {}
    for _ in range(1000):  # bounded wait for the condition: the next beat
        raw = await redis.get(health)
        beat = json.loads(raw) if raw else {}
        if beat.get("inFlight") == 3:
            break
        await asyncio.sleep(0.01)
    assert beat["inFlight"] == 3
    assert beat["service"] == "delivery"
    assert beat["consumer"] == worker.consumer
    assert beat["pid"] == os.getpid()
    assert beat["host"] == socket.gethostname()
    ttl = await redis.ttl(health)
    assert 0 < ttl <= worker.settings.heartbeat_ttl_s

    # And stopping removes it
    gate.opened.set()
    await worker.stop()
    assert await redis.exists(health) == 0


async def test_stop_lets_the_batch_in_flight_finish_within_the_grace_period(
    make_worker: WorkerFactory, keys: Keys, add: Add, pending: Pending,
) -> None:
    # Given a running worker in the middle of a batch
    gate = Gate()
    worker = make_worker(gate)
    stream = keys.enriched("normal")
    ids = [await add(stream, {"n": n}) for n in range(4)]
    await worker.start()
    await asyncio.wait_for(gate.entered.wait(), WAIT_S)

    # When it is asked to stop with a long grace period
    stopping = asyncio.create_task(worker.stop(grace_s=30))
    for _ in range(20):
        await asyncio.sleep(0)  # let stop() get going
    assert not stopping.done()  # it waits for the batch
    gate.opened.set()
    await asyncio.wait_for(stopping, WAIT_S)

    # Then the batch finished and was acked before stop() returned
    assert sorted(gate.finished) == sorted(ids)
    assert worker.stats.processed == 4
    assert await pending(stream, worker.group) == 0


async def test_a_stopping_worker_beats_until_its_batch_finishes(
    make_worker: WorkerFactory, worker_settings: Settings, redis: Redis, keys: Keys, add: Add,
) -> None:
    """Found by running a fleet with a grace longer than the heartbeat's life: a stopping
    process stopped beating at once, so /health no longer listed it while it still finished
    its batches."""
    gate = Gate()
    settings = worker_settings.replace(heartbeat_interval_s=0.1, heartbeat_ttl_s=1)
    worker = make_worker(gate, settings=settings)
    await add(keys.enriched("normal"), {"n": 1})
    await worker.start()
    await asyncio.wait_for(gate.entered.wait(), WAIT_S)
    health = keys.health(worker.consumer)

    async def beats_busy() -> bool:
        raw = await redis.get(health)
        return raw is not None and json.loads(raw)["inFlight"] == 1

    await until_async(beats_busy)

    # When it stops with a grace longer than its heartbeat key lives, and the batch outlasts
    # that life
    stopping = asyncio.create_task(worker.stop(grace_s=30))
    await until(lambda: worker._stopping.is_set())
    deadline = time.monotonic() + 2.5 * settings.heartbeat_ttl_s
    while time.monotonic() < deadline:  # idle time is wall time: the key's life must pass
        # Then its heartbeat is still there, still counting the batch
        raw = await redis.get(health)
        assert raw is not None, "the stopping worker's heartbeat expired"
        assert json.loads(raw)["inFlight"] == 1
        await asyncio.sleep(0.1)

    # And once the batch is done and the worker stopped, it is gone
    gate.opened.set()
    await asyncio.wait_for(stopping, WAIT_S)
    assert await redis.exists(health) == 0


async def test_stop_without_grace_acks_nothing_and_another_worker_takes_over(
    make_worker: WorkerFactory, keys: Keys, add: Add, pending: Pending,
) -> None:
    # Given a running worker whose processor never finishes
    gate = Gate()
    first = make_worker(gate, consumer="engine-host-a-1")
    stream = keys.enriched("normal")
    ids = [await add(stream, {"n": n}) for n in range(4)]
    await first.start()
    await asyncio.wait_for(gate.entered.wait(), WAIT_S)

    # When it stops with no grace at all
    await first.stop(grace_s=0)

    # Then nothing was acked: every entry is still pending, for the stopped consumer
    assert gate.finished == []
    assert first.stats.processed == 0
    assert await pending(stream, first.group) == 4

    # And another worker reclaims and processes all of them
    done: list[tuple[str, int]] = []

    async def process(batch: list[Entry]) -> None:
        done.extend((e.id, e.attempt) for e in batch)

    second = make_worker(process, consumer="engine-host-b-1")
    await second.run_until_idle()
    assert sorted(done) == sorted((entry_id, 2) for entry_id in ids)
    assert await pending(stream, first.group) == 0


async def test_a_stopped_consumer_leaves_its_group_unless_it_holds_entries(
    make_worker: WorkerFactory, redis: Redis, keys: Keys, add: Add,
) -> None:
    """A group's consumers are the processes reading it (GET /v1/streams counts them), not
    every process that ever did; one stopped with entries pending stays, so they can be
    reclaimed from it."""
    stream = keys.enriched("normal")

    async def done(batch: list[Entry]) -> None:
        pass

    finished = make_worker(done, consumer="engine-host-a-1")
    await add(stream, {"n": 1})
    await finished.start()
    await until(lambda: finished.stats.processed == 1)
    names = {c["name"] for c in await redis.xinfo_consumers(stream, finished.group)}
    assert b"engine-host-a-1" in names
    await finished.stop()
    assert await redis.xinfo_consumers(stream, finished.group) == []

    gate = Gate()
    holding = make_worker(gate, consumer="engine-host-b-1")
    await add(stream, {"n": 2})
    await holding.start()
    await asyncio.wait_for(gate.entered.wait(), WAIT_S)
    await holding.stop(grace_s=0)
    [left] = await redis.xinfo_consumers(stream, holding.group)
    assert (left["name"], left["pending"]) == (b"engine-host-b-1", 1)


async def test_a_killed_consumer_leaves_its_group_once_what_it_held_was_taken_over(
    make_worker: WorkerFactory, redis: Redis, keys: Keys, add: Add,
) -> None:
    """A process killed while holding entries cannot leave its group itself: once another has
    reclaimed what it held and its heartbeat expired, a later sweep takes it off, so GET
    /v1/streams counts the processes reading, not every one ever killed. A live process's
    consumer stays, however long it has not read that stream."""
    stream = keys.enriched("normal")
    group = "notifkit:group:engine"
    await redis.xgroup_create(stream, group, id="0", mkstream=True)
    await add(stream, {"n": 1})
    # A process that read one entry and was killed before it acked it
    await redis.xreadgroup(group, "engine-host-killed-1", {stream: ">"}, count=1)
    await add(stream, {"n": 2})
    # A live process holding nothing that has not read this stream for a while: it beats
    await redis.xgroup_createconsumer(stream, group, "engine-host-other-1")
    await redis.set(keys.health("engine-host-other-1"), "{}", ex=30)

    processed: list[Any] = []

    async def done(batch: list[Entry]) -> None:
        processed.extend(e.payload["n"] for e in batch)

    worker = make_worker(done, consumer="engine-host-live-1", streams=[stream])
    await worker.start()
    await until(lambda: 1 in processed and 2 in processed)

    async def names() -> set[str]:
        return {c["name"].decode() for c in await redis.xinfo_consumers(stream, group)}

    deadline = asyncio.get_running_loop().time() + WAIT_S
    while "engine-host-killed-1" in await names():
        assert asyncio.get_running_loop().time() < deadline, await names()
        await asyncio.sleep(0.05)
    assert {"engine-host-live-1", "engine-host-other-1"} <= await names()


async def test_a_started_worker_is_a_consumer_of_its_groups_before_any_entry(
    make_worker: WorkerFactory, redis: Redis, keys: Keys,
) -> None:
    async def nothing(batch: list[Entry]) -> None:
        pass

    worker = make_worker(nothing, consumer="engine-host-c-1")
    await worker.start()
    for stream in keys.enriched_all():
        [consumer] = await redis.xinfo_consumers(stream, worker.group)
        assert consumer["name"] == b"engine-host-c-1"
    await worker.stop()
    for stream in keys.enriched_all():
        assert await redis.xinfo_consumers(stream, worker.group) == []


async def test_reading_that_works_again_after_failures_says_so(
    make_worker: WorkerFactory, keys: Keys, add: Add, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a worker whose first two reads fail as during a Redis outage
    gate = Gate()
    gate.opened.set()
    worker = make_worker(gate)
    real_read = worker._read_new
    failures = 2

    async def flaky_read(**kwargs: Any) -> int:
        nonlocal failures
        if failures:
            failures -= 1
            raise RedisConnectionError("Connection refused")
        return await real_read(**kwargs)

    monkeypatch.setattr(worker, "_read_new", flaky_read)
    await add(keys.enriched("normal"), {"n": 1})

    # When it retries until a read works
    with caplog.at_level("INFO", logger="notifkit.worker"):
        await worker.start()
        await asyncio.wait_for(gate.entered.wait(), WAIT_S)
        await worker.stop()

    # Then two warnings said reading failed, and one line says it works again
    messages = [r.getMessage() for r in caplog.records if r.name == "notifkit.worker"]
    assert sum("failed (Connection refused); retrying" in m for m in messages) == 2
    [again] = [m for m in messages if "works again" in m]
    assert re.fullmatch(r"Reading engine works again after \d+\.\d s of failed reads\.", again)


async def test_a_worker_whose_reads_fail_says_so_in_its_heartbeat(
    make_worker: WorkerFactory, redis: Redis, keys: Keys,
) -> None:
    """A worker that still beats but cannot read (here a stream key an operator overwrote
    with a string; a bug in the read loop would do the same) looked healthy on /health while
    it did nothing. Its heartbeat now says why its reads fail, until they work again."""
    gate = Gate()
    worker = make_worker(gate, service="delivery", streams=keys.outbound_all())
    await worker.start()
    health = keys.health(worker.consumer)

    async def beat() -> dict[str, Any]:
        raw = await redis.get(health)
        return json.loads(raw) if raw else {}

    beats: list[dict[str, Any]] = []

    async def read_error_is(expected: bool) -> None:
        for _ in range(2000):  # bounded wait for the condition: the next beats
            beats.append(await beat())
            if ("readError" in beats[-1]) == expected:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(beats[-1])

    await read_error_is(False)
    stream = keys.outbound("low")
    await redis.delete(stream)
    await redis.set(stream, "not a stream")
    await read_error_is(True)
    assert "WRONGTYPE" in beats[-1]["readError"]
    await redis.delete(stream)  # fixed: the worker joins the stream again and reads on
    await read_error_is(False)
    gate.opened.set()


async def test_a_worker_beats_at_once_when_its_reads_fail_and_when_they_work_again(
    make_worker: WorkerFactory, redis: Redis, keys: Keys, worker_settings: Settings,
) -> None:
    """/health stayed degraded after Redis came back until the next beat, an interval later:
    the last beat said the reads failed. A change of read state now beats at once. With an
    interval of an hour, only such beats can show it here."""
    slow = worker_settings.replace(heartbeat_interval_s=3600.0, heartbeat_ttl_s=14_400)
    gate = Gate()
    worker = make_worker(gate, service="delivery", streams=keys.outbound_all(), settings=slow)
    await worker.start()
    health = keys.health(worker.consumer)

    async def read_error() -> str | None:
        raw = await redis.get(health)
        assert raw is not None
        error = json.loads(raw).get("readError")
        return error if isinstance(error, str) else None

    assert await read_error() is None
    stream = keys.outbound("low")
    await redis.delete(stream)
    await redis.set(stream, "not a stream")
    await until_async(lambda: _is_not_none(read_error()))
    await redis.delete(stream)  # fixed: reads work again, and the beat says so at once
    await until_async(lambda: _is_none(read_error()))
    gate.opened.set()


async def _is_none(value: Awaitable[object]) -> bool:
    return await value is None


async def _is_not_none(value: Awaitable[object]) -> bool:
    return await value is not None


async def test_a_failed_beat_is_tried_again_within_a_second(
    make_worker: WorkerFactory, redis: Redis, keys: Keys, worker_settings: Settings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A beat that failed (Redis away) waited a whole interval for the next: after an outage
    /health listed the process as stale, and answered degraded, for up to that long."""
    slow = worker_settings.replace(heartbeat_interval_s=3600.0, heartbeat_ttl_s=14_400)
    caplog.set_level(logging.WARNING, logger="notifkit.worker")
    worker = make_worker(Gate(), service="delivery", streams=keys.outbound_all(), settings=slow)
    await worker.start()
    await redis.set(keys.heartbeats, "not a sorted set")  # every beat now fails
    stream = keys.outbound("low")
    await redis.delete(stream)
    await redis.set(stream, "not a stream")  # reads fail: a beat is due at once, and fails
    await until(lambda: any(r.getMessage().startswith("Heartbeat failed")
                            for r in caplog.records))
    await redis.delete(keys.heartbeats)  # Redis serves again: only a retry can beat now

    async def indexed() -> bool:
        return await redis.zscore(keys.heartbeats, worker.consumer) is not None

    await until_async(indexed)
    await redis.delete(stream)


async def test_a_failing_heartbeat_writes_the_same_warning_each_time(
    make_worker: WorkerFactory, redis: Redis, keys: Keys, caplog: pytest.LogCaptureFixture,
) -> None:
    """redis-py names the failed command of a pipeline, arguments included, and the
    heartbeat's ZADD score is the time of the beat: every failed beat wrote a different
    warning, which the repeat filter could not fold (one line a second per worker)."""
    worker = make_worker(Gate(), service="delivery", streams=keys.outbound_all())
    caplog.set_level(logging.WARNING, logger="notifkit.worker")
    await worker.start()
    await redis.set(keys.heartbeats, "not a sorted set")  # every beat now fails

    def failures() -> list[str]:
        return [r.getMessage() for r in caplog.records
                if r.getMessage().startswith("Heartbeat failed")]

    await until(lambda: len(failures()) >= 3)
    assert len(set(failures())) == 1, failures()
    assert failures()[0] == ("Heartbeat failed (WRONGTYPE Operation against a key holding the "
                             "wrong kind of value); trying again.")
    await redis.delete(keys.heartbeats)


async def test_removing_a_heartbeat_survives_a_connection_the_server_closed(
    redis: Redis, redis_url: str, keys: Keys,
) -> None:
    """A worker stopping cleanly after a Redis blip (its pooled connections closed by the
    server) still leaves /health: the first command on the stale connection fails, and one
    removal alone left the stopped worker listed, stale, until its key expired."""
    own = Redis.from_url(redis_url)
    try:
        await write_heartbeat(own, keys, "delivery-host-9", {"service": "delivery"}, 30)
        ids = set(await asyncio.gather(*(own.client_id() for _ in range(4))))
        assert len(ids) > 1
        for client_id in ids:
            await redis.client_kill_filter(_id=str(client_id))
        await remove_heartbeat(own, keys, "delivery-host-9")
    finally:
        await own.aclose()
    assert await redis.exists(keys.health("delivery-host-9")) == 0
    assert await redis.zscore(keys.heartbeats, "delivery-host-9") is None


async def test_a_process_stop_shares_one_grace_period_among_its_services(
    settings: Settings, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each service of a process was given the whole SHUTDOWN_GRACE_SECONDS in turn, so a
    SIGTERM while PostgreSQL stalled (delivery's and workflow's batches stuck for their whole
    grace) took 28 s with a 10 s grace. The grace is now one deadline for the process: a
    service stopping after another used it all up gets none."""
    from notifkit.server import NotifkitServer
    from notifkit.worker import StreamWorker

    graces: list[tuple[str, float | None]] = []
    original = StreamWorker.stop

    async def recording(self: StreamWorker, grace_s: float | None = None) -> None:
        graces.append((self.service, grace_s))
        if len(graces) == 1:  # the first service's in-flight work takes the whole grace
            await asyncio.sleep(grace_s or 0.0)
        await original(self, grace_s)

    monkeypatch.setattr(StreamWorker, "stop", recording)
    server = NotifkitServer(services=["enricher", "engine"],
                            settings=settings.replace(shutdown_grace_s=0.5),
                            auto_migrate=False)
    await server.start()
    await server.stop()

    [(first, first_grace), (second, second_grace)] = graces
    assert (first, second) == ("enricher", "engine")
    assert first_grace is not None
    assert 0 < first_grace <= 0.5
    assert second_grace == 0


async def test_a_service_stopping_past_the_grace_drops_its_pool_without_waiting(
    settings: Settings, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seeing a pool off waits up to 1 s for a server that may not answer; eight services in
    turn, after a grace used up by batches stuck in a PostgreSQL stall, took a SIGTERM 6 s past
    the grace. Past the process's deadline the pool is dropped at once; before it, the wait
    is cut to what is left."""
    from notifkit.db.pool import POOL_CLOSE_TIMEOUT_S, close_pool
    from notifkit.services.enricher import EnricherService

    waits: list[float] = []

    async def recording(pool: Any, timeout_s: float = POOL_CLOSE_TIMEOUT_S) -> None:
        waits.append(timeout_s)
        await close_pool(pool, timeout_s)

    monkeypatch.setattr("notifkit.services.base.close_pool", recording)
    loop = asyncio.get_running_loop()
    for deadline, expected in ((loop.time() - 1, 0.0), (None, POOL_CLOSE_TIMEOUT_S)):
        service = EnricherService(settings)
        await service.start()
        service.stop_deadline = deadline
        await service.stop()
        assert waits.pop() == expected


@pytest.mark.parametrize("name", ["enricher", "scheduler", "api"])
async def test_a_service_stopped_while_redis_stalls_stops_within_the_grace(
    settings: Settings, name: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A SIGTERM while Redis stalled took 111 s with a 10 s grace: each service's goodbye to
    Redis (its heartbeat removed, its consumer forgotten, the scheduler's lock released) waited
    for the client's timeouts, one call after another. Those calls now get what is left of the
    grace, and at least 1 s; a heartbeat left behind expires by itself."""
    from notifkit.server import service_class
    from tests.support.pg_proxy import StallingRedisProxy

    async with StallingRedisProxy(settings.replace(port=0, host="127.0.0.1",
                                                   shutdown_grace_s=0.1)) as proxy:
        service = service_class(name)(proxy.settings)
        await service.start()
        proxy.stall()
        # The least a last call gets, made small: the stop then ends far inside the bound
        # below, which only the client's own timeouts (10 s or more a call) would pass.
        monkeypatch.setattr(stream_worker, "STOP_GOODBYE_MIN_S", 0.05)
        stopping = asyncio.create_task(service.stop())
        done, _ = await asyncio.wait({stopping}, timeout=8)
        assert stopping in done, "the stop waited for a stalled Redis"
        stopping.result()


async def test_a_heartbeat_takes_processes_gone_for_an_hour_off_the_index(
    redis: Redis, keys: Keys,
) -> None:
    """Killed processes (a crash, an evicted pod under a new hostname) leave their entry in
    the heartbeat index; /health drops those an hour old, but a deployment whose /health
    nobody asks must not collect one entry per killed process for as long as it runs."""
    now = time.time()
    await redis.zadd(keys.heartbeats, {"delivery-gone-1": now - 7200,
                                       "delivery-recent-2": now - 600})
    await write_heartbeat(redis, keys, "delivery-host-9", {"service": "delivery"}, 30)
    assert await redis.zscore(keys.heartbeats, "delivery-gone-1") is None
    # Within the hour a killed process stays listed (stale) for /health to report.
    assert await redis.zscore(keys.heartbeats, "delivery-recent-2") is not None
    assert await redis.zscore(keys.heartbeats, "delivery-host-9") is not None
