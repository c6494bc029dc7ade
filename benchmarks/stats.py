"""Small measuring helpers: percentiles, times inside ids and records, machine CPU use."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path


def percentile(sorted_values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile of already sorted values (None when there are none)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def uuid7_seconds(value: str) -> float:
    """The creation time a UUIDv7 carries (ms resolution), in epoch seconds."""
    return (uuid.UUID(value).int >> 80) / 1000


def epoch(value: str) -> float:
    """An RFC 3339 time as the simulators write it, in epoch seconds."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


# The legs of a notification's way, each between two points on it: the API's accept, its
# entry in the enricher's, engine's and delivery's streams (each written by the stage before),
# and the provider's receipt.
HOPS = ("api", "enricher", "engine", "delivery")


def hop_breakdown(
    points: Mapping[str, Sequence[float | None]],
) -> dict[str, dict[str, float | None]]:
    """p50 and p99 of each hop in ms. ``points`` holds, per notification, the five times (epoch
    seconds) that bound the hops, in order; one with a point missing is left out."""
    legs: list[list[float]] = [[] for _ in HOPS]
    for times in points.values():
        known = [t for t in times if t is not None]
        if len(known) != len(HOPS) + 1:
            continue
        for index in range(len(HOPS)):
            # Each point has ms resolution, so a hop can read a little below zero; the
            # rounding drops float noise from subtracting epoch seconds.
            legs[index].append(max(0.0, round((known[index + 1] - known[index]) * 1000, 1)))
    out: dict[str, dict[str, float | None]] = {}
    for hop, values in zip(HOPS, legs, strict=True):
        values.sort()
        out[hop] = {"p50_ms": percentile(values, 0.50), "p99_ms": percentile(values, 0.99),
                    "count": float(len(values))}
    return out


# The p99 the benchmark's latency target asks for: a commit slower than this alone misses it.
SLOW_COMMIT_MS = 25.0


def commit_summary(latencies_ms: Sequence[float], seconds: float) -> dict[str, float | None]:
    """p50 / p99 / p99.9 / max of single commits (ms), and how many (and how much time) took
    longer than :data:`SLOW_COMMIT_MS`."""
    ordered = sorted(latencies_ms)
    slow = [v for v in ordered if v > SLOW_COMMIT_MS]

    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, 2)

    return {
        "commits": float(len(ordered)), "seconds": round(seconds, 1),
        "p50_ms": rounded(percentile(ordered, 0.50)), "p99_ms": rounded(percentile(ordered, 0.99)),
        "p999_ms": rounded(percentile(ordered, 0.999)),
        "max_ms": rounded(ordered[-1] if ordered else None),
        "slow": float(len(slow)), "slow_ms": round(sum(slow), 1),
    }


class MachineCpu:
    """Share of all cores busy between two samples, from /proc/stat."""

    def __init__(self) -> None:
        self._last = self._read()

    @staticmethod
    def _read() -> tuple[float, float] | None:
        try:
            fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        except (OSError, IndexError):
            return None
        values = [float(v) for v in fields]
        idle = values[3] + (values[4] if len(values) > 4 else 0.0)
        return sum(values), idle

    def busy(self) -> float | None:
        """Fraction (0..1) of all cores busy since the last call."""
        now = self._read()
        last, self._last = self._last, now
        if now is None or last is None or now[0] <= last[0]:
            return None
        return 1.0 - (now[1] - last[1]) / (now[0] - last[0])


class Progress:
    """One line per step on stderr-like output, with the time since the run started."""

    def __init__(self, quiet: bool = False) -> None:
        self.started = time.monotonic()
        self.quiet = quiet

    def say(self, text: str) -> None:
        if not self.quiet:
            print(f"[{time.monotonic() - self.started:6.1f}s] {text}", flush=True)
