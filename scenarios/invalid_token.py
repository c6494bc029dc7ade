"""FCM reports some push tokens invalid (UNREGISTERED).

Proves: each invalid token reaches FCM exactly once and is then disabled
(``user_contacts.enabled = false``); later sends never use it again; a template with a fallback
chain delivers on the next channel (email) instead, exactly once per notification; a push-only
template is skipped with a reason for those users, not lost; other users' tokens keep working.
"""

from __future__ import annotations

from typing import Any

from scenarios.harness import RunOptions, Sent, System
from scenarios.report import ScenarioResult

DESCRIPTION = ("FCM says some tokens are invalid: each tried once then disabled, never used "
               "again; the fallback chain delivers by email; push-only sends skipped, not lost")
PARAMS: dict[str, Any] = {"users": 30, "invalid_users": 10, "drain_timeout_s": 60.0}
# Without an invalid token FCM refuses nothing, and every check about one holds of nothing.
POSITIVE = frozenset({"users", "invalid_users", "drain_timeout_s"})
# Users beside the invalid ones show that other tokens keep working.
MORE_THAN = {"users": "invalid_users"}

LAYOUT = {"api": ["api"], "workers": ["enricher", "engine", "delivery", "scheduler", "events"]}
TEMPLATES = {
    "push_or_mail": {
        "channels": {"push": {"title": "Hi", "body": "Message {{ data.n }}"},
                     "email": {"subject": "Hi", "text": "Message {{ data.n }}"}},
        "fallback": ["push", "email"],
    },
    "push_only": {"channels": {"push": {"title": "Hi", "body": "Message {{ data.n }}"}}},
}


async def run(options: RunOptions, params: dict[str, Any]) -> ScenarioResult:
    result = ScenarioResult(options.name, options.seed)
    async with System(options, LAYOUT) as system:
        users = await system.bootstrap(users=int(params["users"]), channels=("push", "email"),
                                       templates=TEMPLATES)
        invalid = users[: int(params["invalid_users"])]
        tokens = await push_tokens(system)  # user -> token
        bad_tokens = {tokens[u] for u in invalid}
        for token in sorted(bad_tokens):
            await system.sim.add_fault("invalid_token", "fcm", to=token)
        system.say(f"FCM calls {len(bad_tokens)} tokens invalid", force=True)

        first = await system.send_many(users, template="push_or_mail", label="round 1")
        waiting = await system.quiesce(float(params["drain_timeout_s"]))
        result.check(not waiting, f"round 1 never drained: {waiting}")
        second = await system.send_many(users, template="push_or_mail", label="round 2")
        second_push = await system.send_many(users, template="push_only", label="push only")
        waiting = await system.quiesce(float(params["drain_timeout_s"]))
        result.check(not waiting, f"round 2 never drained: {waiting}")
        sent: list[Sent] = first + second + second_push
        await system.account(sent, result, skips_expected=True)

        # Each invalid token reached FCM exactly once, however many sends named it.
        hits: dict[str, int] = {}
        for hit in system.simulator_faults("invalid_token"):
            hits[hit.to] = hits.get(hit.to, 0) + 1
        for token in sorted(bad_tokens):
            result.check(hits.get(token, 0) == 1,
                         f"the invalid token {token} reached FCM {hits.get(token, 0)} times, "
                         "expected exactly once")
        enabled = await contact_state(system)
        for user in users:
            token = tokens[user]
            should = token not in bad_tokens
            result.check(enabled.get(token) is should,
                         f"push contact {token} of {user} is "
                         f"{'enabled' if enabled.get(token) else 'disabled'}, expected "
                         f"{'enabled' if should else 'disabled'}")

        # One delivery per fallback notification: push for good tokens, email for bad ones.
        for s in first + second:
            channels = await delivered_channels(system, s.event_id)
            expected = "email" if s.user_id in invalid else "push"
            result.check(channels == [expected],
                         f"notification {s.event_id} for {s.user_id} delivered on "
                         f"{channels or 'nothing'}, expected once on {expected}")
        for s in second_push:
            channels = await delivered_channels(system, s.event_id)
            expected_push = [] if s.user_id in invalid else ["push"]
            result.check(channels == expected_push,
                         f"push-only notification {s.event_id} for {s.user_id} delivered on "
                         f"{channels or 'nothing'}, expected {expected_push or 'nothing'}")
        result.facts.update(invalid_tokens=len(bad_tokens),
                            fcm_invalid_answers=sum(hits.values()))
        system.check_alive(result, LAYOUT)
    return result


async def push_tokens(system: System) -> dict[str, str]:
    assert system.db is not None
    rows = await system.db.fetch(
        "SELECT user_id, target FROM user_contacts WHERE project_id = $1 AND channel = 'push'",
        system.project_id)
    return {r["user_id"]: r["target"] for r in rows}


async def contact_state(system: System) -> dict[str, bool]:
    assert system.db is not None
    rows = await system.db.fetch(
        "SELECT target, enabled FROM user_contacts WHERE project_id = $1 AND channel = 'push'",
        system.project_id)
    return {r["target"]: r["enabled"] for r in rows}


async def delivered_channels(system: System, event_id: str) -> list[str]:
    """One entry per provider acceptance of any of the notification's tasks."""
    channels: list[str] = []
    by_provider = {"fcm": "push", "resend": "email", "twilio": "sms"}
    for task_id in await system.task_ids_of_event(event_id):
        for message in await system.sim.messages(task_id=task_id):
            channels.append(by_provider.get(message["provider"], message["provider"]))
    return sorted(channels)
