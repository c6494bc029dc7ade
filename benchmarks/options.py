"""What the benchmark command lines share: argparse types that refuse a value the run cannot
use (status 2, naming the option, before anything starts) and the checks made before a run."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import sys
from collections.abc import Callable, Collection, Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar

from notifkit.config import ConfigError, Settings
from scenarios.__main__ import stoppable, unusable_json_path, unusable_services
from simulators.__main__ import positive_int

__all__ = ["check_env", "comma_list", "env_pair", "one_of", "positive_float", "positive_int",
           "run_until_stopped", "unusable"]

T = TypeVar("T")


def positive_float(text: str) -> float:
    """argparse type: a finite number above 0 (seconds, a rate)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def comma_list(item: Callable[[str], T]) -> Callable[[str], list[T]]:
    """argparse type: a non-empty comma-separated list, each item converted by ``item``."""

    def parse(text: str) -> list[T]:
        values = [item(part.strip()) for part in text.split(",") if part.strip()]
        if not values:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
        # Measured twice, the second figures would stand over the first: a slip, not a wish.
        twice = next((value for index, value in enumerate(values) if value in values[:index]),
                     None)
        if twice is not None:
            raise argparse.ArgumentTypeError(f"names {twice!r} twice, in {text!r}")
        return values

    return parse


def one_of(choices: Collection[str]) -> Callable[[str], str]:
    """argparse type: one of ``choices``."""

    def parse(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(
                f"expected one of {', '.join(choices)}, got {text!r}")
        return text

    return parse


def env_pair(text: str) -> tuple[str, str]:
    """argparse type: ``NAME=VALUE``."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def check_env(parser: argparse.ArgumentParser, pairs: list[tuple[str, str]],
              defaults: Mapping[str, str] | None = None) -> None:
    """Refuse (status 2) an ``--env`` value notifkit's processes would refuse at start-up: the
    settings they would read are validated here, by notifkit's own rules."""
    from scenarios.harness import DEFAULT_DATABASE, DEFAULT_REDIS

    given = dict(pairs)
    if len(given) < len(pairs):  # the later value won without a word
        twice = next(name for index, (name, _) in enumerate(pairs)
                     if name in dict(pairs[:index]))
        parser.error(f"argument --env: {twice}: given twice")
    env = {"REDIS_URL": DEFAULT_REDIS, "DATABASE_URL": DEFAULT_DATABASE, **(defaults or {}),
           **given}
    try:
        Settings.from_env(env)
    except ConfigError as exc:
        if exc.variable in given:
            parser.error(f"argument --env: {exc.variable}: {exc.problem}")


def unusable(prog: str, json_path: Path | None = None, example: str = "results.json") -> int:
    """0 when a run can start, else the exit status after one line on stderr: the results
    path cannot be written (2), a service URL is malformed (2) or does not answer (1), or
    SIGTERM or Ctrl-C came first (130)."""
    problem = None if json_path is None else unusable_json_path(json_path, example)
    if problem is not None:
        print(f"{prog}: {problem}", file=sys.stderr)
        return 2
    try:
        # Stoppable as the run is: a Ctrl-C while a server was slow to answer was a
        # KeyboardInterrupt traceback, and a stop kept from before (main) is obeyed here.
        found = asyncio.run(stoppable(unusable_services()))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print(f"{prog}: stopped before the run started", file=sys.stderr)
        return 130
    if found is None:
        return 0
    status, why = found
    print(f"{prog}: {why}", file=sys.stderr)
    return status


def run_until_stopped(command: str, work: Coroutine[Any, Any, T]) -> T | None:
    """``work`` run to its end (on uvloop where installed), or None once SIGTERM or Ctrl-C
    stopped it: the run's own clean-up has then stopped every process it started and removed
    its schema and keys, and one line says so. A stop used to end in a traceback."""
    runner: Any = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop

        runner = uvloop.run
    try:
        result: T = runner(stoppable(work))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print(f"{command}: stopped; the processes it started were stopped and the run's data "
              "removed", file=sys.stderr)
        return None
    return result
