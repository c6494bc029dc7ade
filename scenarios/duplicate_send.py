"""Providers accept a message and then never answer (``lost_response``): the duplicate-send case.

Proves: against a provider that honours idempotency keys (Resend) a retry after a lost answer
sends nothing twice; against one without them (Twilio SMS) every lost answer costs exactly one
duplicate of the very task whose answer was lost, and each duplicate is visible in the log: the
task is flagged ``possibleDuplicate`` and its timeline has one unanswered attempt per extra copy.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from scenarios.harness import RunOptions, Sent, System, basic_template
from scenarios.report import ScenarioResult

DESCRIPTION = ("lost_response faults: Resend (idempotency keys) sends nothing twice; Twilio "
               "duplicates exactly the lost responses, each flagged in the log")
PARAMS: dict[str, Any] = {
    "users": 40,
    "messages": 60,  # per provider
    "lost_responses": 6,  # per provider, at most
    "probability": 0.15,
    "drain_timeout_s": 60.0,  # waiting longer than this for quiescence is a violation
}
# No message, no lost response allowed (the simulators take at least 1) or a probability of 0:
# no answer is lost, and there is nothing to show about a resend.
POSITIVE = frozenset({"users", "messages", "lost_responses", "probability", "drain_timeout_s"})
RANGES = {"probability": (0.0, 1.0)}

LAYOUT = {"api": ["api"], "workers": ["enricher", "engine", "delivery", "scheduler", "events"]}
PHASES = (("resend", "mail"), ("twilio", "text"))


async def run(options: RunOptions, params: dict[str, Any]) -> ScenarioResult:
    result = ScenarioResult(options.name, options.seed)
    async with System(options, LAYOUT) as system:
        users = await system.bootstrap(
            users=int(params["users"]), channels=("email", "sms"),
            templates={"mail": basic_template(["email"]), "text": basic_template(["sms"])},
        )
        all_sent: list[Sent] = []
        for provider, template in PHASES:
            rule = await system.sim.add_fault(
                "lost_response", provider, probability=float(params["probability"]),
                times=int(params["lost_responses"]))
            system.say(f"{provider}: lost_response on, sending", force=True)
            sent = await system.send_many(
                [users[i % len(users)] for i in range(int(params["messages"]))],
                template=template, label=f"{provider}")
            all_sent += sent
            waiting = await system.quiesce(float(params["drain_timeout_s"]))
            result.check(not waiting, f"{provider}: the system never drained: {waiting}")
            await system.sim.remove_fault(rule["id"])
            lost = await system.fault_count(provider, "lost_response")
            dupes = {t: extra for t, (p, extra) in (await system.duplicates()).items()
                     if p == provider}
            extra_total = sum(dupes.values())
            flagged = await flagged_tasks(system, [s.event_id for s in sent])
            result.facts[provider] = {"lost_responses": lost, "duplicates": extra_total,
                                      "flagged_in_log": len(flagged)}
            result.check(lost > 0, f"{provider}: no response was lost; raise probability")
            if extra_total:
                result.duplicates[f"{provider}: lost response"] += extra_total
            lost_by_task = Counter(hit.task_id for hit in system.simulator_faults(
                "lost_response") if hit.provider == provider)
            if provider == "resend":
                for task_id, extra in dupes.items():
                    result.check(False, f"resend accepted task {task_id} (notification "
                                        f"{await system.event_of_task(task_id)}) {extra + 1} "
                                        "times despite its idempotency key")
                # No duplicate proves the key only if the task was sent again: each lost
                # answer's retry must reach Resend and be answered from its idempotency cache.
                replayed = await system.replayed_tasks(provider)
                result.facts[provider]["answered_from_idempotency_cache"] = sum(
                    replayed.values())
                for problem in lost_answers_not_retried(lost_by_task, replayed):
                    result.check(False, f"resend: {problem}")
            else:
                result.check(extra_total == lost,
                             f"twilio: {lost} lost responses but {extra_total} duplicates "
                             "(each lost answer must cost exactly one)")
                unflagged = sorted(set(dupes) - flagged)
                for task_id in unflagged:
                    result.check(False, f"twilio: task {task_id} (notification "
                                        f"{await system.event_of_task(task_id)}) was sent "
                                        "twice but its timeline does not say so")
                # Exactly, task by task: equal totals could hide a task sent once too often
                # beside one whose lost answer was never resent. And each duplicate is visible
                # in the log: one failed attempt whose answer never came per extra copy.
                unanswered = await system.unanswered_attempts(sorted(set(dupes)))
                for problem in per_task_mismatches(dupes, lost_by_task, unanswered):
                    result.check(False, f"twilio: {problem}")
        # account() attributes duplicates too (and checks each has a cause in the timeline);
        # keep the per-phase attribution above rather than counting them twice.
        attributed = Counter(result.duplicates)
        # A task whose answers were all lost used up its attempts: dead-lettered, not lost.
        await system.account(all_sent, result, dead_letters_expected=True)
        result.duplicates = attributed
        system.check_alive(result, LAYOUT)
    return result


async def flagged_tasks(system: System, event_ids: list[str]) -> set[str]:
    """Tasks whose timeline has a send flagged as a possible duplicate."""
    assert system.db is not None
    rows = await system.db.fetch(
        "SELECT DISTINCT task_id FROM message_logs WHERE project_id = $1 "
        "AND event_id = ANY($2::uuid[]) AND kind = 'sent' "
        "AND (metadata->>'possibleDuplicate')::boolean",
        system.project_id, event_ids)
    return {r["task_id"] for r in rows}


def per_task_mismatches(dupes: dict[str, int], lost_by_task: Counter[str],
                        unanswered: Counter[str]) -> list[str]:
    """Where a provider without idempotency keys did not get exactly one extra copy of a task
    per answer it lost for that task, or where the task's timeline shows fewer unanswered
    attempts than extra copies."""
    problems: list[str] = []
    for task_id in sorted(set(dupes) | set(lost_by_task)):
        extra, lost = dupes.get(task_id, 0), lost_by_task.get(task_id, 0)
        if extra != lost:
            problems.append(f"task {task_id}: {lost} lost response(s) but {extra} "
                            "duplicate(s)")
        if unanswered.get(task_id, 0) < extra:
            problems.append(f"task {task_id}: {extra} duplicate(s) but its timeline shows "
                            f"{unanswered.get(task_id, 0)} attempt(s) whose answer was lost")
    return problems


def lost_answers_not_retried(lost_by_task: Counter[str], replayed: Counter[str]) -> list[str]:
    """Tasks a provider with idempotency keys lost answers for that were not sent again as
    often (each retry answered from its cache): without the retry, "no duplicate" shows
    nothing about the key."""
    return [f"task {task_id}: {lost} lost response(s) but {replayed.get(task_id, 0)} "
            "retry(s) answered from the idempotency cache"
            for task_id, lost in sorted(lost_by_task.items())
            if replayed.get(task_id, 0) < lost]
