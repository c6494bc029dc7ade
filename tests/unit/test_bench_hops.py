"""The benchmark's latency-by-hop breakdown: which leg of a notification's way took how long."""

from __future__ import annotations

from benchmarks.report import hops
from benchmarks.stats import HOPS, hop_breakdown


def test_each_hop_is_the_gap_between_its_two_points_in_ms() -> None:
    points = {
        f"task-{i}": (100.0, 100.001, 100.004 + i / 1000, 100.010 + i / 1000, 100.017 + i / 1000)
        for i in range(100)
    }
    out = hop_breakdown(points)
    assert list(out) == list(HOPS)
    assert out["api"]["p50_ms"] == 1.0
    # The enricher hop grows by 1 ms per notification: 3, 4, ... 102 ms.
    assert out["enricher"]["p50_ms"] == 52.0
    assert out["enricher"]["p99_ms"] == 101.0
    assert out["engine"]["p99_ms"] == 6.0
    assert out["delivery"]["p50_ms"] == 7.0
    assert {f["count"] for f in out.values()} == {100.0}


def test_a_notification_missing_a_point_is_left_out_and_rounding_never_goes_negative() -> None:
    out = hop_breakdown({
        "whole": (10.0, 10.002, 10.001, 10.005, 10.009),  # enricher stamped a ms "early"
        "unrouted": (10.0, 10.001, 10.002, None, None),
    })
    assert out["enricher"] == {"p50_ms": 0.0, "p99_ms": 0.0, "count": 1.0}
    assert out["api"]["p50_ms"] == 2.0


def test_no_notifications_gives_no_figures_and_the_report_says_so() -> None:
    out = hop_breakdown({})
    assert out["api"] == {"p50_ms": None, "p99_ms": None, "count": 0.0}
    assert hops({}) == "–"
    assert hops(out).startswith("api – / –, enricher – / –")


def test_the_report_lists_every_hop_in_order() -> None:
    out = hop_breakdown({"t": (0.0, 0.001, 0.005, 0.011, 0.018)})
    assert hops(out) == "api 1 / 1, enricher 4 / 4, engine 6 / 6, delivery 7 / 7"
