"""Workflow services in real processes: a SIGKILL in the middle of a step, and two processes
competing for the same instances."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.keys import Keys
from notifkit.services.delivery import DeliveryService
from notifkit.services.engine import EngineService
from notifkit.services.enricher import EnricherService
from notifkit.streams import xadd
from simulators import SimulatorServer

from .pipeline import add_template, add_user, drain, simulated

if TYPE_CHECKING:
    from .conftest import Flow, ServiceFactory

SCRIPT = Path(__file__).with_name("workflow_process.py")
REPO_ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 30.0
DRAIN_TIMEOUT_S = 60.0

Spawn = Callable[[str], Awaitable[asyncio.subprocess.Process]]


@pytest.fixture
async def spawn(settings: Settings) -> AsyncIterator[Spawn]:
    """Start workflow_process.py in a MODE; every process is killed at the end."""
    started: list[asyncio.subprocess.Process] = []

    async def _spawn(mode: str) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(SCRIPT), settings.redis_url, settings.database_url,
            settings.namespace, settings.db_schema, mode,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=REPO_ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO_ROOT)},
        )
        started.append(proc)
        assert await read_line(proc) == ["ready"]
        return proc

    yield _spawn
    for proc in started:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def read_line(proc: asyncio.subprocess.Process) -> list[str]:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), STARTUP_TIMEOUT_S)
    if not line:
        assert proc.stderr is not None
        errors = (await proc.stderr.read()).decode(errors="replace")
        pytest.fail(f"the workflow process exited early:\n{errors}")
    return line.decode().split()


async def until(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    """Wait for another process to make ``condition`` true (bounded)."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while not await condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.mark.slow
async def test_a_process_killed_mid_step_resumes_and_the_step_sends_once(
    flow: Flow, spawn: Spawn, make_service: ServiceFactory, settings: Settings,
    redis: Redis, keys: Keys, sim: SimulatorServer,
) -> None:
    # Given a user with an address and a workflow of two e-mails
    await add_user(flow.db, flow.project_id, "u1", "u1@example.com")
    for name in ("first", "second"):
        await add_template(flow.db, flow.project_id, name,
                           {"email": {"subject": name, "text": f"the {name} e-mail"}})
    await flow.define("two-sends", [{"type": "send", "template": "first"},
                                    {"type": "send", "template": "second"}])
    instance_id = await flow.trigger("two-sends", "u1", {"n": 1})

    # When a workflow process writes the first step's message and is killed before it
    # records the step as done
    proc = await spawn("pause-after-send")
    assert await read_line(proc) == ["sent", f"wf:{instance_id}:0"]
    proc.send_signal(signal.SIGKILL)
    assert await proc.wait() == -signal.SIGKILL
    assert (await flow.steps(instance_id))[0]["status"] == "running"
    # (its lock is released by nobody: it expires by its TTL)
    lock = keys.workflow_lock(instance_id)
    await until(lambda: _gone(redis, lock), "the dead process's lock to expire")

    # Then another process reclaims the trigger and finishes the instance
    survivor = make_service(settings=settings.replace(reclaim_min_idle_s=0.0), clock=time.time)
    await survivor.run_until_idle()
    assert (await flow.instance(instance_id))["status"] == "completed"
    steps = await flow.steps(instance_id)
    assert [(s["path"], s["status"]) for s in steps] == [("0", "completed"), ("1", "completed")]

    # The first step's message was written twice, as the same notification with the same key
    sent = await flow.sent()
    assert [m["template"] for m in sent] == ["first", "first", "second"]
    assert sent[0]["eventId"] == sent[1]["eventId"] == steps[0]["output"]["eventId"]
    assert sent[0]["idempotencyKey"] == sent[1]["idempotencyKey"] == f"wf:{instance_id}:0"
    assert sent[2]["idempotencyKey"] == f"wf:{instance_id}:1"

    # and through the send path the provider receives each step's e-mail exactly once
    chosen = simulated(settings, sim)
    stages = [EnricherService(chosen), EngineService(chosen), DeliveryService(chosen)]
    try:
        await drain(*stages)
    finally:
        for stage in stages:
            await stage.stop()
    received = await sim.messages("resend")
    assert sorted(m["content"]["subject"] for m in received) == ["first", "second"]
    assert all(m["acceptCount"] == 1 for m in received)
    assert (await sim.stats())["resend"]["requests"] == 2


async def _gone(redis: Redis, key: str) -> bool:
    return not await redis.exists(key)


@pytest.mark.slow
async def test_two_processes_never_run_the_same_instance_at_once(
    flow: Flow, spawn: Spawn, redis: Redis, keys: Keys, settings: Settings,
) -> None:
    # Given two workflow processes consuming the same stream
    # (the wait makes both processes' timer pollers race for the same wake-ups too)
    await flow.define("busy", [{"type": "send", "template": "a"},
                               {"type": "wait", "seconds": 0.05},
                               {"type": "send", "template": "b"},
                               {"type": "send", "template": "c"}])
    first = await spawn("record-runs")
    second = await spawn("record-runs")

    # When many instances are triggered and each is woken several more times at once
    n = 30
    instances = [await flow.trigger("busy", f"user-{i}", {"i": i}) for i in range(n)]
    for _round in range(4):
        for instance_id in instances:
            await xadd(redis, keys.workflow_inbound, {
                "type": "wake", "instanceId": instance_id, "projectId": flow.project_id,
            }, 10_000)

    async def all_done() -> bool:
        done = await flow.db.fetchval(
            "SELECT count(*) FROM workflow_instances WHERE status = 'completed'"
        )
        return bool(done == n)

    async def runs_recorded() -> bool:
        raw = await redis.lrange(f"{settings.namespace}:test:runs", 0, -1)
        return {json.loads(r)["instance"] for r in raw} == set(instances)

    await until(all_done, "every instance to complete")
    await until(runs_recorded, "every instance's runs to be recorded")
    for proc in (first, second):
        proc.send_signal(signal.SIGKILL)
        await proc.wait()

    # Then no two runs of one instance overlapped in time
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for raw in await redis.lrange(f"{settings.namespace}:test:runs", 0, -1):
        record = json.loads(raw)
        runs[record["instance"]].append(record)
    for instance_id, made in runs.items():
        made.sort(key=lambda r: r["start"])
        for before, after in pairwise(made):
            assert after["start"] >= before["end"], (instance_id, before, after)
    pids = {r["pid"] for made in runs.values() for r in made}
    assert pids == {first.pid, second.pid}  # both took part
    # and the check above compared something: some instance was run by both processes
    shared = [i for i, made in runs.items() if len({r["pid"] for r in made}) == 2]
    assert shared, "no instance was run by both processes: nothing could have overlapped"

    # and every step sent exactly once
    sent = await flow.sent()
    assert len(sent) == 3 * n
    assert len({m["idempotencyKey"] for m in sent}) == 3 * n
