"""redis_restart: Redis with AOF restarted under load; no accepted notification lost.

The scenario starts its own redis-server on a free port with its data in a temporary folder,
``appendonly yes`` and ``appendfsync always``: every write is on disk before Redis answers it,
so whatever notifkit was told is stored survives even a crash. The system runs against that
Redis while sends arrive at a steady pace; part-way through, Redis is SIGKILLed (``mode=kill``,
the default, a crash) or shut down cleanly with SHUTDOWN (``mode=shutdown``), stays down for
``down_s`` and is started again on the same port and folder, replaying its AOF.

Sends refused while Redis is down are not accepted (the API answers an error) and are not
counted. Invariants: every accepted notification is delivered, dead-lettered or skipped with a
reason (0 lost); every service process survives the outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from scenarios.harness import RunOptions, System
from scenarios.processes import ManagedProcess, child_env, free_port, wait_for_port
from scenarios.report import ScenarioResult

DESCRIPTION = "Redis with AOF (appendfsync always) crashed and restarted under load: 0 lost"
PARAMS: dict[str, Any] = {
    "messages": 1200, "rate_per_s": 120.0, "restart_after_s": 3.0, "down_s": 1.5,
    "mode": "kill", "quiesce_s": 60.0,
}
POSITIVE = frozenset({"messages", "rate_per_s", "quiesce_s"})  # no message: none to lose
CHOICES = {"mode": ("kill", "shutdown")}  # SIGKILL, or a clean SHUTDOWN

LAYOUT = {
    "api": ["api"],
    "pipeline": ["enricher", "engine", "delivery", "scheduler", "events"],
}


def redis_process(port: int, folder: Path) -> ManagedProcess:
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
            "--appendonly", "yes", "--appendfsync", "always", "--save", "",
            "--protected-mode", "no"]
    return ManagedProcess("redis", argv, child_env(), folder / "redis.log")


async def run(options: RunOptions, params: dict[str, Any]) -> ScenarioResult:
    result = ScenarioResult(name=options.name, seed=options.seed)
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="notifkit-redis-") as tmp:
        folder = Path(tmp)
        redis = redis_process(port, folder)
        await redis.start()
        try:
            await wait_for_port("127.0.0.1", port, 10, redis)
            await _run(options, params, result, redis, port)
        finally:
            await redis.terminate(timeout_s=5)
            redis.close_logs()
    return result


async def _run(options: RunOptions, params: dict[str, Any], result: ScenarioResult,
               redis: ManagedProcess, port: int) -> None:
    url = f"redis://127.0.0.1:{port}/0"
    options.env.setdefault("API_RATE_PER_SECOND", "1000")  # only the outage refuses sends
    async with System(options, LAYOUT, redis_url=url) as system:
        users = await system.bootstrap(users=100)
        count = int(params["messages"])
        sends = [(users[i % len(users)], {"data": {"n": str(i)}}) for i in range(count)]
        load = asyncio.create_task(system.send_paced(
            sends, rate_per_s=float(params["rate_per_s"]), label="under load"))

        await asyncio.sleep(float(params["restart_after_s"]))
        result.check(not load.done(), "every send was made before Redis went down: the restart "
                                      "was not under load (lower restart_after_s or raise "
                                      "messages)")
        if params["mode"] == "shutdown":
            admin = Redis.from_url(url)
            with contextlib.suppress(Exception):  # the connection closes as Redis exits
                await admin.shutdown(save=False, nosave=False)
            await admin.aclose()
            assert redis.proc is not None
            await redis.proc.wait()
            system.say("Redis shut down cleanly", force=True)
        else:
            await redis.kill()
            system.say("Redis SIGKILLed", force=True)
        await asyncio.sleep(float(params["down_s"]))
        await redis.restart()
        await wait_for_port("127.0.0.1", port, 10, redis)
        system.say("Redis restarted from its AOF", force=True)

        sent = await load
        result.facts["sends accepted / attempted"] = f"{len(sent)}/{count}"
        result.facts["Redis mode"] = f"{params['mode']} (appendonly yes, appendfsync always)"
        result.check(len(sent) >= count // 2,
                     f"only {len(sent)} of {count} sends were accepted: the outage was not "
                     "the only thing wrong")
        left = await system.quiesce(float(params["quiesce_s"]))
        result.check(not left, f"the system did not quiesce: {left}")
        await system.account(sent, result)  # none may be dead-lettered
        system.check_alive(result, LAYOUT)
