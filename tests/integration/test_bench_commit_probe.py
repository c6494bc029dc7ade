"""The benchmark's commit-latency baseline: real commits on the test database, summarised."""

from __future__ import annotations

import asyncpg

from benchmarks.baselines import commit_latency
from benchmarks.report import commit_line
from benchmarks.stats import SLOW_COMMIT_MS, commit_summary


async def test_the_probe_times_real_commits_and_leaves_no_table(db: asyncpg.Pool) -> None:
    flushed = "SELECT pg_current_wal_flush_lsn() - $1::text::pg_lsn"
    start = await db.fetchval("SELECT pg_current_wal_flush_lsn()::text")
    figures = await commit_latency(db, duration_s=0.3, gap_s=0.01)

    assert 5 <= figures["commits"] <= 31
    # The commits reached the write-ahead log on disk: what the probe exists to time.
    assert await db.fetchval(flushed, start) > 0
    assert 0 < figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"]
    assert figures["synchronous_commit"] == await db.fetchval("SHOW synchronous_commit")
    assert await db.fetchval("SELECT to_regclass('bench_commit_probe')") is None
    assert "commits took over 25 ms" in commit_line(figures)


def test_slow_commits_are_counted_and_their_time_summed() -> None:
    latencies = [0.5] * 997 + [SLOW_COMMIT_MS, 120.0, 480.0]
    figures = commit_summary(latencies, 9.96)
    assert figures["commits"] == 1000
    assert figures["p50_ms"] == 0.5
    assert figures["p99_ms"] == 0.5
    assert figures["p999_ms"] == 120.0
    assert figures["max_ms"] == 480.0
    # Exactly SLOW_COMMIT_MS is on target, not over it.
    assert (figures["slow"], figures["slow_ms"]) == (2, 600.0)
    assert commit_summary([], 1.0)["p50_ms"] is None
