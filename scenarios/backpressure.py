"""backpressure: a slow provider (latency fault) under sustained load.

Delivery runs in a process of its own. The simulated provider answers every send only after
``delay_ms``, so delivery can finish about ``WORKER_CONCURRENCY / delay`` sends a second, while
sends keep arriving faster than that. The work that cannot be taken yet must wait in Redis,
not in the process: delivery reads no more than its free capacity.

Invariants, sampled while the load runs: the delivery process's RSS (from /proc) grows by at
most ``rss_growth_mb`` from the first sample taken under backlog to the peak (and so does every
other notifkit process's: the api's and the upstream pipeline's), while the backlog
waiting for delivery grows by at least ``min_backlog`` entries; delivery never holds more than
its concurrency of entries pending; once the provider is fast again everything is delivered,
nothing dropped.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from redis.exceptions import ResponseError

from scenarios.harness import RunOptions, System, group_unread
from scenarios.report import ScenarioResult

DESCRIPTION = "slow provider under sustained load: delivery memory bounded, nothing dropped"
PARAMS: dict[str, Any] = {
    "messages": 3000, "rate_per_s": 400.0, "delay_ms": 400, "concurrency": 50,
    "rss_growth_mb": 40.0, "min_backlog": 500, "quiesce_s": 60.0,
}
# WORKER_CONCURRENCY is at least 1. No message, no delay or a backlog growth of 0 required
# shows no backlog that memory could follow.
POSITIVE = frozenset({"messages", "rate_per_s", "delay_ms", "concurrency", "min_backlog",
                      "quiesce_s"})

LAYOUT = {
    "api": ["api"],
    "pipeline": ["enricher", "engine", "scheduler", "events"],
    "delivery": ["delivery"],
}


def rss_mb(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


async def delivery_queue(system: System) -> tuple[int, int]:
    """(entries waiting unread for delivery, entries pending in delivery's group)."""
    unread = pending = 0
    group = system.keys.group("delivery")
    for stream in system.keys.outbound_all():
        try:
            groups = await system.redis.xinfo_groups(stream)
        except ResponseError as exc:
            if "no such key" in str(exc).lower():
                continue  # no such stream yet
            raise
        for info in groups:
            name = info["name"].decode() if isinstance(info["name"], bytes) else info["name"]
            if name == group:
                unread += await group_unread(system.redis, stream, info)
                pending += int(info.get("pending") or 0)
    return unread, pending


def memory_followed_backlog(rss_of: dict[str, list[tuple[float, int]]], bound_mb: float,
                            peak_backlog: int, facts: dict[str, Any]) -> list[str]:
    """What is wrong with each process's memory under backlog: ``rss_of`` holds, per process,
    (RSS in MB, entries waiting for delivery) at each sample; from the first sample taken under
    backlog to the peak, no process may grow by more than ``bound_mb``."""
    problems: list[str] = []
    for name, series in rss_of.items():
        loaded = [rss for rss, unread in series if unread > 0]
        if not loaded:
            problems.append(f"no memory sample of the {name} process under backlog")
            continue
        grown = max(loaded) - loaded[0]
        facts[f"{name} RSS at first backlog (MB)"] = round(loaded[0], 1)
        facts[f"{name} RSS peak (MB)"] = round(max(loaded), 1)
        if grown > bound_mb:
            problems.append(f"{name} RSS grew {grown:.1f} MB (to {max(loaded):.1f} MB) while "
                            f"the backlog waiting for delivery grew to {peak_backlog}: memory "
                            "follows the backlog")
    return problems


def dropped(result: ScenarioResult, attempted: int) -> list[str]:
    """How the run dropped something: a send refused, or a notification dead-lettered. A slow
    provider fails no send, so a DLQ entry is a notification given up on under load, which
    the accounting does not call lost."""
    problems: list[str] = []
    if result.accepted < attempted:
        problems.append(f"only {result.accepted} of {attempted} sends were accepted")
    if result.dead_lettered:
        problems.append(f"{result.dead_lettered} notifications were dead-lettered under a slow "
                        "provider that failed no send")
    return problems


async def run(options: RunOptions, params: dict[str, Any]) -> ScenarioResult:
    result = ScenarioResult(name=options.name, seed=options.seed)
    concurrency = int(params["concurrency"])
    options.env.setdefault("WORKER_CONCURRENCY", str(concurrency))
    options.env.setdefault("API_RATE_PER_SECOND", "2000")
    options.env.setdefault("API_RATE_BURST", "2000")
    async with System(options, LAYOUT) as system:
        users = await system.bootstrap(users=200)
        await system.sim.add_fault("latency", "resend", delay_ms=int(params["delay_ms"]))
        system.say(f"provider slowed to {params['delay_ms']} ms per send", force=True)
        pid = system.processes["delivery"].pid
        # "Never a process's memory" (CONTRACT §3.8): the other notifkit processes are watched
        # too, by the same rule (the simulators keep every message they accept, by design).
        pids = {name: system.processes[name].pid for name in LAYOUT if name != "delivery"}

        samples: list[tuple[float, float, int, int]] = []  # (t, rss MB, unread, pending)
        # Per process: (rss MB, unread) at each sample.
        rss_of: dict[str, list[tuple[float, int]]] = {name: [] for name in pids}
        stop = asyncio.Event()

        async def sample() -> None:
            while not stop.is_set():
                rss = rss_mb(pid)
                every = {name: rss_mb(p) for name, p in pids.items()}
                unread, pending = await delivery_queue(system)
                if rss is not None:
                    samples.append((time.monotonic(), rss, unread, pending))
                for name, value in every.items():
                    if value is not None:
                        rss_of[name].append((value, unread))
                await asyncio.sleep(0.25)

        sampler = asyncio.create_task(sample())
        count = int(params["messages"])
        sends = [(users[i % len(users)], {"data": {"n": str(i)}}) for i in range(count)]
        sent = await system.send_paced(sends, rate_per_s=float(params["rate_per_s"]),
                                       label="sustained load")
        await asyncio.sleep(1.0)
        stop.set()
        await sampler

        under_load = [s for s in samples if s[2] > 0]
        result.check(bool(under_load), "no backlog ever waited for delivery: the provider was "
                                       "not slow enough for the load")
        if under_load:
            first, peak_rss = under_load[0], max(s[1] for s in under_load)
            peak_backlog = max(s[2] for s in under_load)
            growth = peak_rss - first[1]
            result.facts["delivery RSS at first backlog (MB)"] = round(first[1], 1)
            result.facts["delivery RSS peak (MB)"] = round(peak_rss, 1)
            result.facts["backlog waiting for delivery, peak"] = peak_backlog
            result.check(peak_backlog - first[2] >= int(params["min_backlog"]),
                         f"the backlog grew only from {first[2]} to {peak_backlog}: not enough "
                         "load to show anything")
            result.check(growth <= float(params["rss_growth_mb"]),
                         f"delivery RSS grew {growth:.1f} MB (to {peak_rss:.1f} MB) while the "
                         f"backlog grew to {peak_backlog}: memory follows the backlog")
            for violation in memory_followed_backlog(rss_of, float(params["rss_growth_mb"]),
                                                     peak_backlog, result.facts):
                result.violations.append(violation)

        max_pending = max((s[3] for s in samples), default=0)
        result.facts["delivery pending, peak"] = max_pending
        result.check(max_pending <= concurrency,
                     f"delivery held {max_pending} entries pending, more than its "
                     f"concurrency {concurrency}")
        await system.sim.clear_faults()
        system.say("provider fast again; draining", force=True)
        left = await system.quiesce(float(params["quiesce_s"]))
        result.check(not left, f"the system did not quiesce: {left}")
        await system.account(sent, result)
        for problem in dropped(result, count):
            result.check(False, problem)
        system.check_alive(result, LAYOUT)
    return result
