"""``python -m benchmarks.profile [--topology split] [--seconds 20]``: sample every notifkit
process with py-spy while the saturation load runs, and print each one's hottest functions.

Writes one py-spy ``raw`` (collapsed stacks) file per process under ``--out``; feed them to a
flame-graph viewer (speedscope, inferno) for the full picture.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import math
import shutil
import sys
from pathlib import Path
from typing import Any

from benchmarks.options import (
    check_env,
    env_pair,
    positive_float,
    positive_int,
    run_until_stopped,
    unusable,
)
from benchmarks.stats import Progress
from notifkit.stop_signals import defer_stop_signals
from simulators.__main__ import OneLineParser

# What runs the system (benchmarks.system, .phases, .load) is imported once main has taken
# over SIGTERM and Ctrl-C, as for python -m benchmarks.


def fanout_size(text: str) -> int:
    """argparse type: a campaign size the seeded segments can serve. A smaller one went to the
    whole 10,000-user segment while only its first N receipts were counted: the figure was of
    a campaign that had not finished."""
    from benchmarks.system import SMALL_SEGMENT_SIZE

    value = positive_int(text)
    if value < SMALL_SEGMENT_SIZE:
        raise argparse.ArgumentTypeError(
            f"at least {SMALL_SEGMENT_SIZE} (the smaller segment's users), got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from benchmarks.system import SMALL_SEGMENT_SIZE, TOPOLOGIES

    parser = OneLineParser(prog="python -m benchmarks.profile", description=__doc__)
    parser.add_argument("--topology", default="split", choices=list(TOPOLOGIES))
    parser.add_argument("--seconds", type=positive_float, default=20.0)
    parser.add_argument("--concurrency", type=positive_int, default=64)
    parser.add_argument("--rate", type=positive_float, default=None,
                        help="paced open-loop load instead of saturation")
    parser.add_argument("--fanout", type=fanout_size, default=None,
                        help="profile a campaign to N users instead of the API load: 10000 "
                             f"(the first {SMALL_SEGMENT_SIZE}) or more (each one seeded)")
    parser.add_argument("--out", type=Path, default=Path("bench-results/profile"))
    parser.add_argument("--top", type=positive_int, default=25,
                        help="functions listed per process")
    parser.add_argument("--env", type=env_pair, action="append", default=[],
                        metavar="NAME=VALUE")
    args = parser.parse_args(argv)
    check_env(parser, args.env)
    return args


def spy_duration(seconds: float) -> str:
    """py-spy's ``--duration``, in the whole seconds it takes: rounded up, since truncated,
    ``--seconds 0.5`` asked it to sample for 0 s, not for the load the run then sent."""
    return str(math.ceil(seconds))


def hottest(raw: Path, top: int) -> list[tuple[str, float, float]]:
    """(function, self %, inclusive %) from py-spy's collapsed stacks."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    if not total:
        return []
    return [(frame, 100 * n / total, 100 * inclusive[frame] / total)
            for frame, n in own.most_common(top)]


async def run(args: argparse.Namespace) -> None:
    from benchmarks import phases
    from benchmarks.load import LoadGenerator
    from benchmarks.system import BenchSystem

    if shutil.which("py-spy") is None and not (Path(sys.executable).parent / "py-spy").exists():
        raise SystemExit("py-spy is not installed: pip install py-spy")
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    progress = Progress()
    args.out.mkdir(parents=True, exist_ok=True)
    env = dict(args.env)
    system = BenchSystem(args.out / "logs", users=max(10_000, args.fanout or 0), env=env)
    try:
        await system.open()
        await system.seed()
        await system.start_topology(args.topology)
        api_url = f"http://127.0.0.1:{system.api_port}"
        async with LoadGenerator(api_url, system.api_key, 10_000) as load:
            await load.closed_loop(3.0, args.concurrency)
            await phases.drain(system, progress)
            spies: dict[str, Any] = {}
            sampled = dict(system.processes)
            if system.simulators is not None:
                sampled["simulators"] = system.simulators
            for name, proc in sampled.items():
                spies[name] = await asyncio.create_subprocess_exec(
                    spy, "record", "--pid", str(proc.pid), "--duration",
                    spy_duration(args.seconds), "--rate", "200", "--format", "raw",
                    # --gil: only samples holding the GIL, i.e. Python work, not waiting.
                    "--nonblocking", "--gil",
                    "--output", str(args.out / f"{args.topology}-{name}.txt"),
                    stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
            progress.say(f"Sampling {', '.join(spies)} for {args.seconds:g} s under load ...")
            if args.fanout:
                figures = await phases.fan_out(system, api_url, size=args.fanout,
                                               progress=progress)
                progress.say(f"{figures['per_s']:.0f} recipients/s.")
            elif args.rate:
                result = await load.open_loop(args.rate, args.seconds + 1)
                progress.say(f"{result.achieved_per_s:.0f} notifications/s accepted.")
            else:
                result = await load.closed_loop(args.seconds + 1, args.concurrency)
                progress.say(f"{result.achieved_per_s:.0f} notifications/s accepted.")
            for spy_proc in spies.values():
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(spy_proc.wait(), 30)
    finally:
        await system.close()
    for name in spies:
        raw = args.out / f"{args.topology}-{name}.txt"
        if not raw.exists():
            continue
        print(f"\n## {name}: hottest functions (self %, inclusive %)")
        for frame, self_pct, incl_pct in hottest(raw, args.top):
            print(f"{self_pct:6.1f} {incl_pct:6.1f}  {frame}")


def unusable_out(out: Path) -> str | None:
    """Why the profiles cannot be written under ``out``, or None; found out after the services
    started, it ended the run in a traceback."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"--out {str(out)!r}: cannot use it as a folder: {exc.strerror or exc}"
    return None


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the process's own command line: its signals are this command's
        defer_stop_signals()
    args = parse_args(argv)
    if problem := unusable_out(args.out):
        print(f"benchmarks.profile: {problem}", file=sys.stderr)
        return 2
    if status := unusable("benchmarks.profile"):
        return status
    return 0 if run_until_stopped("benchmarks.profile", run(args)) is not None else 130


if __name__ == "__main__":
    sys.exit(main())
