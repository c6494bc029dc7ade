"""A notification whose recipients go out in pages is in progress until its last page."""

from __future__ import annotations

from typing import Any

from notifkit.services.api.routes.notifications import summary_status

SENT = {"sent", "skipped"}


def event(*kinds: str) -> list[dict[str, Any]]:
    status = {"accepted": "accepted", "dead_lettered": "dead_lettered"}
    return [{"kind": kind, "status": status.get(kind, "processing")} for kind in kinds]


def test_recipients_done_while_pages_follow_read_processing() -> None:
    assert summary_status(SENT, event("accepted", "fanout")) == "processing"


def test_once_the_last_page_is_enriched_the_recipients_tell() -> None:
    assert summary_status(SENT, event("accepted", "fanout", "fanned_out")) == "sent"


def test_a_dead_lettered_page_ends_the_wait_and_its_replay_resumes_it() -> None:
    assert summary_status(SENT, event("accepted", "fanout", "dead_lettered")) == "sent"
    assert summary_status(SENT, event("accepted", "fanout", "dead_lettered", "replayed")) == (
        "processing")


def test_a_notification_sent_in_one_page_is_unchanged() -> None:
    assert summary_status(SENT, event("accepted")) == "sent"
