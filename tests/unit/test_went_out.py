"""Which canceled recipients keep their throttle mark: those something went out to."""

from __future__ import annotations

from typing import Any

from notifkit.services.timeline import went_out

ADA = ("p", "e", "ada")


def row(task: str, kind: str, status: str, attempt: int = 0) -> dict[str, Any]:
    return {"project_id": "p", "event_id": "e", "user_id": "ada", "task_id": task,
            "kind": kind, "status": status, "attempt": attempt}


def test_a_recipient_whose_every_task_was_canceled_before_delivery_got_nothing() -> None:
    assert went_out([row("t1", "scheduled", "scheduled"), row("t1", "canceled", "skipped"),
                     row("t2", "deferred", "scheduled"), row("t2", "canceled", "skipped"),
                     row("t3", "throttled", "throttled")]) == set()


def test_a_task_queued_for_delivery_or_tried_went_out_even_if_canceled_later() -> None:
    assert went_out([row("t1", "canceled", "skipped"),
                     row("t2", "queued", "processing")]) == {ADA}
    # Parked after a provider's 429, then taken out of the scheduler by the cancel
    assert went_out([row("t1", "queued", "processing"), row("t1", "canceled", "skipped")]) \
        == {ADA}
    assert went_out([row("t1", "scheduled", "scheduled"),
                     row("t1", "deferred", "scheduled", attempt=1),
                     row("t1", "canceled", "skipped")]) == {ADA}


def test_a_task_still_scheduled_and_not_canceled_may_go_out() -> None:
    # Moved to delivery before the cancel came, or on its way to the scheduler
    assert went_out([row("t1", "canceled", "skipped"),
                     row("t2", "scheduled", "scheduled")]) == {ADA}
