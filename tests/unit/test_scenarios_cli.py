"""The scenario runner's command line: ``python -m scenarios NAME`` runs one scenario, as
SCENARIOS.md documents, and ``run`` stays accepted."""

from __future__ import annotations

import subprocess
import sys

import pytest

from scenarios.__main__ import parse_args


@pytest.mark.parametrize(
    "argv",
    [["crash_reclaim"], ["run", "crash_reclaim"]],
)
def test_a_scenario_runs_by_name_with_or_without_run(argv: list[str]) -> None:
    args = parse_args(argv)
    assert args.command == "run"
    assert args.names == ["crash_reclaim"]


def test_options_follow_a_bare_name() -> None:
    args = parse_args(["provider_outage", "--seed", "7", "--set", "outage_s=6"])
    assert (args.command, args.names, args.seed, args.set) == (
        "run", ["provider_outage"], 7, ["outage_s=6"])


def test_list_is_still_a_command() -> None:
    assert parse_args(["list"]).command == "list"


def test_an_unknown_bare_name_is_refused_without_running_anything() -> None:
    result = subprocess.run([sys.executable, "-m", "scenarios", "no_such_scenario"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert "no_such_scenario" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        # A misspelt parameter was ignored and the scenario ran with its default.
        (["crash_reclaim", "--set", "mesages=500"], "--set mesages: no such parameter"),
        (["run", "all", "--set", "nope=1"], "--set nope: no such parameter"),
        (["crash_reclaim", "--set", "messages"], "--set expects KEY=VALUE"),
        # A number given as text failed the scenario after its system had started.
        (["crash_reclaim", "--set", "messages=abc"], "--set messages: crash_reclaim takes a "
                                                     "whole number, got 'abc'"),
    ],
)
def test_a_bad_set_is_refused_without_running_anything(argv: list[str], complaint: str) -> None:
    result = subprocess.run([sys.executable, "-m", "scenarios", *argv],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert complaint in lines[0]
