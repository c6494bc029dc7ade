"""Counts in operator-facing sentences read as English: "1 attempt", "3 attempts"."""

from __future__ import annotations

from notifkit.ids import uuid7
from notifkit.services.events import outcome_row
from notifkit.throttle import ThrottleRule
from notifkit.wording import counted


def test_one_is_singular_and_every_other_count_plural() -> None:
    assert counted(1, "attempt") == "1 attempt"
    assert [counted(n, "attempt") for n in (0, 2, 5)] == ["0 attempts", "2 attempts",
                                                          "5 attempts"]


def test_a_dead_lettering_on_the_first_attempt_says_one_attempt() -> None:
    # Given a permanent failure, dead-lettered by the worker on its first attempt
    event = {"type": "notification:failed", "projectId": uuid7(), "eventId": uuid7(),
             "taskId": uuid7(), "channel": "email", "stream": "notifkit:stream:outbound:normal",
             "entryId": "1-0", "attempts": 1, "error": "PermanentError: 422 from resend"}
    # Then its timeline row reads as a person would write it
    row = outcome_row(event)
    assert row is not None
    assert row.detail == "dead-lettered after 1 attempt: PermanentError: 422 from resend"



def test_a_throttle_of_one_send_reads_in_the_singular() -> None:
    assert ThrottleRule(limit=1, window_s=60).describe() == "more than 1 send in 60 s"
    assert ThrottleRule(limit=5, window_s=60).describe() == "more than 5 sends in 60 s"
