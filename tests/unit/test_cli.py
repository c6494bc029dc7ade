"""The command line: invalid configuration exits 2 with one line naming the setting."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import notifkit
import notifkit.config
from notifkit.dev import data_dir_lock
from tests.support.signals import signal_while_importing


def run_cli(*args: str, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("NOTIFKIT_", "REDIS", "DATABASE", "DB_", "PORT"))}
    # Nothing here may reach a shared server: a case that wrongly passes validation fails to
    # connect instead of migrating someone's database.
    full_env.update(REDIS_URL="redis://127.0.0.1:1/0", PORT="0",
                    DATABASE_URL="postgresql://postgres@127.0.0.1:1/notifkit_cli_tests")
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "notifkit", *args],
        capture_output=True, text=True, env=full_env, timeout=60, check=False, cwd=cwd,
    )


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("WORKER_CONCURRENCY", "abc"),
        ("WORKER_CONCURRENCY", "0"),
        ("REDIS_URL", "localhost:6379"),
        ("DATABASE_URL", "mysql://x"),
        ("DB_SCHEMA", "Bad-Schema"),
        ("NOTIFKIT_SERVICES", "api,nope"),
        # A service named twice (a slip for another one, api,api for api,engine) ran once.
        ("NOTIFKIT_SERVICES", "api,delivery,API"),
        ("EMAIL_TRANSPORT", "pigeon"),
        ("AUTO_MIGRATE", "perhaps"),
        ("WEBHOOK_ALLOW_PRIVATE_NETWORKS", "sometimes"),
        ("PROVIDER_TIMEOUT_SECONDS", "-1"),
        ("PORT", "70000"),
        # Values that used to pass validation and fail later, without naming the setting
        ("RECLAIM_MIN_IDLE_SECONDS", "inf"),
        ("RECLAIM_INTERVAL_SECONDS", "inf"),
        ("PROVIDER_TIMEOUT_SECONDS", "inf"),
        ("HEARTBEAT_INTERVAL_SECONDS", "inf"),
        ("HEARTBEAT_INTERVAL_SECONDS", "1e308"),
        ("HOST", "127.0.0.1\n::1"),
        ("TWILIO_BASE_URL", "https://api.twilio.com:0"),
        ("IDEMPOTENCY_TTL_SECONDS", "99999999999999999999"),
        ("RECLAIM_MIN_IDLE_SECONDS", "1e300"),
        ("SCHEDULER_POLL_INTERVAL_SECONDS", "1e300"),
        ("QUEUE_MAX_LEN", "99999999999999999999"),
        ("REDIS_URL", "redis://127.0.0.1:notaport/0"),
        ("REDIS_URL", "redis://127.0.0.1:6379/abc"),
        ("DATABASE_URL", "postgresql://postgres@127.0.0.1:notaport/test"),
        ("SMTP_URL", "smtp://mail.example:abc"),
        ("NOTIFKIT_PUBLIC_URL", "http://notifkit.example:99999"),
        ("NOTIFKIT_SIMULATOR_SMTP", "127.0.0.1:99999"),
        ("REDIS_URL", "redis://[::1"),
        ("DATABASE_URL", "postgresql://[::1/test"),
        ("DB_SCHEMA", "pg_catalog"),
        ("WORKER_CONCURRENCY", "99999999999999999999999"),
        ("DB_MAX_CONNECTIONS", "99999999999999999"),
        ("NOTIFKIT_PUBLIC_URL", "http://:8080"),
        ("NOTIFKIT_SIMULATOR_URL", "http://sim ulators:8025"),
        # int() reads "5_0" as 50: numbers are written in the digits 0-9.
        ("WORKER_CONCURRENCY", "5_0"),
        ("WORKER_CONCURRENCY", "+5"),
        ("RECLAIM_INTERVAL_SECONDS", "1_0"),
        ("MAX_ATTEMPTS", "99999999999999999999"),
        ("ENRICHER_MAX_ATTEMPTS", "1001"),
        ("REDIS_URL", "redis://127.0.0.1:6379/0?bogus=1"),
    ],
)
def test_invalid_configuration_exits_2_naming_the_variable(variable: str, value: str) -> None:
    result = run_cli("serve", env={variable: value})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert variable in lines[0]
    assert "Traceback" not in result.stderr


def test_a_unix_socket_redis_url_is_accepted() -> None:
    from notifkit.config import Settings

    assert Settings(redis_url="unix:///run/redis.sock").redis_url == "unix:///run/redis.sock"


# Full-width digits (pasted from a document) were read as 80: a port nobody asked for.
@pytest.mark.parametrize("port", ["abc", "\uff18\uff10", "8_080"])
def test_a_bad_argument_is_one_line_naming_the_option(port: str) -> None:
    result = run_cli("serve", "--port", port)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "--port" in lines[0]


def test_an_empty_services_flag_is_an_error_not_all() -> None:
    result = run_cli("serve", "--services", "")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "--services" in lines[0]


# A service named twice (api,api for api,engine, say) ran once, leaving the other unrun.
@pytest.mark.parametrize(("services", "named"), [("api,bogus", "bogus"),
                                                 ("api,api", "'api' twice")])
def test_unknown_service_flag_is_named(services: str, named: str) -> None:
    result = run_cli("serve", "--services", services)
    assert result.returncode == 2
    assert "--services" in result.stderr
    assert named in result.stderr


# An option given twice kept its last value without a word: ``--services api --services
# delivery`` ran delivery alone, leaving the api unrun.
@pytest.mark.parametrize("argv", [
    ["serve", "--services", "api", "--services", "delivery"],
    ["--services=api", "--services=delivery"],
    ["serve", "--port", "8081", "--port", "8082"],
    ["dev", "--sim-port", "9025", "--sim-port", "9026"],
    ["dev", "--data-dir", "a", "--data-dir", "b"],
], ids=["services", "services-equals", "port", "dev-sim-port", "dev-data-dir"])
def test_an_option_given_twice_is_refused_naming_it(argv: list[str]) -> None:
    from notifkit.__main__ import build_parser

    option = next(word for word in argv[::-1] if word.startswith("--")).partition("=")[0]
    words = argv if argv[0] in ("serve", "dev") else ["serve", *argv]
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(words)
    assert exited.value.code == 2
    result = run_cli(*argv)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert option in lines[0]
    assert "twice" in lines[0]


def test_version() -> None:
    result = run_cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"notifkit {notifkit.__version__}"


# Ctrl-C lands while ``python -m notifkit`` is still importing its modules: the child sends
# itself SIGINT as the import of notifkit.config begins, with SIGINT handled as in a terminal
# (a parent that ignores it, such as a shell's background job, would pass that on).
INTERRUPTED_WHILE_LOADING = """
import os, runpy, signal, sys

