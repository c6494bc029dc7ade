"""A delivery process killed with SIGKILL in the middle of a batch: the survivor reclaims
its entries, nothing is lost, and nothing the outbox records as sent is sent again."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import asyncpg
import pytest
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.keys import Keys
from notifkit.services.delivery import DeliveryService
from notifkit.services.engine import EngineService
from notifkit.services.enricher import EnricherService
from simulators import SimulatorServer

from .conftest import ServiceFactory
from .helpers import add_template, add_user, drain, entries, send, timeline

REPO_ROOT = Path(__file__).resolve().parents[2]
USERS = 40
DEADLINE_S = 30.0


def delivery_env(settings: Settings, sim: SimulatorServer) -> dict[str, str]:
    return {
        **os.environ,
        "REDIS_URL": settings.redis_url,
        "DATABASE_URL": settings.database_url,
        "NOTIFKIT_NAMESPACE": settings.namespace,
        "DB_SCHEMA": settings.db_schema,
        "AUTO_MIGRATE": "false",
        "NOTIFKIT_SIMULATOR_URL": sim.base_url,
        "NOTIFKIT_SECRET": settings.secret,
        "WORKER_CONCURRENCY": "10",
        "PROVIDER_TIMEOUT_SECONDS": "5",
        # The doomed process must not reclaim anything itself.
        "RECLAIM_INTERVAL_SECONDS": "600",
        "RECLAIM_MIN_IDLE_SECONDS": "600",
        "LOG_FORMAT": "text",
        "LOG_LEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
    }


async def outbox(db: asyncpg.Pool) -> dict[str, str]:
    rows = await db.fetch("SELECT task_id, status FROM delivery_outbox")
    return {r["task_id"]: r["status"] for r in rows}


@pytest.mark.slow
async def test_a_delivery_process_killed_mid_batch_loses_nothing_and_resends_nothing_sent(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    # Given 40 SMS tasks waiting for delivery, and a provider that takes 300 ms a message
    for i in range(USERS):
        await add_user(db, project, f"u{i:02d}", contacts=[("sms", f"+1555000{i:04d}")])
    await add_template(db, project, "t", {"sms": {"text": "Hello {{ user.id }}"}})
    event_id = await send(redis, keys, db, project, "t", [f"u{i:02d}" for i in range(USERS)])
    await drain(await services(EnricherService), await services(EngineService))
    assert len(await entries(redis, keys.outbound("normal"))) == USERS
    await sim.add_fault("latency", "twilio", delay_ms=300)

    # When a delivery process is killed while one batch is recorded sent and another in flight
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "notifkit", "serve", "--services", "delivery",
        cwd=REPO_ROOT, env=delivery_env(sim_settings, sim),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE_S
        while True:
            statuses = list((await outbox(db)).values())
            if statuses.count("sent") >= 10 and "sending" in statuses:
                break
            if proc.returncode is not None or loop.time() > deadline:
                assert proc.stderr is not None
                errors = (await proc.stderr.read()).decode(errors="replace")
                pytest.fail(f"the delivery process never got mid-batch: {statuses}\n{errors}")
            await asyncio.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        assert await proc.wait() == -signal.SIGKILL
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    at_kill = await outbox(db)
    sent_at_kill = {t for t, s in at_kill.items() if s == "sent"}
    in_flight_at_kill = {t for t, s in at_kill.items() if s == "sending"}
    assert sent_at_kill
    assert in_flight_at_kill
    group = keys.group("delivery")
    assert (await redis.xpending(keys.outbound("normal"), group))["pending"] > 0

    # And a survivor takes over (after the provider's held answers are in)
    await sim.clear_faults()
    survivor = await services(DeliveryService, sim_settings)
    await drain(survivor)

    # Then every task was delivered, nothing is pending, and each has one 'sent' row
    messages = await sim.messages("twilio")
    accepted: dict[str, int] = {}
    for m in messages:
        task_id = m["taskId"]
        assert task_id is not None
        accepted[task_id] = max(accepted.get(task_id, 0), m["acceptCount"])
    assert len(accepted) == USERS
    assert (await redis.xpending(keys.outbound("normal"), group))["pending"] == 0
    sent_rows = [r for r in await timeline(db, event_id) if r["kind"] == "sent"]
    assert sorted(r["task_id"] for r in sent_rows) == sorted(accepted)
    assert set((await outbox(db)).values()) == {"sent"}

    # And no task recorded as sent before the kill was sent again; duplicates exist only
    # where a send was in flight when the process died
    assert all(accepted[t] == 1 for t in sent_at_kill)
    duplicated = {t for t, n in accepted.items() if n > 1}
    assert duplicated <= in_flight_at_kill
    flagged = {r["task_id"] for r in sent_rows if r["metadata"].get("possibleDuplicate")}
    assert duplicated <= flagged


async def test_a_retry_that_finds_its_task_sent_and_recorded_adds_no_second_sent_row(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by the SIGKILL test above on a slow machine: a process that sent a batch and
    wrote its 'sent' rows, then died before acking it, left the retry to write a second
    'sent' row (a new attempt number, so the unique key let it in)."""
    # Given one SMS task, and a delivery process that dies after its batch is recorded
    # (its outcome can never be acked)
    await add_user(db, project, "u1", contacts=[("sms", "+15550001")])
    await add_template(db, project, "t", {"sms": {"text": "Hello"}})
    event_id = await send(redis, keys, db, project, "t", "u1")
    await drain(await services(EnricherService), await services(EngineService))
    doomed = await services(DeliveryService, sim_settings)

    async def dies(*_args: object) -> None:
        raise ConnectionError("the process died before acking")

    monkeypatch.setattr(doomed.worker, "_commit", dies)
    await doomed.worker.run_until_idle(reclaim=False)
    assert [r["kind"] for r in await timeline(db, event_id)].count("sent") == 1
    group = keys.group("delivery")
    assert (await redis.xpending(keys.outbound("normal"), group))["pending"] == 1

    # When another process takes the entry over
    await drain(await services(DeliveryService, sim_settings))

    # Then the task was sent once, its entry is acked, and its timeline says 'sent' once
    assert len(await sim.messages("twilio")) == 1
    assert (await redis.xpending(keys.outbound("normal"), group))["pending"] == 0
    sent_rows = [r for r in await timeline(db, event_id) if r["kind"] == "sent"]
    assert [(r["attempt"], r["status"]) for r in sent_rows] == [(1, "sent")]
