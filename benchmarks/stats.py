"""Small measuring helpers: percentiles, times inside ids and records, machine CPU use."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Sequence
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