signal.signal(signal.SIGINT, signal.default_int_handler)


class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == "notifkit.config":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None


sys.meta_path.insert(0, Interrupt())
sys.argv = ["notifkit", "migrate"]
runpy.run_module("notifkit", run_name="__main__", alter_sys=True)
"""


def test_a_ctrl_c_while_the_modules_load_stops_quietly_with_130() -> None:
    """A first run compiles every module, so the start can spend seconds importing; a Ctrl-C
    then printed a KeyboardInterrupt traceback from inside an import."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFKIT_", "PORT"))}
    env.update(REDIS_URL="redis://127.0.0.1:1/0",
               DATABASE_URL="postgresql://postgres@127.0.0.1:1/notifkit_cli_tests")
    result = subprocess.run([sys.executable, "-c", INTERRUPTED_WHILE_LOADING],
                            capture_output=True, text=True, env=env, timeout=60, check=False)
    assert result.returncode == 130, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_help_lists_commands() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    for command in ("serve", "migrate", "dev"):
        assert command in result.stdout


def test_dev_help_shows_each_option_default() -> None:
    # The README lists the dev command's defaults; --help must say the same.
    result = run_cli("dev", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    for option, default in (("--data-dir", ".notifkit"), ("--port", "8080"),
                            ("--sim-port", "8025"), ("--sim-smtp-port", "2525")):
        assert option in text
        assert f"(default: {default})" in text, option


def test_dev_help_says_where_each_port_listens_and_that_0_picks_one() -> None:
    # The README says so of every port option; --help said it of --port alone.
    text = " ".join(run_cli("dev", "--help").stdout.split())
    for option, metavar in (("--port", "PORT"), ("--sim-port", "SIM_PORT"),
                            ("--sim-smtp-port", "SIM_SMTP_PORT")):
        described = text.split(f"{option} {metavar} ")[-1].split("(default:")[0]
        assert "on 127.0.0.1" in described, option
        assert "0 picks a free one" in described, option


def test_a_started_service_freezes_what_is_alive_and_collects_less_often() -> None:
    import gc

    from notifkit.gc_tuning import GC_GEN0_THRESHOLD, tune_gc

    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_threshold()[0] == GC_GEN0_THRESHOLD > before[0]
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_a_failed_migration_is_one_line_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib

    from notifkit import __main__ as cli

    migrate_module = importlib.import_module("notifkit.db.migrate")

    async def failing_migrate(*_args: object, **_kwargs: object) -> list[str]:
        raise migrate_module.MigrationError(
            "migration 0005_workflow_paths failed in schema 'x' and was rolled back: boom")

    monkeypatch.setattr(migrate_module, "migrate", failing_migrate)
    monkeypatch.setattr(cli, "_install_event_loop", lambda: None)  # keep the test's loop policy
    status = cli.main(["migrate"])
    err = capsys.readouterr().err
    assert status == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "DB_SCHEMA" in lines[0]
    assert "0005_workflow_paths" in lines[0]


@pytest.mark.parametrize(("argv", "named"), [
    (["--port", "18230", "--sim-port", "18230"], "--sim-port"),
    (["--port", "18230", "--sim-smtp-port", "18230"], "--sim-smtp-port"),
    (["--sim-port", "18231", "--sim-smtp-port", "18231"], "--sim-smtp-port"),
])
def test_one_port_given_to_two_dev_listeners_is_named(argv: list[str], named: str,
                                                      tmp_path: Path) -> None:
    # The second listener failed as "address already in use", once the first had started.
    result = run_cli("dev", "--data-dir", str(tmp_path / "data"), *argv)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"notifkit: invalid configuration: {named}: is ")
    assert "each listener needs its own" in lines[0]
    assert not (tmp_path / "data").exists(), "refused before anything was made"


