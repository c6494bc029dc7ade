"""What a scenario or benchmark run leaves behind is removed, and nothing else is."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import pytest
import redis.asyncio as aioredis

from notifkit.db.migrate import migrate
from scenarios.harness import RunOptions, System, remove_run_data
from scenarios.processes import ManagedProcess


async def test_every_key_of_the_run_goes_and_only_those(
    redis_url: str, redis: aioredis.Redis, namespace: str
) -> None:
    # More keys than one page of the scan, and a neighbour whose name merely starts the same;
    # all inside the test's namespace, which the fixture empties whatever happens.
    run = f"{namespace}:run"
    keys = [f"{run}:notif:processed:delivery:{n}" for n in range(2_345)]
    writes = redis.pipeline(transaction=False)
    for key in keys:
        writes.set(key, b"1")
    writes.set(f"{run}x:kept", b"1")
    writes.set(f"{namespace}:kept", b"1")
    await writes.execute()

    await remove_run_data(None, aioredis.Redis.from_url(redis_url), "unused", run)

    assert [key async for key in redis.scan_iter(match=f"{run}:*", count=1000)] == []
    assert await redis.exists(f"{run}x:kept", f"{namespace}:kept") == 2


async def test_a_clean_up_cancelled_again_and_again_still_stops_and_removes_everything(
    redis_url: str, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a run with processes, a schema and keys of its own
    monkeypatch.setenv("NOTIFKIT_TEST_REDIS_URL", redis_url)
    monkeypatch.setenv("NOTIFKIT_TEST_DATABASE_URL", database_url)
    system = System(RunOptions(name="cleanup", run_dir=tmp_path), {})
    await migrate(system.settings)
    await system.redis.set(f"{system.namespace}:left", b"1")
    for name in ("first", "second", "third"):
        process = ManagedProcess(name, ["sleep", "60"], {}, tmp_path / f"{name}.log")
        await process.start()
        system.processes[name] = process
    try:
        # When its clean-up is cancelled, then cancelled again at every step (a second Ctrl-C,
        # a supervisor insisting)
        cleanup = asyncio.ensure_future(system.__aexit__(None, None, None))
        await asyncio.sleep(0)  # under way, as a run's clean-up is when the repeat comes
        while not cleanup.done():
            cleanup.cancel()
            await asyncio.sleep(0)
        # Then it still stops every process and removes the run's data, and only then says
        # it was cancelled; the first cancellation used to leave the rest running
        with pytest.raises(asyncio.CancelledError):
            await cleanup
        assert [name for name, p in system.processes.items() if p.running] == []
        check = aioredis.Redis.from_url(redis_url)
        try:
            assert await check.exists(f"{system.namespace}:left") == 0
        finally:
            await check.aclose()
        conn = await asyncpg.connect(database_url)
        try:
            assert await conn.fetchval("SELECT 1 FROM pg_namespace WHERE nspname = $1",
                                       system.schema) is None
        finally:
            await conn.close()
    finally:
        # Whatever a failing clean-up left behind goes, so a failure leaves nothing either.
        for process in system.processes.values():
            await process.kill()
        await remove_run_data(await asyncpg.create_pool(database_url, min_size=1, max_size=1),
                              aioredis.Redis.from_url(redis_url), system.schema,
                              system.namespace)
