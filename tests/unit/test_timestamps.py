"""``utc_now_iso``: the timestamp every stage stamps on what it emits."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

from notifkit.clock import utc_now_iso

ISO_MS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")


def test_it_is_now_in_utc_to_the_millisecond() -> None:
    before = datetime.now(UTC)
    stamp = utc_now_iso()
    after = datetime.now(UTC)
    assert ISO_MS.match(stamp), stamp
    parsed = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    assert before.replace(microsecond=before.microsecond // 1000 * 1000) <= parsed <= after


def test_it_moves_on_as_time_passes() -> None:
    first = utc_now_iso()
    time.sleep(0.003)
    assert utc_now_iso() > first