def test_several_dev_ports_of_0_each_pick_a_free_one() -> None:
    import argparse

    from notifkit.__main__ import load_settings

    args = argparse.Namespace(command="dev", port=0, sim_port=0, sim_smtp_port=0)
    assert load_settings(args).port == 0


@pytest.mark.parametrize("option", ["--sim-port", "--sim-smtp-port"])
def test_a_dev_simulator_port_out_of_range_is_named(option: str) -> None:
    result = run_cli("dev", option, "99999", "--data-dir", "/nonexistent/notifkit-cli-test")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert option in lines[0]


def test_serve_options_work_without_the_serve_command() -> None:
    # CONTRACT §1: `python -m notifkit` runs the services named by --services
    from notifkit.__main__ import build_parser

    bare = run_cli("--services", "api,bogus")
    assert bare.returncode == 2
    assert "--services" in bare.stderr
    assert "bogus" in bare.stderr
    assert "invalid choice" not in bare.stderr
    assert build_parser().parse_args(["serve", "--services", "api"]).services == "api"


def test_a_bare_services_flag_reaches_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from notifkit import __main__ as cli

    seen: list[tuple[str, ...]] = []

    async def fake_serve(settings: notifkit.config.Settings, _port_option: str = "PORT") -> int:
        seen.append(settings.services)
        return 0

    monkeypatch.setattr(cli, "serve", fake_serve)
    monkeypatch.setattr(cli, "setup_logging", lambda *_args, **_options: None)
    monkeypatch.setattr(cli, "_install_event_loop", lambda: None)
    assert cli.main(["--services", "engine,api", "--port", "0"]) == 0
    assert seen == [("api", "engine")]



