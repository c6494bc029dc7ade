"""The email provider fails every request (500) for a while, then recovers, under steady traffic.

Proves: a failed send is retried on the reclaim cycle (tries of one task at least the reclaim
idle time apart, never a hot loop); a task that used up its attempts is dead-lettered after
exactly that many provider failures, with ``notification:failed``; every other one is delivered
once, after the recovery if it failed before; nothing is lost.
"""

from __future__ import annotations

import asyncio
import time
from itertools import pairwise
from typing import Any

from scenarios.harness import RunOptions, System, attempt_limits, epoch, failed_event_ids
from scenarios.report import ScenarioResult

DESCRIPTION = ("email provider 100% 500s for a period, then recovers: retry cycle, DLQ after "
               "exactly the attempt limit, the rest delivered once after recovery, 0 lost")
PARAMS: dict[str, Any] = {
    "users": 30,
    "outage_s": 4.0,
    "traffic_s": 6.0,
    "send_rate_per_s": 20,
    "drain_timeout_s": 60.0,  # waiting longer than this for quiescence is a violation
}
# No outage or no traffic: nothing failed, was retried or was dead-lettered.
POSITIVE = frozenset({"users", "outage_s", "traffic_s", "send_rate_per_s", "drain_timeout_s"})

LAYOUT = {"api": ["api"], "workers": ["enricher", "engine", "delivery", "scheduler", "events"]}
# Two processes' clocks on one machine agree to well within this.
CLOCK_SLACK_S = 0.05
# The reclaim idle time counts from when the entry was read, not from when the provider
# answered, so two tries are a little less than the idle time apart; a hot loop would be
# milliseconds apart.
RETRY_GAP_FRACTION = 0.5


async def run(options: RunOptions, params: dict[str, Any]) -> ScenarioResult:
    result = ScenarioResult(options.name, options.seed)
    async with System(options, LAYOUT) as system:
        limit = attempt_limits(system, options, result).max_attempts
        users = await system.bootstrap(users=int(params["users"]), channels=("email",))
        rate = float(params["send_rate_per_s"])
        count = int(rate * float(params["traffic_s"]))
        rule = await system.sim.add_fault("error", "resend", status=500)
        system.say("resend down (500 for every request)", force=True)
        sending = asyncio.create_task(system.send_paced(
            [(users[i % len(users)], {}) for i in range(count)], rate_per_s=rate))
        await asyncio.sleep(float(params["outage_s"]))
        await system.sim.remove_fault(rule["id"])
        recovered_at = time.time()
        system.say("resend recovered", force=True)
        sent = await sending
        waiting = await system.quiesce(float(params["drain_timeout_s"]))
        result.check(not waiting, f"the system never drained: {waiting}")
        await system.account(sent, result, dead_letters_expected=True)

        failures: dict[str, list[float]] = {}
        for hit in system.simulator_faults("error"):
            failures.setdefault(hit.task_id, []).append(hit.at)
        dead = await dlq_by_event(system)
        failed_events = await failed_event_ids(system)
        counts = {"dead_lettered": 0, "recovered_after_failing": 0, "never_failed": 0}
        for s in sent:
            tasks = await system.task_ids_of_event(s.event_id)
            tries = sorted(t for task in tasks for t in failures.get(task, []))
            copies = [epoch(m["receivedAt"]) for task in tasks
                      for m in await system.sim.messages(task_id=task)]
            gaps = [b - a for a, b in pairwise(tries)]
            result.check(all(g >= options.reclaim_s * RETRY_GAP_FRACTION for g in gaps),
                         f"notification {s.event_id} was retried {min(gaps, default=0):.2f} s "
                         f"after a failure, faster than the reclaim cycle ({options.reclaim_s} s)")
            if s.event_id in dead:
                counts["dead_lettered"] += 1
                result.check(not copies, f"notification {s.event_id} is in the DLQ but was "
                                         "delivered too")
                result.check(len(tries) == limit,
                             f"notification {s.event_id} dead-lettered after {len(tries)} "
                             f"provider failures, the limit is {limit}")
                result.check(dead[s.event_id] == limit,
                             f"notification {s.event_id}: its DLQ entry says "
                             f"{dead[s.event_id]} attempts, the limit is {limit}")
                result.check(s.event_id in failed_events,
                             f"no notification:failed for dead-lettered {s.event_id}")
                continue
            result.check(len(copies) == 1, f"notification {s.event_id} delivered "
                                           f"{len(copies)} times, expected once")
            result.check(len(tries) < limit,
                         f"notification {s.event_id} failed {len(tries)} times (the limit is "
                         f"{limit}) yet was not dead-lettered")
            if tries:
                counts["recovered_after_failing"] += 1
                result.check(all(at + CLOCK_SLACK_S >= recovered_at for at in copies),
                             f"notification {s.event_id} was delivered during the outage")
            else:
                counts["never_failed"] += 1
        # The row's two outcomes must both have happened, or the run proved only one of them.
        result.check(counts["dead_lettered"] > 0,
                     "no notification was dead-lettered: the outage was too short to use up "
                     "the attempt limit (lengthen outage_s)")
        result.check(counts["recovered_after_failing"] > 0,
                     "no notification failed and was then delivered after the recovery: the "
                     "retry cycle was not shown (lengthen traffic_s past outage_s)")
        result.facts.update(counts)
        result.facts["provider_failures"] = sum(len(v) for v in failures.values())
        system.check_alive(result, LAYOUT)
    return result


async def dlq_by_event(system: System) -> dict[str, int]:
    """event id -> attempts its DLQ entry records."""
    out: dict[str, int] = {}
    for _id, record in await system.stream_entries(system.keys.dlq):
        payload = record.get("payload")
        event_id = payload.get("eventId") if isinstance(payload, dict) else None
        if event_id:
            out[str(event_id)] = int(record.get("attempts") or 0)
    return out
