"""The machine a run happened on, and the markdown tables of its figures."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.stats import SLOW_COMMIT_MS


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "ram_gib": ram_gib,
        "os": platform.platform(),
        "python": platform.python_version(),
        "redis": _version(["redis-server", "--version"]),
        "postgresql": _version(["postgres", "--version"]) or _version(["psql", "--version"]),
    }


def _version(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _n(value: Any, digits: int = 0) -> str:
    if value is None:
        return "–"
    return f"{value:,.{digits}f}"


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    topologies: dict[str, Any] = results["topologies"]
    names = list(topologies)
    lines = [
        f"Machine: {m['cores']} cores ({m['cpu']}), {m['ram_gib']} GiB RAM, {m['os']}, "
        f"Python {m['python']}.",
        f"notifkit settings: {_settings(results)}.",
        "",
        "| | " + " | ".join(_label(n, topologies[n]) for n in names) + " |",
        "|---|" + "---:|" * len(names),
    ]

    def row(label: str, cells: list[str]) -> None:
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    row("**saturation**: notifications/s received by the provider",
        [f"**{_n(topologies[n]['saturation']['per_s'])}**" for n in names])
    row("API accepted/s in the same window",
        [_n(topologies[n]["saturation"]["api_accepted_per_s"]) for n in names])
    if all("saturation_batched" in topologies[n] for n in names) and names:
        k = topologies[names[0]]["saturation_batched"]["recipients_per_request"]
        row(f"saturation with {k} recipients per request: notifications/s",
            [_n(topologies[n]["saturation_batched"]["per_s"]) for n in names])
    row("CPU cores used at saturation, per process",
        [_cores(topologies[n]["saturation"]["cores_used"]) for n in names])
    row("other work on the machine meanwhile (cores; 1-min load average)",
        [f"{_n(topologies[n]['saturation'].get('other_cores'), 2)}; "
         f"{_n(topologies[n]['saturation'].get('load_average'), 1)}" for n in names])
    row("CPU ms per notification at saturation, per process",
        [_costs(topologies[n]["saturation"].get("cpu_ms_per_notification") or {})
         for n in names])
    row("notifkit CPU ms per notification (all its processes)",
        [_n(topologies[n]["saturation"].get("notifkit_cpu_ms_per_notification"), 2)
         for n in names])
    rates = [r["offered_per_s"] for r in (topologies[names[0]]["latency"] if names else [])]
    for index, rate in enumerate(rates):
        cells = []
        for n in names:
            r = topologies[n]["latency"][index]
            cell = f"{_n(r['p50_ms'], 1)} / {_n(r['p95_ms'], 1)} / {_n(r['p99_ms'], 1)}"
            if r["missed"] or r["delivered"] < r["measured"] or \
                    r["achieved_per_s"] < 0.95 * r["offered_per_s"]:
                cell += (f" (not sustained: {_n(r['achieved_per_s'])}/s accepted, "
                         f"{r['delivered']:,}/{r['measured']:,} delivered)")
            cells.append(cell)
        row(f"latency p50 / p95 / p99 ms at {rate:g}/s offered", cells)
        row(f"by hop at {rate:g}/s, p50 / p99 ms",
            [hops(topologies[n]["latency"][index].get("hops") or {}) for n in names])
        row(f"CPU cores used at {rate:g}/s (machine busy)",
            [paced_cores(topologies[n]["latency"][index]) for n in names])
    sizes = sorted({f["recipients"] for n in names for f in topologies[n]["fan_out"]})
    for size in sizes:
        runs = {n: next((f for f in topologies[n]["fan_out"] if f["recipients"] == size), None)
                for n in names}
        row(f"fan-out {size:,} users: recipients/s",
            [_n(r["per_s"]) if r else "not run" for r in runs.values()])
        row(f"fan-out {size:,} users: peak RSS MiB per process",
            [_rss(r["usage"]) if r else "not run" for r in runs.values()])

    baselines = results.get("baselines") or {}
    if baselines:
        best = max((topologies[n]["saturation"]["per_s"] for n in names), default=None)
        best_batched = max((topologies[n]["saturation_batched"]["per_s"] for n in names
                            if "saturation_batched" in topologies[n]), default=None)
        lines += ["", "| baseline (same run) | per second | best notifkit topology ÷ baseline "
                  "| same, 10 recipients per request ÷ baseline |", "|---|---:|---:|---:|"]
        labels = {
            "redis_streams": "ceiling: bare XADD → XREADGROUP → XACK loop (batches of 100)",
            "http_post": "ceiling: bare HTTP POST loop to the simulator (64 in flight)",
            "celery": "Celery on Redis, same work per notification "
                      f"({baselines.get('celery', {}).get('concurrency', '?')} prefork workers)",
        }
        for key, label in labels.items():
            if key in baselines:
                per_s = baselines[key]["per_s"]
                ratio = f"{best / per_s:.2f}×" if best and per_s else "–"
                batched = f"{best_batched / per_s:.2f}×" if best_batched and per_s else "–"
                lines.append(f"| {label} | {_n(per_s)} | {ratio} | {batched} |")
        if "pg_commit" in baselines:
            lines += ["", "Floor under the latency figures: a lone single-row PostgreSQL commit "
                      f"every {_n(baselines['pg_commit']['gap_ms'])} ms, nothing else running: "
                      + commit_line(baselines["pg_commit"]) + "."]
    lines += ["", "Notes: the load generator (a lean HTTP/1.1 client on kept-alive connections, "
              "pre-encoded bodies, no idempotency keys) runs on the same cores as everything it "
              "measures. Latency is from the API's accept (the time inside the notification's "
              "UUIDv7 id) to the simulator's receipt; percentiles are of the notifications "
              "accepted after a short warm-up. Redis and PostgreSQL CPU is that of the whole "
              "server (other databases' work included). The Celery producer is a bare enqueue "
              "with no HTTP API in front, which favours Celery."]
    return "\n".join(lines)


def hops(figures: dict[str, dict[str, float | None]]) -> str:
    """``api 1 / 3, enricher 4 / 9, ...``: each hop's p50 / p99 in ms."""
    if not figures:
        return "–"
    return ", ".join(f"{hop} {_n(f.get('p50_ms'))} / {_n(f.get('p99_ms'))}"
                     for hop, f in figures.items())