async def test_a_database_url_that_never_answers_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A port that accepts connections and never speaks (a server of another kind) makes asyncpg
    # time out after 60 s with an exception whose text is empty; the line ended in ": ".

    import asyncpg

    from notifkit.db import pool

    async def silent(*_args: object, **_kwargs: object) -> None:
        raise TimeoutError

    monkeypatch.setattr(asyncpg, "connect", silent)
    with pytest.raises(pool.DatabaseUnavailable) as caught:
        await pool.connect(notifkit.config.Settings())
    assert str(caught.value) == ("DATABASE_URL: cannot connect to PostgreSQL: no answer in time "
                                 "(is a PostgreSQL server listening there?)")


def test_a_dev_data_dir_that_cannot_be_a_folder_is_named(tmp_path: Path) -> None:
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    result = run_cli("dev", "--data-dir", str(not_a_folder), "--port", "0", "--sim-port", "0",
                     "--sim-smtp-port", "0")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "--data-dir" in lines[0]
    assert "Traceback" not in result.stderr


def test_a_dev_data_dir_held_by_another_dev_is_named(tmp_path: Path) -> None:
    # Given a folder another dev process holds (a second dev on it used to start a second
    # embedded Redis on the same files, and its exit left the first one's server orphaned)
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from pathlib import Path; from notifkit.dev import data_dir_lock\n"
         "with data_dir_lock(Path(sys.argv[1])):\n"
         "    print('held', flush=True); sys.stdin.read()", str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"

        # When dev starts on it
        result = run_cli("dev", "--data-dir", str(tmp_path), "--port", "0", "--sim-port", "0",
                         "--sim-smtp-port", "0")
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)

    # Then it stops at once with one line naming the option and the holder
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"notifkit: invalid configuration: --data-dir: {str(tmp_path)!r} is in use by another "
        f"notifkit dev (pid {holder.pid}); stop that one, or give this one another --data-dir"
    ]
    assert "Traceback" not in result.stdout + result.stderr

    # And once the holder is gone the folder is free again
    with data_dir_lock(tmp_path):
        pass


@pytest.mark.parametrize(("argv", "named"), [(["--services", "api", "--port", "5432"], "--port"),
                                             (["--services", "api"], "PORT")])
def test_a_port_that_cannot_be_bound_is_named_as_it_was_given(
    argv: list[str], named: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from notifkit import __main__ as cli
    from notifkit.server import NotifkitServer

    async def port_taken(_self: NotifkitServer) -> None:
        raise notifkit.config.ConfigError(
            "PORT", "cannot listen on 0.0.0.0:5432 (HOST:PORT): address already in use")

    monkeypatch.setattr(NotifkitServer, "start", port_taken)
    monkeypatch.setattr(cli, "_install_event_loop", lambda: None)  # keep the test's loop policy
    monkeypatch.setenv("LOG_FORMAT", "text")
    # Given --port on the command line, the message used to name PORT, which was never set
    status = cli.main(argv)
    err = capsys.readouterr().err
    assert status == 2
    assert f"notifkit could not start: {named}: cannot listen on 0.0.0.0:5432" in err, err
    assert "Traceback" not in err


def test_an_empty_dev_data_dir_is_refused(tmp_path: Path) -> None:
    # An empty --data-dir used to mean the current folder: lock, admin key and demo went there.
    result = run_cli("dev", "--data-dir", "", "--port", "0", "--sim-port", "0",
                     "--sim-smtp-port", "0", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "notifkit: invalid configuration: --data-dir: must name a folder, got ''"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("content", "problem"), [
    ("short\n", "holds a key shorter than 16 characters; delete it to get a new one"),
    ("\n", "holds a key shorter than 16 characters; delete it to get a new one"),
    (None, "cannot be read: Is a directory; delete it to get a new one"),
])
def test_a_dev_admin_key_file_it_cannot_use_is_named(
    content: str | None, problem: str, tmp_path: Path,
) -> None:
    # Given a left-over admin-key it cannot use (the message used to blame NOTIFKIT_ADMIN_KEY,
    # which was never set, or be a bare "[Errno 21] Is a directory")
    key_file = tmp_path / "admin-key"
    if content is None:
        key_file.mkdir()
    else:
        key_file.write_text(content)
    result = run_cli("dev", "--data-dir", str(tmp_path), "--port", "0", "--sim-port", "0",
                     "--sim-smtp-port", "0")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"notifkit: invalid configuration: --data-dir: {key_file} {problem}"]


