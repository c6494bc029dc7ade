"""A scenario's parameters mean what their names say: ``--set messages=N`` sends N."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from scenarios import catalog
from scenarios.harness import RunOptions

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
def system_urls(redis_url: str, database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scenario finds Redis and PostgreSQL the way the fixtures did."""
    monkeypatch.setenv("NOTIFKIT_TEST_REDIS_URL", redis_url)
    monkeypatch.setenv("NOTIFKIT_TEST_DATABASE_URL", database_url)


@pytest.mark.usefixtures("system_urls")
def test_malformed_sends_its_messages_after_the_garbage(tmp_path: Path) -> None:
    """Given more messages than users (and a count that is no multiple of them), the send
    after the garbage is that many notifications, cycling through the users."""
    module = catalog.load("malformed")
    options = RunOptions(name="malformed", seed=1, run_dir=tmp_path)

    result = asyncio.run(module.run(options, {**module.PARAMS, "users": 2, "messages": 5}))

    assert result.ok, result.violations
    assert result.accepted == 5
    assert result.delivered == 5