def commit_line(figures: dict[str, Any]) -> str:
    """``p50 / p99 / p99.9 / max 0.4 / 3.1 / 120 / 480 ms; 6 of 2,400 over 25 ms ...``"""
    return (f"p50 / p99 / p99.9 / max {_n(figures['p50_ms'], 1)} / {_n(figures['p99_ms'], 1)} / "
            f"{_n(figures['p999_ms'], 1)} / {_n(figures['max_ms'], 1)} ms; "
            f"{_n(figures['slow'])} of {_n(figures['commits'])} commits took over "
            f"{_n(SLOW_COMMIT_MS)} ms ({_n(figures['slow_ms'])} ms in all, in "
            f"{_n(figures['seconds'], 1)} s; synchronous_commit = "
            f"{figures.get('synchronous_commit', '?')})")


def _settings(results: dict[str, Any]) -> str:
    env = results.get("settings", {}).get("env") or {}
    shown = ", ".join(f"{k}={v}" for k, v in sorted(env.items()))
    return ((shown + ", " if shown else "")
            + "LOG_LEVEL=WARNING, API rate limit raised to 1,000,000/s (its bucket still runs)")


def _label(name: str, topology: dict[str, Any]) -> str:
    if name == "all":
        return "one process (`all`)"
    return f"{name}: " + " / ".join(topology["processes"])


def paced_cores(result: dict[str, Any]) -> str:
    """Cores per process under a paced load, and the share of the machine busy meanwhile."""
    cores = result.get("cores_used")
    if not cores:
        return "–"  # a run recorded before the paced phase measured CPU
    busy = result.get("machine_cpu_busy")
    return _cores(cores) + (f" ({busy:.0%})" if isinstance(busy, (int, float)) else "")


def _cores(cores: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:.2f}" for name, value in cores.items())


def _costs(costs: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:.2f}" for name, value in costs.items())


def _rss(usage: dict[str, dict[str, float | None]]) -> str:
    return ", ".join(f"{name} {u['peak_rss_mb']:.0f}" for name, u in usage.items()
                     if u.get("peak_rss_mb") is not None)
