"""The scenarios' accounting against a running system: "lost" is accepted, and neither
delivered, nor in the DLQ, nor skipped with a reason (SCENARIOS.md), whichever stage skipped."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from scenarios.harness import RunOptions, System
from scenarios.report import ScenarioResult

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LAYOUT = {"api": ["api"], "pipeline": ["enricher", "engine", "delivery", "scheduler", "events"]}


async def account_a_send_to_an_unknown_user(run_dir: Path) -> ScenarioResult:
    result = ScenarioResult("accounting", 1)
    async with System(RunOptions(name="accounting", run_dir=run_dir), LAYOUT) as system:
        [user] = await system.bootstrap(users=1)
        known = await system.send(user)
        unknown = await system.send("no-such-user")
        assert known is not None
        assert unknown is not None
        waiting = await system.quiesce(60)
        assert not waiting, waiting
        await system.account([known, unknown], result, skips_expected=True)
    return result


def test_a_notification_the_enricher_skips_is_skipped_not_lost(
    redis_url: str, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The enricher's row for an unknown user names no channel; the accounting read only rows
    # of a channel and called the notification lost.
    monkeypatch.setenv("NOTIFKIT_TEST_REDIS_URL", redis_url)
    monkeypatch.setenv("NOTIFKIT_TEST_DATABASE_URL", database_url)

    result = asyncio.run(account_a_send_to_an_unknown_user(tmp_path))

    assert result.lost == []
    assert (result.accepted, result.delivered) == (2, 1)
    assert dict(result.skipped) == {"skipped: unknown user": 1}
