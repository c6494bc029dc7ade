"""The push provider is down (503), and SMS is down for some recipients too.

Proves: a template with the chain push -> sms -> email delivers every notification exactly once,
on the first channel of the chain that works for that recipient, after trying the earlier ones in
order (the simulators' clocks: the push failure before the SMS try before the delivery).
"""

from __future__ import annotations

import math
from typing import Any

from scenarios.harness import RunOptions, System, epoch
from scenarios.report import ScenarioResult

DESCRIPTION = ("push provider down (503), SMS down for some: the chain push -> sms -> email "
               "delivers each notification exactly once, in chain order")
PARAMS: dict[str, Any] = {"users": 30, "messages": 60, "drain_timeout_s": 60.0}
# SMS is down for users 0-9 (SMS_DOWN_FOR): the 11th user, sent the 11th message, is the first
# whose chain stops at SMS, and without one the SMS step is never shown to deliver.
RANGES = {"users": (11, math.inf), "messages": (11, math.inf)}
POSITIVE = frozenset({"drain_timeout_s"})

LAYOUT = {"api": ["api"], "workers": ["enricher", "engine", "delivery", "scheduler", "events"]}
TEMPLATE = {
    "channels": {"push": {"title": "Hi", "body": "Message {{ data.n }}"},
                 "sms": {"text": "Message {{ data.n }}"},
                 "email": {"subject": "Hi", "text": "Message {{ data.n }}"}},
    "fallback": ["push", "sms", "email"],
}
# Users 0-9 have the numbers +15550000000 ... +15550000009: SMS fails for them too.
SMS_DOWN_FOR = "+1555000000?"
PROVIDER_CHANNEL = {"fcm": "push", "twilio": "sms", "resend": "email"}


async def run(options: RunOptions, params: dict[str, Any]) -> ScenarioResult:
    result = ScenarioResult(options.name, options.seed)
    async with System(options, LAYOUT) as system:
        users = await system.bootstrap(users=int(params["users"]),
                                       channels=("push", "sms", "email"),
                                       templates={"chain": TEMPLATE})
        await system.sim.add_fault("error", "fcm", status=503)
        await system.sim.add_fault("error", "twilio", to=SMS_DOWN_FOR, status=503)
        system.say("FCM down; Twilio down for some numbers", force=True)
        sent = await system.send_many(
            [users[i % len(users)] for i in range(int(params["messages"]))], template="chain")
        waiting = await system.quiesce(float(params["drain_timeout_s"]))
        result.check(not waiting, f"the system never drained: {waiting}")
        await system.account(sent, result)

        failures: dict[str, dict[str, float]] = {}  # task id -> provider -> first failure
        for hit in system.simulator_faults("error"):
            failures.setdefault(hit.task_id, {}).setdefault(hit.provider, hit.at)
        sms_down = {s.user_id for s in sent if fnmatch_number(users.index(s.user_id))}
        via: dict[str, int] = {}
        for s in sent:
            tasks = await system.task_ids_of_event(s.event_id)
            deliveries = [(m["provider"], epoch(m["receivedAt"]))
                          for t in tasks for m in await system.sim.messages(task_id=t)]
            expected = "email" if s.user_id in sms_down else "sms"
            got = [PROVIDER_CHANNEL.get(p, p) for p, _at in deliveries]
            result.check(got == [expected],
                         f"notification {s.event_id} for {s.user_id} delivered on "
                         f"{got or 'nothing'}, expected exactly once on {expected}")
            if len(deliveries) != 1:
                continue
            via[got[0]] = via.get(got[0], 0) + 1
            # Chain order: every earlier channel failed before the delivery.
            tried = {p: at for t in tasks for p, at in failures.get(t, {}).items()}
            earlier = ["fcm"] + (["twilio"] if expected == "email" else [])
            times = [tried.get(p) for p in earlier] + [deliveries[0][1]]
            result.check(None not in times and times == sorted(t for t in times if t),
                         f"notification {s.event_id}: the chain was not followed in order "
                         f"({dict(zip([*earlier, 'delivered'], times, strict=True))})")
        for problem in chain_ends_not_shown(
                {"email" if s.user_id in sms_down else "sms" for s in sent}):
            result.check(False, problem)
        result.facts.update(delivered_via=via, sms_down_users=len(sms_down))
        system.check_alive(result, LAYOUT)
    return result


def chain_ends_not_shown(expected: set[str]) -> list[str]:
    """What the run did not show, given the channels its notifications were expected on: a
    delivery by SMS once push failed, or by email once SMS failed too."""
    return [f"no notification was expected on {channel}: the chain's step to {channel} was "
            f"not shown ({why})"
            for channel, why in (("sms", "every recipient had SMS down"),
                                 ("email", "no recipient had SMS down"))
            if channel not in expected]


def fnmatch_number(index: int) -> bool:
    from fnmatch import fnmatchcase

    return fnmatchcase(f"+1555{index:07d}", SMS_DOWN_FOR)
