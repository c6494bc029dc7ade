"""The instance lock (held with a token, renewed, released only by its holder), what a busy
instance does with its entry, and the timer set (atomic moves, rebuilt from PostgreSQL)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import pytest
from redis.asyncio import Redis

from notifkit.keys import Keys
from notifkit.services.workflow import service as workflow_service
from notifkit.services.workflow.lock import InstanceLocks
from notifkit.services.workflow.timers import Timers
from notifkit.streams import decode
from notifkit.tasks import cancel_all
from tests.support.streams import xrange

if TYPE_CHECKING:
    from .conftest import FakeClock, Flow, ServiceFactory


async def test_the_lock_is_exclusive_renewed_and_released_only_by_its_holder(
    redis: Redis, keys: Keys,
) -> None:
    locks = InstanceLocks(redis, ttl_ms=300)
    key = keys.workflow_lock("i-1")
    held = await locks.acquire(key)
    assert held is not None
    assert await locks.acquire(key) is None
    # Renewed while held: still there after several TTLs
    for _ in range(3):
        await asyncio.sleep(0.3)  # real time is what the lock's TTL measures
        assert await redis.get(key) == held.token.encode()
    assert not held.lost
    await held.release()
    assert await redis.exists(key) == 0

    # A holder whose lock expired and was taken over neither renews nor frees the new one
    stale = await locks.acquire(key)
    assert stale is not None
    await redis.set(key, "someone-else", px=10_000)
    await asyncio.sleep(0.25)  # past one renewal interval (ttl / 3)
    assert stale.lost
    await stale.release()
    assert await redis.get(key) == b"someone-else"


async def test_a_busy_instance_is_looked_at_again_after_its_holder_lets_go(
    flow: Flow, make_service: ServiceFactory, clock: FakeClock, redis: Redis, keys: Keys,
) -> None:
    await flow.define("one", [{"type": "send", "template": "hello"}])
    instance_id = await flow.trigger("one", "u1")
    # Given another process holding the instance's lock
    await redis.set(keys.workflow_lock(instance_id), "other-process", px=60_000)
    service = make_service()
    await service.run_until_idle()
    # Then nothing ran, the entry is acked, and a retry wake is due shortly
    assert await flow.sent() == []
    assert (await flow.instance(instance_id))["status"] == "pending"
    assert await redis.zscore(keys.workflow_timers, f"{instance_id}:retry") is not None
    # When the holder lets go and the retry is due
    await redis.delete(keys.workflow_lock(instance_id))
    clock.advance(1)
    await service.run_until_idle()
    assert [m["template"] for m in await flow.sent()] == ["hello"]
    assert (await flow.instance(instance_id))["status"] == "completed"


async def test_an_instance_whose_holder_died_is_looked_at_less_and_less_often_and_said_once(
    flow: Flow, make_service: ServiceFactory, clock: FakeClock, redis: Redis, keys: Keys,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await flow.define("one", [{"type": "send", "template": "hello"}])
    instance_id = await flow.trigger("one", "u1")
    # Given a process that died holding the instance's lock (its TTL runs out by itself)
    await redis.set(keys.workflow_lock(instance_id), "dead-process", px=60_000)
    service = make_service()
    caplog.set_level(logging.INFO, logger="notifkit.workflow")
    await service.run_until_idle()
    # Then the first look again is as soon as for a holder about to let go
    first = await redis.zscore(keys.workflow_timers, f"{instance_id}:retry")
    assert first is not None
    assert first <= (clock() + service.lock_retry_s) * 1000
    # When 20 s pass while the lock stays held
    looks = 0
    for _ in range(80):
        clock.advance(0.25)
        if await service.poll_timers():
            looks += 1
            await service.worker.run_until_idle()
    # Then it was looked at a handful of times, not four times a second, and said once
    assert 2 <= looks <= 8
    said = [r for r in caplog.records if "running elsewhere" in r.getMessage()]
    assert len(said) == 1
    # And once the lock is free, the next look runs it
    await redis.delete(keys.workflow_lock(instance_id))
    clock.advance(60)
    await service.run_until_idle()
    assert (await flow.instance(instance_id))["status"] == "completed"


async def test_due_timers_move_to_the_stream_once_even_with_two_pollers(
    redis: Redis, keys: Keys,
) -> None:
    a = Timers(redis, keys.workflow_timers, keys.workflow_inbound, 10_000)
    b = Timers(redis, keys.workflow_timers, keys.workflow_inbound, 10_000)
    for i in range(200):
        await a.schedule(f"i-{i}", "0", 1000 + i)
    await a.schedule("later", "0", 5000)
    moved = await asyncio.gather(*(t.move_due(2000, limit=7) for t in [a, b] * 20))
    assert sum(moved) == 200
    wakes = [decode(f) for _id, f in await xrange(redis, keys.workflow_inbound)]
    assert sorted(w["timer"] for w in wakes) == sorted(f"i-{i}:0" for i in range(200))
    assert all(w["type"] == "wake" for w in wakes)
    assert await redis.zrange(keys.workflow_timers, 0, -1) == [b"later:0"]


async def test_lost_timers_are_rebuilt_from_postgresql(
    flow: Flow, make_service: ServiceFactory, clock: FakeClock, redis: Redis, keys: Keys,
) -> None:
    await flow.define("slow", [{"type": "wait", "seconds": 60},
                               {"type": "send", "template": "late"}])
    instance_id = await flow.trigger("slow", "u1")
    service = make_service()
    await service.run_until_idle()
    await redis.delete(keys.workflow_timers)  # Redis lost its data
    assert await service.rebuild_timers() == 1
    clock.advance(60)
    await service.run_until_idle()
    assert [m["template"] for m in await flow.sent()] == ["late"]
    assert (await flow.instance(instance_id))["status"] == "completed"


async def test_timers_lost_while_the_service_runs_are_all_rebuilt_at_its_next_poll(
    flow: Flow, make_service: ServiceFactory, clock: FakeClock, redis: Redis, keys: Keys,
) -> None:
    await flow.define("slow", [{"type": "wait", "seconds": 60},
                               {"type": "send", "template": "late"}])
    instances = [await flow.trigger("slow", f"u{i}") for i in range(7)]
    service = make_service(rebuild_page_size=3)  # seven sleepers span three pages
    await service.run_until_idle()
    assert await redis.zcard(keys.workflow_timers) == 7
    await redis.delete(keys.workflow_timers, keys.workflow_timers_ready)  # Redis lost its data
    clock.advance(60)
    await service.run_until_idle()
    assert sorted(m["to"]["userId"] for m in await flow.sent()) == [f"u{i}" for i in range(7)]
    assert {(await flow.instance(i))["status"] for i in instances} == {"completed"}


async def test_a_timer_rebuild_reports_its_progress_and_its_end(
    flow: Flow, make_service: ServiceFactory, redis: Redis, keys: Keys,
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Rebuilding the timers after Redis lost its data said it began, then nothing: neither
    # how far a long rebuild had got nor that it was over.
    monkeypatch.setattr(workflow_service, "REBUILD_PROGRESS_S", 0.0)  # every page reports
    await flow.define("slow", [{"type": "wait", "seconds": 60},
                               {"type": "send", "template": "late"}])
    for i in range(7):
        await flow.trigger("slow", f"u{i}")
    service = make_service(rebuild_page_size=3)
    await service.run_until_idle()
    await redis.delete(keys.workflow_timers, keys.workflow_timers_ready)  # Redis lost its data
    caplog.clear()
    caplog.set_level(logging.INFO, logger="notifkit.workflow")
    assert await service.rebuild_timers_if_lost() == 7
    messages = [r.getMessage() for r in caplog.records if "workflow timers" in r.getMessage()]
    assert messages[1:] == [
        "Rebuilding the workflow timers: 3 sleeping instances re-added so far.",
        "Rebuilding the workflow timers: 6 sleeping instances re-added so far.",
        "Rebuilding the workflow timers: 7 sleeping instances re-added so far.",
        "Rebuilt the workflow timers: 7 sleeping instances re-added from PostgreSQL.",
    ]


class _LosesAfter:
    """A lock that reports itself lost after ``checks`` looks (as if it expired mid-run)."""

    def __init__(self, checks: int) -> None:
        self.checks = checks

    @property
    def lost(self) -> bool:
        self.checks -= 1
        return self.checks < 0


async def test_a_runner_that_loses_its_lock_stops_before_the_next_step(
    flow: Flow, make_service: ServiceFactory,
) -> None:
    from notifkit.db import workflows as db
    from notifkit.services.workflow.runner import LockLost

    await flow.define("two", [{"type": "send", "template": "a"},
                              {"type": "send", "template": "b"}])
    instance_id = await flow.trigger("two", "u1")
    service = make_service()
    await service.open()
    instance = await db.get_instance(service.pool, instance_id)
    assert instance is not None
    with pytest.raises(LockLost):
        await service.runner.run(instance, _LosesAfter(1))  # type: ignore[arg-type]
    assert [m["template"] for m in await flow.sent()] == ["a"]
    assert [s["path"] for s in await flow.steps(instance_id)] == ["0"]
    # and the instance is at the next step, for whoever holds the lock now
    assert (await flow.instance(instance_id))["cursor"] == "1"


async def test_releasing_a_lock_ends_a_renewal_that_swallowed_the_cancellation(
    redis: Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A renewal's call completing as the release cancels it (asyncio.wait_for in redis-py
    swallows that cancellation on Python 3.11): the renewer went on renewing and the release
    waited for it for good, the instance's lock held all the while."""
    locks = InstanceLocks(redis, ttl_ms=30)  # a renewal every 10 ms
    renew = locks._renew
    inside, swallowed = asyncio.Event(), asyncio.Event()

    async def renew_swallowing_one_cancellation(**kwargs: Any) -> Any:
        result = await renew(**kwargs)
        if not swallowed.is_set():
            inside.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                swallowed.set()
        return result

    monkeypatch.setattr(locks, "_renew", renew_swallowing_one_cancellation)
    key = keys.workflow_lock("i-swallow")
    held = await locks.acquire(key)
    assert held is not None
    async with asyncio.timeout(30):  # guards against hangs, as below
        await inside.wait()  # the renewer is inside its renewal now
    releasing = asyncio.create_task(held.release())
    # Waited for without cancelling it (a cancellation would end the renewer by itself): the
    # bound only keeps a hang from hanging the suite, it measures nothing.
    await asyncio.wait({releasing}, timeout=30)
    try:
        assert releasing.done()
        assert swallowed.is_set()
        assert await redis.exists(key) == 0
    finally:
        await cancel_all([t for t in (releasing, held._renewer) if t is not None])
