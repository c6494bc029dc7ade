"""Checks the scenarios make from what they observed, on observations made up to break them: a
check that cannot see the break it exists for passes whatever the system does."""

from __future__ import annotations

from typing import Any

from scenarios.backpressure import memory_followed_backlog


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
