"""A scenario run stopped with SIGTERM (or Ctrl-C) stops every process it started and removes
its schema and Redis keys, as a finished run does: while its system starts and once it runs."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import pytest
import redis

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")]


def _children(pid: int) -> dict[int, dict[str, str]]:
    """The processes whose parent is ``pid``, with their environment."""
    found: dict[int, dict[str, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat.rpartition(")")[2].split()[1]) != pid:
                continue
            raw = (entry / "environ").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        env = dict(item.partition("=")[::2] for item in raw.decode(errors="replace").split("\0")
                   if "=" in item)
        found[int(entry.name)] = env
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


async def _schema_exists(database_url: str, schema: str) -> bool:
    conn = await asyncpg.connect(database_url)
    try:
        return bool(await conn.fetchval("SELECT 1 FROM pg_namespace WHERE nspname = $1", schema))
    finally:
        await conn.close()


@pytest.mark.parametrize("settle_s", [0.0, 8.0], ids=["starting", "running"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_run_leaves_nothing_behind(
    signum: signal.Signals, settle_s: float, redis_url: str, database_url: str, tmp_path: Path
) -> None:
    env = dict(os.environ, NOTIFKIT_TEST_REDIS_URL=redis_url,
               NOTIFKIT_TEST_DATABASE_URL=database_url)
    runner = subprocess.Popen(
        [sys.executable, "-m", "scenarios", "run", "key_revocation", "--set", "watch_s=60",
         "--json", str(tmp_path / "results.json")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    started: dict[int, dict[str, str]] = {}
    try:
        deadline = time.monotonic() + 60
        while len([e for e in started.values() if "DB_SCHEMA" in e]) < 2:
            assert time.monotonic() < deadline, "the scenario never started its processes"
            time.sleep(0.1)
            started.update(_children(runner.pid))
        time.sleep(settle_s)
        started.update(_children(runner.pid))
        runner.send_signal(signum)
        _, err = runner.communicate(timeout=60)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == 130, err
    assert "Traceback" not in err
    assert [pid for pid in started if _alive(pid)] == []
    named = next(e for e in started.values() if "DB_SCHEMA" in e)
    client = redis.Redis.from_url(redis_url)
    try:
        assert list(client.scan_iter(f"{named['NOTIFKIT_NAMESPACE']}:*", count=1000)) == []
    finally:
        client.close()
    assert not asyncio.run(_schema_exists(database_url, named["DB_SCHEMA"]))