def test_dev_does_not_read_port_which_does_not_apply_to_it(tmp_path: Path) -> None:
    # dev listens on --port; a PORT in the environment, even one no server could use, is not
    # its setting: the start goes on, here to the unreachable Redis run_cli points it at.
    result = run_cli("dev", "--data-dir", str(tmp_path), "--port", "0", "--sim-port", "0",
                     "--sim-smtp-port", "0", env={"PORT": "not-a-port"})
    assert "PORT" not in result.stderr.replace("--port", ""), result.stderr
    assert result.returncode == 1, result.stderr
    assert "REDIS_URL" in result.stderr


def test_with_json_logs_invalid_configuration_is_one_json_record_naming_the_variable() -> None:
    # A log collector that parses every line of a JSON-logging process must not meet a plain
    # line at the moment the process is misconfigured.
    result = run_cli("serve", env={"WORKER_CONCURRENCY": "abc", "LOG_FORMAT": "json"})
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    record = json.loads(line)
    assert record["level"] == "error"
    assert record["setting"] == "WORKER_CONCURRENCY"
    assert "WORKER_CONCURRENCY: must be a whole number" in record["msg"]
    assert record["service"] == "all"  # what the process was to run
    assert result.stdout == ""
    narrow = run_cli("serve", "--services", "delivery,api",
                     env={"WORKER_CONCURRENCY": "abc", "LOG_FORMAT": "json"})
    assert json.loads(narrow.stderr)["service"] == "api,delivery"


@pytest.mark.parametrize("services", ["api,nope", "api,api", ","])
def test_with_json_logs_a_services_setting_it_cannot_read_still_names_a_service(
    services: str
) -> None:
    # The record about the services it was to run named no service at all: it names the
    # command, as migrate's records do.
    result = run_cli("serve", env={"NOTIFKIT_SERVICES": services, "LOG_FORMAT": "json"})
    assert result.returncode == 2
    record = json.loads(result.stderr)
    assert record["setting"] == "NOTIFKIT_SERVICES"
    assert record["service"] == "serve"


def test_with_json_logs_an_unusable_setting_is_a_record_carrying_it() -> None:
    # run_cli's Redis refuses connections: the setting is well-formed, the server unusable.
    result = run_cli("serve", env={"LOG_FORMAT": "json"})
    assert result.returncode == 1
    record = json.loads(result.stderr)
    assert record["level"] == "error"
    assert record["msg"].startswith("notifkit could not start: REDIS_URL: ")
    assert record["setting"] == "REDIS_URL"
    assert record["service"] == "all"


