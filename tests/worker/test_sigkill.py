"""A SIGKILL at any instant loses nothing (CONTRACT §3, last line): a real process is killed
while it holds entries, and a second worker reclaims and finishes every one of them."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pytest
from redis.asyncio import Redis

from notifkit.keys import Keys
from notifkit.worker import Entry

if TYPE_CHECKING:
    from .conftest import Add, Pending, WorkerFactory

HOLDER = Path(__file__).with_name("hold_entries.py")
REPO_ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 20.0


async def read_line(proc: asyncio.subprocess.Process) -> list[str]:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), STARTUP_TIMEOUT_S)
    if not line:
        assert proc.stderr is not None
        errors = (await proc.stderr.read()).decode(errors="replace")
        pytest.fail(f"the holding process exited early:\n{errors}")
    return line.decode().split()


@pytest.mark.slow
async def test_entries_held_by_a_killed_process_are_reclaimed_and_none_is_lost(
    make_worker: WorkerFactory, redis: Redis, redis_url: str,
    namespace: str, keys: Keys, add: Add, pending: Pending,
) -> None:
    n = 12
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(HOLDER), redis_url, namespace, "engine", str(n),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=REPO_ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        # Given a worker process that has taken N entries and is in the middle of them
        kind, dead_consumer = await read_line(proc)
        assert kind == "ready"
        assert dead_consumer == f"engine-{socket.gethostname()}-{proc.pid}"
        priorities = ("critical", "normal", "low")
        added: set[tuple[str, str]] = set()
        for i in range(n):
            stream = keys.enriched(priorities[i % 3])
            added.add((stream, await add(stream, {"n": i})))
        held: set[tuple[str, str]] = set()
        while held != added:
            kind, consumer, *entries = await read_line(proc)
            assert (kind, consumer) == ("holding", dead_consumer)
            held.update(tuple(e.rsplit("/", 1)) for e in entries)  # type: ignore[misc]
        group = keys.group("engine")
        for stream in keys.enriched_all():
            reply = await redis.xpending_range(stream, group, "-", "+", n)
            assert {cast(bytes, r["consumer"]).decode() for r in reply} <= {dead_consumer}

        # When it is killed without any chance to clean up
        proc.send_signal(signal.SIGKILL)
        assert await asyncio.wait_for(proc.wait(), STARTUP_TIMEOUT_S) == -signal.SIGKILL
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()

    # Then a second worker reclaims and processes every entry, each exactly once
    seen: list[tuple[str, str, int, bool]] = []

    async def process(batch: list[Entry]) -> None:
        seen.extend((e.stream, e.id, e.attempt, e.reclaimed) for e in batch)

    survivor = make_worker(process)
    assert survivor.consumer != dead_consumer
    for _round in range(5):  # bounded: one drain is expected to be enough
        await survivor.run_until_idle()
        if len(seen) >= n:
            break
    assert sorted((stream, entry_id) for stream, entry_id, _a, _r in seen) == sorted(added)
    assert all(reclaimed and attempt == 2 for _s, _id, attempt, reclaimed in seen)
    assert survivor.stats.reclaimed == n
    assert survivor.stats.processed == n
    for stream in keys.enriched_all():
        assert await pending(stream, group) == 0
    for stream, entry_id in added:
        assert await redis.exists(keys.attempts(group, entry_id, stream)) == 0
