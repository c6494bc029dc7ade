"""When a 'scheduled' timeline row says its task is due: what a cancel reads to tell a task
still on its way to the scheduler from one already moved to delivery."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from notifkit.services.api.routes.notifications import scheduled_due

LOGGED = datetime(2026, 12, 4, 19, 0, tzinfo=UTC)


def test_the_engines_row_names_its_due_time() -> None:
    due = scheduled_due({"dueAt": "2026-12-05T06:00:00.000Z", "reason": "quietHours"}, LOGGED)
    assert due == datetime(2026, 12, 5, 6, 0, tzinfo=UTC)


@pytest.mark.parametrize("wait", [30, 1.5])
def test_a_park_is_due_its_wait_after_it_was_logged(wait: float) -> None:
    due = scheduled_due({"retryAfterSeconds": wait, "parkCount": 1}, LOGGED)
    assert due == LOGGED + timedelta(seconds=wait)


@pytest.mark.parametrize("metadata", [
    {}, None, "text", {"dueAt": "soon"}, {"dueAt": 5}, {"retryAfterSeconds": True},
    {"retryAfterSeconds": "30"}, {"retryAfterSeconds": float("nan")},
    {"retryAfterSeconds": 1e300},
])
def test_a_row_that_says_neither_has_no_due_time(metadata: Any) -> None:
    assert scheduled_due(metadata, LOGGED) is None
