"""workflow_wait_for_event: waitForEvent with a timeout; the event comes for some users only.

Workflow: send ``welcome``; wait up to ``timeout_s`` for ``activated``; branch on whether it
came: ``thanks`` or ``reminder``. Two workflow processes share the instances. Right after the
triggers, while the first steps are running, one workflow process is SIGKILLed (the other is
stopped until then, so every instance lock there is the victim's): its pending entries are
reclaimed by the survivor, and the instances it held stay locked until their lock expires
(``WORKFLOW_LOCK_TTL_SECONDS``), then resume. Each chosen user's event is posted once that
user's instance is waiting for it.

Invariants, from the provider's records and the instances: every user gets exactly one
``welcome`` and exactly one of ``thanks`` (the event came) or ``reminder`` (it did not), each
accepted once; every instance completes; each instance's steps ran one after another (no
step started before the previous one finished), and no step of an instance the victim held
started or finished while the victim's lock on it lived (the instance lock held); nothing
lost.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from typing import Any

from scenarios.harness import RunOptions, Sent, System, epoch
from scenarios.report import ScenarioResult

DESCRIPTION = "waitForEvent with a timeout; SIGKILL a workflow process mid-step: the right " \
              "branch per user, each step once"
PARAMS: dict[str, Any] = {
    # The lock outlives the reclaim of the victim's entries (RECLAIM_MIN_IDLE_SECONDS, 1 s, and
    # a sweep a second later at most), so a survivor that ignored it would be seen running.
    "users": 30, "timeout_s": 8, "kill_within_s": 5.0, "lock_ttl_s": 5, "quiesce_s": 45.0,
}
# A waitForEvent timeout is more than 0 s; WORKFLOW_LOCK_TTL_SECONDS at least 1.
POSITIVE = frozenset({"timeout_s", "kill_within_s", "lock_ttl_s", "quiesce_s"})
# Half the users post the event: each branch needs one user of its own.
RANGES = {"users": (2, math.inf)}

LAYOUT = {
    "api": ["api"],
    "pipeline": ["enricher", "engine", "delivery", "scheduler", "events"],
    "workflow-1": ["workflow"],
    "workflow-2": ["workflow"],
}

# The processes' clocks and the database's agree to well within this on one machine.
CLOCK_SLACK_S = 0.05
# How long past its timeout a waitForEvent may end beyond what a dead lock holds it back:
# the timers' poll, the wake-up's way through the stream and a busy machine.
LATE_WAKE_S = 3.0

TEMPLATES = {
    name: {"channels": {"email": {"subject": name, "text": f"{name} {{{{ user.id }}}}"}}}
    for name in ("welcome", "thanks", "reminder")
}


def workflow(timeout_s: int) -> dict[str, Any]:
    return {"steps": [
        {"type": "send", "template": "welcome"},
        {"type": "waitForEvent", "event": "activated", "timeoutSeconds": timeout_s,
         "onTimeout": "continue"},
        {"type": "branch", "if": "steps[1] is not none",
         "then": [{"type": "send", "template": "thanks"}],
         "else": [{"type": "send", "template": "reminder"}]},
    ]}


async def instance(system: System, instance_id: str) -> dict[str, Any]:
    status, body = await system.request("GET", f"/v1/workflow-instances/{instance_id}")
    return body if status == 200 else {}


async def run(options: RunOptions, params: dict[str, Any]) -> ScenarioResult:
    result = ScenarioResult(name=options.name, seed=options.seed)
    options.env.setdefault("WORKFLOW_LOCK_TTL_SECONDS", str(int(params["lock_ttl_s"])))
    rng = random.Random(options.seed)
    async with System(options, LAYOUT) as system:
        users = await system.bootstrap(users=int(params["users"]), templates=TEMPLATES)
        status, body = await system.request("PUT", "/v1/workflows/onboarding",
                                            json=workflow(int(params["timeout_s"])))
        result.check(status in (200, 201), f"defining the workflow: {status} {body}")
        chosen = set(rng.sample(users, len(users) // 2))  # these users send the event

        instances: dict[str, str] = {}

        async def trigger(user: str) -> None:
            status, body = await system.request("POST", "/v1/workflows/onboarding/trigger",
                                                json={"userId": user, "data": {}})
            if status == 202:
                instances[user] = body["instanceId"]
            else:
                result.violations.append(f"triggering for {user}: {status} {body}")

        # Until the kill only workflow-1 runs: every instance lock then is the victim's.
        system.pause("workflow-2")
        triggering = asyncio.gather(*(trigger(u) for u in users))
        held: list[tuple[str, str]] = []
        locks: dict[str, int] = {}
        deadline = time.monotonic() + float(params["kill_within_s"])
        while time.monotonic() < deadline:
            system.pause("workflow-1")  # what it holds when looked at, it holds when killed
            held = await system.pending_of("workflow-1", "workflow")
            if held and (locks := await instance_locks(system)):
                break
            system.resume("workflow-1")
            await asyncio.sleep(0.01)
        system.say(f"SIGKILL workflow-1 holding {len(held)} entries", force=True)
        await system.kill("workflow-1")
        killed_at = time.time()
        locks = await instance_locks(system)  # instance id -> ms the dead lock still lives
        system.resume("workflow-2")
        await triggering
        result.facts["entries workflow-1 held when killed"] = len(held)
        result.facts["instance locks held when killed"] = len(locks)
        result.check(bool(held), "workflow-1 never held an entry: the kill proved nothing")
        result.check(bool(locks), "workflow-1 held no instance lock when killed: the lock's "
                                  "hold over a crashed run was not shown")

        # Post each chosen user's event once their instance waits for it.
        posted: dict[str, float] = {}
        deadline = time.monotonic() + float(params["timeout_s"])
        while len(posted) < len(chosen) and time.monotonic() < deadline:
            for user in sorted(chosen - posted.keys()):
                body = await instance(system, instances.get(user, ""))
                steps = body.get("steps") or []
                if len(steps) > 1 and steps[1].get("status") == "waiting":
                    status, reply = await system.request(
                        "POST", "/v1/events", json={"name": "activated", "userId": user,
                                                    "data": {"from": "scenario"}})
                    result.check(status == 202, f"posting {user}'s event: {status} {reply}")
                    posted[user] = time.time()
            system.say(f"events posted: {len(posted)}/{len(chosen)}")
            await asyncio.sleep(0.2)
        result.check(len(posted) == len(chosen),
                     f"{len(chosen) - len(posted)} instances never reached waitForEvent in time")

        left = await system.quiesce(float(params["quiesce_s"]))
        result.check(not left, f"the system did not quiesce: {left}")

        # Each user's e-mails, by template (subject), counting every acceptance.
        got: dict[str, list[str]] = {}
        for message in await system.sim.messages(limit=100_000):
            content = message.get("content") or {}
            subject = str(content.get("subject") or "")
            got.setdefault(str(message.get("to")), []).append(subject)
        duplicates = await system.duplicates()
        result.check(not duplicates, f"tasks accepted more than once: {list(duplicates)[:10]}")
        # Resend accepts a task once however often it gets it under the same key: a step
        # whose send went out twice shows only as an answer from its idempotency cache.
        replayed = await system.replayed_tasks("resend")
        replayed -= await system.unanswered_attempts(list(replayed))
        result.check(not replayed, "tasks sent again and answered from Resend's idempotency "
                                   f"cache: {sorted(replayed)[:10]}")
        sent: list[Sent] = []
        for index, user in enumerate(users):
            address = f"user{index}@example.com"
            subjects = sorted(s for a, ss in got.items() if address in a for s in ss)
            want = sorted(["welcome", "thanks" if user in posted else "reminder"])
            came = "sent" if user in posted else "not sent"
            result.check(subjects == want,
                         f"{user} (event {came}) got {subjects}, expected {want}")
            body = await instance(system, instances.get(user, ""))
            result.check(body.get("status") == "completed",
                         f"instance of {user} is {body.get('status')!r}, not completed")
            steps = sorted(body.get("steps") or [], key=lambda s: s["index"])
            for step in steps:
                output = step.get("output") or {}
                # Latency counts from the send step's finish, not the trigger: the waits
                # between steps are the workflow's, the rest is the pipeline's.
                if step.get("type") == "send" and output.get("eventId"):
                    sent.append(Sent(output["eventId"], user, epoch(step.get("at"))))
            times = [epoch(s.get("at")) for s in steps if s.get("at")]
            result.check(times == sorted(times),
                         f"instance of {user} ran steps out of order: {steps}")
        for problem in await ran_under_dead_lock(system, locks, killed_at):
            result.check(False, problem)
        for problem in await waits_off_time(system, instances, posted, params):
            result.check(False, problem)
        result.facts["users who sent the event"] = len(posted)
        result.facts["instances"] = len(instances)
        result.facts["lock contention retries"] = sum(
            system.count_log_lines("running elsewhere").values())
        await system.account(sent, result)
        system.check_alive(result, [n for n in LAYOUT if n != "workflow-1"])
    return result


async def instance_locks(system: System) -> dict[str, int]:
    """Instance id -> milliseconds its workflow lock still lives, for every lock held now."""
    prefix = system.keys.workflow_lock("")
    out: dict[str, int] = {}
    async for key in system.redis.scan_iter(match=system.keys.workflow_lock("*"), count=1000):
        name = key.decode() if isinstance(key, bytes) else str(key)
        ttl_ms = int(await system.redis.pttl(name))
        if ttl_ms > 0:
            out[name[len(prefix):]] = ttl_ms
    return out


async def ran_under_dead_lock(system: System, locks: dict[str, int],
                              killed_at: float) -> list[str]:
    """The steps of instances whose lock the killed process held that started or finished
    after the kill while that lock still lived: only its holder may run an instance, and the
    holder was dead."""
    assert system.db is not None
    rows = await system.db.fetch(
        "SELECT instance_id::text AS instance_id, path, started_at, finished_at "
        "FROM workflow_steps WHERE project_id = $1 AND instance_id::text = ANY($2::text[])",
        system.project_id, list(locks))
    problems: list[str] = []
    for row in rows:
        until = killed_at + locks[row["instance_id"]] / 1000 - CLOCK_SLACK_S
        for what in ("started_at", "finished_at"):
            at = row[what]
            if at is not None and killed_at + CLOCK_SLACK_S < at.timestamp() < until:
                problems.append(
                    f"instance {row['instance_id']}: step {row['path']} {what[:-3]} "
                    f"{at.timestamp() - killed_at:.2f} s after workflow-1 was killed, while "
                    f"its lock lived {until - killed_at + CLOCK_SLACK_S:.2f} s more: run "
                    "without the instance lock")
    return problems


async def waits_off_time(system: System, instances: dict[str, str], posted: dict[str, float],
                         params: dict[str, Any]) -> list[str]:
    """Each waitForEvent that ended at the wrong time: one timed out must have waited its
    timeout, neither less nor much more (a dead process's instance lock may hold it back up
    to the lock's TTL, and the timers' poll a little more); one whose event came must have
    ended after the event was posted."""
    assert system.db is not None
    timeout_s = float(params["timeout_s"])
    late_s = float(params["lock_ttl_s"]) + LATE_WAKE_S
    rows = await system.db.fetch(
        "SELECT instance_id::text AS instance_id, started_at, finished_at FROM workflow_steps "
        "WHERE project_id = $1 AND type = 'waitForEvent' AND instance_id::text = ANY($2::text[])",
        system.project_id, list(instances.values()))
    ended = {r["instance_id"]: r for r in rows}
    problems: list[str] = []
    for user, instance_id in sorted(instances.items()):
        row = ended.get(instance_id)
        if row is None or row["finished_at"] is None:
            problems.append(f"{user}'s waitForEvent never ended")
            continue
        waited = (row["finished_at"] - row["started_at"]).total_seconds()
        if user in posted:
            if row["finished_at"].timestamp() < posted[user] - CLOCK_SLACK_S:
                problems.append(f"{user}'s waitForEvent ended {waited:.3f} s after it began, "
                                "before the event was posted")
        elif waited < timeout_s - CLOCK_SLACK_S:
            problems.append(f"{user}'s waitForEvent timed out after {waited:.3f} s, before "
                            f"its timeout of {timeout_s:g} s")
        elif waited > timeout_s + late_s:
            problems.append(f"{user}'s waitForEvent timed out after {waited:.3f} s, more than "
                            f"{late_s:g} s past its timeout of {timeout_s:g} s")
    return problems
