"""Start-up failures that only show against real servers: one line naming the setting, a
non-zero exit, no traceback, and a SIGTERM during a slow start is obeyed."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
import redis

from notifkit.keys import Keys
from tests.support.signals import start_then_stop_insistently

# Every run gets names of its own, so runs sharing one Redis and PostgreSQL (several
# checkouts, say) never meet; the fixture below removes whatever a start left behind.
_made: list[tuple[str, str]] = []


@pytest.fixture(autouse=True)
def _clean_up(redis_url: str, database_url: str) -> Iterator[None]:
    yield
    client = redis.Redis.from_url(redis_url)
    try:
        for namespace, _schema in _made:
            for key in client.scan_iter(f"{namespace}:*"):
                client.delete(key)
    finally:
        client.close()
    schemas = [schema for _namespace, schema in _made]
    _made.clear()
    asyncio.run(_drop_schemas(database_url, schemas))


async def _drop_schemas(database_url: str, schemas: list[str]) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        for schema in schemas:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


def _env(redis_url: str, database_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NOTIFKIT_", "REDIS", "DATABASE", "DB_", "FCM_", "PORT"))}
    suffix = uuid.uuid4().hex[:8]
    env.update(REDIS_URL=redis_url, DATABASE_URL=database_url, LOG_FORMAT="text",
               NOTIFKIT_NAMESPACE=f"cli-start-failures-{suffix}",
               DB_SCHEMA=f"cli_start_failures_{suffix}", AUTO_MIGRATE="false", PORT="0")
    env.update(extra)
    _made.append((env["NOTIFKIT_NAMESPACE"], env["DB_SCHEMA"]))
    return env


def run_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "notifkit", *args], capture_output=True,
                          text=True, env=env, timeout=60, check=False)


def _with_database(database_url: str, name: str) -> str:
    parts = urlsplit(database_url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def _one_line_naming(result: subprocess.CompletedProcess[str], variable: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines()
              if "ERROR" in line or line.startswith("notifkit:")]
    assert len(errors) == 1, result.stderr
    assert variable in errors[0], result.stderr


@pytest.mark.parametrize("command", ["migrate", "serve"])
def test_an_unknown_database_is_named(command: str, redis_url: str, database_url: str) -> None:
    url = _with_database(database_url, "notifkit_no_such_database")
    result = run_cli(_env(redis_url, url, AUTO_MIGRATE="true",
                          NOTIFKIT_SERVICES="engine"), command)
    _one_line_naming(result, "DATABASE_URL")


def test_bad_connection_options_are_named(redis_url: str, database_url: str) -> None:
    result = run_cli(_env(redis_url, database_url + "?sslmode=bogus"), "migrate")
    _one_line_naming(result, "DATABASE_URL")


# Each an FCM_CREDENTIALS_FILE that cannot serve: (what is at the path, or None for nothing).
_BAD_FCM_FILES: dict[str, str | None] = {
    "missing": None,
    "not JSON": "client_email = a@b",
    "not a service-account file": json.dumps(["client_email", "private_key"]),
    "no private key": json.dumps({"client_email": "a@b", "token_uri": "https://t.example"}),
    # Well-formed JSON whose key cannot sign: every push would have been retried, then
    # dead-lettered.
    "a key that cannot sign": json.dumps({"client_email": "a@b", "private_key": "not a pem"}),
}


@pytest.mark.parametrize("case", [*_BAD_FCM_FILES, "a directory"])
def test_an_unusable_fcm_credentials_file_is_refused_before_anything_starts(
    case: str, redis_url: str, database_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "fcm.json"
    if case == "a directory":  # exists, cannot be read as a file
        path.mkdir()
    elif _BAD_FCM_FILES[case] is not None:
        path.write_text(str(_BAD_FCM_FILES[case]))
    env = _env(redis_url, database_url, NOTIFKIT_SERVICES="api,delivery", HOST="127.0.0.1",
               FCM_PROJECT_ID="p", FCM_CREDENTIALS_FILE=str(path), AUTO_MIGRATE="true")
    result = run_cli(env, "serve")
    # Refused as an invalid setting, like any other: it used to be found only when delivery
    # built its transports, after the migrations had run and the api was listening.
    _one_line_naming(result, "FCM_CREDENTIALS_FILE")
    assert result.returncode == 2
    assert "invalid configuration: FCM_CREDENTIALS_FILE: " in result.stderr, result.stderr
    assert "listening" not in result.stderr, result.stderr
    assert not asyncio.run(_schema_exists(database_url, env["DB_SCHEMA"]))


def _the_reason_once(result: subprocess.CompletedProcess[str], port: int) -> None:
    """The line gives the system's reason once, not asyncio's wording of the bind around it
    ("error while attempting to bind on address ('127.0.0.1', 8080): address already in use")."""
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr, result.stderr
    assert "error while attempting to bind" not in result.stderr, result.stderr
    assert os.strerror(errno.EADDRINUSE) in result.stderr, result.stderr


def test_a_port_in_use_is_named(redis_url: str, database_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = _env(redis_url, database_url, NOTIFKIT_SERVICES="api", HOST="127.0.0.1",
                   PORT=str(port), AUTO_MIGRATE="true")
        result = run_cli(env, "serve")
    _one_line_naming(result, "PORT")
    _the_reason_once(result, port)


def test_a_port_option_in_use_is_named_without_port(redis_url: str, database_url: str) -> None:
    # Given --port, the line said "--port: cannot listen on ... (HOST:PORT)": the PORT the
    # user never set, beside the option they typed.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = _env(redis_url, database_url, NOTIFKIT_SERVICES="api", HOST="127.0.0.1",
                   AUTO_MIGRATE="true")
        result = run_cli(env, "serve", "--port", str(port))
    _one_line_naming(result, "--port: cannot listen on")
    assert "PORT" not in result.stderr, result.stderr
    _the_reason_once(result, port)


@pytest.mark.parametrize("host", ["192.0.2.1", "no-such-host.invalid"])
def test_a_host_this_machine_cannot_listen_on_is_named(
    host: str, redis_url: str, database_url: str
) -> None:
    # An address of the documentation range is no local interface, and .invalid never
    # resolves: either was blamed on PORT.
    env = _env(redis_url, database_url, NOTIFKIT_SERVICES="api", HOST=host, AUTO_MIGRATE="true")
    result = run_cli(env, "serve")
    _one_line_naming(result, "HOST")
    assert "could not start: HOST: " in result.stderr, result.stderr


def test_a_redis_refusing_the_database_index_is_named(
    redis_url: str, database_url: str
) -> None:
    parts = urlsplit(redis_url)
    env = _env(urlunsplit(parts._replace(path="/99999")), database_url,
               NOTIFKIT_SERVICES="engine")
    _one_line_naming(run_cli(env, "serve"), "REDIS_URL")


@pytest.mark.parametrize("services", ["api", "engine"])
def test_an_unreachable_redis_is_named_by_every_service(
    services: str, redis_url: str, database_url: str
) -> None:
    # The api used to start without Redis and fail request by request.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, never listening: connections are refused
        env = _env(f"redis://127.0.0.1:{port}/0", database_url, NOTIFKIT_SERVICES=services,
                   AUTO_MIGRATE="true")
        result = run_cli(env, "serve")
    _one_line_naming(result, "REDIS_URL")
    assert result.returncode == 1
    # Refused before migrating: no schema was created for a process that never ran.
    assert not asyncio.run(_schema_exists(database_url, env["DB_SCHEMA"]))


async def _schema_exists(database_url: str, schema: str) -> bool:
    conn = await asyncpg.connect(database_url)
    try:
        return bool(await conn.fetchval(
            "SELECT 1 FROM pg_namespace WHERE nspname = $1", schema))
    finally:
        await conn.close()


@contextlib.contextmanager
def _silent_postgres() -> Iterator[int]:
    """The port of a 'PostgreSQL' that accepts connections and then never answers."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        yield silent.getsockname()[1]


