"""priority_isolation: a 50k low-priority backlog, then critical sends.

The backlog is ``backlog`` single-recipient low-priority notifications. 50,000 API requests
would take longer than the scenario's budget on a small machine, so they are written the way
the API writes them but in bulk: a ``notifications`` row each (one executemany), then the
InboundMessage entries XADDed to ``inbound:low`` in pipelines. Everything downstream of the
API is the real pipeline. Critical sends go through the API, once on the idle system (the
baseline, measured in this same run) and once while the backlog is being worked through, at
the same pace.

Invariants: the critical p99 under backlog stays within ``ratio`` x idle p99 + ``slack_ms``;
the backlog was really there while the critical sends went through (a large part of it still
waiting after the last critical one was delivered); every critical and idle send delivered.
The backlog itself is load, not the subject: it is not drained before the system stops, so
its notifications are reported as facts and not counted as accepted.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from scenarios.harness import RunOptions, Sent, System
from scenarios.report import ScenarioResult

DESCRIPTION = "50k low-priority backlog, then critical sends: critical p99 near the idle p99"
PARAMS: dict[str, Any] = {
    "backlog": 50_000, "users": 100, "critical": 100, "rate_per_s": 25.0,
    "ratio": 3.0, "slack_ms": 250.0, "min_backlog_left": 0.1, "wait_s": 30.0,
}
# Without a backlog, or with none of it required to be left, the critical sends were not
# measured under backlog; without critical sends nothing was measured.
POSITIVE = frozenset({"backlog", "users", "critical", "rate_per_s", "min_backlog_left",
                      "wait_s"})
RANGES = {"min_backlog_left": (0.0, 1.0)}  # a share of the backlog

# One process per stage, as a deployment that cares about latency runs them: stages sharing
# one event loop would also share its queue of ready work.
LAYOUT = {
    "api": ["api"],
    "enricher": ["enricher"],
    "engine": ["engine"],
    "delivery": ["delivery"],
    "rest": ["scheduler", "events"],
}


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(0.99 * len(ordered) + 0.999) - 1))]


async def paced_critical(system: System, users: list[str], count: int,
                         rate_per_s: float, label: str) -> list[Sent]:
    """``count`` critical sends at a steady pace, so each measures the pipeline rather than
    its own place in a queue of our making."""
    sent: list[Sent] = []
    tasks = []

    async def one(index: int) -> None:
        got = await system.send(users[index % len(users)], priority="critical",
                                data={"n": f"{label}-{index}"})
        if got is not None:
            sent.append(got)

    for index in range(count):
        tasks.append(asyncio.create_task(one(index)))
        await asyncio.sleep(1.0 / rate_per_s)
    await asyncio.gather(*tasks)
    return sent


async def wait_delivered(system: System, sent: list[Sent], timeout_s: float) -> bool:
    """Until every send in ``sent`` has a 'sent' row (the backlog keeps the system busy, so
    quiescence is not the signal here)."""
    ids = [s.event_id for s in sent]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = await system.db.fetchval(  # type: ignore[union-attr]
            "SELECT count(DISTINCT event_id) FROM message_logs WHERE project_id = $1 "
            "AND event_id = ANY($2::uuid[]) AND kind = 'sent'", system.project_id, ids)
        system.say(f"critical delivered: {done}/{len(ids)}")
        if done >= len(ids):
            return True
        await asyncio.sleep(0.2)
    return False


async def backlog_left(system: System) -> int:
    waiting = await system.backlog()
    return sum(v for k, v in waiting.items() if ":low/" in k)


async def run(options: RunOptions, params: dict[str, Any]) -> ScenarioResult:
    result = ScenarioResult(name=options.name, seed=options.seed)
    async with System(options, LAYOUT) as system:
        users = await system.bootstrap(users=int(params["users"]))
        count, rate = int(params["critical"]), float(params["rate_per_s"])

        idle = await paced_critical(system, users, count, rate, "idle")
        # The baseline is only comparable if it measured as many sends as the busy run.
        result.check(len(idle) == count, f"only {len(idle)} of {count} critical sends were "
                                         "accepted on the idle system")
        result.check(await wait_delivered(system, idle, float(params["wait_s"])),
                     "the idle critical sends were not all delivered")
        idle_result = ScenarioResult(name=options.name, seed=options.seed)
        await system.account(idle, idle_result)

        system.say("queueing the low-priority backlog")
        started = time.monotonic()
        backlog_tasks = await queue_backlog(system, users, int(params["backlog"]))
        result.facts["backlog queued"] = backlog_tasks
        result.facts["backlog queued in (s)"] = round(time.monotonic() - started, 1)
        # Let the backlog reach the later stages too, so every stream has low work waiting.
        await asyncio.sleep(1.0)
        result.facts["backlog waiting when critical sends began"] = await backlog_left(system)

        busy = await paced_critical(system, users, count, rate, "busy")
        result.check(await wait_delivered(system, busy, float(params["wait_s"])),
                     "the critical sends under backlog were not all delivered in time")
        left = await backlog_left(system)
        result.facts["backlog waiting after the last critical delivery"] = left
        result.check(left >= float(params["min_backlog_left"]) * backlog_tasks,
                     f"only {left} of {backlog_tasks} backlog tasks were still waiting when the "
                     f"critical sends were done: the measurement was not under backlog")

        await system.account(idle + busy, result)
        busy_ids = {s.event_id for s in busy}
        accepted_at = {s.event_id: s.accepted_at for s in busy}
        busy_latency = await delivered_latencies(system, accepted_at)
        idle_p99 = idle_result.percentile(0.99)
        result.latencies_s = busy_latency
        if idle_p99 is None or not busy_latency:
            result.violations.append("no latency could be measured")
        else:
            busy_p99 = p99(busy_latency)
            bound = float(params["ratio"]) * idle_p99 + float(params["slack_ms"]) / 1000
            result.facts["idle p99 (ms)"] = round(idle_p99 * 1000)
            result.facts["critical p99 under backlog (ms)"] = round(busy_p99 * 1000)
            result.facts["bound (ms)"] = round(bound * 1000)
            result.check(busy_p99 <= bound,
                         f"critical p99 under backlog {busy_p99 * 1000:.0f} ms exceeds "
                         f"{params['ratio']} x idle p99 {idle_p99 * 1000:.0f} ms + "
                         f"{params['slack_ms']} ms = {bound * 1000:.0f} ms")
        result.check(len(busy_ids) == count, f"only {len(busy_ids)} of {count} critical sends "
                                             "were accepted under backlog")
        system.check_alive(result, LAYOUT)
    return result


async def queue_backlog(system: System, users: list[str], count: int) -> int:
    """``count`` low-priority notifications, each to one user, as the API would accept them."""
    from notifkit.clock import utc_now_iso
    from notifkit.ids import uuid7
    from notifkit.streams import encode

    now = utc_now_iso()
    messages: list[dict[str, Any]] = [
        {"eventId": uuid7(), "projectId": system.project_id, "template": "basic",
         "to": {"userId": users[i % len(users)]}, "data": {"n": f"backlog-{i}"},
         "channels": None, "priority": "low", "sendAt": None, "campaignId": None,
         "idempotencyKey": None, "createdAt": now}
        for i in range(count)
    ]
    await system.db.executemany(  # type: ignore[union-attr]
        "INSERT INTO notifications (id, project_id, template_id, priority, status, "
        "recipients_spec, data) VALUES ($1, $2, 'basic', 'low', 'accepted', $3, $4)",
        [(m["eventId"], m["projectId"], m["to"]["userId"], m["data"]) for m in messages])
    stream = system.keys.inbound("low")
    for start in range(0, count, 1000):
        pipe = system.redis.pipeline(transaction=False)
        for message in messages[start:start + 1000]:
            pipe.xadd(stream, encode(message))
        await pipe.execute()
    return count


async def delivered_latencies(system: System, accepted_at: dict[str, float]) -> list[float]:
    """Provider receipt time minus API acceptance, per event (the first copy counts)."""
    from datetime import datetime

    rows = await system.db.fetch(  # type: ignore[union-attr]
        "SELECT DISTINCT task_id, event_id::text AS event_id FROM message_logs "
        "WHERE project_id = $1 AND event_id = ANY($2::uuid[]) AND channel <> ''",
        system.project_id, list(accepted_at))
    out: dict[str, float] = {}
    for row in rows:
        for message in await system.sim.messages(task_id=row["task_id"]):
            at = datetime.fromisoformat(str(message["receivedAt"]).replace("Z", "+00:00"))
            latency = max(0.0, at.timestamp() - accepted_at[row["event_id"]])
            out[row["event_id"]] = min(latency, out.get(row["event_id"], latency))
    return list(out.values())