@pytest.mark.parametrize(("variable", "meant"), [("WORKER_CONCURENCY", "WORKER_CONCURRENCY"),
                                               ("DATABASE_URI", "DATABASE_URL"),
                                               ("NOTIFKIT_ADMIN_TOKEN", None),
                                               # A duration named without its unit, or with
                                               # another, is too unlike it for difflib.
                                               ("PROVIDER_TIMEOUT", "PROVIDER_TIMEOUT_SECONDS"),
                                               ("RECLAIM_INTERVAL", "RECLAIM_INTERVAL_SECONDS"),
                                               ("IDEMPOTENCY_TTL", "IDEMPOTENCY_TTL_SECONDS"),
                                               ("SHUTDOWN_GRACE_MS", "SHUTDOWN_GRACE_SECONDS")])
def test_a_misspelt_setting_is_a_warning_naming_it(variable: str, meant: str | None) -> None:
    # It was ignored without a word, the process running on the default.
    result = run_cli("serve", env={variable: "5", "LOG_FORMAT": "json"})
    records = [json.loads(line) for line in result.stderr.strip().splitlines()]
    [warning] = [record for record in records if record.get("setting") == variable]
    assert warning["level"] == "warning"
    assert f"{variable} is not a notifkit setting" in warning["msg"]
    if meant is not None:
        assert f"did you mean {meant}?" in warning["msg"]


def test_settings_of_other_programs_draw_no_warning() -> None:
    result = run_cli("serve", env={"HOSTNAME": "box", "NOTIFKIT_TEST_REDIS_URL": "redis://x",
                                   "SMTP_HOST": "mail", "LOG_FORMAT": "json"})
    assert "not a notifkit setting" not in result.stderr


def test_with_text_logs_or_an_invalid_log_format_the_line_is_plain_text() -> None:
    text = run_cli("serve", env={"WORKER_CONCURRENCY": "abc", "LOG_FORMAT": "text"})
    assert text.returncode == 2
    assert text.stderr.strip().splitlines() == [
        "notifkit: invalid configuration: WORKER_CONCURRENCY: must be a whole number, "
        "got 'abc'"]
    unknown = run_cli("serve", env={"LOG_FORMAT": "xml"})
    assert unknown.returncode == 2
    assert unknown.stderr.strip().splitlines() == [
        "notifkit: invalid configuration: LOG_FORMAT: must be json or text, got 'xml'"]


def test_an_unknown_redis_url_option_is_named_without_the_clients_internals() -> None:
    result = run_cli("serve", env={"REDIS_URL": "redis://127.0.0.1:6379/0?bogus=1",
                                   "LOG_FORMAT": "text"})
    assert result.returncode == 2
    assert "unknown option 'bogus'" in result.stderr
    assert "__init__" not in result.stderr


@pytest.mark.parametrize(("argv", "setting"), [
    (["serve", "--port", "abc"], "--port"),
    (["serve", "--services", "api", "--services", "api"], "--services"),
    (["migrate", "--services", "api"], "arguments"),
    (["bogus"], "COMMAND"),
    (["dev", "--bogus"], "arguments"),
])
def test_with_json_logs_a_bad_argument_is_one_json_record_naming_it(
    argv: list[str], setting: str
) -> None:
    result = run_cli(*argv, env={"LOG_FORMAT": "json"})
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    record = json.loads(line)
    assert record["level"] == "error"
    assert record["setting"] == setting
    # The command named on the line, though argparse reports an unknown option from the top.
    assert record["service"] == (argv[0] if argv[0] in ("dev", "migrate") else "serve")
    assert "invalid arguments" in record["msg"]
    text = run_cli(*argv, env={"LOG_FORMAT": "text"})
    assert text.returncode == 2
    assert text.stderr.startswith("python -m notifkit")


def test_dev_with_a_bad_argument_and_no_log_format_speaks_plain_text() -> None:
    # dev's logs are text unless LOG_FORMAT says otherwise, its refusals too.
    result = run_cli("dev", "--bogus")
    assert result.returncode == 2
    assert result.stderr.startswith("python -m notifkit: invalid arguments: unrecognized")


