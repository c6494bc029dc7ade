"""``utc_now_iso``: the timestamp every stage stamps on what it emits; and milliseconds to
times and back, which the timeline and the scheduler write."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from notifkit.clock import from_ms, iso_from_ms, to_ms, utc_now_iso
from notifkit.services.engine.service import _parse_ms

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


LAST_MS = to_ms(datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC))


def test_the_last_millisecond_a_send_may_name_is_written_as_given() -> None:
    # Through a float of seconds it was ...59.998Z: a send shown a millisecond early.
    assert LAST_MS == 253402300799999
    assert iso_from_ms(LAST_MS) == "9999-12-31T23:59:59.999Z"
    assert _parse_ms("9999-12-31T23:59:59.999Z") == LAST_MS


@given(st.integers(min_value=0, max_value=LAST_MS))
def test_milliseconds_survive_the_way_to_text_and_back(ms: int) -> None:
    assert to_ms(from_ms(ms)) == ms
    text = iso_from_ms(ms)
    assert ISO_MS.match(text), text
    assert _parse_ms(text) == ms
