"""The system under test: notifkit processes, the simulators, and the data they run on.

Each run gets its own PostgreSQL schema and Redis namespace (removed afterwards), a project,
an API key, one template and ``users`` users inserted in bulk with ``generate_series`` (no API
calls), each with an e-mail address, in two segments: the first 10,000 users and all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import asyncpg
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.db.migrate import migrate
from notifkit.errors import MalformedPayload
from notifkit.keys import Keys
from notifkit.streams import as_str, decode
from scenarios.harness import remove_run_data, service_urls, stream_backlog
from scenarios.processes import (
    ManagedProcess,
    child_env,
    free_port,
    python_module,
    wait_for_port,
)
from simulators import SimulatorClient

ADMIN_KEY = "bench-admin-key-0123456789"
SECRET = "bench-secret-0123456789abcdef"
TEMPLATE = "bench"
TEMPLATE_CONTENT = {
    "email": {"subject": "Hello {{ user.id }}", "text": "Message {{ data.n }} for {{ user.id }}"},
}
SMALL_SEGMENT = "first-10k"
LARGE_SEGMENT = "everyone"
SMALL_SEGMENT_SIZE = 10_000
# The simulators keep this many messages; a phase never needs more than the control API's
# 100,000-message answer, so a little more is enough.
SIM_MAX_MESSAGES = 150_000
STREAM_PAGE = 5_000

# The services each topology runs, per process.
TOPOLOGIES: dict[str, dict[str, list[str]]] = {
    "all": {"notifkit": ["all"]},
    "split": {
        "api": ["api"],
        "pipeline": ["enricher", "engine", "events", "scheduler", "workflow", "ai"],
        "delivery": ["delivery"],
    },
}


def user_id(index: int) -> str:
    return f"user-{index:06d}"


def peak_rss_mb(pid: int | None) -> float | None:
    """VmHWM of a live process, in MiB (None when it is gone or /proc is missing)."""
    if pid is None:
        return None
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return None


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time a live process has used, in seconds."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def pids_named(*names: str) -> list[int]:
    """Pids of every process whose command name is one of ``names`` (redis-server, postgres)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().strip() in names:
                    found.append(int(entry.name))
    return found


