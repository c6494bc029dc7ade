"""The benchmark and profiler command lines refuse bad input before anything starts: status 2
and a line naming the option, where they used to run for minutes and then end in a traceback."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

import benchmarks.__main__ as bench
from benchmarks import options, profile
from tests.support.signals import signal_while_importing

Parse = Callable[[list[str]], argparse.Namespace]


@pytest.mark.parametrize(
    ("parse", "argv", "option"),
    [
        (bench.parse_args, ["--topologies", "nope"], "--topologies"),
        (bench.parse_args, ["--topologies", "split,nope"], "--topologies"),
        (bench.parse_args, ["--topologies", ","], "--topologies"),
        (bench.parse_args, ["--duration", "-1"], "--duration"),
        # 0 silently meant the default duration.
        (bench.parse_args, ["--duration", "0"], "--duration"),
        (bench.parse_args, ["--duration", "nan"], "--duration"),
        (bench.parse_args, ["--rates=-5,0"], "--rates"),
        (bench.parse_args, ["--rates", "abc"], "--rates"),
        (bench.parse_args, ["--rates", "250,inf"], "--rates"),
        # A topology or rate given twice measured it twice, its second figures over the first.
        (bench.parse_args, ["--topologies", "all,split,all"], "--topologies"),
        (bench.parse_args, ["--rates", "250,250"], "--rates"),
        # The later value won without a word.
        (bench.parse_args, ["--env", "LOG_LEVEL=INFO", "--env", "LOG_LEVEL=ERROR"], "LOG_LEVEL"),
        (profile.parse_args, ["--env", "WORKER_CONCURRENCY=5", "--env", "WORKER_CONCURRENCY=6"],
         "WORKER_CONCURRENCY"),
        (bench.parse_args, ["--concurrency", "0"], "--concurrency"),
        (bench.parse_args, ["--celery-concurrency", "-3"], "--celery-concurrency"),
        (bench.parse_args, ["--env", "junk"], "--env"),
        (bench.parse_args, ["--env", "=1"], "--env"),
        (bench.parse_args, ["--env", "WORKER_CONCURRENCY=abc"], "WORKER_CONCURRENCY"),
        (profile.parse_args, ["--seconds", "-1"], "--seconds"),
        (profile.parse_args, ["--seconds", "0"], "--seconds"),
        (profile.parse_args, ["--rate", "-5"], "--rate"),
        (profile.parse_args, ["--fanout", "-1"], "--fanout"),
        # The campaign went to 10,000 users and its figure counted only the first 5 receipts.
        (profile.parse_args, ["--fanout", "5"], "--fanout"),
        (profile.parse_args, ["--fanout", "9999"], "--fanout"),
        (profile.parse_args, ["--top", "-1"], "--top"),
        (profile.parse_args, ["--concurrency", "0"], "--concurrency"),
        (profile.parse_args, ["--env", "junk"], "--env"),
        (profile.parse_args, ["--env", "DB_MAX_CONNECTIONS=-2"], "DB_MAX_CONNECTIONS"),
    ],
)
def test_a_bad_option_is_refused_with_status_2_naming_it(
    parse: Parse, argv: list[str], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse(argv)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("python -m benchmarks"), lines
    assert option in lines[0]


def test_good_options_are_parsed_into_values() -> None:
    args = bench.parse_args(["--rates", "250,500.5", "--topologies", "all",
                             "--duration", "3", "--env", "WORKER_CONCURRENCY=100"])
    assert (args.rates, args.topologies, args.duration, args.env) == (
        [250.0, 500.5], ["all"], 3.0, [("WORKER_CONCURRENCY", "100")])
    defaults = bench.parse_args([])
    assert defaults.rates == [250.0, 500.0, 1000.0]
    assert defaults.topologies == ["all", "split"]
    args = profile.parse_args(["--seconds", "5", "--fanout", "10000", "--env", "A=b=c"])
    assert (args.seconds, args.fanout, args.env) == (5.0, 10000, [("A", "b=c")])


# benchmarks/ is not an installed package: the child finds it from the checkout.
REPO = Path(__file__).resolve().parents[2]


def run_bench(tmp_path: Path, env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "benchmarks", *argv],
                          env={**os.environ, "PYTHONPATH": path, **env}, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)


def test_a_json_path_that_is_a_folder_is_refused_before_the_run(tmp_path: Path) -> None:
    # It used to run for 7-10 minutes, then lose the figures in a traceback.
    result = run_bench(tmp_path, {}, "--json", str(tmp_path))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"benchmarks: --json {str(tmp_path)!r}: is a folder; name a file, e.g. "
        f"{str(tmp_path / 'bench.json')!r}"]


def test_a_json_path_whose_folder_cannot_be_made_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run_bench(tmp_path, {}, "--json", str(blocker / "b.json"))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"benchmarks: --json {str(blocker / 'b.json')!r}: cannot create")


@pytest.mark.parametrize("inside", ["", "sub"])
def test_a_profile_folder_that_cannot_be_made_is_refused_before_the_run(
    tmp_path: Path, inside: str,
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = blocker / inside if inside else blocker
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-m", "benchmarks.profile", "--out", str(out)],
                            env={**os.environ, "PYTHONPATH": path}, cwd=tmp_path,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"benchmarks.profile: --out {str(out)!r}: cannot use it as a folder: "
        + ("File exists" if not inside else "Not a directory")], result.stderr


def test_an_unreachable_database_is_one_line_naming_its_variable(
    tmp_path: Path, redis_url: str
) -> None:
    result = run_bench(tmp_path, {"NOTIFKIT_TEST_REDIS_URL": redis_url,
                                  "NOTIFKIT_TEST_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/t"},
                       "--quick", "--json", str(tmp_path / "b.json"))
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("benchmarks: NOTIFKIT_TEST_DATABASE_URL: cannot reach PostgreSQL: ")
    assert not (tmp_path / "b.json").exists()


def test_the_table_is_printed_before_the_json_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def fake_run(args: argparse.Namespace) -> dict[str, Any]:
        return {"figures": 1}

    async def services_fine() -> None:
        return None

    def full_disk(self: Path, text: str) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(bench, "run", fake_run)
    monkeypatch.setattr(bench, "markdown", lambda results: "THE TABLE")
    monkeypatch.setattr(options, "unusable_services", services_fine)
    monkeypatch.setattr(Path, "write_text", full_disk)
    assert bench.main(["--json", str(tmp_path / "b.json")]) == 1
    out, err = capsys.readouterr()
    assert "THE TABLE" in out
    assert err.strip().splitlines()[-1].startswith(
        f"benchmarks: --json {str(tmp_path / 'b.json')!r}: cannot write")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
# Start-up, load and the clean-up's 180 s below must all fit, on a machine busy with other work.
@pytest.mark.timeout(420)
def test_a_stopped_run_says_so_in_one_line_and_leaves_nothing_behind(
    tmp_path: Path, redis_url: str, database_url: str, signum: signal.Signals,
) -> None:
    # Given a benchmark run under way (its system started, its load running)
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    run = subprocess.Popen(
        [sys.executable, "-m", "benchmarks", "--quick", "--skip-baselines", "--skip-fanout",
         "--topologies", "split", "--rates", "250", "--json", str(tmp_path / "b.json")],
        env={**os.environ, "PYTHONPATH": path, "NOTIFKIT_TEST_REDIS_URL": redis_url,
             "NOTIFKIT_TEST_DATABASE_URL": database_url},
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert run.stdout is not None
        schema = None
        for line in run.stdout:
            if found := re.search(r"Migrating schema (\w+)", line):
                schema = found.group(1)
            if "saturation:" in line:
                break
        assert schema is not None

        # When it is told to stop
        run.send_signal(signum)
        # The clean-up stops each process in turn, each given its grace period: generous,
        # for a machine busy with other work.
        out, err = run.communicate(timeout=180)
    finally:
        if run.poll() is None:
            # The processes it started live in their own sessions: only the run itself can
            # stop them, so a failed test still lets its clean-up run before the kill.
            run.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.communicate(timeout=60)
            run.kill()

    # Then it ends with status 130 and one line, no traceback, and its schema and keys are gone
    assert run.returncode == 130, out + err
    assert err.strip().splitlines() == [
        "benchmarks: stopped; the processes it started were stopped and the run's data "
        "removed"], err
    assert not (tmp_path / "b.json").exists()
    namespace = schema.replace("bench_", "bench-", 1)

    async def leftovers() -> tuple[bool, list[bytes]]:
        connection = await asyncpg.connect(database_url)
        redis = Redis.from_url(redis_url)
        try:
            has_schema = await connection.fetchval(
                "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema)
            keys = [key async for key in redis.scan_iter(match=f"{namespace}*")]
        finally:
            await connection.close()
            await redis.aclose()
        return bool(has_schema), keys

    assert asyncio.run(leftovers()) == (False, [])


@pytest.mark.parametrize(("seconds", "duration"), [(0.5, "1"), (1.0, "1"), (20.2, "21")])
def test_the_profile_samples_at_least_as_long_as_asked(seconds: float, duration: str) -> None:
    # py-spy takes whole seconds; --seconds 0.5 used to reach it as 0.
    assert profile.spy_duration(seconds) == duration


def _clean_env(**env: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("REDIS_URL", "DATABASE_URL", "NOTIFKIT_TEST_REDIS_URL",
                          "NOTIFKIT_TEST_DATABASE_URL")}
    return {**clean, **env}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
@pytest.mark.parametrize("command", ["benchmarks", "benchmarks.profile"])
def test_a_stop_while_the_command_loads_is_a_stop(
    tmp_path: Path, command: str, signum: signal.Signals
) -> None:
    """Given the command still importing what runs the system (each import is a line on stderr
    with ``-X importtime``), when SIGTERM or Ctrl-C comes, then it ends as stopped: 130, one
    line, no traceback. Imported with the module, SIGTERM killed it and a Ctrl-C ended in a
    KeyboardInterrupt traceback."""
    # Nothing answers there: a command that went on would end with 1, naming it.
    status, stderr = signal_while_importing(
        [command, "--json" if command == "benchmarks" else "--out",
         str(tmp_path / "out" / "b.json")],
        "benchmarks.system", signum, timeout_s=30,
        env=_clean_env(NOTIFKIT_TEST_REDIS_URL="redis://127.0.0.1:1/0"))
    assert status == 130, stderr[-2000:]
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == f"{command}: stopped before the run started"


def test_a_ctrl_c_while_the_services_are_checked_is_a_stop(tmp_path: Path) -> None:
    """Given a check of the services waiting on a Redis that accepts and never answers, when
    Ctrl-C comes, then the command ends as stopped (130), not in a KeyboardInterrupt
    traceback."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        runner = subprocess.Popen(
            [sys.executable, "-m", "benchmarks", "--json", str(tmp_path / "b.json")],
            env=_clean_env(
                NOTIFKIT_TEST_REDIS_URL=f"redis://127.0.0.1:{silent.getsockname()[1]}/0"),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            silent.settimeout(30)
            waiting, _ = silent.accept()
            with waiting:
                runner.send_signal(signal.SIGINT)
                _, stderr = runner.communicate(timeout=30)
        finally:
            if runner.poll() is None:
                runner.kill()
                runner.wait()
    assert runner.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines() == ["benchmarks: stopped before the run started"]
