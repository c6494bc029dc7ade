"""`python -m simulators`: bad arguments get one clear line and exit 2; a running simulator
serves HTTP and SMTP and stops cleanly on SIGTERM and SIGINT."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
import socket
import sys
from pathlib import Path

import aiohttp
import aiosmtplib
import pytest

from tests.support.signals import signal_while_importing, start_then_stop_insistently

ROOT = Path(__file__).resolve().parents[2]
LISTENING = re.compile(r"listening on (http://[\d.]+:\d+) \(SMTP ([\d.]+):(\d+)\)")


async def run_cli(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "simulators",
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--port", "http"], "port must be an integer"),
        # int() reads any script's digits: a full-width 80 listened on port 80.
        (["--port", "\uff18\uff10"], "port must be an integer"),
        (["--max-messages", "\uff15"], "expected a positive integer"),
        (["--smtp-port", "70000"], "port must be 0-65535"),
        (["--seed", "-3"], "non-negative"),
        # A seed POST /_sim/reset could not take back would make a run impossible to replay.
        (["--seed", str(2**63 + 1)], "argument --seed: at most 9223372036854775808"),
        (["--max-messages", "0"], "positive"),
        (["--max-messages", "-5"], "expected a positive integer, got -5"),
        (["--max-messages", "many"], "expected a positive integer, got 'many'"),
        # Past what a ring buffer can be sized to: refused, not an OverflowError traceback.
        (["--max-messages", "9223372036854775808"], "argument --max-messages: at most"),
        (["--host", "", "--port", "0", "--smtp-port", "0"], "argument --host: must not be empty"),
        (["--colour"], "unrecognized arguments"),
        # Found only at the bind: "address already in use" for the second listener, as if
        # another program held the port, and a host's line break broke the message in two.
        (["--port", "18240", "--smtp-port", "18240"],
         "argument --smtp-port: is 18240, the port given to --port"),
        (["--host", "127.0.0.1\n::1", "--port", "0", "--smtp-port", "0"],
         "argument --host: must be a host name or address, without white space"),
    ],
)
async def test_bad_arguments_exit_2_with_one_line(args: list[str], complaint: str) -> None:
    process = await run_cli(*args)
    stdout, stderr = await asyncio.wait_for(process.communicate(), 20)
    assert process.returncode == 2
    lines = stderr.decode().strip().splitlines()
    assert len(lines) == 1
    assert complaint in lines[0]
    assert stdout == b""


@pytest.mark.slow
@pytest.mark.parametrize("stop_with", [signal.SIGTERM, signal.SIGINT])
async def test_serves_and_stops_cleanly(stop_with: signal.Signals) -> None:
    process = await run_cli("--port", "0", "--smtp-port", "0", "--seed", "4")
    assert process.stderr is not None
    try:
        line = (await asyncio.wait_for(process.stderr.readline(), 20)).decode()
        match = LISTENING.search(line)
        assert match, line
        base_url, smtp_host, smtp_port = match.group(1), match.group(2), int(match.group(3))
        assert "seed 4" in line

        async with aiohttp.ClientSession() as http:
            async with http.get(base_url + "/_sim/health") as response:
                assert (await response.json())["seed"] == 4
            body = {"from": "a@example.com", "to": "b@example.com", "subject": "s", "text": "t"}
            async with http.post(
                base_url + "/emails", json=body, headers={"Authorization": "Bearer re_1"}
            ) as response:
                assert response.status == 200
        await aiosmtplib.send(
            "Subject: hi\r\n\r\nbody\r\n",
            sender="a@example.com",
            recipients=["c@example.com"],
            hostname=smtp_host,
            port=smtp_port,
            timeout=5,
        )
        received = (await asyncio.wait_for(process.stderr.readline(), 10)).decode()
        assert "resend accepted message" in received
    finally:
        process.send_signal(stop_with)
        _, rest = await asyncio.wait_for(process.communicate(), 20)
    assert process.returncode == 0
    assert "Traceback" not in rest.decode()
    assert "smtp accepted message" in rest.decode()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_stop_signal_while_the_server_modules_load_stops_cleanly(
    signum: signal.Signals,
) -> None:
    """Given the command still importing aiohttp (each import is a line on stderr with
    ``-X importtime``), when SIGTERM or Ctrl-C comes, then it stops with status 0 and no
    traceback: the package imported the whole server before the command could handle either,
    so SIGTERM killed it and a Ctrl-C ended in a KeyboardInterrupt traceback."""
    status, stderr = signal_while_importing(
        ["simulators", "--port", "0", "--smtp-port", "0"], "aiohttp", signum, timeout_s=30,
        cwd=ROOT)
    assert status == 0, stderr[-2000:]
    assert "Traceback" not in stderr


@pytest.mark.parametrize("again", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_signal_repeated_while_stopping_still_ends_cleanly(again: signal.Signals) -> None:
    # Given running simulators, when Ctrl-C is pressed, and pressed again (or a supervisor
    # insists) while they stop
    status, stderr = start_then_stop_insistently(
        [sys.executable, "-m", "simulators", "--port", "0", "--smtp-port", "0"],
        "Simulators listening on", again, cwd=ROOT)
    # Then the stop under way ends as a stop: status 0, not killed by the repeated signal
    assert status == 0, stderr
    assert "Traceback" not in stderr, stderr


@pytest.mark.parametrize("option", ["--port", "--smtp-port"])
async def test_a_port_in_use_is_named_by_its_option(option: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        other = "--smtp-port" if option == "--port" else "--port"
        proc = await run_cli(option, port, other, "0")
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert f"error: {option}: cannot listen on 127.0.0.1:{port}" in lines[0]


@pytest.mark.parametrize("host", ["nosuchhost.invalid", "192.0.2.1", "::ffff:127.0.0.1"])
async def test_an_address_that_cannot_be_bound_is_named_as_the_host(host: str) -> None:
    """A name that does not resolve, an address of another machine, or one no socket can
    bind (an IPv4-mapped IPv6 address) is the host's fault."""
    proc = await run_cli("--host", host, "--port", "0", "--smtp-port", "0")
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert f"error: --host: cannot listen on {host}:0" in lines[0]


