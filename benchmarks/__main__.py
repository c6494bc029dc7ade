"""``python -m benchmarks [--quick] [--json FILE] [--duration S]``: notifkit's throughput,
latency and fan-out against real Redis, PostgreSQL and the provider simulators (no simulated
latency, no faults), with baselines measured in the same run; prints a markdown table and
writes the figures as JSON."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.options import (
    check_env,
    comma_list,
    env_pair,
    one_of,
    positive_float,
    positive_int,
    run_until_stopped,
    unusable,
)
from benchmarks.report import commit_line, hops, machine, markdown
from benchmarks.stats import Progress
from notifkit.stop_signals import defer_stop_signals
from simulators.__main__ import OneLineParser

if TYPE_CHECKING:
    from benchmarks.system import BenchSystem

# What runs the system (benchmarks.system, .phases, .baselines: a fifth of a second to import)
# is imported once main has taken over SIGTERM and Ctrl-C: imported with this module, a stop
# while it loaded killed the process or ended in a KeyboardInterrupt traceback.

# Larger read batches than the default 50 amortise each batch's round trips: at saturation on
# the split topology, 200 / 400 / 800 slots gave 1,638-1,692 / 1,844-1,884 / 1,896-2,033
# notifications/s (two interleaved quick runs each) with the same latency at 500/s offered.
# Two more pooled PostgreSQL connections per service let the API overlap its accept
# transactions; kept small, since the PostgreSQL server may be shared (max_connections).
BENCH_ENV = {"WORKER_CONCURRENCY": "800", "DB_MAX_CONNECTIONS": "4"}


# The second saturation pass: one request names this many users, so the API's per-request
# cost is shared and the pipeline behind it is what saturates.
BATCH_RECIPIENTS = 10


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from benchmarks.system import TOPOLOGIES

    parser = OneLineParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true",
                        help="shorter phases, 10,000-user fan-out only (about 3 minutes)")
    parser.add_argument("--json", type=Path, default=Path("bench-results/bench.json"),
                        help="where to write the figures (default bench-results/bench.json)")
    parser.add_argument("--duration", type=positive_float, default=None,
                        help="seconds each measured window lasts (default 20, quick 5)")
    parser.add_argument("--topologies", type=comma_list(one_of(TOPOLOGIES)),
                        default=list(TOPOLOGIES),
                        help=f"comma-separated, of {', '.join(TOPOLOGIES)}")
    parser.add_argument("--rates", type=comma_list(positive_float), default=[250.0, 500.0, 1000.0],
                        help="offered loads for the latency phases, per second "
                             "(default 250,500,1000)")
    parser.add_argument("--concurrency", type=positive_int, default=64,
                        help="requests in flight during the saturation phase (default 64)")
    parser.add_argument("--celery-concurrency", type=positive_int, default=8,
                        help="Celery prefork worker processes (default 8: the best of 4, 8 "
                             "and 16 on the 2-core benchmark machine)")
    parser.add_argument("--fanout-topology", default="split", choices=list(TOPOLOGIES),
                        help="topology the fan-out campaigns run on (default split)")
    parser.add_argument("--skip-baselines", action="store_true")
    parser.add_argument("--skip-fanout", action="store_true")
    parser.add_argument("--env", type=env_pair, action="append", default=[],
                        metavar="NAME=VALUE",
                        help="extra environment for the notifkit processes (repeatable); "
                             f"defaults: {', '.join(f'{k}={v}' for k, v in BENCH_ENV.items())}")
    args = parser.parse_args(argv)
    check_env(parser, args.env, BENCH_ENV)
    return args


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks import baselines
    from benchmarks.system import BenchSystem

    progress = Progress()
    duration: float = args.duration if args.duration is not None else (
        5.0 if args.quick else 20.0)
    warmup = 2.0 if args.quick else 5.0
    rate_window = min(duration, 4.0 if args.quick else 10.0)
    rates: list[float] = args.rates
    topologies: list[str] = args.topologies
    fanouts = [] if args.skip_fanout else ([10_000] if args.quick else [10_000, 100_000])
    users = max(fanouts or [10_000])
    env = {**BENCH_ENV, **dict(args.env)}
    results: dict[str, Any] = {
        "machine": machine(),
        "settings": {"quick": args.quick, "duration_s": duration, "warmup_s": warmup,
                     "rate_window_s": rate_window, "saturation_concurrency": args.concurrency,
                     "env": env},
        "baselines": {}, "topologies": {},
    }
    progress.say("Note: the load generator and this runner share the machine's "
                 f"{results['machine']['cores']} cores with the system under test; their CPU "
                 "use is reported with the saturation figures.")
    folder = args.json.parent / "logs"
    system = BenchSystem(folder, users=users, env=env)
    try:
        progress.say(f"Migrating schema {system.schema}, starting the simulators, inserting "
                     f"{users:,} users ...")
        await system.open()
        await system.seed()
        if not args.skip_baselines:
            progress.say("Baseline: bare XADD/XREADGROUP/XACK loop ...")
            results["baselines"]["redis_streams"] = await baselines.redis_ceiling(
                system.redis_url, system.namespace, min(duration, 5.0))
            progress.say(f"  {results['baselines']['redis_streams']['per_s']:,.0f} messages/s")
            progress.say("Baseline: bare HTTP POST loop to the simulator ...")
            results["baselines"]["http_post"] = await baselines.http_ceiling(
                system.sim_url, min(duration, 5.0))
            progress.say(f"  {results['baselines']['http_post']['per_s']:,.0f} requests/s")
            progress.say("Baseline: lone PostgreSQL commits, one every "
                         f"{baselines.COMMIT_GAP_S * 1000:g} ms ...")
            assert system.db is not None
            commits = await baselines.commit_latency(system.db, min(duration, 15.0))
            results["baselines"]["pg_commit"] = commits
            progress.say(f"  {commit_line(commits)}")
            progress.say(f"Baseline: Celery ({args.celery_concurrency} prefork workers) ...")
            results["baselines"]["celery"] = await baselines.celery_baseline(
                system, warmup_s=warmup, duration_s=duration,
                concurrency=args.celery_concurrency, progress=progress)
            progress.say(f"  {results['baselines']['celery']['per_s']:,.0f} notifications/s")
        for topology in topologies:
            results["topologies"][topology] = await run_topology(
                system, topology, args=args, duration=duration, warmup=warmup,
                rate_window=rate_window, rates=rates, fanouts=fanouts, progress=progress)
    finally:
        progress.say("Stopping everything and removing the run's schema and keys ...")
        await system.close()
    return results


async def run_topology(system: BenchSystem, topology: str, *, args: argparse.Namespace,
                       duration: float, warmup: float, rate_window: float, rates: list[float],
                       fanouts: list[int], progress: Progress) -> dict[str, Any]:
    from benchmarks import phases
    from benchmarks.system import TOPOLOGIES

    layout = " / ".join(f"{name}: {','.join(s)}" for name, s in TOPOLOGIES[topology].items())
    progress.say(f"Topology {topology} ({layout}): starting ...")
    out: dict[str, Any] = {"processes": TOPOLOGIES[topology]}
    rate_warmup = 1.0 if args.quick else 2.0
    await system.start_topology(topology)
    api_url = f"http://127.0.0.1:{system.api_port}"
    progress.say(f"Topology {topology}: saturation, {warmup:g} s warm-up + {duration:g} s "
                 f"measured, {args.concurrency} requests in flight ...")
    out["saturation"] = await phases.saturation(
        system, api_url, warmup_s=warmup, duration_s=duration, concurrency=args.concurrency,
        progress=progress)
    progress.say(f"  {out['saturation']['per_s']:,.0f} notifications/s received by the "
                 f"provider (API accepted {out['saturation']['api_accepted_per_s']:,.0f}/s)")
    if not args.quick:
        progress.say(f"Topology {topology}: saturation again, {BATCH_RECIPIENTS} recipients "
                     "per request ...")
        out["saturation_batched"] = await phases.saturation(
            system, api_url, warmup_s=warmup, duration_s=duration,
            concurrency=args.concurrency, progress=progress, recipients=BATCH_RECIPIENTS)
        progress.say(f"  {out['saturation_batched']['per_s']:,.0f} notifications/s received "
                     "by the provider")
    out["latency"] = []
    for rate in rates:
        progress.say(f"Topology {topology}: {rate:g}/s offered for "
                     f"{rate_warmup + rate_window:g} s ...")
        figures = await phases.fixed_rate(system, api_url, rate_per_s=rate,
                                          warmup_s=rate_warmup, duration_s=rate_window,
                                          progress=progress)
        out["latency"].append(figures)
        progress.say(f"  p50 {figures['p50_ms']} ms, p95 {figures['p95_ms']} ms, "
                     f"p99 {figures['p99_ms']} ms ({figures['delivered']}/{figures['measured']}"
                     " delivered)")
        progress.say(f"  by hop, p50 / p99 ms: {hops(figures.get('hops') or {})}")
    out["usage"] = await system.stop_topology()
    out["fan_out"] = []
    for size in fanouts if topology == args.fanout_topology else []:
        # Fresh processes, so each peak RSS belongs to this campaign alone.
        await system.start_topology(topology)
        progress.say(f"Topology {topology}: fan-out to a {size:,}-user segment ...")
        figures = await phases.fan_out(system, api_url=f"http://127.0.0.1:{system.api_port}",
                                       size=size, progress=progress)
        out["fan_out"].append(figures)
        rss = ", ".join(f"{n} {u['peak_rss_mb']:.0f} MiB" for n, u in figures["usage"].items()
                        if u["peak_rss_mb"] is not None)
        progress.say(f"  {figures['per_s']:,.0f} recipients/s; peak RSS {rss}")
        await system.stop_topology()
    return out


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the process's own command line: its signals are this command's
        # Kept until the run handles them (run_until_stopped): a stop before is obeyed then.
        defer_stop_signals()
    args = parse_args(argv)
    if status := unusable("benchmarks", args.json, "bench.json"):
        return status
    # A stop (SIGTERM, Ctrl-C) cancels the run, whose clean-up still stops every process it
    # started.
    results = run_until_stopped("benchmarks", run(args))
    if results is None:
        return 130
    # The table first: should the figures not be written after all, the run is still on screen.
    print()
    print(markdown(results))
    try:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    except OSError as exc:
        print(f"benchmarks: --json {str(args.json)!r}: cannot write: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    print(f"\nFigures written to {args.json}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
