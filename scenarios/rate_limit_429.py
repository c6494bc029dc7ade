"""The provider answers 429 with Retry-After for a while, then recovers.

Proves: every task that met a 429 was parked with the scheduler (a ``deferred`` row on its
timeline), reached the provider again only after the 429 it got plus Retry-After (the
simulator's own clock: the time it answered 429 against the time it accepted the message),
and nothing was dropped.
"""

from __future__ import annotations

import asyncio
from typing import Any

from scenarios.harness import RunOptions, System, epoch
from scenarios.report import ScenarioResult

DESCRIPTION = ("provider 429 + Retry-After for a window: parked with the scheduler, sent after "
               "Retry-After (simulator clocks), none dropped")
PARAMS: dict[str, Any] = {
    "users": 30,
    "messages": 60,
    "window_s": 1.5,
    "retry_after_s": 2,
    "send_rate_per_s": 40,
    "drain_timeout_s": 60.0,  # waiting longer than this for quiescence is a violation
}
# No message or no 429 window: no send meets a 429; a Retry-After of 0 asks for no wait.
POSITIVE = frozenset({"users", "messages", "window_s", "retry_after_s", "send_rate_per_s",
                      "drain_timeout_s"})

LAYOUT = {"api": ["api"], "workers": ["enricher", "engine", "delivery", "scheduler", "events"]}
# The simulator writes whole milliseconds; a send in the same millisecond is not early.
CLOCK_RESOLUTION_S = 0.001


async def run(options: RunOptions, params: dict[str, Any]) -> ScenarioResult:
    result = ScenarioResult(options.name, options.seed)
    retry_after_s = float(params["retry_after_s"])
    async with System(options, LAYOUT) as system:
        users = await system.bootstrap(users=int(params["users"]), channels=("email",))
        rule = await system.sim.add_fault("rate_limit", "resend", retry_after_s=retry_after_s)
        system.say(f"resend answers 429 (Retry-After {retry_after_s:g} s)", force=True)
        sending = asyncio.create_task(system.send_paced(
            [(users[i % len(users)], {}) for i in range(int(params["messages"]))],
            rate_per_s=float(params["send_rate_per_s"])))
        await asyncio.sleep(float(params["window_s"]))
        await system.sim.remove_fault(rule["id"])
        system.say("resend recovered", force=True)
        sent = await sending
        waiting = await system.quiesce(float(params["drain_timeout_s"]))
        result.check(not waiting, f"the system never drained: {waiting}")
        await system.account(sent, result)

        result.check(result.dead_lettered == 0,
                     f"{result.dead_lettered} notifications were dropped to the DLQ over a "
                     "429 window shorter than Retry-After")
        refusals = limited_at(system)  # task id -> times the simulator answered 429
        result.check(bool(refusals), "no send met a 429; lengthen the window")
        deferred = await deferred_tasks(system)
        early: list[str] = []
        for task_id, times in sorted(refusals.items()):
            event = await system.event_of_task(task_id)
            result.check(task_id in deferred, f"task {task_id} (notification {event}) met a "
                                              "429 but was never parked with the scheduler")
            received = [epoch(m["receivedAt"]) for m in await system.sim.messages(
                task_id=task_id)]
            result.check(bool(received), f"task {task_id} (notification {event}) met a 429 "
                                         "and was never sent")
            for at in received:
                before = [t for t in times if t <= at]
                if before and at + CLOCK_RESOLUTION_S < max(before) + retry_after_s:
                    early.append(task_id)
                    result.check(False, f"task {task_id} (notification {event}) was sent "
                                        f"{max(before) + retry_after_s - at:.3f} s before its "
                                        "Retry-After ran out")
        margins = [min(at for at in [epoch(m["receivedAt"]) for m in
                                     await system.sim.messages(task_id=t)]) - max(times)
                   for t, times in refusals.items() if await system.sim.messages(task_id=t)]
        result.facts.update(rate_limited_tasks=len(refusals), parked=len(deferred),
                            sent_early=len(early),
                            earliest_resend_after_429_s=round(min(margins), 3) if margins else None)
        system.check_alive(result, LAYOUT)
    return result


def limited_at(system: System) -> dict[str, list[float]]:
    """When the simulator answered 429 to each task."""
    out: dict[str, list[float]] = {}
    for hit in system.simulator_faults("rate_limit"):
        out.setdefault(hit.task_id, []).append(hit.at)
    return out


async def deferred_tasks(system: System) -> set[str]:
    assert system.db is not None
    rows = await system.db.fetch(
        "SELECT DISTINCT task_id FROM message_logs WHERE project_id = $1 AND kind = 'deferred'",
        system.project_id)
    return {r["task_id"] for r in rows}