def test_sigterm_during_a_hanging_start_stops_the_process(
    redis_url: str, database_url: str
) -> None:
    # Given a PostgreSQL that accepts the connection and then never answers
    with _silent_postgres() as port:
        url = f"postgresql://postgres@127.0.0.1:{port}/test"
        process = subprocess.Popen(
            [sys.executable, "-m", "notifkit", "serve"],
            env=_env(redis_url, url, AUTO_MIGRATE="true", NOTIFKIT_SERVICES="engine"),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        try:
            time.sleep(3)  # the process is now waiting on PostgreSQL
            assert process.poll() is None
            # When it is told to stop
            process.send_signal(signal.SIGTERM)
            # Then it stops promptly, without a traceback
            _, stderr = process.communicate(timeout=15)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert "Traceback" not in stderr, stderr


@pytest.mark.parametrize("option", ["--port", "--sim-port", "--sim-smtp-port"])
def test_a_dev_port_in_use_is_named_by_its_option(
    option: str, redis_url: str, database_url: str, tmp_path: Path
) -> None:
    # dev takes its ports from options, not from PORT: the message names the option typed.
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        ports = {"--port": "0", "--sim-port": "0", "--sim-smtp-port": "0"}
        ports[option] = str(taken.getsockname()[1])
        args = [word for pair in ports.items() for word in pair]
        result = run_cli(_env(redis_url, database_url, AUTO_MIGRATE="true"), "dev",
                         "--data-dir", str(tmp_path), *args)
    assert result.returncode == 2, result.stderr
    _one_line_naming(result, f"{option}: cannot listen on")
    # Before anything started: no migration ran (about 35 lines of them came first, with the
    # embedded servers' start, and then all of it was stopped again).
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    # dev takes no PORT at all: the line used to say the address came from HOST:PORT.
    assert "PORT" not in result.stderr, result.stderr
    assert "error while attempting to bind" not in result.stderr, result.stderr


def test_an_unmigrated_schema_without_auto_migrate_is_named(
    redis_url: str, database_url: str
) -> None:
    # AUTO_MIGRATE=false on a schema nobody migrated: the first query failed and the line
    # blamed DATABASE_URL with a bare 'relation ... does not exist'. In a namespace of its own
    # the workflow worker had started before the failing query, was never stopped, and the
    # process never exited.
    env = _env(redis_url, database_url, NOTIFKIT_SERVICES="workflow")
    result = run_cli(env, "serve")
    _one_line_naming(result, "DB_SCHEMA")
    assert "python -m notifkit migrate" in result.stderr


# Other tools' tables of that name: dbmate and Rails (version text), golang-migrate
# (version bigint, dirty boolean).
_FOREIGN_LEDGERS = {
    "rails": "version varchar PRIMARY KEY",
    "golang-migrate": "version bigint PRIMARY KEY, dirty boolean NOT NULL DEFAULT false",
}


@pytest.mark.parametrize("auto_migrate", ["true", "false"])
@pytest.mark.parametrize("tool", sorted(_FOREIGN_LEDGERS))
def test_a_schema_holding_another_tools_schema_migrations_is_named(
    tool: str, auto_migrate: str, redis_url: str, database_url: str
) -> None:
    # A shared database's schema (public, the default) often holds another tool's
    # schema_migrations: every command stopped with 'DATABASE_URL: column "checksum" does not
    # exist', blaming the URL for what DB_SCHEMA chose.
    env = _env(redis_url, database_url, AUTO_MIGRATE=auto_migrate, NOTIFKIT_SERVICES="api")
    asyncio.run(_make_foreign_ledger(database_url, env["DB_SCHEMA"], _FOREIGN_LEDGERS[tool]))
    for command in ("migrate", "serve"):
        result = run_cli(env, command)
        _one_line_naming(result, "DB_SCHEMA")
        assert "schema_migrations" in result.stderr, result.stderr
        assert "checksum" not in result.stderr, result.stderr
    # And the other tool's table is left as it was
    assert asyncio.run(_tables_in(database_url, env["DB_SCHEMA"])) == {"schema_migrations"}


async def _make_foreign_ledger(database_url: str, schema: str, columns: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        await conn.execute(f'CREATE TABLE "{schema}".schema_migrations ({columns})')
        await conn.execute(f"INSERT INTO \"{schema}\".schema_migrations (version) VALUES ('1')")
    finally:
        await conn.close()


async def _tables_in(database_url: str, schema: str) -> set[str]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = $1", schema)
        return {row["table_name"] for row in rows}
    finally:
        await conn.close()


def test_an_api_alone_refuses_an_unmigrated_schema_at_start(
    redis_url: str, database_url: str
) -> None:
    # The api queries nothing while it starts: it used to answer /health with "ok" and every
    # other request with a 500.
    env = _env(redis_url, database_url, NOTIFKIT_SERVICES="api", PORT="0")
    result = run_cli(env, "serve")
    _one_line_naming(result, "DB_SCHEMA")
    assert "python -m notifkit migrate" in result.stderr


@pytest.mark.parametrize("services", ["engine", "api,engine"])
def test_an_unmigrated_schema_is_refused_before_any_stream_is_read(
    services: str, redis_url: str, database_url: str
) -> None:
    # Given an entry waiting on a stream the engine reads, and a schema nobody migrated
    env = _env(redis_url, database_url, NOTIFKIT_SERVICES=services, HOST="127.0.0.1")
    stream = Keys(env["NOTIFKIT_NAMESPACE"]).enriched("normal")
    client = redis.Redis.from_url(redis_url)
    try:
        client.xadd(stream, {"payload": "{}"})
        # When the process starts with AUTO_MIGRATE=false
        result = run_cli(env, "serve")
        # Then it refuses before any service starts: the check ran only after every service
        # had started, by which time the engine had created its consumer group (and could have
        # read the entry into its pending list) and the api was listening.
        _one_line_naming(result, "DB_SCHEMA")
        assert "python -m notifkit migrate" in result.stderr
        assert "listening" not in result.stderr, result.stderr
        assert client.xinfo_groups(stream) == []
        assert set(client.scan_iter(f"{env['NOTIFKIT_NAMESPACE']}:*")) == {stream.encode()}
    finally:
        client.close()


def _with_query(database_url: str, query: str) -> str:
    return urlunsplit(urlsplit(database_url)._replace(query=query))


# libpq parameters that asyncpg sent to the server as settings, which the server refused
# ("unrecognized configuration parameter"), though asyncpg does what each asks.
@pytest.mark.parametrize("query", [
    "connect_timeout=5",
    "sslmode=disable&connect_timeout=10",
    "fallback_application_name=psql",
    "gssencmode=disable",
    "channel_binding=prefer",
])
def test_a_database_url_with_libpq_parameters_asyncpg_can_honour_is_used(
    query: str, redis_url: str, database_url: str
) -> None:
    env = _env(redis_url, _with_query(database_url, query))
    migrated = run_cli(env, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert asyncio.run(_schema_exists(database_url, env["DB_SCHEMA"]))
    # The services' pools connect with the same URL.
    env.update(NOTIFKIT_SERVICES="engine,api", HOST="127.0.0.1")
    process = subprocess.Popen([sys.executable, "-m", "notifkit", "serve"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        lines = []
        for line in process.stderr:
            lines.append(line)
            if "notifkit is running" in line or "could not start" in line:
                break
        assert "notifkit is running: api, engine." in lines[-1], "".join(lines)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_connect_timeout_in_the_database_url_bounds_the_wait_for_postgresql(
    redis_url: str, database_url: str
) -> None:
    # Given a PostgreSQL that accepts the connection and then never answers
    with _silent_postgres() as port:
        env = _env(redis_url, f"postgresql://postgres@127.0.0.1:{port}/test?connect_timeout=1")
        # Then the process gives up by itself, naming the setting, long before asyncpg's own
        # 60 s (connect_timeout was sent to the server as a setting, so it never applied).
        result = subprocess.run([sys.executable, "-m", "notifkit", "migrate"],
                                capture_output=True, text=True, env=env, timeout=40,
                                check=False)
    _one_line_naming(result, "DATABASE_URL")
    assert result.returncode == 1
    assert "no answer in time" in result.stderr, result.stderr


@pytest.mark.parametrize(("query", "parameter"), [
    ("keepalives=1", "keepalives"),
    ("sslmode=require&keepalives_idle=30", "keepalives_idle"),
    ("hostaddr=127.0.0.1", "hostaddr"),
    ("channel_binding=require", "channel_binding"),
    ("connect_timeout=soon", "connect_timeout"),
])
def test_a_libpq_parameter_asyncpg_cannot_honour_is_an_invalid_setting(
    query: str, parameter: str, redis_url: str, database_url: str
) -> None:
    env = _env(redis_url, _with_query(database_url, query), AUTO_MIGRATE="true",
               NOTIFKIT_SERVICES="engine")
    result = run_cli(env, "serve")
    _one_line_naming(result, "DATABASE_URL")
    assert result.returncode == 2
    assert f"invalid configuration: DATABASE_URL: {parameter}" in result.stderr, result.stderr


@pytest.mark.parametrize("again", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_signal_repeated_while_stopping_still_ends_cleanly(
    again: signal.Signals, redis_url: str, database_url: str
) -> None:
    # Given a running process, when Ctrl-C is pressed, and pressed again (or a supervisor
    # insists) while it stops
    env = _env(redis_url, database_url, NOTIFKIT_SERVICES="api", AUTO_MIGRATE="true",
               HOST="127.0.0.1")
    status, stderr = start_then_stop_insistently(
        [sys.executable, "-m", "notifkit", "serve"], "notifkit is running", again, env=env)
    # Then the stop under way ends as a stop: status 0, not killed by the signal once the event
    # loop had closed and put back the default handlers
    assert status == 0, stderr
    assert "Traceback" not in stderr, stderr


@pytest.mark.parametrize(("command", "auto_migrate"), [("migrate", "true"), ("serve", "true"),
                                                        ("serve", "false")])
def test_a_schema_migrated_by_a_newer_release_is_named(
    command: str, auto_migrate: str, redis_url: str, database_url: str
) -> None:
    # Given a schema that a newer notifkit migrated further than this one knows
    env = _env(redis_url, database_url, NOTIFKIT_SERVICES="api", HOST="127.0.0.1")
    assert run_cli(env, "migrate").returncode == 0
    asyncio.run(_record_migration(database_url, env["DB_SCHEMA"], 9999, "9999_from_the_future"))
    # When this release starts on it (or migrates it)
    result = run_cli({**env, "AUTO_MIGRATE": auto_migrate}, command)
    # Then it refuses in one line naming the setting and the migration it does not know: it
    # said the schema was up to date and served on tables whose meaning it did not know.
    _one_line_naming(result, "DB_SCHEMA")
    assert "9999_from_the_future" in result.stderr
    assert "newer" in result.stderr
    assert "listening" not in result.stderr, result.stderr


async def _record_migration(database_url: str, schema: str, version: int, name: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(f'INSERT INTO "{schema}".schema_migrations (version, name, checksum) '
                           "VALUES ($1, $2, 'unknown')", version, name)
    finally:
        await conn.close()
