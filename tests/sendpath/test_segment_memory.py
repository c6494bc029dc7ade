"""A 100,000-user segment fans out with flat memory: the enricher works a page at a time,
so its peak RSS grows by a small, fixed amount however large the segment is."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import asyncpg
import pytest
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.keys import Keys
from tests.support.streams import xrevrange

from .helpers import send

REPO_ROOT = Path(__file__).resolve().parents[2]
MEMBERS = 100_000
# What a page of enriched messages may cost on top of an idle enricher. Holding the whole
# segment would take about 600 MB (100,000 enriched messages as Python objects plus their
# encoded entries, measured with tracemalloc); paging measured about 15 MB.
GROWTH_BOUND_MB = 60
DEADLINE_S = 240.0  # generous: a loaded 2-core CI machine is slow, and this bounds memory, not time


def status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
async def test_a_100k_segment_fans_out_with_flat_memory(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, sp_settings: Settings,
) -> None:
    # Given 100,000 members of a segment, each with an address and a preference
    await db.execute(
        "INSERT INTO users (project_id, id, attributes, locale) "
        "SELECT $1, 'user-' || lpad(g::text, 6, '0'), jsonb_build_object('n', g), 'en' "
        "FROM generate_series(1, $2) g", project, MEMBERS)
    await db.execute(
        "INSERT INTO user_contacts (project_id, user_id, channel, target) "
        "SELECT project_id, id, 'email', id || '@example.com' FROM users "
        "WHERE project_id = $1", project)
    await db.execute(
        "INSERT INTO user_segments (project_id, user_id, segment) "
        "SELECT project_id, id, 'everyone' FROM users WHERE project_id = $1", project)
    await db.execute(
        "INSERT INTO user_channel_preferences (project_id, user_id, channel, enabled) "
        "SELECT project_id, id, 'sms', false FROM users WHERE project_id = $1", project)

    # And an enricher running in a process of its own, idle
    env = {**os.environ, "REDIS_URL": sp_settings.redis_url,
           "DATABASE_URL": sp_settings.database_url, "NOTIFKIT_NAMESPACE": sp_settings.namespace,
           "DB_SCHEMA": sp_settings.db_schema, "AUTO_MIGRATE": "false",
           "LOG_LEVEL": "WARNING", "LOG_FORMAT": "text"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "notifkit", "serve", "--services", "enricher",
        cwd=REPO_ROOT, env=env, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    loop = asyncio.get_running_loop()
    try:
        group = keys.group("enricher")
        deadline = loop.time() + DEADLINE_S
        while not await _has_group(redis, keys.inbound("low"), group):
            assert proc.returncode is None, "the enricher exited at start"
            assert loop.time() < deadline, "the enricher never joined its group"
            await asyncio.sleep(0.05)
        idle_kb = status_kb(proc.pid, "VmRSS")

        # When a notification goes to the whole segment
        await send(redis, keys, db, project, "t", {"segment": "everyone"}, priority="low")
        enriched = keys.enriched("low")
        while await redis.xlen(enriched) < MEMBERS or \
                (await redis.xpending(keys.inbound("low"), group))["pending"]:
            if proc.returncode is not None or loop.time() > deadline:
                assert proc.stderr is not None
                errors = (await proc.stderr.read()).decode(errors="replace")
                pytest.fail(f"fan-out stopped at {await redis.xlen(enriched)}:\n{errors}")
            await asyncio.sleep(0.1)
        peak_kb = status_kb(proc.pid, "VmHWM")
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()

    # Then every member got exactly one enriched message, and the peak stayed near idle
    assert await redis.xlen(enriched) == MEMBERS
    last = await xrevrange(redis, enriched, count=1)
    assert b"user-100000" in last[0][1][b"data"]
    growth_mb = (peak_kb - idle_kb) / 1024
    print(f"enricher RSS idle {idle_kb / 1024:.0f} MB, peak {peak_kb / 1024:.0f} MB, "
          f"growth {growth_mb:.1f} MB for {MEMBERS} recipients")
    assert growth_mb < GROWTH_BOUND_MB


async def _has_group(redis: Redis, stream: str, group: str) -> bool:
    try:
        groups = await redis.xinfo_groups(stream)
    except Exception:
        return False
    return any(g["name"].decode() == group for g in groups)
