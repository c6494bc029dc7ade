"""The scenarios' accounting against a running system: "lost" is accepted, and neither
delivered, nor in the DLQ, nor skipped with a reason (SCENARIOS.md), whichever stage skipped."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from scenarios.harness import RunOptions, Sent, System
from scenarios.report import ScenarioResult

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LAYOUT = {"api": ["api"], "pipeline": ["enricher", "engine", "delivery", "scheduler", "events"]}


async def account(run_dir: Path, users: int,
                  stage: Callable[[System, list[str]], Awaitable[list[Sent | None]]],
                  **how: bool) -> ScenarioResult:
    """The accounting of what ``stage`` sends to ``users`` fresh users, once all is done."""
    result = ScenarioResult("accounting", 1)
    async with System(RunOptions(name="accounting", run_dir=run_dir), LAYOUT) as system:
        sent = await stage(system, await system.bootstrap(users=users))
        assert None not in sent
        waiting = await system.quiesce(60)
        assert not waiting, waiting
        await system.account([s for s in sent if s is not None], result, **how)
    return result


async def send_to_an_unknown_user(system: System, users: list[str]) -> list[Sent | None]:
    return [await system.send(users[0]), await system.send("no-such-user")]


async def send_one_that_always_fails(system: System, users: list[str]) -> list[Sent | None]:
    await system.sim.add_fault("error", "resend", to="user0@example.com", status=500)
    return [await system.send(user) for user in users]


def test_a_notification_the_enricher_skips_is_skipped_not_lost(
    redis_url: str, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The enricher's row for an unknown user names no channel; the accounting read only rows
    # of a channel and called the notification lost.
    monkeypatch.setenv("NOTIFKIT_TEST_REDIS_URL", redis_url)
    monkeypatch.setenv("NOTIFKIT_TEST_DATABASE_URL", database_url)

    result = asyncio.run(account(tmp_path, 1, send_to_an_unknown_user, skips_expected=True))

    assert result.lost == []
    assert (result.accepted, result.delivered) == (2, 1)
    assert dict(result.skipped) == {"skipped: unknown user": 1}


def test_a_dead_lettered_notification_is_a_violation_unless_the_scenario_expects_one(
    redis_url: str, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A notification in the DLQ is not lost by the accounting's rule, so a scenario in which
    # nothing fails a send for good passed with one given up on (invalid_token, malformed,
    # scheduler_failover, key_revocation: their "delivered" or "skipped" held of the rest).
    monkeypatch.setenv("NOTIFKIT_TEST_REDIS_URL", redis_url)
    monkeypatch.setenv("NOTIFKIT_TEST_DATABASE_URL", database_url)

    result = asyncio.run(account(tmp_path, 2, send_one_that_always_fails))

    assert (result.accepted, result.delivered, result.dead_lettered) == (2, 1, 1)
    assert result.lost == []
    assert result.violations == [
        "1 notification(s) dead-lettered, though nothing in this scenario should give one up"]

    expected = asyncio.run(account(tmp_path, 2, send_one_that_always_fails,
                                   dead_letters_expected=True))
    assert expected.dead_lettered == 1
    assert expected.ok, expected.violations
