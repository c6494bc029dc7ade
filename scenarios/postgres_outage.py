"""postgres_outage: PostgreSQL unreachable for a while; workers hold their work, retry after
recovery, 0 lost.

The pipeline processes reach PostgreSQL through a TCP proxy the scenario controls (the shared
server is never stopped). The API keeps the real address, so sends are still accepted while
the pipeline cannot reach the database. Part-way through a steady load the proxy resets every
open connection and refuses new ones for ``down_s``, then lets them through again.

The outage lasts longer than the attempt limit's worth of reclaim cycles (the enricher's five,
each up to ``2 * reclaim_s`` apart): a worker that spent an attempt on every try would
dead-letter what it held. Invariants: while the database is away, work is held pending rather
than acked (pending entries seen), and /health names a worker waiting for PostgreSQL; every
worker that saw the outage start saw it end (one log line each); after it returns everything is
delivered, none dead-lettered, 0 lost, and every process survives.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from scenarios.harness import RunOptions, System, service_urls
from scenarios.processes import wait_for_port
from scenarios.report import ScenarioResult
from scenarios.tcp_proxy import TcpProxy

DESCRIPTION = "PostgreSQL unreachable for a while: workers hold their work, retry after " \
              "recovery, 0 lost"
PARAMS: dict[str, Any] = {
    "messages": 600, "rate_per_s": 100.0, "cut_after_s": 2.0, "down_s": 8.0,
    "reclaim_s": 0.5, "quiesce_s": 60.0,
}
# The most attempts any stage allows (the enricher's, CONTRACT §3), and how far apart a failed
# entry's tries come at most: it is retried once idle for RECLAIM_MIN_IDLE_SECONDS, by a sweep
# every RECLAIM_INTERVAL_SECONDS (both reclaim_s here).
MOST_ATTEMPTS = 5
CYCLES_PER_TRY = 2
# No message or no outage: no work held while PostgreSQL is away.
POSITIVE = frozenset({"messages", "rate_per_s", "down_s", "quiesce_s"})
RANGES = {"reclaim_s": (0.01, math.inf)}  # RECLAIM_INTERVAL_SECONDS is at least 0.01

LAYOUT = {"pipeline": ["enricher", "engine", "delivery", "scheduler", "events"]}


def through(url: str, port: int) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2
                                     else host))


async def accepted_since(system: System, since: float) -> int:
    """Notifications of the run's project the api accepted from ``since`` (epoch seconds)."""
    assert system.db is not None
    return int(await system.db.fetchval(
        "SELECT count(*) FROM notifications WHERE project_id = $1 "
        "AND created_at >= to_timestamp($2)", system.project_id, since))


async def pending_total(system: System) -> int:
    total = 0
    for stream in system.keys.all_streams():
        if stream == system.keys.dlq:
            continue
        try:
            groups = await system.redis.xinfo_groups(stream)
        except Exception:
            continue
        total += sum(int(g.get("pending") or 0) for g in groups)
    return total


async def waiting_for_postgres(system: System) -> set[str]:
    """The workers whose heartbeat, as /health lists them, says they wait for PostgreSQL."""
    try:
        _status, body = await system.request("GET", "/health")
    except Exception:  # a probe that failed shows nothing; the next one may
        return set()
    services = (body or {}).get("services") or {}
    return {name for name, entry in services.items()
            if "waiting for PostgreSQL" in str(entry.get("readError", ""))}


def outage_lines(system: System) -> tuple[list[str], list[str]]:
    """The services that logged an outage's start, and its end (one entry per line)."""
    starts: list[str] = []
    ends: list[str] = []
    for name in LAYOUT:
        for record in system.log_records(name):
            if record.get("outage") == "start":
                starts.append(f"{name}/{record.get('service')}")
            elif record.get("outage") == "end":
                ends.append(f"{name}/{record.get('service')}")
    return starts, ends