@pytest.mark.parametrize(("command", "env", "warned"), [
    ("serve", {"RESEND_API_KEY": "re_x", "SENDGRID_API_KEY": "SG.x"}, "EMAIL_TRANSPORT"),
    ("serve", {"SCHEDULER_POLL_INTERVAL_SECONDS": "60"}, "SCHEDULER_POLL_INTERVAL_SECONDS"),
    ("migrate", {"SCHEDULER_POLL_INTERVAL_SECONDS": "60"}, "SCHEDULER_POLL_INTERVAL_SECONDS"),
    # Taken (tests and one process per service use it), but a fleet would send twice.
    ("serve", {"RECLAIM_MIN_IDLE_SECONDS": "0"}, "RECLAIM_MIN_IDLE_SECONDS is 0"),
])
def test_with_json_logs_a_warning_about_the_settings_is_one_json_record(
    command: str, env: dict[str, str], warned: str
) -> None:
    """Read before logging was set up, the settings' warnings came out as Python's bare
    last-resort lines (and once more as a record when the server checked them again)."""
    result = run_cli(command, env={**env, "LOG_FORMAT": "json"})
    records = [json.loads(line) for line in result.stderr.strip().splitlines()]
    warnings = [r for r in records if r["level"] == "warning" and warned in r["msg"]]
    assert len(warnings) == 1, result.stderr


@pytest.mark.parametrize("idle", ["0.03", "60"])
def test_a_reclaim_idle_time_that_keeps_entries_alive_draws_no_warning(idle: str) -> None:
    result = run_cli("serve", env={"RECLAIM_MIN_IDLE_SECONDS": idle, "LOG_FORMAT": "json"})
    assert "RECLAIM_MIN_IDLE_SECONDS is" not in result.stderr


def test_with_json_logs_migrate_writes_only_json_records() -> None:
    # PostgreSQL unreachable (run_cli's DATABASE_URL): the failure is a record naming it
    result = run_cli("migrate", env={"LOG_FORMAT": "json"})
    assert result.returncode == 1
    assert result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    record = json.loads(line)
    assert record["level"] == "error"
    assert record["msg"].startswith("DATABASE_URL: cannot connect to PostgreSQL")
    assert record["service"] == "migrate"  # every record names one, the command's here


def _signal_while_importing_redis(command: str, signum: signal.Signals) -> tuple[int, str]:
    """``python -m notifkit <command>`` with ``signum`` sent once the Redis client has been
    imported (the settings' Redis URL check), while the command is still loading."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NOTIFKIT_", "REDIS", "DATABASE", "DB_", "PORT", "LOG_"))}
    # Nothing answers there: a start that goes on instead of stopping fails (status 1).
    env.update(REDIS_URL="redis://127.0.0.1:1/0", PORT="0", LOG_FORMAT="text",
               DATABASE_URL="postgresql://postgres@127.0.0.1:1/notifkit_cli_tests")
    return signal_while_importing(["notifkit", command], "redis", signum, env=env)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_stop_signal_while_the_command_is_still_importing_stops_it_cleanly(
    signum: signal.Signals,
) -> None:
    """Given ``serve`` still loading its modules (the Redis client, then the services), when
    SIGTERM or Ctrl-C comes, then the start stops cleanly with status 0 and no traceback: the
    default action killed the process (SIGTERM) or ended it in a KeyboardInterrupt traceback
    from the module being imported (Ctrl-C)."""
    status, stderr = _signal_while_importing_redis("serve", signum)
    assert status == 0, stderr[-2000:]
    assert "Traceback" not in stderr
    assert "Stopping while starting" in stderr


def test_a_ctrl_c_while_migrate_is_still_importing_ends_it_with_130() -> None:
    """migrate handles no signal itself: a Ctrl-C kept while it was still starting ends it as
    one during the migration does (130, no traceback), not with a migration run anyway."""
    status, stderr = _signal_while_importing_redis("migrate", signal.SIGINT)
    assert status == 130, stderr[-2000:]
    assert "Traceback" not in stderr
