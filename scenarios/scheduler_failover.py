"""scheduler_failover: scheduled sends; SIGKILL the polling scheduler; a second one takes the lock.

Notifications are sent with ``sendAt`` spread over a few seconds ahead. Two scheduler processes
run; the one holding the poll lock (its token names its pid) is SIGKILLed while tasks are
still waiting. The survivor must take the lock once it expires and move every remaining task.

Invariants: every task reaches the provider exactly once (the simulator's acceptCount), none
before its ``sendAt``, none lost; the lock ends with the survivor.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from scenarios.harness import RunOptions, Sent, System
from scenarios.report import ScenarioResult

DESCRIPTION = "scheduled sends; SIGKILL the polling scheduler; the other takes the lock"
PARAMS: dict[str, Any] = {
    "messages": 300, "lead_s": 3.0, "spread_s": 6.0, "kill_after_s": 2.0,
    "lock_ttl_s": 2, "quiesce_s": 40.0, "early_tolerance_s": 0.0,
}
POSITIVE = frozenset({"messages", "lock_ttl_s", "quiesce_s"})  # the lock TTL is at least 1
# The kill comes kill_after_s into the spread of sendAt: past its end, nothing is left for
# the survivor to move.
MORE_THAN = {"spread_s": "kill_after_s"}

LAYOUT = {
    "api": ["api"],
    "pipeline": ["enricher", "engine", "delivery", "events"],
    "scheduler-1": ["scheduler"],
    "scheduler-2": ["scheduler"],
}


def rfc3339(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="milliseconds") \
        .replace("+00:00", "Z")


async def lock_holder(system: System) -> str | None:
    """The layout name of the scheduler process whose token is in the poll lock."""
    raw = await system.redis.get(system.keys.scheduler_lock)
    if raw is None:
        return None
    consumer = (raw.decode() if isinstance(raw, bytes) else str(raw)).split(":", 1)[0]
    pid = consumer.rsplit("-", 1)[-1]
    for name in ("scheduler-1", "scheduler-2"):
        if str(system.processes[name].pid) == pid:
            return name
    return None


def sent_more_than_once(accepted: dict[str, int], replayed: Counter[str],
                        task_event: dict[str, str]) -> list[str]:
    """The notifications a provider was handed more than once: accepted more than once
    (``accepted``: event id -> the highest acceptCount of its tasks), or asked again for a
    task it answered from its idempotency cache (``replayed``: task id -> such requests)."""
    times = dict(accepted)
    for task_id, count in replayed.items():
        event_id = task_event.get(task_id, f"? (task {task_id})")
        times[event_id] = times.get(event_id, 1) + count
    return sorted(e for e, n in times.items() if n > 1)


async def run(options: RunOptions, params: dict[str, Any]) -> ScenarioResult:
    result = ScenarioResult(name=options.name, seed=options.seed)
    options.env.setdefault("SCHEDULER_LOCK_TTL_SECONDS", str(int(params["lock_ttl_s"])))
    options.env.setdefault("API_RATE_PER_SECOND", "1000")  # every send must be accepted
    options.env.setdefault("API_RATE_BURST", "1000")
    rng = random.Random(options.seed)
    async with System(options, LAYOUT) as system:
        users = await system.bootstrap(users=50)
        holder = None
        for _ in range(100):
            holder = await lock_holder(system)
            if holder:
                break
            await asyncio.sleep(0.1)
        result.check(holder is not None, "no scheduler took the poll lock")
        survivor = "scheduler-2" if holder == "scheduler-1" else "scheduler-1"

        base = time.time() + float(params["lead_s"])
        send_at: dict[str, float] = {}
        sent: list[Sent] = []
        sem = asyncio.Semaphore(32)

        async def one(index: int) -> None:
            due = base + rng.random() * float(params["spread_s"])
            async with sem:
                got = await system.send(users[index % len(users)], sendAt=rfc3339(due))
            if got is not None:
                sent.append(got)
                send_at[got.event_id] = round(due, 3)  # sendAt carries milliseconds
                system.say(f"scheduling: {len(sent)} accepted")

        await asyncio.gather(*(one(i) for i in range(int(params["messages"]))))
        result.check(len(sent) == int(params["messages"]),
                     f"only {len(sent)} of {params['messages']} sends were accepted")

        await asyncio.sleep(max(0.0, base + float(params["kill_after_s"]) - time.time()))
        if holder is not None:
            waiting = sum([int(await system.redis.zcard(s))
                           for s in system.keys.scheduled_shards()])
            result.facts["tasks waiting when the holder was killed"] = waiting
            result.check(waiting > 0, "nothing was waiting when the poller was killed; the "
                                      "scenario proved nothing (raise spread_s)")
            system.say(f"SIGKILL {holder} (holds the poll lock, {waiting} tasks waiting)")
            await system.kill(holder)
            killed_at = time.time()
            new_holder = None
            while time.time() - killed_at < float(params["lock_ttl_s"]) * 5:
                new_holder = await lock_holder(system)
                if new_holder and new_holder != holder:  # the dead one's token lingers
                    break
                await asyncio.sleep(0.1)
            result.facts["lock taken over after (s)"] = round(time.time() - killed_at, 2)
            result.check(new_holder == survivor,
                         f"the poll lock did not pass to {survivor} (holder: {new_holder})")

        left = await system.quiesce(float(params["quiesce_s"]))
        result.check(not left, f"the system did not quiesce: {left}")

        # None early, each once: the provider's own records against each sendAt.
        rows = await system.db.fetch(  # type: ignore[union-attr]
            "SELECT DISTINCT task_id, event_id::text AS event_id FROM message_logs "
            "WHERE project_id = $1 AND channel <> ''", system.project_id)
        task_event = {r["task_id"]: r["event_id"] for r in rows}
        early: list[str] = []
        per_event: dict[str, int] = {}
        for message in await system.sim.messages(limit=100_000):
            event_id = task_event.get(message.get("taskId") or "")
            if event_id is None or event_id not in send_at:
                continue
            # acceptCount counts the provider's acceptances of the task; the highest one seen
            # is how many times it was sent
            per_event[event_id] = max(per_event.get(event_id, 0),
                                      int(message.get("acceptCount") or 1))
            received = datetime.fromisoformat(
                str(message["receivedAt"]).replace("Z", "+00:00")).timestamp()
            if received < send_at[event_id] - float(params["early_tolerance_s"]):
                early.append(f"{event_id} ({send_at[event_id] - received:.3f} s early)")
        # Resend honours idempotency keys: a task the scheduler moved twice reaches it twice
        # but is accepted once, and only its idempotency cache knows.
        replayed = await system.replayed_tasks("resend")
        # A retry after an answer that never came (a loaded machine) is no second move.
        replayed -= await system.unanswered_attempts(list(replayed))
        result.facts["provider requests answered from the idempotency cache"] = sum(
            replayed.values())
        twice = sent_more_than_once(per_event, replayed, task_event)
        result.check(not early, f"{len(early)} sent before their sendAt: {early[:10]}")
        result.check(not twice, f"{len(twice)} sent more than once: {twice[:10]}")
        for item in sent:  # latency of a scheduled send counts from its sendAt
            item.accepted_at = send_at.get(item.event_id, item.accepted_at)
        await system.account(sent, result)
        system.check_alive(result, [n for n in LAYOUT if n != holder])
    return result