async def run(options: RunOptions, params: dict[str, Any]) -> ScenarioResult:
    result = ScenarioResult(name=options.name, seed=options.seed)
    options.reclaim_s = float(params["reclaim_s"])
    _redis_url, database_url = service_urls()
    target = urlsplit(database_url)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432)
    await proxy.start()
    try:
        async with System(options, LAYOUT,
                          service_database_url=through(database_url, proxy.port)) as system:
            await system.spawn("api", ["api"], DATABASE_URL=database_url)
            await wait_for_port("127.0.0.1", system.api_ports["api"], 30,
                                system.processes["api"])
            await _run(system, params, result, proxy)
    finally:
        await proxy.stop()
    return result


async def _run(system: System, params: dict[str, Any], result: ScenarioResult,
               proxy: TcpProxy) -> None:
    users = await system.bootstrap(users=100)
    count = int(params["messages"])
    sends = [(users[i % len(users)], {"data": {"n": str(i)}}) for i in range(count)]
    load = asyncio.create_task(system.send_paced(
        sends, rate_per_s=float(params["rate_per_s"]), label="under load"))

    await asyncio.sleep(float(params["cut_after_s"]))
    await proxy.cut()
    cut_at = time.time()
    system.say(f"PostgreSQL unreachable for {params['down_s']} s", force=True)
    held = 0
    waiting: set[str] = set()  # workers /health showed waiting for PostgreSQL
    deadline = time.monotonic() + float(params["down_s"])
    while time.monotonic() < deadline:
        held = max(held, await pending_total(system))
        waiting |= await waiting_for_postgres(system)
        await asyncio.sleep(0.2)
    # What the api accepted meanwhile (it reaches PostgreSQL directly) cannot have gone
    # through the pipeline: every such notification still has an entry waiting somewhere.
    backlog_at_end = sum((await system.backlog()).values())
    accepted_during = await accepted_since(system, cut_at)
    proxy.restore()
    system.say("PostgreSQL reachable again", force=True)

    sent = await load
    result.facts["entries held pending during the outage (peak)"] = held
    result.facts["connections refused during the outage"] = proxy.refused
    result.check(held > 0, "no entry was held pending while PostgreSQL was away: either the "
                           "outage hit no work or the workers acked what they could not do")
    result.facts["accepted during the outage"] = accepted_during
    result.facts["entries waiting at the outage's end"] = backlog_at_end
    result.check(accepted_during > 0, "the api accepted nothing during the outage: the run "
                                      "cannot show that the workers held new work")
    result.check(backlog_at_end >= accepted_during,
                 f"{accepted_during} notifications were accepted during the outage, but only "
                 f"{backlog_at_end} entries were waiting at its end: the workers acked work "
                 "they could not do")
    result.check(proxy.refused > 0, "nothing tried to reach PostgreSQL during the outage")
    retry_span_s = MOST_ATTEMPTS * CYCLES_PER_TRY * float(params["reclaim_s"])
    result.facts["worst-case span of the enricher's attempts without holding (s)"] = retry_span_s
    result.check(float(params["down_s"]) > retry_span_s,
                 f"the outage ({params['down_s']} s) was no longer than the enricher's "
                 f"{MOST_ATTEMPTS} attempts' worth of reclaim cycles ({retry_span_s:g} s): it "
                 "cannot show that workers hold their work rather than spend attempts on it")
    result.facts["workers /health showed waiting for PostgreSQL"] = sorted(waiting)
    result.check(bool(waiting), "/health never showed a worker waiting for PostgreSQL during "
                                "the outage")
    left = await system.quiesce(float(params["quiesce_s"]))
    result.check(not left, f"the system did not quiesce: {left}")
    starts, ends = outage_lines(system)
    result.facts["outages logged (start, end)"] = [len(starts), len(ends)]
    result.check(sorted(starts) == sorted(ends),
                 f"workers logged an outage's start without its end (or the reverse): started "
                 f"{sorted(starts)}, ended {sorted(ends)}")
    await system.account(sent, result)
    result.check(result.dead_lettered == 0,
                 f"{result.dead_lettered} notifications were dead-lettered: the workers spent "
                 "their attempts on an outage instead of holding their work")
    result.check(len(sent) == count, f"only {len(sent)} of {count} sends were accepted")
    system.check_alive(result, ["api", *LAYOUT])
