"""Poison messages: one that always fails at delivery (the provider answers 500 for one
recipient) and one that always fails at the enricher; then the delivery cause is fixed and the
dead-lettered entry replayed through ``POST /v1/dlq/{id}/replay``.

Proves: a poison lands in the DLQ after exactly its stage's attempt limit (read from the
settings the processes run with, not assumed), a ``notification:failed`` event is emitted for
it, the traffic around it is delivered, and after the fix a replay delivers it exactly once.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from typing import Any

from notifkit.streams import encode
from scenarios.harness import (
    ADMIN_KEY,
    RunOptions,
    Sent,
    System,
    attempt_limits,
    basic_template,
    failed_event_ids,
)
from scenarios.report import ScenarioResult

DESCRIPTION = ("messages that always fail (provider 500 for one recipient; enricher and engine "
               "crashes) are dead-lettered after exactly their stage's attempt limit without "
               "their batch neighbours, notification:failed is emitted, a replay after the fix "
               "delivers once")
PARAMS: dict[str, Any] = {"users": 20, "messages": 40, "drain_timeout_s": 60.0}
# The first user is the poison's; the traffic around it needs another. Half the messages
# share the enricher poison's batch, so one message would leave it alone.
RANGES = {"users": (2, math.inf), "messages": (2, math.inf)}
POSITIVE = frozenset({"drain_timeout_s"})

LAYOUT = {"api": ["api"], "workers": ["enricher", "delivery", "scheduler", "events"],
          "engine": ["engine"]}


async def run(options: RunOptions, params: dict[str, Any]) -> ScenarioResult:
    result = ScenarioResult(options.name, options.seed)
    async with System(options, LAYOUT) as system:
        limits = attempt_limits(system, options, result)
        users = await system.bootstrap(users=int(params["users"]), channels=("email",),
                                       templates={"mail": basic_template(["email"])})
        poison_user, others = users[0], users[1:]
        # 1. Delivery poison: the provider always fails for this one address.
        rule = await system.sim.add_fault("error", "resend", to="user0@example.com", status=500)
        system.say("resend answers 500 for user0@example.com; sending", force=True)
        poison = await system.send(poison_user, template="mail")
        assert poison is not None, "the API refused the poison notification"
        sent: list[Sent] = [poison]
        sent += await system.send_many(
            [others[i % len(others)] for i in range(int(params["messages"]))], template="mail")
        waiting = await system.quiesce(float(params["drain_timeout_s"]))
        result.check(not waiting, f"the system never drained: {waiting}")
        # 2. Enricher poison: an inbound entry of the right shape that fails every time (its
        # segment cursor is not text, so the segment query raises). The workers are paused
        # while it and more traffic queue up, so the poison shares its read batch with
        # innocent notifications: it must not take them down with it.
        # (A read blocked when the pause began takes the first entry that arrives on its own,
        # so traffic goes in before the poison as well as after it.)
        system.pause("workers")
        half = int(params["messages"]) // 2
        sent += await system.send_many([others[i % len(others)] for i in range(half)],
                                       template="mail", label="before the enricher poison")
        enricher_poison = str(uuid.uuid4())
        await system.redis.xadd(system.keys.inbound("normal"), encode({
            "eventId": enricher_poison, "projectId": system.project_id, "template": "mail",
            "to": {"segment": "everyone"}, "priority": "normal", "segmentAfter": 12345,
        }))
        sent += await system.send_many([others[i % len(others)] for i in range(half)],
                                       template="mail", label="after the enricher poison")
        system.resume("workers")
        system.say("enricher poison queued with other traffic", force=True)
        waiting = await system.quiesce(float(params["drain_timeout_s"]))
        result.check(not waiting, f"the system never drained: {waiting}")
        # 3. Engine poisons: enriched entries whose quiet hours are not an object. The engine
        # is paused while two of them and more traffic queue up (the first may be read alone).
        system.pause("engine")
        engine_poisons = [str(uuid.uuid4()) for _ in range(2)]
        for event_id in engine_poisons:
            await system.redis.xadd(system.keys.enriched("normal"), encode({
                "eventId": event_id, "projectId": system.project_id, "template": "mail",
                "createdAt": "2026-01-01T00:00:00Z", "priority": "normal",
                "user": {"id": others[0]}, "contacts": {"email": ["user1@example.com"]},
                "preferences": {"quietHours": "never"}, "data": {},
            }))
            await asyncio.sleep(0.1)
        sent += await system.send_many([others[i % len(others)] for i in range(half)],
                                       template="mail", label="after the engine poisons")
        await system.wait_until(lambda waiting: not any(":inbound:" in k for k in waiting),
                                float(params["drain_timeout_s"]))
        system.resume("engine")
        system.say("engine poisons queued with other traffic", force=True)
        waiting = await system.quiesce(float(params["drain_timeout_s"]))
        result.check(not waiting, f"the system never drained: {waiting}")

        dlq = await dead_letters(system)
        failed_events = await failed_event_ids(system)
        expected = [(poison.event_id, "delivery", limits.max_attempts),
                    (enricher_poison, "enricher", limits.enricher_max_attempts),
                    *((e, "engine", limits.max_attempts) for e in engine_poisons)]
        for event_id, service, limit in expected:
            records = [r for r in dlq.values() if event_of(r) == event_id]
            result.check(len(records) == 1,
                         f"{service} poison {event_id}: {len(records)} DLQ entries, expected 1")
            for record in records:
                result.check(record.get("service") == service,
                             f"poison {event_id} dead-lettered by {record.get('service')}, "
                             f"expected {service}")
                result.check(record.get("attempts") == limit,
                             f"{service} poison {event_id}: dead-lettered after "
                             f"{record.get('attempts')} attempts, the limit is {limit}")
            result.check(event_id in failed_events,
                         f"no notification:failed event for the {service} poison {event_id}")
            if service != "delivery":  # delivery's tries are counted by the provider below
                tried = failed_attempts(system, service, event_id)
                result.check(tried == limit,
                             f"{service} poison {event_id}: {tried} failed attempts logged "
                             f"before the DLQ, the limit is {limit}")
        poisons = {event_id for event_id, _service, _limit in expected}
        innocent = sorted({event_of(r) or "?" for r in dlq.values()} - poisons)
        result.check(not innocent, f"notifications dead-lettered along with a poison: "
                                   f"{', '.join(innocent)}")
        provider_tries = await system.fault_count("resend", "error")
        result.check(provider_tries == limits.max_attempts,
                     f"resend saw the poison {provider_tries} times, the limit is "
                     f"{limits.max_attempts}")
        result.facts.update(dlq_before_replay=len(dlq), provider_tries=provider_tries)

        # 3. Fix the cause, replay the delivery poison through the API.
        await system.sim.remove_fault(rule["id"])
        entry_id = next((i for i, r in dlq.items() if event_of(r) == poison.event_id), None)
        if entry_id is not None:
            status, body = await system.request("POST", f"/v1/dlq/{entry_id}/replay")
            if status in (401, 403):
                status, body = await system.request("POST", f"/v1/dlq/{entry_id}/replay",
                                                    key=ADMIN_KEY)
            result.check(status == 202, f"replay of {entry_id} answered {status}: {body}")
            system.say(f"cause fixed; replayed DLQ entry {entry_id}", force=True)
            waiting = await system.quiesce(float(params["drain_timeout_s"]))
            result.check(not waiting, f"the replay never drained: {waiting}")
            task_ids = await system.task_ids_of_event(poison.event_id)
            copies = [m for t in task_ids for m in await system.sim.messages(task_id=t)]
            # Resend accepts a task once however often it gets it under the same key: a
            # replay that sent it twice shows only as an answer from its idempotency cache
            # (less a retry after an answer that never came).
            again = await system.replayed_tasks("resend")
            again -= await system.unanswered_attempts(task_ids)
            sends = len(copies) + sum(again[t] for t in task_ids)
            result.check(sends == 1,
                         f"the replayed notification {poison.event_id} reached resend "
                         f"{sends} times ({len(copies)} accepted, the rest answered from its "
                         "idempotency cache), expected once")
            result.facts["replayed_deliveries"] = sends
        await system.account(sent, result, dead_letters_expected=True)
        system.check_alive(result, LAYOUT)
    return result


async def dead_letters(system: System) -> dict[str, dict[str, Any]]:
    return dict(await system.stream_entries(system.keys.dlq))


def event_of(record: dict[str, Any]) -> str | None:
    payload = record.get("payload") or {}
    return payload.get("eventId") if isinstance(payload, dict) else None


def failed_attempts(system: System, service: str, event_id: str) -> int:
    """How many attempts at ``event_id`` the ``service`` workers logged as failed, in every
    process: the attempts really made, not the count the DLQ entry claims."""
    return sum(1 for name in system.processes for record in system.log_records(name)
               if record.get("service") == service and record.get("event_id") == event_id
               and str(record.get("msg", "")).startswith("Attempt "))
