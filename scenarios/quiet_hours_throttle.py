"""quiet_hours_throttle: sends into users' quiet hours and over the per-user throttle.

Two users sit in quiet hours in their own timezones (one at a +05:45 offset, one on US
Eastern time), a period that began an hour ago and ends ``quiet_s`` after the sends begin
(quiet hours are given to the second, ``HH:MM:SS``, so the run does not wait for a minute to
turn).
A third user, outside quiet hours, is sent more than the project's throttle allows.

Invariants:
- normal sends in quiet hours are deferred (a 'deferred' timeline row), reach the provider no
  earlier than the end of the quiet period and within ``late_bound_s`` after it;
- critical sends bypass both: a critical send in quiet hours arrives before the period ends, a
  critical send over the throttle is delivered and never throttled;
- of the throttled user's normal sends exactly ``limit`` reach the provider, every other one
  has a 'throttled' timeline row and none reaches the provider;
- nothing lost.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from scenarios.harness import RunOptions, Sent, System, contacts_for
from scenarios.report import ScenarioResult

DESCRIPTION = "sends in quiet hours are deferred to their end; over the throttle logged; " \
              "critical bypasses both"
PARAMS: dict[str, Any] = {
    "quiet_s": 10.0, "per_quiet_user": 2, "throttle_limit": 3, "over_throttle": 7,
    "critical": 2, "late_bound_s": 5.0, "quiesce_s": 40.0,
}

# Each count is a kind of send whose handling the scenario checks: with 0 of it, or no send
# over the throttle, that check holds of nothing. Quiet hours ending as the sends begin defer
# nothing, and a bound of 0 s is missed by any delivery.
POSITIVE = frozenset({"quiet_s", "per_quiet_user", "critical", "late_bound_s", "quiesce_s"})
MORE_THAN = {"over_throttle": "throttle_limit"}

ZONES = {"user-00000": "Asia/Kathmandu", "user-00001": "America/New_York"}
THROTTLED = "user-00002"


def _received(message: Mapping[str, Any]) -> float:
    return datetime.fromisoformat(str(message["receivedAt"]).replace("Z", "+00:00")).timestamp()


async def provider_times(system: System, sent: list[Sent]) -> dict[str, list[float]]:
    """Event id -> when the provider received each copy of it."""
    rows = await system.db.fetch(  # type: ignore[union-attr]
        "SELECT DISTINCT task_id, event_id::text AS event_id FROM message_logs "
        "WHERE project_id = $1 AND event_id = ANY($2::uuid[]) AND channel <> ''",
        system.project_id, [s.event_id for s in sent])
    task_event = {r["task_id"]: r["event_id"] for r in rows}
    out: dict[str, list[float]] = {}
    for message in await system.sim.messages(limit=100_000):
        event_id = task_event.get(message.get("taskId") or "")
        if event_id is not None:
            out.setdefault(event_id, []).append(_received(message))
    return out


async def kinds_of(system: System, sent: list[Sent]) -> dict[str, set[str]]:
    rows = await system.db.fetch(  # type: ignore[union-attr]
        "SELECT event_id::text AS event_id, kind FROM message_logs WHERE project_id = $1 "
        "AND event_id = ANY($2::uuid[]) AND channel <> ''",
        system.project_id, [s.event_id for s in sent])
    out: dict[str, set[str]] = {}
    for row in rows:
        out.setdefault(row["event_id"], set()).add(row["kind"])
    return out


async def run(options: RunOptions, params: dict[str, Any]) -> ScenarioResult:
    result = ScenarioResult(name=options.name, seed=options.seed)
    limit = int(params["throttle_limit"])
    async with System(options, {"api": ["api"], "pipeline": [
            "enricher", "engine", "delivery", "scheduler", "events"]}) as system:
        await system.bootstrap(users=3, settings={
            "throttle": {"limit": limit, "windowSeconds": 3600}})
        quiet_end = float(int(time.time() + float(params["quiet_s"])) + 1)  # a whole second
        for index, (user, zone) in enumerate(ZONES.items()):
            local_now = datetime.now(UTC).astimezone(ZoneInfo(zone))
            local_end = datetime.fromtimestamp(quiet_end, UTC).astimezone(ZoneInfo(zone))
            end = local_end.strftime("%H:%M:%S")
            start = (local_now - timedelta(hours=1)).strftime("%H:%M:%S")
            status, body = await system.request(
                "PUT", f"/v1/users/{user}",
                json={"timezone": zone, "contacts": contacts_for(index, ["email"])})
            result.check(status in (200, 201), f"setting {user}'s timezone: {status} {body}")
            status, body = await system.request(
                "PUT", f"/v1/users/{user}/preferences",
                json={"quietHours": {"start": start, "end": end}})
            result.check(status == 200, f"setting {user}'s quiet hours: {status} {body}")
            result.facts[f"{user} quiet hours ({zone})"] = f"{start}-{end}"

        quiet_normal: list[Sent] = []
        quiet_critical: list[Sent] = []
        for user in ZONES:
            for n in range(int(params["per_quiet_user"])):
                got = await system.send(user, data={"n": f"quiet-{n}"})
                if got:
                    quiet_normal.append(got)
            for n in range(int(params["critical"])):
                got = await system.send(user, priority="critical", data={"n": f"crit-{n}"})
                if got:
                    quiet_critical.append(got)
        over_normal: list[Sent] = []
        over_critical: list[Sent] = []
        for n in range(int(params["over_throttle"])):
            got = await system.send(THROTTLED, data={"n": f"over-{n}"})
            if got:
                over_normal.append(got)
        for n in range(int(params["critical"])):
            got = await system.send(THROTTLED, priority="critical", data={"n": f"crit-{n}"})
            if got:
                over_critical.append(got)
        everything = quiet_normal + quiet_critical + over_normal + over_critical
        expected = (len(ZONES) * (int(params["per_quiet_user"]) + int(params["critical"]))
                    + int(params["over_throttle"]) + int(params["critical"]))
        result.check(len(everything) == expected,
                     f"only {len(everything)} of {expected} sends were accepted")

        system.say(f"waiting for the quiet period to end in {quiet_end - time.time():.0f} s")
        await asyncio.sleep(max(0.0, quiet_end - time.time()))
        left = await system.quiesce(float(params["quiesce_s"]))
        result.check(not left, f"the system did not quiesce: {left}")

        times = await provider_times(system, everything)
        kinds = await kinds_of(system, everything)
        late_bound = float(params["late_bound_s"])
        for s in quiet_normal:
            arrived = times.get(s.event_id, [])
            result.check("deferred" in kinds.get(s.event_id, set()),
                         f"{s.event_id} ({s.user_id}, in quiet hours) was not deferred")
            # Deferred, not dropped: the early/late checks below pass on no arrival at all.
            result.check(len(arrived) == 1,
                         f"{s.event_id} ({s.user_id}, in quiet hours) reached the provider "
                         f"{len(arrived)} times, expected once after its quiet hours")
            early = [t for t in arrived if t < quiet_end]
            result.check(not early, f"{s.event_id} ({s.user_id}) reached the provider "
                                    f"{quiet_end - min(early, default=0):.1f} s before its "
                                    "quiet hours ended")
            late = [t for t in arrived if t > quiet_end + late_bound]
            result.check(not late, f"{s.event_id} ({s.user_id}) arrived "
                                   f"{max(late, default=0) - quiet_end:.1f} s after its quiet "
                                   "hours ended")
        for s in quiet_critical:
            arrived = times.get(s.event_id, [])
            result.check(bool(arrived), f"critical {s.event_id} ({s.user_id}) never reached "
                                        "the provider")
            result.check(not arrived or min(arrived) < quiet_end,
                         f"critical {s.event_id} ({s.user_id}) waited for quiet hours")
        result.check(len(over_normal) > limit,
                     f"{len(over_normal)} normal sends to {THROTTLED} were accepted, none over "
                     f"its throttle of {limit}: no throttling was shown")
        through = [s for s in over_normal if times.get(s.event_id)]
        throttled = [s for s in over_normal if "throttled" in kinds.get(s.event_id, set())]
        result.facts["throttled user: normal sends delivered"] = len(through)
        result.facts["throttled user: normal sends throttled"] = len(throttled)
        result.check(len(through) == min(limit, len(over_normal)),
                     f"{len(through)} of {len(over_normal)} normal sends to {THROTTLED} got "
                     f"through a throttle of {limit}")
        unlogged = [s.event_id for s in over_normal
                    if not times.get(s.event_id) and s not in throttled]
        result.check(not unlogged, f"sends held back without a 'throttled' row: {unlogged}")
        both = [s.event_id for s in throttled if times.get(s.event_id)]
        result.check(not both, f"sends both throttled and delivered: {both}")
        for s in over_critical:
            result.check(bool(times.get(s.event_id))
                         and "throttled" not in kinds.get(s.event_id, set()),
                         f"critical {s.event_id} to {THROTTLED} was throttled")
        deferred_by = [max(times[s.event_id]) - quiet_end for s in quiet_normal
                       if times.get(s.event_id)]
        if deferred_by:
            result.facts["deferred sends arrived after the quiet end (s, max)"] = round(
                max(deferred_by), 2)
        await system.account(everything, result, skips_expected=True)
        system.check_alive(result, ["api", "pipeline"])
    return result
