"""What a scenario found, as a table row, a JSON object and a list of violated invariants."""

from __future__ import annotations

import json
import math
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class ScenarioResult:
    name: str
    seed: int
    accepted: int = 0
    delivered: int = 0
    duplicates: Counter[str] = field(default_factory=Counter)  # cause -> count
    dead_lettered: int = 0
    skipped: Counter[str] = field(default_factory=Counter)  # reason -> count
    lost: list[str] = field(default_factory=list)  # event ids
    latencies_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    violations: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)  # scenario-specific observations
    logs: list[str] = field(default_factory=list)  # the run's folders of process logs

    @property
    def ok(self) -> bool:
        return not self.violations and not self.lost

    def check(self, condition: bool, violation: str) -> None:
        """Record ``violation`` unless ``condition`` holds."""
        if not condition:
            self.violations.append(violation)

    def check_none_dead_lettered(self, because: str) -> None:
        """A dead-lettered notification is not lost by the accounting's rule: where nothing
        ``because`` says could fail a send, one is given up on, and a violation."""
        self.check(not self.dead_lettered,
                   f"{self.dead_lettered} notification(s) dead-lettered, though {because}")

    def percentile(self, q: float) -> float | None:
        if not self.latencies_s:
            return None
        ordered = sorted(self.latencies_s)
        index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
        return ordered[index]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("latencies_s")
        data["duplicates"] = dict(self.duplicates)
        data["skipped"] = dict(self.skipped)
        data["lostCount"] = len(self.lost)
        data["p50_s"] = self.percentile(0.50)
        data["p99_s"] = self.percentile(0.99)
        data["ok"] = self.ok
        return data


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


def _counts(counter: Counter[str]) -> str:
    total = sum(counter.values())
    if not total:
        return "0"
    return f"{total} (" + ", ".join(f"{k}: {v}" for k, v in sorted(counter.items())) + ")"


def table(results: Sequence[ScenarioResult]) -> str:
    headers = ["scenario", "result", "accepted", "delivered", "duplicates", "DLQ", "skipped",
               "lost", "p50", "p99", "time"]
    rows = [
        [
            r.name,
            "ok" if r.ok else "FAILED",
            str(r.accepted),
            str(r.delivered),
            _counts(r.duplicates),
            str(r.dead_lettered),
            _counts(r.skipped),
            str(len(r.lost)),
            _ms(r.percentile(0.5)),
            _ms(r.percentile(0.99)),
            f"{r.wall_s:.1f} s",
        ]
        for r in results
    ]
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    lines = [
        "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    for row in rows:
        lines.append(
            "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
        )
    return "\n".join(lines)


def violations_text(results: Sequence[ScenarioResult]) -> str:
    out: list[str] = []
    for r in results:
        for violation in r.violations:
            out.append(f"{r.name}: {violation}")
        if r.lost:
            shown = ", ".join(r.lost[:20])
            more = f" (+{len(r.lost) - 20} more)" if len(r.lost) > 20 else ""
            out.append(f"{r.name}: {len(r.lost)} notification(s) lost: {shown}{more}")
    return "\n".join(out)


def write_json(path: Path, results: Sequence[ScenarioResult]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([r.to_json() for r in results], indent=2, default=str) + "\n")


class Progress:
    """One live line on a terminal; plain lines otherwise (CI logs)."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last = ""
        self._shown_at = 0.0

    # Without a terminal (CI logs), at most one progress line per this many seconds.
    quiet_interval_s = 2.0

    def update(self, text: str, *, force: bool = False) -> None:
        """Show ``text`` as the live line; ``force`` for a line worth keeping in a CI log."""
        if text == self._last:
            return
        self._last = text
        now = time.monotonic()
        if self.live:
            self.stream.write("\r\033[K" + text + ("\n" if force else ""))
        elif force or now - self._shown_at >= self.quiet_interval_s:
            self._shown_at = now
            self.stream.write(text + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self.live and self._last:
            self.stream.write("\n")
            self.stream.flush()
        self._last = ""