class BenchSystem:
    """Owns the schema, namespace, simulators and notifkit processes of one benchmark run."""

    def __init__(self, folder: Path, *, users: int, env: Mapping[str, str] | None = None) -> None:
        self.redis_url, self.database_url = service_urls()
        suffix = secrets.token_hex(4)
        self.namespace = f"bench-{suffix}"
        self.schema = f"bench_{suffix}"
        self.keys = Keys(self.namespace)
        self.folder = folder
        self.users = users
        self.extra_env = dict(env or {})
        self.settings = Settings(
            redis_url=self.redis_url, database_url=self.database_url,
            namespace=self.namespace, db_schema=self.schema, secret=SECRET,
        )
        self.redis: Redis = Redis.from_url(self.redis_url)
        self.db: asyncpg.Pool | None = None
        self.sim_port = free_port()
        self.smtp_port = free_port()
        self.sim_url = f"http://127.0.0.1:{self.sim_port}"
        self.sim = SimulatorClient(self.sim_url, timeout_s=120.0)
        self.simulators: ManagedProcess | None = None
        self.processes: dict[str, ManagedProcess] = {}
        self.api_port = 0
        self.project_id = ""
        self.api_key = "bench-key-" + secrets.token_hex(16)

    # -- lifecycle ---------------------------------------------------------------------
    async def open(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        await migrate(self.settings)
        from notifkit.db.pool import create_pool

        self.db = await create_pool(self.settings, max_size=4)
        self.simulators = ManagedProcess(
            "simulators",
            python_module("simulators", "--host", "127.0.0.1", "--port", str(self.sim_port),
                          "--smtp-port", str(self.smtp_port), "--seed", "1",
                          "--max-messages", str(SIM_MAX_MESSAGES), "--log-level", "WARNING"),
            child_env(), self.folder / "simulators.log",
        )
        await self.simulators.start()
        await wait_for_port("127.0.0.1", self.sim_port, 30, self.simulators)

    async def close(self) -> None:
        await self.stop_topology()
        if self.simulators is not None:
            with contextlib.suppress(Exception):
                await self.simulators.terminate(timeout_s=10)
            self.simulators.close_logs()
        await self.sim.close()
        await remove_run_data(self.db, self.redis, self.schema, self.namespace)

    # -- data --------------------------------------------------------------------------
    async def seed(self) -> None:
        """A project, its key, the template and the users, straight into PostgreSQL."""
        assert self.db is not None
        async with self.db.acquire() as conn, conn.transaction():
            self.project_id = str(await conn.fetchval(
                "INSERT INTO projects (name) VALUES ('benchmark') RETURNING id"))
            await conn.execute(
                "INSERT INTO project_api_keys (project_id, key_hash, role, name) "
                "VALUES ($1, $2, 'full', 'benchmark')",
                self.project_id, hashlib.sha256(self.api_key.encode()).hexdigest())
            await conn.execute(
                "INSERT INTO templates (project_id, id, content) VALUES ($1, $2, $3)",
                self.project_id, TEMPLATE, TEMPLATE_CONTENT)
            await conn.execute(
                "INSERT INTO users (project_id, id, locale) "
                "SELECT $1, 'user-' || lpad(g::text, 6, '0'), 'en' "
                "FROM generate_series(0, $2 - 1) g", self.project_id, self.users)
            await conn.execute(
                "INSERT INTO user_contacts (project_id, user_id, channel, target) "
                "SELECT project_id, id, 'email', id || '@example.com' FROM users "
                "WHERE project_id = $1", self.project_id)
            await conn.execute(
                "INSERT INTO user_segments (project_id, user_id, segment) "
                "SELECT project_id, id, $2 FROM users WHERE project_id = $1",
                self.project_id, LARGE_SEGMENT)
            await conn.execute(
                "INSERT INTO user_segments (project_id, user_id, segment) "
                "SELECT project_id, id, $2 FROM users WHERE project_id = $1 "
                "ORDER BY id LIMIT $3", self.project_id, SMALL_SEGMENT, SMALL_SEGMENT_SIZE)
        await self.db.execute("ANALYZE")

    # -- notifkit processes --------------------------------------------------------------
    def env_for(self, services: Sequence[str]) -> dict[str, str]:
        return child_env(
            REDIS_URL=self.redis_url,
            DATABASE_URL=self.database_url,
            DB_SCHEMA=self.schema,
            NOTIFKIT_NAMESPACE=self.namespace,
            NOTIFKIT_SERVICES=",".join(services),
            NOTIFKIT_ADMIN_KEY=ADMIN_KEY,
            NOTIFKIT_SECRET=SECRET,
            NOTIFKIT_SIMULATOR_URL=self.sim_url,
            AUTO_MIGRATE="false",
            # One line per notification per stage would measure the logger, not notifkit.
            LOG_LEVEL="WARNING",
            LOG_FORMAT="json",
            # The per-project API rate limit would cap every figure at its default.
            API_RATE_PER_SECOND="1000000",
            API_RATE_BURST="1000000",
            PORT=str(self.api_port),
            **self.extra_env,
        )

    async def start_topology(self, topology: str) -> None:
        await self.stop_topology()
        self.api_port = free_port()
        for name, services in TOPOLOGIES[topology].items():
            proc = ManagedProcess(name, python_module("notifkit", "serve"),
                                  self.env_for(services), self.folder / f"{topology}-{name}.log")
            await proc.start()
            self.processes[name] = proc
        api = next(p for n, p in self.processes.items()
                   if "api" in TOPOLOGIES[topology][n] or "all" in TOPOLOGIES[topology][n])
        await wait_for_port("127.0.0.1", self.api_port, 60, api)
        await self.wait_for_workers(len(self.processes))

    async def wait_for_workers(self, processes: int, timeout_s: float = 60.0) -> None:
        """Until every process's workers have sent their first heartbeat."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            beats = [k async for k in self.redis.scan_iter(
                match=self.keys.health("*"), count=1000)]
            services = {k.decode().rsplit(":", 1)[-1].split("-", 1)[0] for k in beats}
            if {"enricher", "engine", "delivery", "events"} <= services:
                return
            for proc in self.processes.values():
                if not proc.running:
                    raise RuntimeError(f"{proc.name} exited at start:\n{proc.tail()}")
            await asyncio.sleep(0.2)
        raise TimeoutError("the workers did not report a heartbeat in time")

    async def stop_topology(self) -> dict[str, dict[str, float | None]]:
        """SIGTERM every notifkit process; returns each one's peak RSS and CPU seconds."""
        usage = self.usage()
        for proc in self.processes.values():
            with contextlib.suppress(Exception):
                await proc.terminate(timeout_s=15)
            proc.close_logs()
        self.processes = {}
        return usage

    def cpu_by_process(self) -> dict[str, float]:
        """CPU seconds used so far by each notifkit process, the simulators, Redis and
        PostgreSQL (every postgres process: other databases' work included)."""
        used: dict[str, float] = {}
        for name, proc in self.processes.items():
            used[name] = cpu_seconds(proc.pid) or 0.0
        if self.simulators is not None:
            used["simulators"] = cpu_seconds(self.simulators.pid) or 0.0
        for label, comm in (("redis", "redis-server"), ("postgres", "postgres")):
            used[label] = sum(cpu_seconds(pid) or 0.0 for pid in pids_named(comm))
        return used

    def usage(self) -> dict[str, dict[str, float | None]]:
        return {name: {"peak_rss_mb": peak_rss_mb(p.pid), "cpu_s": cpu_seconds(p.pid)}
                for name, p in self.processes.items()}

    def check_alive(self) -> None:
        for proc in self.processes.values():
            if not proc.running:
                raise RuntimeError(f"{proc.name} died:\n{proc.tail()}")

    # -- observing ------------------------------------------------------------------------
    async def backlog(self) -> int:
        """Entries some group has not yet acked, over every stream."""
        return sum((await stream_backlog(self.redis, self.keys)).values())

    async def stream_times(self, stream: str, field: str, since_s: float) -> dict[str, float]:
        """When each entry written to ``stream`` since ``since_s`` was added (the ms inside its
        id, in epoch seconds), by its payload's ``field``; the first entry wins."""
        times: dict[str, float] = {}
        start = f"{int(since_s * 1000)}-0"
        while True:
            page: Any = await self.redis.xrange(stream, min=start, count=STREAM_PAGE)
            for entry_id, fields in page:
                with contextlib.suppress(MalformedPayload):
                    key = decode(fields).get(field)
                    if isinstance(key, str) and key not in times:
                        times[key] = int(as_str(entry_id).split("-")[0]) / 1000
            if len(page) < STREAM_PAGE:
                return times
            start = "(" + as_str(page[-1][0])

    async def accepted_at_sim(self) -> int:
        stats: Any = await self.sim.stats()
        return sum(int(s.get("accepted", 0)) for s in stats.values())
