"""Two scheduler processes: one polls; SIGKILL it and the other takes over within the lock
TTL. Every task leaves once, none early, none lost (SCENARIOS: scheduler_failover)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import cast

import asyncpg
import pytest
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.keys import SCHEDULER_SHARDS, Keys
from notifkit.streams import decode, xadd
from tests.support.streams import xrange

from .helpers import scheduled_task

REPO_ROOT = Path(__file__).resolve().parents[2]
LOCK_TTL_S = 2
POLL_INTERVAL_S = 0.05
STARTUP_TIMEOUT_S = 30.0
# Scheduling slack on a busy two-core machine, on top of the contract's bound.
SLACK_S = 1.5


async def wait_for(predicate: object, timeout_s: float, what: str) -> None:
    """Poll a real process's effect on Redis until ``predicate()`` holds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate():  # type: ignore[operator]
            return
        await asyncio.sleep(0.02)
    pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")


async def start_scheduler(settings: Settings, log_path: Path) -> asyncio.subprocess.Process:
    env = {
        **os.environ,
        "REDIS_URL": settings.redis_url,
        "DATABASE_URL": settings.database_url,
        "NOTIFKIT_NAMESPACE": settings.namespace,
        "DB_SCHEMA": settings.db_schema,
        "AUTO_MIGRATE": "false",
        "SCHEDULER_LOCK_TTL_SECONDS": str(LOCK_TTL_S),
        "SCHEDULER_POLL_INTERVAL_SECONDS": str(POLL_INTERVAL_S),
        "RECLAIM_INTERVAL_SECONDS": "0.5",
        "RECLAIM_MIN_IDLE_SECONDS": "1",
        "LOG_FORMAT": "text",
        "PYTHONUNBUFFERED": "1",
    }
    with log_path.open("ab") as log_file:  # a file, so a chatty child never blocks on a pipe
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "notifkit", "serve", "--services", "scheduler",
            cwd=REPO_ROOT, env=env, stdout=log_file, stderr=log_file,
        )


def print_logs(directory: Path) -> None:
    for log_file in sorted(directory.glob("scheduler-*.log")):
        print(f"--- {log_file.name}\n{log_file.read_text(errors='replace')[-4000:]}")


def holder_pid(token: bytes | None) -> int | None:
    """The pid in a lock token ``scheduler-{host}-{pid}:{random}``."""
    if token is None:
        return None
    consumer = token.decode().rsplit(":", 1)[0]
    return int(consumer.rsplit("-", 1)[1])


@pytest.mark.slow
async def test_the_other_scheduler_takes_over_a_killed_poller_and_nothing_is_lost(
    settings: Settings, redis: Redis, db: asyncpg.Pool, project_id: str, tmp_path: Path
) -> None:
    keys = Keys(settings.namespace)
    procs = [await start_scheduler(settings, tmp_path / f"scheduler-{i}.log") for i in range(2)]
    try:
        # Given two scheduler processes, one of them holding the poll lock
        pids = {p.pid for p in procs}

        async def locked() -> bool:
            return holder_pid(cast(bytes | None, await redis.get(keys.scheduler_lock))) in pids

        await wait_for(locked, STARTUP_TIMEOUT_S, "a scheduler to take the poll lock")
        first = holder_pid(cast(bytes | None, await redis.get(keys.scheduler_lock)))
        poller = next(p for p in procs if p.pid == first)
        survivor = next(p for p in procs if p.pid != first)

        # And 120 tasks due over the next few seconds, all of them scheduled
        start_ms = time.time_ns() // 1_000_000
        tasks = [
            scheduled_task(keys, project_id, start_ms + 800 + 40 * i, task_id=uuid.uuid4().hex)
            for i in range(120)
        ]
        for task in tasks:
            await xadd(redis, keys.scheduled, task, maxlen=100_000)

        async def all_scheduled() -> bool:
            waiting = sum([await redis.zcard(keys.scheduled_shard(s)) for s in SCHEDULER_SHARDS])
            sent = await redis.xlen(keys.outbound("normal"))
            return bool(waiting + sent == len(tasks))

        await wait_for(all_scheduled, STARTUP_TIMEOUT_S, "every task to be scheduled")

        # When the polling process is SIGKILLed while tasks are falling due
        async def some_sent() -> bool:
            return bool(await redis.xlen(keys.outbound("normal")) >= 10)

        await wait_for(some_sent, STARTUP_TIMEOUT_S, "the first tasks to leave")
        poller.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        assert await redis.xlen(keys.outbound("normal")) < len(tasks)  # killed mid-run
        assert await asyncio.wait_for(poller.wait(), STARTUP_TIMEOUT_S) == -signal.SIGKILL

        # Then the other process takes the lock within the lock's TTL
        async def taken_over() -> bool:
            holder = holder_pid(cast(bytes | None, await redis.get(keys.scheduler_lock)))
            return holder == survivor.pid

        await wait_for(taken_over, LOCK_TTL_S + STARTUP_TIMEOUT_S, "the survivor to take over")
        takeover_s = time.monotonic() - killed_at
        assert takeover_s <= LOCK_TTL_S + POLL_INTERVAL_S + SLACK_S

        # And every task leaves exactly once, none before its due time
        last_due_s = (tasks[-1]["dueAt"] - time.time_ns() // 1_000_000) / 1000

        async def all_sent() -> bool:
            return bool(await redis.xlen(keys.outbound("normal")) >= len(tasks))

        await wait_for(all_sent, max(last_due_s, 0) + LOCK_TTL_S + 15, "every task to leave")
        entries = await xrange(redis, keys.outbound("normal"))
        sent = Counter(decode(fields)["taskId"] for _id, fields in entries)
        assert sent == {t["taskId"]: 1 for t in tasks}
        due = {t["taskId"]: t["dueAt"] for t in tasks}
        for entry_id, fields in entries:
            added_ms = int(entry_id.decode().split("-")[0])  # Redis's clock, same host
            assert added_ms >= due[decode(fields)["taskId"]]

        # And the rows of moved tasks are deleted from PostgreSQL
        async def rows_gone() -> bool:
            return bool(await db.fetchval("SELECT count(*) FROM scheduled_payloads") == 0)

        await wait_for(rows_gone, STARTUP_TIMEOUT_S, "moved rows to be deleted")
        assert survivor.returncode is None
    except BaseException:
        print_logs(tmp_path)
        raise
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except TimeoutError:
                proc.kill()
                await proc.wait()
