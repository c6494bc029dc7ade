"""The measured phases run against one topology: saturation, fixed offered loads, fan-out.

Every figure is counted at the simulator: a notification counts once the provider simulator
received its request (``receivedAt``). A notification's accept time is the time inside its id
(a UUIDv7 the API assigns when it accepts the request, before its PostgreSQL commit and XADD),
and every task id derived from it keeps that time, so each simulator record carries the
moment its notification was accepted.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import RedisError

from benchmarks.load import LoadGenerator, LoadResult
from benchmarks.stats import (
    MachineCpu,
    Progress,
    epoch,
    hop_breakdown,
    percentile,
    uuid7_seconds,
)
from benchmarks.system import LARGE_SEGMENT, SMALL_SEGMENT, TEMPLATE, BenchSystem
from notifkit import codec
from notifkit.ids import derived_uuid7
from notifkit.tasks import cancel_and_wait

SIM_QUERY_LIMIT = 100_000
MAX_BACKLOG = 5_000


async def drain(system: BenchSystem, progress: Progress, timeout_s: float = 120.0) -> bool:
    """Until no stream holds unacked entries; False if the deadline came first."""
    deadline = time.monotonic() + timeout_s
    calm = 0
    last_said = 0.0
    while time.monotonic() < deadline:
        system.check_alive()
        waiting = await system.backlog()
        calm = calm + 1 if waiting == 0 else 0
        if calm >= 3:
            return True
        if waiting and time.monotonic() - last_said > 2:
            progress.say(f"  draining: {waiting} entries still in the streams")
            last_said = time.monotonic()
        await asyncio.sleep(0.2)
    return False


def _tick(progress: Progress, label: str, system: BenchSystem):  # type: ignore[no-untyped-def]
    def tick(result: LoadResult) -> None:
        elapsed = max(time.time() - result.started_at, 1e-9)
        progress.say(f"  {label}: {len(result.accepted)} accepted "
                     f"({len(result.accepted) / elapsed:.0f}/s)"
                     + (f", {result.missed} missed" if result.missed else ""))
    return tick


class Brake:
    """Holds a closed loop's senders while the streams hold more than ``limit`` entries.

    The API can accept faster than the pipeline delivers (several recipients per request):
    held this way, the pipeline stays saturated without a backlog that takes minutes to drain.
    A reading that fails (a Redis connection lost mid-call) leaves the brake as it was until
    the next one: were the brake to die with the senders held, they would stay held for the
    rest of the phase, and the phase would measure an idle system.
    """

    def __init__(self, backlog: Callable[[], Awaitable[int]], progress: Progress,
                 *, limit: int = MAX_BACKLOG, interval_s: float = 0.25) -> None:
        self.backlog = backlog
        self.progress = progress
        self.limit = limit
        self.interval_s = interval_s
        self.paused = asyncio.Event()
        self.failed_readings = 0

    async def run(self) -> None:
        while True:
            try:
                held = await self.backlog() > self.limit
            except (RedisError, OSError) as exc:
                self.failed_readings += 1
                if self.failed_readings == 1:
                    self.progress.say(f"  (the backlog could not be read, {exc!r}; the brake "
                                      "stays as it was and reads again)")
            else:
                if held:
                    self.paused.set()
                else:
                    self.paused.clear()
            await asyncio.sleep(self.interval_s)

    async def stop(self, task: asyncio.Task[None]) -> None:
        """End ``task`` (this brake's run) and let the senders go. Cancelled again until it
        ends: on Python 3.11 a cancellation that lands as one of redis-py's calls completes
        is swallowed (``asyncio.wait_for``), and the brake read on, for good, with the run
        waiting for it."""
        await cancel_and_wait(task, timeout_s=60)
        self.paused.clear()


async def saturation(system: BenchSystem, api_url: str, *, warmup_s: float, duration_s: float,
                     concurrency: int, progress: Progress,
                     recipients: int = 1) -> dict[str, Any]:
    """Closed-loop load from ``concurrency`` senders; the rate of provider receipts during
    ``duration_s`` after ``warmup_s`` of the same load. ``recipients`` users per request."""
    await system.sim.reset()
    brake = Brake(system.backlog, progress)
    braking = asyncio.create_task(brake.run())
    try:
        async with LoadGenerator(api_url, system.api_key, 10_000, recipients) as load:
            running = asyncio.create_task(load.closed_loop(
                warmup_s + duration_s, concurrency, _tick(progress, "saturation", system),
                brake.paused))
            await asyncio.sleep(warmup_s)
            await system.sim.reset()
            cpu = MachineCpu()
            cpu_before = system.cpu_by_process()
            own_cpu = time.process_time()
            window_start = time.time()
            result = await running
            window_end = time.time()
            busy = cpu.busy()
            cpu_after = system.cpu_by_process()
            own_cpu = time.process_time() - own_cpu
    finally:
        await brake.stop(braking)
    backlog_at_end = await system.backlog()
    drained = await drain(system, progress)
    messages = await system.sim.messages(limit=SIM_QUERY_LIMIT)
    received = [epoch(m["receivedAt"]) for m in messages]
    in_window = sum(1 for t in received if window_start <= t < window_end)
    seconds = window_end - window_start
    accepted_in_window = sum(1 for _e, _u, t in result.accepted if t >= window_start)
    cores = {name: round((cpu_after[name] - cpu_before.get(name, 0.0)) / seconds, 2)
             for name in cpu_after}
    notifkit_cpu_s = sum(cpu_after[n] - cpu_before.get(n, 0.0) for n in system.processes)
    return {
        "recipients_per_request": recipients,
        "concurrency": concurrency,
        "seconds": round(seconds, 2),
        "received": in_window,
        "per_s": round(in_window / seconds, 1),
        "api_accepted_per_s": round(accepted_in_window * recipients / seconds, 1),
        "rejected": result.rejected,
        "errors": result.errors,
        "backlog_at_end": backlog_at_end,
        "drained": drained,
        "truncated": len(messages) >= SIM_QUERY_LIMIT,
        "machine_cpu_busy": round(busy, 3) if busy is not None else None,
        "cores_used": {**cores, "load generator + runner": round(own_cpu / seconds, 2)},
        # Everything else the machine ran meanwhile (other users' work competes for the cores).
        "other_cores": round(max(0.0, (busy or 0.0) * (os.cpu_count() or 1)
                                 - sum(cores.values()) - own_cpu / seconds), 2)
        if busy is not None else None,
        "load_average": os.getloadavg()[0],
        # Robust to other work on the machine: what one notification costs notifkit itself.
        "notifkit_cpu_ms_per_notification": round(1000 * notifkit_cpu_s / in_window, 3)
        if in_window else None,
        "cpu_ms_per_notification": {name: round(1000 * c * seconds / in_window, 3)
                                    for name, c in cores.items()} if in_window else {},
    }


async def fixed_rate(system: BenchSystem, api_url: str, *, rate_per_s: float, warmup_s: float,
                     duration_s: float, progress: Progress) -> dict[str, Any]:
    """Paced open-loop load at ``rate_per_s``; latency accept -> provider receipt of the
    notifications accepted after ``warmup_s``."""
    await system.sim.reset()
    # What the load costs, over the whole paced run (warm-up included): below saturation a
    # notification costs several times its saturation price, and queueing for the cores,
    # not the work itself, sets the latency.
    cpu = MachineCpu()
    cpu_before = system.cpu_by_process()
    began = time.monotonic()
    async with LoadGenerator(api_url, system.api_key, 10_000) as load:
        result = await load.open_loop(rate_per_s, warmup_s + duration_s,
                                      _tick(progress, f"{rate_per_s:g}/s", system))
    paced_s = time.monotonic() - began
    busy = cpu.busy()
    cpu_after = system.cpu_by_process()
    drained = await drain(system, progress, timeout_s=60)
    measured_from = result.started_at + warmup_s
    wanted = {derived_uuid7(event, user, "email"): event
              for event, user, t in result.accepted if t >= measured_from}
    messages = await system.sim.messages(limit=SIM_QUERY_LIMIT)
    received: dict[str, float] = {}
    for m in messages:
        task_id = m.get("taskId")
        if task_id in wanted:
            t = epoch(m["receivedAt"])
            received[task_id] = min(t, received.get(task_id, t))
    latencies = sorted(max(0.0, t - uuid7_seconds(task)) * 1000 for task, t in received.items())
    hops = await _hops(system, wanted, received, result.started_at)
    offered = int(rate_per_s * (warmup_s + duration_s))
    return {
        "offered_per_s": rate_per_s,
        "achieved_per_s": round(len(result.accepted) / (warmup_s + duration_s), 1),
        "sent": offered - result.missed,
        "missed": result.missed,
        "generator_max_lag_ms": round(result.max_lag_ms, 1),
        "rejected": result.rejected,
        "errors": result.errors,
        "measured": len(wanted),
        "delivered": len(received),
        "drained": drained,
        "p50_ms": _round(percentile(latencies, 0.50)),
        "p95_ms": _round(percentile(latencies, 0.95)),
        "p99_ms": _round(percentile(latencies, 0.99)),
        "max_ms": _round(latencies[-1] if latencies else None),
        "hops": hops,
        "machine_cpu_busy": round(busy, 3) if busy is not None else None,
        "cores_used": {name: round((cpu_after[name] - cpu_before.get(name, 0.0)) / paced_s, 2)
                       for name in cpu_after},
    }


async def _hops(system: BenchSystem, wanted: dict[str, str], received: dict[str, float],
                since_s: float) -> dict[str, dict[str, float | None]]:
    """Where the latency went: each measured notification's points on its way, read off the
    ids of the stream entries each stage wrote (the load sends at normal priority)."""
    keys = system.keys
    queued = await system.stream_times(keys.inbound("normal"), "eventId", since_s - 1)
    enriched = await system.stream_times(keys.enriched("normal"), "eventId", since_s - 1)
    routed = await system.stream_times(keys.outbound("normal"), "taskId", since_s - 1)
    return hop_breakdown({
        task: (uuid7_seconds(task), queued.get(event), enriched.get(event), routed.get(task),
               received.get(task))
        for task, event in wanted.items()
    })


async def fan_out(system: BenchSystem, api_url: str, *, size: int, progress: Progress,
                  timeout_s: float = 600.0) -> dict[str, Any]:
    """One campaign to a segment of ``size`` users; recipients per second from accept to the
    last provider receipt."""
    import aiohttp

    segment = SMALL_SEGMENT if size <= 10_000 else LARGE_SEGMENT
    await system.sim.reset()
    async with aiohttp.ClientSession() as http, http.post(
        f"{api_url}/v1/notifications",
        data=codec.dumps({"to": {"segment": segment}, "template": TEMPLATE,
                          "campaignId": f"fanout-{size}", "data": {"n": 0}}),
        headers={"Authorization": f"Bearer {system.api_key}",
                 "Content-Type": "application/json"},
    ) as resp:
        body = codec.loads(await resp.read())
        if resp.status != 202:
            raise RuntimeError(f"the campaign was refused: {resp.status} {body}")
    accepted_at = uuid7_seconds(body["id"])
    deadline = time.monotonic() + timeout_s
    count = 0
    last_said = 0.0
    while time.monotonic() < deadline:
        system.check_alive()
        count = await system.accepted_at_sim()
        if count >= size:
            break
        if time.monotonic() - last_said >= 2:
            elapsed = time.time() - accepted_at
            progress.say(f"  fan-out {size:,}: {count:,} received ({count / elapsed:.0f}/s)")
            last_said = time.monotonic()
        await asyncio.sleep(0.25)
    newest = await system.sim.messages(limit=1)
    last = epoch(newest[0]["receivedAt"]) if newest else time.time()
    seconds = max(last - accepted_at, 1e-9)
    await drain(system, progress)
    return {
        "recipients": size,
        "received": count,
        "complete": count >= size,
        "seconds": round(seconds, 2),
        "per_s": round(count / seconds, 1),
        "usage": system.usage(),
    }


def _round(value: float | None) -> float | None:
    return round(value, 1) if value is not None else None
