"""A provider answering 429 with Retry-After for a while: tasks are parked with the scheduler,
sent after the window, none dropped, none sent before it (SCENARIOS: rate_limit_429).

One clock drives both halves: delivery computes a parked task's due time from it and the
scheduler compares due times with it, so the test moves time instead of waiting for it.
"""

from __future__ import annotations

import time
import types
from collections import Counter

import asyncpg
import pytest
from redis.asyncio import Redis

from notifkit.config import Settings, SmsSettings
from notifkit.keys import SCHEDULER_SHARDS, Keys
from notifkit.services.delivery import service as delivery_module
from notifkit.services.engine import EngineService
from notifkit.services.enricher import EnricherService
from simulators import SimulatorServer

from .helpers import FakeClock, SchedulerFactory
from .pipeline import SMS, add_template, add_user, drain, entries, send, timeline

RETRY_AFTER_S = 30
USERS = 6


async def waiting(redis: Redis, keys: Keys) -> int:
    return sum([await redis.zcard(keys.scheduled_shard(s)) for s in SCHEDULER_SHARDS])


async def test_tasks_parked_by_a_429_leave_after_the_window_and_are_sent_once(
    settings: Settings, db: asyncpg.Pool, redis: Redis, keys: Keys, project_id: str,
    make_scheduler: SchedulerFactory, clock: FakeClock, sim: SimulatorServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock.now_ms = time.time_ns() // 1_000_000
    start_ms = clock.now_ms
    monkeypatch.setattr(delivery_module, "time", types.SimpleNamespace(
        time=lambda: clock.now_ms / 1000, monotonic=time.monotonic,
        perf_counter=time.perf_counter))
    s = settings.replace(provider_timeout_s=2.0, sms=SmsSettings(
        account_sid="AC" + "1" * 32, auth_token="twilio-token", from_number="+15005550006",
        base_url=sim.base_url))
    for i in range(USERS):
        await add_user(db, project_id, f"u{i}", contacts=[("sms", f"+1555000100{i}")])
    await add_template(db, project_id, "code", {"sms": SMS})
    rule = await sim.add_fault("rate_limit", "twilio", retry_after_s=RETRY_AFTER_S)
    pipeline = [EnricherService(s), EngineService(s), delivery_module.DeliveryService(s),
                make_scheduler(settings=s)]
    try:
        # Given a provider that answers 429 (Retry-After: 30 s) to every send
        events = [await send(redis, keys, db, project_id, "code", f"u{i}")
                  for i in range(USERS)]
        await drain(*pipeline)
        # Then every task is parked until the Retry-After, and nothing went out
        assert await waiting(redis, keys) == USERS
        assert (await sim.stats())["twilio"]["requests"] == USERS
        assert await sim.messages("twilio") == []
        parked = await entries(redis, keys.scheduled)
        assert {p["dueAt"] for p in parked} == {start_ms + RETRY_AFTER_S * 1000}
        assert {p["reason"] for p in parked} == {"rateLimited"}

        # When the window has not quite passed, nothing is tried again
        clock.now_ms = start_ms + RETRY_AFTER_S * 1000 - 1
        await drain(*pipeline)
        assert (await sim.stats())["twilio"]["requests"] == USERS

        # When it has, every task is tried once more; the provider still refuses: parked again
        clock.now_ms = start_ms + RETRY_AFTER_S * 1000
        await drain(*pipeline)
        assert (await sim.stats())["twilio"]["requests"] == 2 * USERS
        assert await waiting(redis, keys) == USERS
        assert await sim.messages("twilio") == []

        # When the provider's limit lifts, still nothing goes before the second window ends
        await sim.remove_fault(rule["id"])
        clock.now_ms = start_ms + 2 * RETRY_AFTER_S * 1000 - 1
        await drain(*pipeline)
        assert await sim.messages("twilio") == []

        # Then after it, every task is sent exactly once and none is lost
        clock.now_ms = start_ms + 2 * RETRY_AFTER_S * 1000
        await drain(*pipeline)
    finally:
        for service in pipeline[:3]:
            await service.close()

    sent = await sim.messages("twilio")
    assert Counter(m["to"] for m in sent) == {f"+1555000100{i}": 1 for i in range(USERS)}
    assert all(m["acceptCount"] == 1 for m in sent)
    assert (await sim.stats())["twilio"]["requests"] == 3 * USERS
    assert await waiting(redis, keys) == 0
    assert await redis.xlen(keys.dlq) == 0
    for event_id in events:
        rows = [(r["kind"], r["status"], r["attempt"]) for r in await timeline(db, event_id)]
        assert rows == [("queued", "processing", 0), ("deferred", "scheduled", 1),
                        ("deferred", "scheduled", 2), ("sent", "sent", 3)]
    assert await db.fetchval("SELECT count(*) FROM scheduled_payloads") == 0
