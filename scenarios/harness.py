"""The real system for a scenario: services as OS processes, simulators, Redis and PostgreSQL.

    async with System(run, layout={"api": ["api"], "pipeline": [...], "delivery-1": [...]}) as sys:
        await sys.bootstrap(users=100)
        ids = await sys.send_many(...)
        await sys.kill("delivery-1")
        await sys.quiesce()
        result = await sys.account(ids)

Redis and PostgreSQL are found the way the test fixtures find them (env URLs, then the local
default ports); each run gets its own Redis namespace and PostgreSQL schema, removed afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from notifkit.config import Settings
from notifkit.db.migrate import migrate
from notifkit.keys import Keys
from scenarios.processes import (
    ManagedProcess,
    child_env,
    free_port,
    python_module,
    wait_for_port,
)
from scenarios.report import Progress, ScenarioResult
from simulators import SimulatorClient

ADMIN_KEY = "scenario-admin-key-0123456789"
SECRET = "scenario-secret-0123456789abcdef"
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"
DEFAULT_DATABASE = "postgresql://postgres@127.0.0.1:5432/test"

SIM_MAX_MESSAGES = 100_000
# The most unread entries counted per group when Redis cannot tell a group's lag.
UNREAD_SCAN = 10_000
SKIP_STATUSES = ("skipped", "suppressed", "throttled")
# The simulated providers that honour an idempotency key (SIMULATORS.md): never a duplicate.
IDEMPOTENT_PROVIDERS = frozenset({"resend"})
# A timeline row of a failed attempt whose answer never came: the send may have reached the
# provider, so a second copy of it is explained.
_UNANSWERED_ATTEMPT = ("(kind = 'failed' AND (detail LIKE 'no answer within%' "
                       "OR detail LIKE 'connection failed%'))")
NOTHING_ACCEPTED = ("no notification was accepted: the run showed nothing about what happens to "
                    "one")


def service_urls() -> tuple[str, str]:
    redis_url = os.environ.get("NOTIFKIT_TEST_REDIS_URL") or os.environ.get("REDIS_URL")
    database_url = (os.environ.get("NOTIFKIT_TEST_DATABASE_URL")
                    or os.environ.get("DATABASE_URL"))
    return redis_url or DEFAULT_REDIS, database_url or DEFAULT_DATABASE


@dataclass
class RunOptions:
    name: str
    seed: int = 1
    run_dir: Path = Path("scenario-results")
    reclaim_s: float = 1.0
    env: dict[str, str] = field(default_factory=dict)
    progress: Progress | None = None
    # Each System's folder of process logs, in the order they started (the JSON result
    # names them, so a result can be told its logs among several runs').
    log_folders: list[str] = field(default_factory=list)


@dataclass
class Sent:
    event_id: str
    user_id: str
    accepted_at: float  # wall clock, seconds


@dataclass(frozen=True)
class FaultHit:
    at: float  # epoch seconds, the simulators' clock
    provider: str
    to: str
    task_id: str


def fault_hits(log_text: str, kind: str) -> list[FaultHit]:
    """The ``kind`` faults in the simulators' text log, each provider's (SMTP's too) alike:
    ``simulators.pipeline.log_fault`` writes these lines."""

    line_re = re.compile(r"^(\S+ \S+) \w+ \S+ (\w+) fault " + re.escape(kind)
                         + r" \(rule [^)]*\) for to=(\S*) task_id=(\S+?)\.?$")
    hits: list[FaultHit] = []
    for line in log_text.splitlines():
        match = line_re.match(line.strip())
        if match:
            at = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            hits.append(FaultHit(at, match.group(2), match.group(3), match.group(4)))
    return hits


def idempotent_replays(log_text: str) -> Counter[tuple[str, str]]:
    """``(provider, idempotency key)`` -> how many requests the simulators answered from their
    idempotency cache, from their text log: a task handed to such a provider again shows here,
    never as a second acceptance."""
    line_re = re.compile(r" (\w+) idempotent replay of key (\S+); nothing sent again\.$")
    replays: Counter[tuple[str, str]] = Counter()
    for line in log_text.splitlines():
        match = line_re.search(line.strip())
        if match:
            replays[(match.group(1), match.group(2))] += 1
    return replays


class System:
    """Owns every process, connection and namespace of one scenario run."""

    def __init__(self, options: RunOptions, layout: Mapping[str, Sequence[str]], *,
                 redis_url: str | None = None, service_database_url: str | None = None) -> None:
        """``redis_url`` replaces the shared Redis (a scenario's own, which it restarts);
        ``service_database_url`` is what the notifkit processes get instead of the shared
        PostgreSQL (a proxy the scenario controls), while the harness itself keeps the real
        one for migrating and accounting."""
        self.options = options
        self.layout = dict(layout)
        self.redis_url, self.database_url = service_urls()
        self.redis_url = redis_url or self.redis_url
        self.service_database_url = service_database_url or self.database_url
        suffix = secrets.token_hex(4)
        self.namespace = f"sc-{options.name}-{suffix}"
        self.schema = f"sc_{options.name}_{suffix}"[:60]
        self.keys = Keys(self.namespace)
        self.folder = options.run_dir / f"{options.name}-{suffix}"
        options.log_folders.append(str(self.folder))
        self.processes: dict[str, ManagedProcess] = {}
        self.api_ports: dict[str, int] = {}
        self.sim_port = free_port()
        self.smtp_port = free_port()
        self.redis: Redis = Redis.from_url(self.redis_url)
        self.db: asyncpg.Pool | None = None
        self.http: aiohttp.ClientSession | None = None
        self.sim = SimulatorClient(f"http://127.0.0.1:{self.sim_port}")
        self.project_id = ""
        self.api_key = ""
        self.settings = Settings(
            redis_url=self.redis_url, database_url=self.database_url,
            namespace=self.namespace, db_schema=self.schema, secret=SECRET,
        )

    # -- lifecycle -------------------------------------------------------------------
    async def __aenter__(self) -> System:
        try:
            return await self._start()
        except BaseException:
            # A start that failed or was cancelled (SIGTERM, Ctrl-C) half-way stops what it had
            # started and removes the run's data, as a finished run does.
            await self.__aexit__(None, None, None)
            raise

    async def _start(self) -> System:
        self.folder.mkdir(parents=True, exist_ok=True)
        await migrate(self.settings)
        from notifkit.db.pool import create_pool

        self.db = await create_pool(self.settings, max_size=4)
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        sim = ManagedProcess(
            "simulators",
            python_module("simulators", "--host", "127.0.0.1", "--port", str(self.sim_port),
                          "--smtp-port", str(self.smtp_port), "--seed", str(self.options.seed),
                          # Accounting reads every message back: keep as many as it asks for.
                          "--max-messages", str(SIM_MAX_MESSAGES)),
            child_env(),
            self.folder / "simulators.log",
        )
        await sim.start()
        self.processes["simulators"] = sim
        await wait_for_port("127.0.0.1", self.sim_port, 20, sim)
        for name, services in self.layout.items():
            await self.spawn(name, services)
        for name, port in self.api_ports.items():
            await wait_for_port("127.0.0.1", port, 30, self.processes[name])
        return self

    async def __aexit__(self, *exc: object) -> None:
        await to_the_end(self._stop_and_remove())

    async def _stop_and_remove(self) -> None:
        for proc in self.processes.values():
            with contextlib.suppress(Exception):
                await proc.terminate(timeout_s=10)
            proc.close_logs()
        if self.http is not None:
            await self.http.close()
        await self.sim.close()
        if self.db is None:  # stopped during its migration: the schema may exist already
            from notifkit.db.pool import create_pool

            with contextlib.suppress(Exception):
                self.db = await create_pool(self.settings, max_size=1)
        await remove_run_data(self.db, self.redis, self.schema, self.namespace)

    def env_for(self, services: Sequence[str], **extra: str) -> dict[str, str]:
        env = child_env(
            REDIS_URL=self.redis_url,
            DATABASE_URL=self.service_database_url,
            DB_SCHEMA=self.schema,
            NOTIFKIT_NAMESPACE=self.namespace,
            NOTIFKIT_SERVICES=",".join(services),
            NOTIFKIT_ADMIN_KEY=ADMIN_KEY,
            NOTIFKIT_SECRET=SECRET,
            NOTIFKIT_SIMULATOR_URL=f"http://127.0.0.1:{self.sim_port}",
            RECLAIM_INTERVAL_SECONDS=str(self.options.reclaim_s),
            RECLAIM_MIN_IDLE_SECONDS=str(self.options.reclaim_s),
            SCHEDULER_POLL_INTERVAL_SECONDS="0.2",
            HEARTBEAT_INTERVAL_SECONDS="1",
            SHUTDOWN_GRACE_SECONDS="5",
            PROVIDER_TIMEOUT_SECONDS="2",
            AUTO_MIGRATE="false",
            LOG_FORMAT="json",
        )
        env.update(self.options.env)
        env.update(extra)
        return env

    async def spawn(self, name: str, services: Sequence[str], **env: str) -> ManagedProcess:
        extra = dict(env)
        if "api" in services:
            port = self.api_ports.get(name) or free_port()
            self.api_ports[name] = port
            extra["PORT"] = str(port)
        proc = ManagedProcess(
            name, python_module("notifkit", "serve"), self.env_for(services, **extra),
            self.folder / f"{name}.log",
        )
        await proc.start()
        self.processes[name] = proc
        return proc

    async def kill(self, name: str) -> None:
        await self.processes[name].kill()

    async def restart(self, name: str) -> None:
        await self.processes[name].restart()
        if name in self.api_ports:
            await wait_for_port("127.0.0.1", self.api_ports[name], 30, self.processes[name])

    def pause(self, name: str) -> None:
        import signal

        self.processes[name].signal(signal.SIGSTOP)

    def resume(self, name: str) -> None:
        import signal

        self.processes[name].signal(signal.SIGCONT)

    def check_alive(self, result: ScenarioResult, expected: Iterable[str]) -> None:
        for name in expected:
            proc = self.processes[name]
            result.check(proc.running, f"process {name} died unexpectedly:\n{proc.tail()}")

    # -- HTTP ----------------------------------------------------------------------------
    @property
    def api_url(self) -> str:
        port = next(iter(self.api_ports.values()))
        return f"http://127.0.0.1:{port}"

    async def request(self, method: str, path: str, *, key: str | None = None,
                      json: Any = None, headers: Mapping[str, str] | None = None,
                      base: str | None = None) -> tuple[int, Any]:
        assert self.http is not None
        all_headers = {"Authorization": f"Bearer {key or self.api_key}", **(headers or {})}
        async with self.http.request(method, (base or self.api_url) + path, json=json,
                                     headers=all_headers) as resp:
            body: Any = None
            if resp.content_type == "application/json":
                body = await resp.json()
            return resp.status, body

    async def bootstrap(self, *, users: int = 10, channels: Sequence[str] = ("email",),
                        templates: Mapping[str, Any] | None = None,
                        settings: Mapping[str, Any] | None = None) -> list[str]:
        """A project, a full key, ``users`` users with a contact per channel, templates."""
        status, body = await self.request(
            "POST", "/v1/projects", key=ADMIN_KEY,
            json={"name": self.options.name, "settings": dict(settings or {})},
        )
        assert status == 201, body
        self.project_id = body["id"]
        status, body = await self.request(
            "POST", f"/v1/projects/{self.project_id}/keys", key=ADMIN_KEY,
            json={"role": "full", "name": "scenario"},
        )
        assert status == 201, body
        self.api_key = body["key"]
        for name, template in (templates or {"basic": basic_template(channels)}).items():
            status, body = await self.request("PUT", f"/v1/templates/{name}", json=template)
            assert status in (200, 201), body
        user_ids = [f"user-{i:05d}" for i in range(users)]
        sem = asyncio.Semaphore(16)

        async def put_user(user_id: str, index: int) -> None:
            async with sem:
                status, body = await self.request(
                    "PUT", f"/v1/users/{user_id}", json={"contacts": contacts_for(index, channels)}
                )
                assert status in (200, 201), body

        await asyncio.gather(*(put_user(u, i) for i, u in enumerate(user_ids)))
        return user_ids

    async def send(self, user_id: str, *, template: str = "basic",
                   priority: str = "normal", **fields: Any) -> Sent | None:
        body = {"to": user_id, "template": template, "priority": priority,
                "data": {"n": user_id}, **fields}
        try:
            status, reply = await self.request("POST", "/v1/notifications", json=body)
        except (aiohttp.ClientError, TimeoutError):
            return None
        if status != 202:
            return None
        return Sent(reply["id"], user_id, time.time())

    async def send_many(self, user_ids: Sequence[str], *, concurrency: int = 32,
                        label: str = "sending", **fields: Any) -> list[Sent]:
        sem = asyncio.Semaphore(concurrency)
        sent: list[Sent] = []

        async def one(user_id: str) -> None:
            async with sem:
                result = await self.send(user_id, **fields)
                if result is not None:
                    sent.append(result)
                    self.say(f"{label}: {len(sent)}/{len(user_ids)} accepted")

        await asyncio.gather(*(one(u) for u in user_ids))
        return sent

    async def send_paced(self, sends: Sequence[tuple[str, Mapping[str, Any]]], *,
                         rate_per_s: float, concurrency: int = 32,
                         label: str = "sending") -> list[Sent]:
        """Send ``(user_id, fields)`` pairs at about ``rate_per_s``, so faults land under load
        rather than after a burst has already drained."""
        sem = asyncio.Semaphore(concurrency)
        sent: list[Sent] = []
        started = time.monotonic()

        async def one(index: int, user_id: str, fields: Mapping[str, Any]) -> None:
            delay = started + index / rate_per_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            async with sem:
                result = await self.send(user_id, **fields)
                if result is not None:
                    sent.append(result)
                    self.say(f"{label}: {len(sent)}/{len(sends)} accepted")

        await asyncio.gather(*(one(i, u, f) for i, (u, f) in enumerate(sends)))
        return sent

    def say(self, text: str, *, force: bool = False) -> None:
        """A progress line; ``force`` for one worth keeping in a CI log (a fault injected)."""
        if self.options.progress is not None:
            self.options.progress.update(f"[{self.options.name}] {text}", force=force)

    # -- quiescence ------------------------------------------------------------------------
    async def backlog(self) -> dict[str, int]:
        """Entries not yet acked by every group of every stream, plus scheduled tasks."""
        waiting = await stream_backlog(self.redis, self.keys)
        scheduled = 0
        for shard in self.keys.scheduled_shards():
            scheduled += int(await self.redis.zcard(shard))
        if scheduled:
            waiting["scheduled"] = scheduled
        timers = int(await self.redis.zcard(self.keys.workflow_timers))
        if timers:
            waiting["workflow timers"] = timers
        return waiting

    async def quiesce(self, timeout_s: float = 60.0, *, stable_polls: int = 3) -> dict[str, int]:
        """Wait until nothing is waiting anywhere for a few polls in a row; returns what was
        still waiting at the deadline (empty = quiescent)."""
        deadline = time.monotonic() + timeout_s
        calm = 0
        waiting: dict[str, int] = {}
        while time.monotonic() < deadline:
            try:
                waiting = await self.backlog()
            except (RedisError, OSError) as exc:  # Redis coming back: not calm yet
                waiting = {f"unreadable ({exc.__class__.__name__})": 1}
            if waiting:
                calm = 0
                self.say("draining: " + ", ".join(
                    f"{k.rsplit(':', 1)[-1]}={v}" for k, v in sorted(waiting.items())[:4]))
            else:
                calm += 1
                if calm >= stable_polls:
                    return {}
            await asyncio.sleep(0.25)
        return waiting

    # -- inspecting processes and streams ---------------------------------------------------
    def consumer_of(self, name: str, service: str) -> str:
        """The consumer name the worker in process ``name`` uses (see notifkit.worker)."""
        import socket

        return f"{service}-{socket.gethostname()}-{self.processes[name].pid}"

    async def pending_of(self, name: str, service: str) -> list[tuple[str, str]]:
        """``(stream, entry id)`` pending for the consumer of ``service`` in process ``name``."""
        consumer = self.consumer_of(name, service)
        group = self.keys.group(service)
        held: list[tuple[str, str]] = []
        for stream in self.keys.all_streams():
            try:
                rows = await self.redis.xpending_range(
                    stream, group, min="-", max="+", count=10_000, consumername=consumer)
            except Exception:  # no such group on this stream
                continue
            held.extend((stream, text_of(r["message_id"])) for r in rows)
        return held

    async def pending_of_dead_consumers(self) -> dict[str, int]:
        """Entries still pending for consumers whose process is gone."""
        live = {p.pid for p in self.processes.values() if p.running}
        stale: dict[str, int] = {}
        for stream in self.keys.all_streams():
            try:
                groups = await self.redis.xinfo_groups(stream)
            except Exception:
                continue
            for group in groups:
                for consumer in await self.redis.xinfo_consumers(stream, group["name"]):
                    name = text_of(consumer["name"])
                    pid = name.rsplit("-", 1)[-1]
                    if int(consumer.get("pending") or 0) and (
                            not pid.isdigit() or int(pid) not in live):
                        stale[f"{stream}/{name}"] = int(consumer["pending"])
        return stale

    async def task_ids_of(self, entries: Iterable[tuple[str, str]]) -> set[str]:
        from notifkit.streams import decode

        task_ids: set[str] = set()
        for stream, entry_id in entries:
            for _id, fields in await self.redis.xrange(stream, entry_id, entry_id) or []:
                with contextlib.suppress(Exception):
                    task_id = decode(fields).get("taskId")  # type: ignore[arg-type]
                    if task_id:
                        task_ids.add(str(task_id))
        return task_ids

    def log_records(self, name: str) -> list[dict[str, Any]]:
        """The JSON log records process ``name`` wrote (over all its restarts)."""
        import json

        proc = self.processes[name]
        records: list[dict[str, Any]] = []
        try:
            text = proc.log_path.read_text(errors="replace")
        except OSError:
            return records
        for line in text.splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    records.append(json.loads(line))
        return records

    def count_log_lines(self, *fragments: str) -> dict[str, int]:
        """Per process: how many log messages contain every fragment."""
        counts: dict[str, int] = {}
        for name in self.processes:
            n = sum(1 for r in self.log_records(name)
                    if all(f in str(r.get("message", r.get("msg", ""))) for f in fragments))
            if n:
                counts[name] = n
        return counts

    async def duplicates(self) -> dict[str, tuple[str, int]]:
        """task id -> (provider, extra acceptances) for every task a provider accepted more
        than once, from the simulators' records."""
        most: dict[str, tuple[str, int]] = {}
        for message in await self.sim.messages(limit=SIM_MAX_MESSAGES):
            task_id = message.get("taskId")
            count = int(message.get("acceptCount") or 1)
            if task_id and count > 1 and count - 1 > most.get(task_id, ("", 0))[1]:
                most[task_id] = (message["provider"], count - 1)
        return most

    async def tasks_sent_after_lost_answers(self, task_ids: list[str]) -> set[str]:
        """Tasks whose timeline admits a possible duplicate: a send flagged
        ``possibleDuplicate``, or a failed attempt whose answer never came."""
        assert self.db is not None
        rows = await self.db.fetch(
            "SELECT DISTINCT task_id FROM message_logs WHERE project_id = $1 "
            "AND task_id = ANY($2::text[]) AND ("
            "(kind = 'sent' AND (metadata->>'possibleDuplicate')::boolean) OR "
            f"{_UNANSWERED_ATTEMPT})",
            self.project_id, task_ids)
        return {r["task_id"] for r in rows}

    async def unanswered_attempts(self, task_ids: list[str]) -> Counter[str]:
        """Per task: the failed attempts its timeline records as never answered (the send may
        have reached the provider)."""
        assert self.db is not None
        rows = await self.db.fetch(
            "SELECT task_id FROM message_logs WHERE project_id = $1 "
            f"AND task_id = ANY($2::text[]) AND {_UNANSWERED_ATTEMPT}",
            self.project_id, task_ids)
        return Counter(r["task_id"] for r in rows)

    async def stream_entries(self, stream: str) -> list[tuple[str, dict[str, Any]]]:
        """``(entry id, decoded payload)`` of every entry of ``stream``; undecodable ones are
        left out."""
        from notifkit.streams import decode

        out: list[tuple[str, dict[str, Any]]] = []
        for entry_id, fields in await self.redis.xrange(stream) or []:
            with contextlib.suppress(Exception):
                out.append((text_of(entry_id), decode(fields)))  # type: ignore[arg-type]
        return out

    async def fault_count(self, provider: str, kind: str) -> int:
        """How many requests the simulators answered with a ``kind`` fault for ``provider``."""
        stats: dict[str, Any] = dict((await self.sim.stats()).get(provider) or {})
        return int((stats.get("faults") or {}).get(kind, 0))

    async def event_of_task(self, task_id: str) -> str:
        assert self.db is not None
        value = await self.db.fetchval(
            "SELECT event_id::text FROM message_logs WHERE project_id = $1 AND task_id = $2 "
            "LIMIT 1", self.project_id, task_id)
        return str(value or "?")

    async def task_ids_of_event(self, event_id: str) -> list[str]:
        """The tasks the pipeline made for a notification (one per recipient and channel)."""
        assert self.db is not None
        rows = await self.db.fetch(
            "SELECT DISTINCT task_id FROM message_logs WHERE project_id = $1 "
            "AND event_id = $2::uuid AND channel <> ''", self.project_id, event_id)
        return [r["task_id"] for r in rows]

    async def replayed_tasks(self, provider: str) -> Counter[str]:
        """task id -> how often ``provider`` answered a repeat of the task from its idempotency
        cache (nothing sent again, so no acceptCount shows it)."""
        replays = idempotent_replays(
            self.processes["simulators"].log_path.read_text(errors="replace"))
        task_of = {str(m.get("idempotencyKey")): str(m.get("taskId"))
                   for m in await self.sim.messages(provider=provider, limit=SIM_MAX_MESSAGES)
                   if m.get("idempotencyKey") and m.get("taskId")}
        out: Counter[str] = Counter()
        for (name, key), count in replays.items():
            if name == provider:
                out[task_of.get(key, f"? (key {key})")] += count
        return out

    def simulator_faults(self, kind: str) -> list[FaultHit]:
        """Every request the simulators answered with a ``kind`` fault, from their log (the
        simulators' own clock and the recipient and task each fault hit)."""
        return fault_hits(self.processes["simulators"].log_path.read_text(errors="replace"),
                          kind)

    async def wait_until(self, done: Callable[[dict[str, int]], bool],
                         timeout_s: float) -> bool:
        """Poll :meth:`backlog` until ``done(backlog)`` holds; False at the deadline."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if done(await self.backlog()):
                return True
            await asyncio.sleep(0.1)
        return False

    # -- accounting ------------------------------------------------------------------------
    async def account(self, sent: Sequence[Sent], result: ScenarioResult, *,
                      skips_expected: bool = False, dead_letters_expected: bool = False) -> None:
        """Fill ``result`` from PostgreSQL and the simulators' records: delivered, duplicates,
        DLQ, skipped, lost, latency. Unless ``skips_expected`` (the scenario sets up
        preferences, suppressions, throttles or unusable contacts), a notification skipped
        with a reason is a violation: a skip is not lost, so a wrong one would pass unseen.
        So, unless ``dead_letters_expected`` (the scenario makes sends fail for good), is a
        notification in the DLQ."""
        result.accepted = len(sent)
        # Nothing lost of nothing accepted would pass while showing nothing.
        result.check(bool(sent), NOTHING_ACCEPTED)
        if not sent:
            return
        assert self.db is not None
        event_ids = [s.event_id for s in sent]
        accepted_at = {s.event_id: s.accepted_at for s in sent}
        # Rows of a channel, and skips of none: the enricher skips a notification to an
        # unknown user, or to a segment without members, before any channel is chosen.
        rows = await self.db.fetch(
            "SELECT event_id::text AS event_id, task_id, status, kind, detail "
            "FROM message_logs WHERE project_id = $1 AND event_id = ANY($2::uuid[]) "
            "AND (channel <> '' OR status = ANY($3::text[]))",
            self.project_id, event_ids, list(SKIP_STATUSES),
        )
        task_event = {r["task_id"]: r["event_id"] for r in rows}
        skipped: dict[str, str] = {}
        for r in rows:
            if r["status"] in SKIP_STATUSES:
                reason = skip_reason(r["status"], r["detail"] or r["kind"])
                skipped.setdefault(r["event_id"], reason)
        dead: set[str] = set()
        for _id, record in await self.stream_entries(self.keys.dlq):
            payload = record.get("payload")
            event_id = payload.get("eventId") if isinstance(payload, dict) else None
            if event_id:
                dead.add(str(event_id))
        messages = await self.sim.messages(limit=SIM_MAX_MESSAGES)
        delivered: dict[str, float] = {}
        for message in messages:
            event_id = task_event.get(message.get("taskId") or "")
            if event_id is None:
                continue
            received = epoch(message.get("receivedAt"))
            if event_id not in delivered or received < delivered[event_id]:
                delivered[event_id] = received
        # A task accepted n times shows n records with acceptCount 1..n: count n - 1 once.
        # Each duplicate needs a cause in the system's own timeline (CONTRACT §4 allows only a
        # resend after a lost answer, to a provider without idempotency keys).
        dupes = await self.duplicates()
        explained = await self.tasks_sent_after_lost_answers(list(dupes))
        for task_id, (provider, extra) in dupes.items():
            event = task_event.get(task_id, "?")
            if provider in IDEMPOTENT_PROVIDERS:
                cause = "despite its idempotency key"
                result.check(False, f"{provider} accepted task {task_id} (notification {event}) "
                                    f"{extra + 1} times despite its idempotency key")
            elif task_id in explained:
                cause = "sent again after a lost answer"
            else:
                cause = "unexplained"
                result.check(False, f"{provider} accepted task {task_id} (notification {event}) "
                                    f"{extra + 1} times, and its timeline shows no lost answer "
                                    "that would explain it")
            result.duplicates[f"{provider}: {cause}"] += extra
        result.delivered = len(delivered)
        result.dead_lettered = len(dead & set(event_ids))
        for event_id, reason in skipped.items():
            if event_id not in delivered:
                result.skipped[reason] += 1
        result.check(skips_expected or not result.skipped,
                     f"{sum(result.skipped.values())} notification(s) skipped although nothing "
                     f"in this scenario should skip one: {summarize_counter(result.skipped)}")
        if not dead_letters_expected:
            result.check_none_dead_lettered("nothing in this scenario should give one up")
        for event_id in event_ids:
            if event_id not in delivered and event_id not in dead and event_id not in skipped:
                result.lost.append(event_id)
            elif event_id in delivered:
                result.latencies_s.append(max(0.0, delivered[event_id] - accepted_at[event_id]))


def skip_reason(status: str, detail: str) -> str:
    """``status: detail`` for the table, without saying the status twice."""
    return detail if detail.startswith(status) else f"{status}: {detail}"


def basic_template(channels: Sequence[str]) -> dict[str, Any]:
    content: dict[str, Any] = {
        "email": {"subject": "Hello {{ user.id }}", "text": "Message {{ data.n }}"},
        "sms": {"text": "Message {{ data.n }}"},
        "push": {"title": "Hello", "body": "Message {{ data.n }}"},
        "inapp": {"text": "Message {{ data.n }}"},
    }
    return {"channels": {c: content[c] for c in channels if c in content}}


def contacts_for(index: int, channels: Sequence[str]) -> list[dict[str, str]]:
    targets = {
        "email": f"user{index}@example.com",
        "sms": f"+1555{index:07d}",
        "push": f"device-token-{index:06d}",
    }
    return [{"channel": c, "target": targets[c]} for c in channels if c in targets]


def summarize_counter(counter: Counter[str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in counter.items())


# CONTRACT §3: 3 attempts, 5 for the enricher.
SPEC_LIMITS = (5, 3)


def attempt_limits(system: System, options: RunOptions, result: ScenarioResult) -> Settings:
    """The processes' settings, having checked that their attempt limits are the contract's
    unless the run set them: a scenario that took its limits from the code under test alone
    would pass a wrong default."""
    limits = Settings.from_env(system.env_for(["delivery"]))
    overridden = {"MAX_ATTEMPTS", "ENRICHER_MAX_ATTEMPTS"} & set(options.env)
    result.check(bool(overridden) or (limits.enricher_max_attempts, limits.max_attempts)
                 == SPEC_LIMITS,
                 f"the processes run with attempt limits enricher "
                 f"{limits.enricher_max_attempts}, elsewhere {limits.max_attempts}; the "
                 f"contract's are {SPEC_LIMITS[0]} and {SPEC_LIMITS[1]}")
    return limits


def text_of(value: Any) -> str:
    """A Redis reply's bytes (or anything else) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


async def failed_event_ids(system: System) -> set[str]:
    """The events whose ``notification:failed`` is on the events stream."""
    return {str(event["eventId"])
            for _id, event in await system.stream_entries(system.keys.events_inbound)
            if event.get("type") == "notification:failed" and event.get("eventId")}


def epoch(value: Any) -> float:
    """An RFC 3339 time (the simulators', a timeline's) as epoch seconds; none is now."""
    if not value:
        return time.time()
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


async def to_the_end(work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` to its end however often the caller is cancelled meanwhile, then pass the
    cancellation on. A run stopped with Ctrl-C is cancelled again by each repeat (see
    scenarios/__main__.py): its clean-up, cut short, left processes running and the run's
    schema and keys behind."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
    task.result()
    if cancelled:
        raise asyncio.CancelledError


async def remove_run_data(db: asyncpg.Pool | None, redis: Redis, schema: str,
                          namespace: str) -> None:
    """Drop a run's schema and every key of its namespace, then close both connections."""
    if db is not None:
        with contextlib.suppress(Exception):
            await db.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await db.close()
    with contextlib.suppress(Exception):
        await unlink_namespace(redis, namespace)
    await redis.aclose()


async def unlink_namespace(redis: Redis, namespace: str) -> None:
    """Remove every ``{namespace}:*`` key, one UNLINK per page of the scan: a benchmark's
    fan-out leaves a few hundred thousand dedup marks, and a round trip per key took minutes."""
    page: list[bytes | str] = []
    async for key in redis.scan_iter(match=f"{namespace}:*", count=1000):
        page.append(key)
        if len(page) >= 1000:
            await redis.unlink(*page)
            page.clear()
    if page:
        await redis.unlink(*page)


async def group_unread(redis: Redis, stream: str, group: dict[str, Any]) -> int:
    """Entries of ``stream`` its consumer group (an XINFO GROUPS row) has not read yet."""
    lag = group.get("lag")
    if lag is not None:
        return int(lag)
    # Redis cannot tell the lag (after replaying its AOF, for one): count what lies past the
    # group's last delivered entry instead of taking it for nothing.
    past = await redis.xrange(
        stream, f"({text_of(group['last-delivered-id'])}", "+", count=UNREAD_SCAN)
    return len(past or ())


async def stream_backlog(redis: Redis, keys: Keys) -> dict[str, int]:
    """Entries each group of each stream (but the DLQ) has not acked yet, read or unread,
    keyed ``{stream}/{group}``; groups with nothing waiting are left out."""
    waiting: dict[str, int] = {}
    for stream in keys.all_streams():
        if stream == keys.dlq:
            continue
        try:
            groups = await redis.xinfo_groups(stream)
        except ResponseError as exc:
            if "no such key" in str(exc).lower():
                continue  # no such stream yet
            raise
        for group in groups:
            pending = int(group.get("pending") or 0)
            unread = await group_unread(redis, stream, group)
            if pending or unread:
                waiting[f"{stream}/{text_of(group['name'])}"] = pending + unread
    return waiting
