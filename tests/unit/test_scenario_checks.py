"""Checks the scenarios make from what they observed, on observations made up to break them: a
check that cannot see the break it exists for passes whatever the system does."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

from scenarios.backpressure import dropped, memory_followed_backlog
from scenarios.crash_reclaim import not_reclaimed_by_survivor
from scenarios.duplicate_send import lost_answers_not_retried, per_task_mismatches
from scenarios.fallback_chain import chain_ends_not_shown
from scenarios.harness import NOTHING_ACCEPTED, RunOptions, System, idempotent_replays
from scenarios.report import ScenarioResult
from scenarios.scheduler_failover import sent_more_than_once


def test_backpressure_watches_every_process_not_only_delivery() -> None:
    # The api holds every request it cannot pass on: its memory follows the backlog.
    facts: dict[str, Any] = {}
    rss_of = {
        "api": [(58.0, 0), (58.0, 10), (90.0, 900), (130.0, 2000)],
        "pipeline": [(46.0, 0), (46.2, 10), (46.5, 2000)],
    }

    problems = memory_followed_backlog(rss_of, 40.0, 2000, facts)

    assert problems == ["api RSS grew 72.0 MB (to 130.0 MB) while the backlog waiting for "
                        "delivery grew to 2000: memory follows the backlog"]
    assert facts["pipeline RSS peak (MB)"] == 46.5


def test_backpressure_needs_a_sample_of_each_process_under_backlog() -> None:
    problems = memory_followed_backlog({"api": [(58.0, 0)]}, 40.0, 0, {})

    assert problems == ["no memory sample of the api process under backlog"]


def test_duplicate_send_matches_duplicates_to_lost_answers_task_by_task() -> None:
    # Two answers lost, two duplicates: the totals agree, yet task b's lost answer was never
    # resent and task a went out three times for one lost answer.
    dupes = {"a": 2}
    lost = Counter({"a": 1, "b": 1})
    unanswered = Counter({"a": 2, "b": 1})

    assert per_task_mismatches(dupes, lost, unanswered) == [
        "task a: 1 lost response(s) but 2 duplicate(s)",
        "task b: 1 lost response(s) but 0 duplicate(s)",
    ]


def test_duplicate_send_wants_each_duplicate_visible_in_the_timeline() -> None:
    # Two lost answers, two extra copies, but the timeline records one unanswered attempt.
    assert per_task_mismatches({"a": 2}, Counter({"a": 2}), Counter({"a": 1})) == [
        "task a: 2 duplicate(s) but its timeline shows 1 attempt(s) whose answer was lost"]


def test_duplicate_send_accepts_one_copy_per_lost_answer_each_logged() -> None:
    assert per_task_mismatches({"a": 1, "c": 2}, Counter({"a": 1, "c": 2}),
                               Counter({"a": 1, "c": 2})) == []


def test_crash_reclaim_credits_only_the_survivor_with_the_takeover() -> None:
    # The engine's orphans were taken by its restarted victim, not by the survivor: the
    # stage's total would have hidden that.
    orphaned = {"engine": 3, "delivery": 2}
    reclaimed = {"engine-1": 3, "engine-2": 1, "delivery-2": 2}

    assert not_reclaimed_by_survivor(orphaned, reclaimed) == [
        "killed engine processes left 3 entries pending, but the surviving engine-2 reports "
        "reclaiming only 1 (the restarted victims 3)"]


def test_fallback_chain_must_show_both_ends_of_its_chain() -> None:
    # Every recipient with SMS down showed the step to email, never the one to SMS.
    assert chain_ends_not_shown({"email"}) == [
        "no notification was expected on sms: the chain's step to sms was not shown (every "
        "recipient had SMS down)"]
    assert chain_ends_not_shown({"sms", "email"}) == []


def test_accounting_for_nothing_accepted_is_a_violation(tmp_path: Path) -> None:
    # Every send refused left nothing to lose, and the scenario passed having shown nothing.
    result = ScenarioResult("accounting", 1)

    async def account_nothing() -> None:
        system = System(RunOptions(name="accounting", run_dir=tmp_path), {})
        try:
            await system.account([], result)
        finally:
            await system.redis.aclose()

    asyncio.run(account_nothing())

    assert result.violations == [NOTHING_ACCEPTED]
    assert not result.ok


def test_scheduler_failover_sees_a_task_resend_answered_from_its_idempotency_cache() -> None:
    # Resend accepts a task once however often it is handed over with the same key: a task
    # the scheduler moved twice showed acceptCount 1, and "every task sent once" held.
    log = ("2026-12-03 16:30:01,123 INFO simulators: resend accepted message m1 to=a@x "
           "task_id=t1 accept_count=1.\n"
           "2026-12-03 16:30:01,456 INFO simulators: resend idempotent replay of key t1; "
           "nothing sent again.\n")
    replays = idempotent_replays(log)
    replayed = Counter({"t1": replays[("resend", "t1")]})

    twice = sent_more_than_once({"e1": 1, "e2": 1}, replayed, {"t1": "e1", "t2": "e2"})

    assert twice == ["e1"]
    assert sent_more_than_once({"e1": 1, "e2": 2}, Counter(), {}) == ["e2"]


def test_duplicate_send_wants_each_lost_resend_answer_retried_under_its_key() -> None:
    # A task never sent again after its answer was lost cannot be sent twice: no duplicate
    # from Resend would then say nothing about its idempotency key.
    lost = Counter({"t1": 1, "t2": 2})

    assert lost_answers_not_retried(lost, Counter({"t1": 1, "t2": 1})) == [
        "task t2: 2 lost response(s) but 1 retry(s) answered from the idempotency cache"]
    assert lost_answers_not_retried(lost, Counter({"t1": 1, "t2": 2})) == []


def test_backpressure_calls_a_dead_lettered_notification_dropped() -> None:
    # A DLQ entry is not lost by the accounting's rule, so "nothing dropped" passed with one.
    result = ScenarioResult("backpressure", 1, accepted=100, delivered=99, dead_lettered=1)

    assert dropped(result, 100) == [
        "1 notifications were dead-lettered under a slow provider that failed no send"]
    assert dropped(ScenarioResult("backpressure", 1, accepted=99, delivered=99), 100) == [
        "only 99 of 100 sends were accepted"]


def test_a_dead_lettered_notification_fails_a_run_where_nothing_could_fail_a_send() -> None:
    # crash_reclaim and redis_restart checked 0 lost, and a DLQ entry is not lost.
    result = ScenarioResult("crash_reclaim", 1, accepted=10, delivered=9, dead_lettered=1)

    result.check_none_dead_lettered("only processes crashed")

    assert result.violations == ["1 notification(s) dead-lettered, though only processes "
                                 "crashed"]
    clean = ScenarioResult("crash_reclaim", 1, accepted=10, delivered=10)
    clean.check_none_dead_lettered("only processes crashed")
    assert clean.ok
