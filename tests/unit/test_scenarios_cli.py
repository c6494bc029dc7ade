"""The scenario runner's command line: ``python -m scenarios NAME`` runs one scenario, as
SCENARIOS.md documents, and ``run`` stays accepted."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from scenarios import catalog
from scenarios.__main__ import mistyped, parse_args, unusable_json_path
from tests.support.signals import signal_while_importing, stop_insistently


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


def test_options_may_come_before_a_bare_name() -> None:
    # "--seed 3 malformed" was refused as "invalid choice: '3'", naming neither option.
    args = parse_args(["--seed", "3", "--json", "out.json", "malformed"])
    assert (args.command, args.names, args.seed, args.json) == (
        "run", ["malformed"], 3, Path("out.json"))


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
        # The later value won without a word, as PROVIDER_RATE_LIMITS' later pair once did.
        (["malformed", "--set", "users=3", "--set", "users=4"], "--set users: given twice"),
        # A number given as text failed the scenario after its system had started.
        (["crash_reclaim", "--set", "messages=abc"], "--set messages: crash_reclaim takes a "
                                                     "whole number, got 'abc'"),
        # argparse's own complaints came below its usage block.
        (["malformed", "--seed", "abc"], "argument --seed: expected a non-negative integer, "
                                         "got 'abc'"),
        (["malformed", "--bogus"], "unrecognized arguments: --bogus"),
        # A bad option first was answered "the following arguments are required: command".
        (["--bogus", "malformed"], "unrecognized arguments: --bogus"),
        # Alone, it was answered "the following arguments are required: NAME".
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["run", "--seed", "3", "--bogus"], "unrecognized arguments: --bogus"),
        (["--seed", "abc", "malformed"], "argument --seed: expected a non-negative integer, "
                                         "got 'abc'"),
        (["run"], "the following arguments are required: NAME"),
        (["list", "extra"], "unrecognized arguments: extra"),
    ],
)
def test_a_bad_option_is_one_line_without_running_anything(argv: list[str],
                                                           complaint: str) -> None:
    result = subprocess.run([sys.executable, "-m", "scenarios", *argv],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert complaint in lines[0]


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        # A seed past the simulators' largest passed here and failed the scenario once the
        # simulators refused it.
        (["malformed", "--seed", str(2**63 + 1)], "argument --seed: at most "
                                                  "9223372036854775808"),
        # A name given twice ran the scenario twice, its second result beside the first.
        (["malformed", "key_revocation", "malformed"], "'malformed' named twice"),
        # A negative seed passed here and failed the run once the simulators refused it.
        (["malformed", "--seed", "-1"], "argument --seed: expected a non-negative integer, "
                                        "got -1"),
        # A negative or infinite duration ran the system, then called every send lost.
        (["malformed", "--set", "drain_timeout_s=-5"], "--set drain_timeout_s: malformed takes "
                                                       "a number more than 0, got -5"),
        (["malformed", "--set", "drain_timeout_s=nan"], "--set drain_timeout_s: malformed takes "
                                                        "a finite number, got nan"),
        (["malformed", "--set", "drain_timeout_s=1e400"], "--set drain_timeout_s: malformed "
                                                          "takes a finite number, got inf"),
        # A parameter that must be more than 0 said "at least 0" of a negative value, and
        # then refused the 0 it had suggested.
        (["malformed", "--set", "messages=-3"], "--set messages: malformed takes a number "
                                                "more than 0, got -3"),
        (["crash_reclaim", "--set", "provider_delay_ms=-1"], "--set provider_delay_ms: "
         "crash_reclaim takes a number of at least 0, got -1"),
        # Any mode but "shutdown" silently ran in kill mode.
        (["redis_restart", "--set", "mode=bogus"], "--set mode: redis_restart takes one of "
                                                   "kill, shutdown, got 'bogus'"),
        (["redis_restart", "--set", "mode=5"], "--set mode: redis_restart takes one of "
                                               "kill, shutdown, got 5"),
        # A probability above 1 was refused by the simulators once the system had started.
        (["duplicate_send", "--set", "probability=5"], "--set probability: duplicate_send "
                                                       "takes a number from 0 to 1, got 5"),
        (["priority_isolation", "--set", "min_backlog_left=1.5"],
         "--set min_backlog_left: priority_isolation takes a number from 0 to 1, got 1.5"),
        # Zero users were cycled through with a modulo, a rate of 0 divided a pace: each
        # failed the scenario with a ZeroDivisionError once its system had started.
        (["crash_reclaim", "--set", "users=0"], "--set users: crash_reclaim takes a number "
                                                "more than 0, got 0"),
        (["crash_reclaim", "--set", "send_rate_per_s=0"],
         "--set send_rate_per_s: crash_reclaim takes a number more than 0, got 0"),
        (["redis_restart", "--set", "rate_per_s=0"], "--set rate_per_s: redis_restart takes a "
                                                     "number more than 0, got 0"),
        # No user (or no message) left nothing to send after the garbage, and no invalid token
        # nothing for FCM to refuse: the scenario passed without checking what it proves.
        (["malformed", "--set", "users=0"], "--set users: malformed takes a number more than "
                                            "0, got 0"),
        (["malformed", "--set", "messages=0"], "--set messages: malformed takes a number more "
                                               "than 0, got 0"),
        (["invalid_token", "--set", "invalid_users=0"],
         "--set invalid_users: invalid_token takes a number more than 0, got 0"),
        (["invalid_token", "--set", "users=0"], "--set users: invalid_token takes a number "
                                                "more than 0, got 0"),
        # The poison takes the first user; the traffic around it had none left.
        (["dlq_poison", "--set", "users=1"], "--set users: dlq_poison takes a number of at "
                                             "least 2, got 1"),
        # Settings the processes refuse: every notifkit process exited at start.
        (["backpressure", "--set", "concurrency=0"], "--set concurrency: backpressure takes a "
                                                     "number more than 0, got 0"),
        (["postgres_outage", "--set", "reclaim_s=0"], "--set reclaim_s: postgres_outage takes a "
                                                      "number of at least 0.01, got 0"),
        (["scheduler_failover", "--set", "lock_ttl_s=0"],
         "--set lock_ttl_s: scheduler_failover takes a number more than 0, got 0"),
    ],
)
def test_a_value_no_scenario_can_use_is_refused_before_anything_starts(
    argv: list[str], complaint: str
) -> None:
    result = subprocess.run([sys.executable, "-m", "scenarios", *argv],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert complaint in lines[0], result.stderr


def test_a_list_read_by_a_reader_that_stopped_early_ends_without_a_traceback() -> None:
    # ``python -m scenarios list | head -3``: the reader is gone before the list is written.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run([sys.executable, "-m", "scenarios", "list"], stdout=write_end,
                                stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    finally:
        os.close(write_end)
    assert result.stderr == ""
    assert result.returncode == 0


def test_a_list_stdout_cannot_take_is_one_line_and_status_1() -> None:
    # ``python -m scenarios list > file`` on a full disk (/dev/full fails every write) ended
    # in an OSError traceback; it is one line naming stdout.
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "scenarios", "list"], stdout=full,
                                stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    assert result.stderr == "scenarios: cannot write to stdout: No space left on device\n"
    assert result.returncode == 1


def test_a_count_of_0_that_proves_nothing_is_refused_by_the_runner() -> None:
    # crash_reclaim ran and passed with messages=0, having shown nothing.
    result = subprocess.run([sys.executable, "-m", "scenarios", "crash_reclaim", "--set",
                             "messages=0"], capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "scenarios: --set messages: crash_reclaim takes a number more than 0, got 0"]


@pytest.mark.parametrize(
    ("name", "key", "value", "why"),
    [
        ("crash_reclaim", "kills", 0, "takes a number more than 0, got 0"),
        ("crash_reclaim", "drain_timeout_s", 0, "takes a number more than 0, got 0"),
        # The enricher poison shares its batch with half the messages: one left it alone.
        ("dlq_poison", "messages", 1, "takes a number of at least 2, got 1"),
        ("duplicate_send", "messages", 0, "takes a number more than 0, got 0"),
        ("duplicate_send", "lost_responses", 0, "takes a number more than 0, got 0"),
        ("duplicate_send", "probability", 0, "takes a number more than 0, got 0"),
        # Users 0-9 have SMS down: the chain's SMS step needs an 11th.
        ("fallback_chain", "messages", 0, "takes a number of at least 11, got 0"),
        ("fallback_chain", "users", 10, "takes a number of at least 11, got 10"),
        ("invalid_token", "drain_timeout_s", 0, "takes a number more than 0, got 0"),
        ("key_revocation", "users", 0, "takes a number more than 0, got 0"),
        ("key_revocation", "watch_s", 0, "takes a number more than 0, got 0"),
        ("malformed", "drain_timeout_s", 0, "takes a number more than 0, got 0"),
        ("postgres_outage", "messages", 0, "takes a number more than 0, got 0"),
        ("postgres_outage", "down_s", 0, "takes a number more than 0, got 0"),
        ("postgres_outage", "quiesce_s", 0, "takes a number more than 0, got 0"),
        ("priority_isolation", "backlog", 0, "takes a number more than 0, got 0"),
        ("priority_isolation", "critical", 0, "takes a number more than 0, got 0"),
        ("priority_isolation", "min_backlog_left", 0, "takes a number more than 0, got 0"),
        ("priority_isolation", "wait_s", 0, "takes a number more than 0, got 0"),
        ("provider_outage", "outage_s", 0, "takes a number more than 0, got 0"),
        ("provider_outage", "traffic_s", 0, "takes a number more than 0, got 0"),
        ("quiet_hours_throttle", "quiet_s", 0, "takes a number more than 0, got 0"),
        ("quiet_hours_throttle", "per_quiet_user", 0, "takes a number more than 0, got 0"),
        ("quiet_hours_throttle", "critical", 0, "takes a number more than 0, got 0"),
        ("quiet_hours_throttle", "late_bound_s", 0, "takes a number more than 0, got 0"),
        ("rate_limit_429", "messages", 0, "takes a number more than 0, got 0"),
        ("rate_limit_429", "window_s", 0, "takes a number more than 0, got 0"),
        ("rate_limit_429", "retry_after_s", 0, "takes a number more than 0, got 0"),
        ("redis_restart", "messages", 0, "takes a number more than 0, got 0"),
        ("redis_restart", "quiesce_s", 0, "takes a number more than 0, got 0"),
        ("scheduler_failover", "messages", 0, "takes a number more than 0, got 0"),
        ("workflow_wait_for_event", "kill_within_s", 0, "takes a number more than 0, got 0"),
        # Half the users post the event: one user left no one to post it.
        ("workflow_wait_for_event", "users", 1, "takes a number of at least 2, got 1"),
        ("backpressure", "messages", 0, "takes a number more than 0, got 0"),
        ("backpressure", "delay_ms", 0, "takes a number more than 0, got 0"),
        ("backpressure", "min_backlog", 0, "takes a number more than 0, got 0"),
    ],
)
def test_a_value_that_makes_a_scenario_prove_nothing_is_refused(
    name: str, key: str, value: float, why: str
) -> None:
    assert mistyped([name], {key: value}) == f"--set {key}: {name} {why}"


@pytest.mark.parametrize(
    ("name", "overrides", "why"),
    [
        # Every user's token invalid left none to show other tokens keep working.
        ("invalid_token", {"invalid_users": 30},
         "--set invalid_users: invalid_token takes a number less than users (30), got 30"),
        ("invalid_token", {"users": 10},
         "--set users: invalid_token takes a number more than invalid_users (10), got 10"),
        # No send over the throttle: nothing shown throttled.
        ("quiet_hours_throttle", {"over_throttle": 3},
         "--set over_throttle: quiet_hours_throttle takes a number more than throttle_limit "
         "(3), got 3"),
        # Probes only up to the bound: none shows the key rejected after it.
        ("key_revocation", {"watch_s": 1.0},
         "--set watch_s: key_revocation takes a number more than bound_s (1), got 1.0"),
        # Every task due before the kill: nothing left for the survivor to move.
        ("scheduler_failover", {"kill_after_s": 6.0},
         "--set kill_after_s: scheduler_failover takes a number less than spread_s (6), "
         "got 6.0"),
    ],
)
def test_values_that_together_prove_nothing_are_refused(
    name: str, overrides: dict[str, float], why: str
) -> None:
    assert mistyped([name], overrides) == why


@pytest.mark.parametrize("name", catalog.available())
def test_every_scenario_takes_its_own_defaults(name: str) -> None:
    assert mistyped([name], dict(catalog.load(name).PARAMS)) is None


def test_a_json_path_that_is_a_folder_is_refused_before_the_run(tmp_path: Path) -> None:
    # It used to run the whole scenario, then end in a traceback writing the results.
    result = subprocess.run(
        [sys.executable, "-m", "scenarios", "malformed", "--json", str(tmp_path)],
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"scenarios: --json {str(tmp_path)!r}: is a folder; name a file, e.g. "
        f"{str(tmp_path / 'results.json')!r}"]


def test_a_json_path_whose_folder_cannot_be_made_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = subprocess.run(
        [sys.executable, "-m", "scenarios", "malformed", "--json", str(blocker / "r.json")],
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"scenarios: --json {str(blocker / 'r.json')!r}: cannot create")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_json_path_that_cannot_be_written_is_refused_before_the_run() -> None:
    # /proc takes no new file, not even root's (whom a read-only folder does not stop): the
    # run went ahead and ended in a traceback writing the results.
    path = "/proc/notifkit-scenario-results.json"
    result = subprocess.run(
        [sys.executable, "-m", "scenarios", "malformed", "--json", path],
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"scenarios: --json {path!r}: cannot be written: No such file or directory"]


def test_a_writable_json_path_is_left_as_it_was(tmp_path: Path) -> None:
    # Checked by opening it: a file that was not there is not left behind, one that was
    # keeps its content until the run replaces it.
    fresh, kept = tmp_path / "new.json", tmp_path / "old.json"
    kept.write_text("[]\n")
    assert unusable_json_path(fresh) is None
    assert not fresh.exists()
    assert unusable_json_path(kept) is None
    assert kept.read_text() == "[]\n"


def run_scenarios(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("REDIS_URL", "DATABASE_URL", "NOTIFKIT_TEST_REDIS_URL",
                          "NOTIFKIT_TEST_DATABASE_URL")}
    return subprocess.run([sys.executable, "-m", "scenarios", *argv], env={**clean, **env},
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(
    ("env", "status", "line"),
    [
        ({"NOTIFKIT_TEST_REDIS_URL": "redis://127.0.0.1:1/0"}, 1,
         "scenarios: NOTIFKIT_TEST_REDIS_URL: cannot reach Redis: "),
        ({"REDIS_URL": "redis://127.0.0.1:1/0"}, 1, "scenarios: REDIS_URL: cannot reach Redis: "),
        ({"NOTIFKIT_TEST_REDIS_URL": "nope"}, 2,
         "scenarios: NOTIFKIT_TEST_REDIS_URL: must be a redis:// or rediss:// URL, got 'nope'"),
        # Redis.from_url's own ValueError ended in a traceback.
        ({"NOTIFKIT_TEST_REDIS_URL": "redis://127.0.0.1:6379/0?socket_timeout=abc"}, 2,
         "scenarios: NOTIFKIT_TEST_REDIS_URL: has an option the client cannot use (Invalid "
         "value for 'socket_timeout'"),
        ({"NOTIFKIT_TEST_DATABASE_URL": "mysql://x"}, 2,
         "scenarios: NOTIFKIT_TEST_DATABASE_URL: must be a postgresql:// or postgres:// URL"),
    ],
)
def test_services_that_cannot_serve_a_run_are_one_line_before_any_scenario(
    env: dict[str, str], status: int, line: str
) -> None:
    # Found inside the run, this failed every chosen scenario in turn as a violated invariant.
    result = run_scenarios(env, "run", "all")
    assert result.returncode == status, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(line), lines[0]
    assert result.stdout == ""


def test_an_unreachable_database_is_named_after_a_working_redis(redis_url: str) -> None:
    result = run_scenarios({"NOTIFKIT_TEST_REDIS_URL": redis_url,
                            "NOTIFKIT_TEST_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/t"},
                           "malformed")
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("scenarios: NOTIFKIT_TEST_DATABASE_URL: cannot reach PostgreSQL: ")


def test_all_beside_scenario_names_is_refused_for_what_it_is() -> None:
    # It was called an unknown scenario, although 'all' is how every scenario is run.
    result = subprocess.run([sys.executable, "-m", "scenarios", "run", "all", "malformed"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "scenarios: 'all' runs every scenario; name scenarios or 'all', not both"]


@contextlib.contextmanager
def run_connecting_to_a_silent_redis(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A run whose Redis accepts the connection and never answers, once it has connected: it
    waits in its check of the services, before anything starts."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        env = dict(os.environ,
                   NOTIFKIT_TEST_REDIS_URL=f"redis://127.0.0.1:{silent.getsockname()[1]}/0")
        runner = subprocess.Popen(
            [sys.executable, "-m", "scenarios", "malformed", "--json",
             str(tmp_path / "results.json")],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            silent.settimeout(30)
            waiting, _ = silent.accept()
            with waiting:
                yield runner
        finally:
            if runner.poll() is None:
                runner.kill()
                runner.wait()


def test_a_signal_repeated_while_a_run_stops_still_ends_with_130(tmp_path: Path) -> None:
    # Given a run waiting on a Redis that never answers
    with run_connecting_to_a_silent_redis(tmp_path) as runner:
        # When it is stopped, and told again and again while it stops
        stderr = stop_insistently(runner, signal.SIGTERM, signal.SIGTERM)
    # Then it ends as a stopped run does, not killed by a repeat after its loop had closed
    assert runner.returncode == 130, stderr
    assert "Traceback" not in stderr, stderr


def test_a_stop_while_the_run_connects_to_redis_is_a_stop(tmp_path: Path) -> None:
    # Given a run still connecting to a Redis that never answers
    with run_connecting_to_a_silent_redis(tmp_path) as runner:
        # When it is stopped once (redis-py swallows a cancellation while it connects, and
        # its timeout followed 5 s later)
        runner.send_signal(signal.SIGTERM)
        _, stderr = runner.communicate(timeout=30)
    # Then the run ends as stopped, not as one whose Redis cannot be reached
    assert runner.returncode == 130, stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_stop_while_the_harness_loads_is_a_stop(tmp_path: Path, signum: signal.Signals) -> None:
    """Given a run still importing the harness (each import is a line on stderr with
    ``-X importtime``), when SIGTERM or Ctrl-C comes, then it ends as a stopped run (130, no
    traceback): imported before the command handled either, SIGTERM killed it and a Ctrl-C
    ended in a KeyboardInterrupt traceback."""
    clean = {k: v for k, v in os.environ.items()
             if k not in ("REDIS_URL", "DATABASE_URL", "NOTIFKIT_TEST_DATABASE_URL")}
    # Nothing answers there: a run that went on would end with 1, naming it.
    env = dict(clean, NOTIFKIT_TEST_REDIS_URL="redis://127.0.0.1:1/0")
    status, stderr = signal_while_importing(
        ["scenarios", "malformed", "--json", str(tmp_path / "results.json")],
        "scenarios.harness", signum, timeout_s=30, env=env)
    assert status == 130, stderr[-2000:]
    assert "Traceback" not in stderr


@pytest.mark.parametrize(("name", "key"), [("malformed", "users"), ("crash_reclaim", "messages"),
                                           ("priority_isolation", "backlog")])
def test_a_count_past_what_a_run_can_hold_is_refused(name: str, key: str) -> None:
    # users=10**23 built its user list until the machine killed the run (status 137), with
    # its processes started and nothing said.
    assert mistyped([name], {key: 10**23}) == (
        f"--set {key}: {name} takes a whole number up to 100000 (the messages the simulators "
        f"keep for the accounting), got {10**23}")
    assert mistyped([name], {key: 100_000}) is None
