"""``python -m scenarios list | [run] NAME... | [run] all [--json FILE] [--seed N] [--set k=v]``.

``run`` may be left out: ``python -m scenarios crash_reclaim`` runs that one scenario.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import sys
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

from notifkit.config import ConfigError, Settings
from notifkit.stop_signals import (
    STOP_SIGNALS,
    defer_stop_signals,
    ignore_stop_signals,
    on_stop_signals,
)
from scenarios import catalog
from scenarios.report import Progress, ScenarioResult, table, violations_text, write_json
from simulators.__main__ import OneLineParser, ascii_int, seed_value

T = TypeVar("T")

# The Redis and PostgreSQL clients and the harness (a fifth of a second to import) are imported
# where they are used, once main has taken over SIGTERM and Ctrl-C: imported here, a stop while
# they loaded killed the process or ended in a KeyboardInterrupt traceback.

COMMANDS = ("list", "run")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] not in COMMANDS and args[0] not in ("-h", "--help"):
        # ``python -m scenarios NAME``: run is the default command, options first or not
        # (``--seed 3 NAME`` was refused as an invalid command '3').
        args.insert(0, "run")
    # One line naming what is wrong, as for notifkit and the simulators, not a usage block.
    parser = OneLineParser(prog="python -m scenarios", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="list the scenarios and what each proves")
    run = commands.add_parser("run", help="run scenarios by name, or 'all'")
    run.add_argument("names", nargs="+", metavar="NAME",
                     help="scenarios to run, each once (see 'list'), or 'all'")
    # The simulators refuse a negative seed or one past 2**63, which failed the run only
    # after its first processes had started: refused here instead, by the simulators' rule.
    run.add_argument("--seed", type=seed_value, default=1,
                     help="seed for faults and traffic, 0 to 2**63 (default 1)")
    run.add_argument("--json", type=Path, default=Path("scenario-results/results.json"),
                     help="where to write the JSON results; each process's log goes "
                     "beside it (default scenario-results/results.json)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a scenario parameter, e.g. --set messages=500")
    if args[:1] == ["run"] and (unknown := unknown_options(args[1:])):
        # argparse names a missing NAME before an unknown option: "--bogus" alone was
        # answered "the following arguments are required: NAME".
        run.error(f"unrecognized arguments: {' '.join(unknown)}")
    return parser.parse_args(args)


RUN_OPTIONS = ("-h", "--help", "--seed", "--json", "--set")
RUN_VALUE_OPTIONS = ("--seed", "--json", "--set")


def unknown_options(words: list[str]) -> list[str]:
    """The words of a ``run`` command line that look like options it does not have (the value
    after ``--seed``, ``--json`` or ``--set`` is a value, whatever it looks like)."""
    unknown: list[str] = []
    value_next = False
    for word in words:
        if value_next:
            value_next = False
        elif word == "--":
            break
        elif word.startswith("-"):
            # argparse takes an unambiguous prefix too (--js for --json).
            given = word.split("=", 1)[0]
            matches = [option for option in RUN_OPTIONS if option == given
                       or (given.startswith("--") and option.startswith(given))]
            if not matches:
                unknown.append(word)
            value_next = ("=" not in word and bool(matches)
                          and all(option in RUN_VALUE_OPTIONS for option in matches))
    return unknown


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects KEY=VALUE, got {pair!r}")
        if key in overrides:  # which of two values was meant cannot be told
            raise ValueError(f"--set {key}: given twice")
        try:
            overrides[key] = ascii_int(value)
        except ValueError:
            try:
                # float() too reads any script's digits: a full-width value stays text, for
                # the parameter's own check to refuse.
                overrides[key] = float(value) if value.isascii() else value
            except ValueError:
                overrides[key] = value
    return overrides


def mistyped(names: list[str], overrides: dict[str, Any]) -> str | None:
    """Why an override cannot stand in for its default (a number given as text, say), or
    None: caught here, it would only fail the scenario after its system had started."""
    for name in names:
        module = catalog.load(name)
        for key, default in module.PARAMS.items():
            if key in overrides and (why := refused(module, key, default, overrides[key])):
                return f"--set {key}: {name} {why}"
        params = {**module.PARAMS, **overrides}
        for larger, smaller in catalog.more_than(module).items():
            if params[larger] > params[smaller]:
                continue
            # Named by the setting given, which may be either one.
            if larger in overrides:
                return (f"--set {larger}: {name} takes a number more than {smaller} "
                        f"({params[smaller]:g}), got {params[larger]!r}")
            if smaller in overrides:
                return (f"--set {smaller}: {name} takes a number less than {larger} "
                        f"({params[larger]:g}), got {params[smaller]!r}")
    return None


def refused(module: Any, key: str, default: Any, value: Any) -> str | None:
    """Why ``value`` cannot stand in for the parameter ``key`` whose default is ``default``."""
    choices: tuple[str, ...] | None = catalog.choices(module).get(key)
    if isinstance(default, str):
        # Parsed as a number when it looks like one: compared as the text it was given.
        if choices is not None and str(value) not in choices:
            return f"takes one of {', '.join(choices)}, got {value!r}"
        return None
    if isinstance(default, bool):
        return None
    if isinstance(default, int) and not isinstance(value, int):
        return f"takes a whole number, got {value!r}"
    if isinstance(default, float) and not isinstance(value, int | float):
        return f"takes a number, got {value!r}"
    # Every parameter is a count, a duration, a rate or a ratio: a negative or infinite one
    # (a drain timeout of -5, say) ran the system and then reported everything it sent as lost.
    if isinstance(value, float) and not math.isfinite(value):
        return f"takes a finite number, got {value!r}"
    # Zero users or a rate of 0 divided by zero once the system had started. Checked before
    # the sign: "at least 0" for -3, then "more than 0" for the 0 it suggested, misled.
    if key in catalog.positive(module) and value <= 0:
        return f"takes a number more than 0, got {value!r}"
    if value < 0:
        return f"takes a number of at least 0, got {value!r}"
    # Every count a run makes is held in its memory, and every message it sends is read back
    # from the simulators, which keep SIM_MAX_MESSAGES: users=10**23 built its user list
    # until the machine killed the run.
    from scenarios.harness import SIM_MAX_MESSAGES

    if isinstance(default, int) and value > SIM_MAX_MESSAGES:
        return (f"takes a whole number up to {SIM_MAX_MESSAGES} (the messages the simulators "
                f"keep for the accounting), got {value!r}")
    bounds = catalog.ranges(module).get(key)
    if bounds is not None and not bounds[0] <= value <= bounds[1]:
        if math.isinf(bounds[1]):
            return f"takes a number of at least {bounds[0]:g}, got {value!r}"
        return f"takes a number from {bounds[0]:g} to {bounds[1]:g}, got {value!r}"
    return None


def unusable_json_path(path: Path, example: str = "results.json") -> str | None:
    """Why the results cannot be written to ``path`` (its folder also holds the processes'
    logs), or None: found out after the run, it cost the whole run and ended in a traceback.
    ``example`` is the file name suggested when ``path`` is a folder."""
    if path.is_dir():
        return f"--json {str(path)!r}: is a folder; name a file, e.g. {str(path / example)!r}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"--json {str(path)!r}: cannot create its folder: {exc.strerror or exc}"
    # A folder that takes no new file (/proc, a read-only mount) let the run go ahead and end
    # in a traceback writing its results. Opened to append, so existing results stay as they
    # are until the run replaces them; a file made only to find out is removed again.
    existed = path.exists()
    try:
        with path.open("a"):
            pass
    except OSError as exc:
        return f"--json {str(path)!r}: cannot be written: {exc.strerror or exc}"
    if not existed:
        path.unlink(missing_ok=True)
    return None


def _source(test_variable: str, variable: str) -> str:
    """The variable a service's URL came from, in service_urls' order (the first one when
    neither is set: the default was used, and that is the one to set)."""
    return variable if not os.environ.get(test_variable) and os.environ.get(variable) \
        else test_variable


async def unusable_services() -> tuple[int, str] | None:
    """(exit status, why) when Redis or PostgreSQL cannot serve a run, else None. Found out
    inside the run, it failed every chosen scenario in turn, each reported as a violated
    invariant; a malformed URL is a 2, an unreachable server a 1, as for notifkit itself."""
    import asyncpg
    from redis.asyncio import Redis
    from redis.exceptions import RedisError

    from scenarios.harness import service_urls

    redis_url, database_url = service_urls()
    redis_variable = _source("NOTIFKIT_TEST_REDIS_URL", "REDIS_URL")
    database_variable = _source("NOTIFKIT_TEST_DATABASE_URL", "DATABASE_URL")
    try:
        Settings.from_env({"REDIS_URL": redis_url, "DATABASE_URL": database_url})
    except ConfigError as exc:
        named = redis_variable if exc.variable == "REDIS_URL" else database_variable
        return 2, f"{named}: {exc.problem}"
    # The URLs may hold passwords: the messages name the variable, not the URL.
    try:
        redis = Redis.from_url(redis_url, socket_connect_timeout=5, socket_timeout=5)
    except ValueError as exc:  # a query option the client cannot read (socket_timeout=abc)
        return 2, f"{redis_variable}: {exc}"
    try:
        await redis.ping()
    except (RedisError, OSError) as exc:
        return 1, f"{redis_variable}: cannot reach Redis: {exc}"
    finally:
        await redis.aclose()
    try:
        connection = await asyncpg.connect(database_url, timeout=5)
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError) as exc:
        return 1, f"{database_variable}: cannot reach PostgreSQL: {exc}"
    await connection.close()
    return None


async def run_all(names: list[str], seed: int, overrides: dict[str, Any],
                  run_dir: Path) -> list[ScenarioResult]:
    from scenarios.harness import RunOptions

    results: list[ScenarioResult] = []
    progress = Progress()
    for index, name in enumerate(names, 1):
        module = catalog.load(name)
        params = {**module.PARAMS, **{k: v for k, v in overrides.items() if k in module.PARAMS}}
        options = RunOptions(name=name, seed=seed, run_dir=run_dir, progress=progress)
        progress.update(f"[{index}/{len(names)}] {name}: starting")
        started = time.monotonic()
        try:
            result = await module.run(options, params)
        except Exception as exc:  # a crashed scenario is a failed one, with the reason
            result = ScenarioResult(name=name, seed=seed)
            result.violations.append(f"the scenario itself failed: {type(exc).__name__}: {exc}")
        result.wall_s = time.monotonic() - started
        result.logs = options.log_folders
        progress.done()
        status = "ok" if result.ok else "FAILED"
        print(f"{name}: {status} in {result.wall_s:.1f} s", file=sys.stderr, flush=True)
        results.append(result)
    return results


async def stoppable(work: Awaitable[T]) -> T:
    """``work``, cancelled by SIGTERM or Ctrl-C. The processes it starts run in sessions of
    their own, so a signal reaches only this one; cancelled, each System stops what it started
    and removes its schema and keys. SIGTERM's default action left every process running."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    stopping = False

    def stop() -> None:
        # Every signal cancels again: a library can swallow one cancellation (redis-py does
        # while it connects), and a second Ctrl-C must still stop the run. A System's
        # clean-up runs to its end however often it is cancelled.
        nonlocal stopping
        stopping = True
        task.cancel()

    def quiet_while_stopping(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # A scenario's helper tasks (probes, senders) fail once their processes are stopped;
        # after a stop that is expected, not an error worth a traceback.
        if stopping and isinstance(context.get("exception"), Exception):
            return
        loop.default_exception_handler(context)

    loop.set_exception_handler(quiet_while_stopping)
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    on_stop_signals(stop)
    try:
        result = await work
    finally:
        if stopping:
            # The run ends with 130 now; a repeat would otherwise meet the default handler
            # and kill the process by the signal.
            ignore_stop_signals()
        else:
            for signum, handler in previous.items():
                if handler is not None:
                    signal.signal(signum, handler)
    if stopping:
        # Told to stop, yet the work finished: its cancellation was swallowed (redis-py's,
        # while connecting, turns into a timeout later). A stop all the same.
        raise asyncio.CancelledError
    return result


def write_out(text: str) -> bool:
    """``text`` on stdout; False when stdout could not take it. A reader that stopped early
    (``list | head``) is nothing wrong with the run; stdout that fails (a full disk) is one
    line on stderr. Either way the interpreter's own flush at exit would fail again, so stdout
    goes nowhere now."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except OSError as exc:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print(f"scenarios: cannot write to stdout: {exc.strerror or exc}", file=sys.stderr)
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the process's own command line: its signals are this command's
        # Kept until a run handles them (stoppable): a stop before is obeyed then, with 130.
        defer_stop_signals()
    args = parse_args(argv)
    if args.command == "list":
        listed = write_out("".join(f"{name:<26} {catalog.load(name).DESCRIPTION}\n"
                                   for name in catalog.available()))
        return 0 if listed else 1
    if "all" in args.names and args.names != ["all"]:
        print("scenarios: 'all' runs every scenario; name scenarios or 'all', not both",
              file=sys.stderr)
        return 2
    names = catalog.available() if args.names == ["all"] else args.names
    twice = next((name for index, name in enumerate(names) if name in names[:index]), None)
    if twice is not None:  # it ran twice, its second result beside the first
        print(f"scenarios: {twice!r} named twice; name each scenario once", file=sys.stderr)
        return 2
    unknown = [n for n in names if n not in catalog.available()]
    if unknown:
        print(f"scenarios: unknown scenario {unknown[0]!r}; see 'python -m scenarios list'",
              file=sys.stderr)
        return 2
    try:
        overrides = parse_overrides(args.set)
    except ValueError as exc:
        print(f"scenarios: {exc}", file=sys.stderr)
        return 2
    known = {key for name in names for key in catalog.load(name).PARAMS}
    unused = sorted(set(overrides) - known)
    if unused:  # a misspelt parameter would otherwise be ignored without a word
        print(f"scenarios: --set {unused[0]}: no such parameter in {', '.join(names)}; "
              f"known: {', '.join(sorted(known))}", file=sys.stderr)
        return 2
    if (problem := mistyped(names, overrides) or unusable_json_path(args.json)) is not None:
        print(f"scenarios: {problem}", file=sys.stderr)
        return 2
    try:
        unusable = asyncio.run(stoppable(unusable_services()))
    except (KeyboardInterrupt, asyncio.CancelledError):
        return 130
    if unusable is not None:
        status, why = unusable
        print(f"scenarios: {why}", file=sys.stderr)
        return status
    try:
        results = asyncio.run(stoppable(run_all(names, args.seed, overrides, args.json.parent)))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("scenarios: stopped; the processes started were stopped and the run's data "
              "removed", file=sys.stderr)
        return 130
    # The results first: a table nobody reads (``| head``) must not cost them.
    write_json(args.json, results)
    printed = write_out(table(results) + "\n")
    problems = violations_text(results)
    if problems:
        print("\nViolated invariants:\n" + problems, file=sys.stderr)
        return 1
    return 0 if printed else 1


if __name__ == "__main__":
    sys.exit(main())