@pytest.mark.slow
async def test_json_log_format_writes_one_object_a_line() -> None:
    # Given simulators started with JSON logs, as compose.yaml runs them
    process = await run_cli("--port", "0", "--smtp-port", "0", "--log-format", "json")
    assert process.stderr is not None
    try:
        # Then every line, the start-up line and a received message's included, is one JSON
        # object with the time, level, logger and message
        started = json.loads(await asyncio.wait_for(process.stderr.readline(), 20))
        assert {"ts", "level", "logger", "msg"} <= started.keys()
        base_url = LISTENING.search(started["msg"])
        assert base_url, started
        async with aiohttp.ClientSession() as http, http.post(
            base_url.group(1) + "/emails", headers={"Authorization": "Bearer re_1"},
            json={"from": "a@example.com", "to": "b@example.com", "subject": "s",
                  "text": "t"},
        ) as response:
            assert response.status == 200
        received = json.loads(await asyncio.wait_for(process.stderr.readline(), 10))
        assert "resend accepted message" in received["msg"]
    finally:
        process.send_signal(signal.SIGTERM)
        _, rest = await asyncio.wait_for(process.communicate(), 20)
    assert process.returncode == 0
    assert all(json.loads(line)["msg"] for line in rest.decode().splitlines())


@pytest.mark.parametrize(("given", "level"), [("warning", "WARNING"), ("Debug", "DEBUG")])
def test_a_log_level_is_taken_in_either_case_as_notifkit_takes_it(given: str,
                                                                   level: str) -> None:
    from simulators.__main__ import parse_args

    assert parse_args(["--log-level", given]).log_level == level


def test_a_json_record_stays_one_line_whatever_its_message_holds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # U+2028 and U+2029 are line ends to splitlines and JavaScript: escaped, as notifkit's
    # records escape them, one collector reads both.
    from simulators.logs import setup_logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        setup_logging("json", "INFO")
        logging.getLogger("simulators.test").info("a\u2028b\u2029c\nd", extra={"to": "x"})
        lines = capsys.readouterr().err.splitlines()
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    assert len(lines) == 1, lines
    record = json.loads(lines[0])
    assert (record["msg"], record["to"], record["logger"]) == (
        "a\u2028b\u2029c\nd", "x", "simulators.test")
