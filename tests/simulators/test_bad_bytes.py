"""Text that is not valid Unicode and bodies that do not decompress: a clear 4xx, and nothing
stored that could break a later listing."""

from __future__ import annotations

import asyncio
import logging
import smtplib
from typing import Any

import aiohttp
import pytest

from simulators import SimulatorServer

RESEND = {"Authorization": "Bearer re_1", "Content-Type": "application/json"}


async def call(sim: SimulatorServer, method: str, path: str, **options: Any) -> tuple[int, str]:
    # A fresh connection each time: the server closes one whose body it could not read.
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as http, \
            http.request(method, sim.base_url + path, **options) as response:
        return response.status, await response.text()


async def listings_still_work(sim: SimulatorServer) -> None:
    for path in ("/_sim/messages", "/_sim/faults", "/_sim/receipts", "/_sim/stats", "/_sim/"):
        status, _ = await call(sim, "GET", path)
        assert status == 200, path


@pytest.mark.parametrize(("path", "body", "headers"), [
    ("/emails", b'{"from": "a@example.com", "to": "b@example.com", "subject": "s", '
                b'"text": "\\ud800"}', RESEND),
    ("/emails", b'{"from": "a@example.com", "to": "b@example.com", "subject": "\\udfff", '
                b'"text": "t"}', {**RESEND, "Idempotency-Key": "sur1"}),
    ("/v1/chat/completions", b'{"model": "gpt-4o-mini", "messages": '
                             b'[{"role": "user", "content": "\\ud800"}]}',
     {"Authorization": "Bearer sk-1", "Content-Type": "application/json"}),
])
async def test_a_lone_surrogate_in_a_provider_body_is_the_providers_bad_request(
    sim: SimulatorServer, path: str, body: bytes, headers: dict[str, str]
) -> None:
    status, _ = await call(sim, "POST", path, data=body, headers=headers)
    assert status == 400
    assert await sim.messages() == []
    await listings_still_work(sim)


@pytest.mark.parametrize(("path", "body"), [
    ("/_sim/faults", b'{"kind": "error", "provider": "twilio", "to": "\\ud800*"}'),
    ("/_sim/receipts", b'{"url": "http://127.0.0.1:9/\\ud800", "secret": "s"}'),
])
async def test_a_lone_surrogate_in_a_control_body_is_refused_and_nothing_stored(
    sim: SimulatorServer, path: str, body: bytes
) -> None:
    status, text = await call(sim, "POST", path, data=body)
    assert status == 400
    assert "Unicode" in text
    await listings_still_work(sim)


async def test_bytes_that_are_not_utf8_in_headers_and_smtp_are_stored_readably(
    sim: SimulatorServer,
) -> None:
    # A header byte that is not UTF-8 reaches the handler as a lone surrogate.
    raw_task_id = b"task-\xff".decode("latin-1")
    body = {"from": "a@example.com", "to": "b@example.com", "subject": "s", "text": "t"}
    status, _ = await call(sim, "POST", "/emails", json=body,
                           headers={"Authorization": "Bearer re_1",
                                    "X-Notifkit-Task-Id": raw_task_id})
    assert status == 200

    def send_raw_envelope() -> None:
        with smtplib.SMTP(sim.smtp_host, sim.smtp_port, timeout=5) as client:
            client.ehlo()
            # Declared SMTPUTF8: without it a non-ASCII sender is refused outright.
            client.send(b"MAIL FROM:<a\xff@example.com> SMTPUTF8\r\n")
            assert client.getreply()[0] == 250
            client.putcmd("RCPT", "TO:<b@example.com>")
            client.getreply()
            client.data(b"Subject: hi\r\n\r\nbody\r\n")

    await asyncio.to_thread(send_raw_envelope)
    assert len(await sim.messages()) == 2
    await listings_still_work(sim)


class Collect(logging.Handler):
    """Keeps the records of a logger, and says when one has arrived (it may follow the
    answer: aiohttp reads the rest of a request body after the handler answered)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []
        self.logged = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.logged.set()


TWILIO = {"Authorization": "Basic QUMxOnRvaw==",
          "Content-Type": "application/x-www-form-urlencoded"}
NOT_GZIP = [
    # (path, headers, what the provider's own 400 says)
    ("/emails", RESEND, '"name": "validation_error"'),
    ("/emails/batch", RESEND, '"name": "validation_error"'),
    ("/v3/mail/send", RESEND, '"errors"'),
    ("/2010-04-01/Accounts/AC1/Messages.json", TWILIO, '"code": 400'),
    ("/v1/projects/p/messages:send", RESEND, '"INVALID_ARGUMENT"'),
    ("/v1/chat/completions", RESEND, '"invalid_request_error"'),
    ("/_sim/faults", {}, '"error"'),
]


@pytest.mark.parametrize(("path", "headers", "says"), NOT_GZIP)
async def test_a_body_that_does_not_decompress_is_a_400_and_one_warning(
    sim: SimulatorServer, path: str, headers: dict[str, str], says: str
) -> None:
    """Bad client input: the provider's own 400 for an unreadable body (never a recipient
    error such as Twilio's 21610), and one warning line in the log, no traceback."""
    collect = Collect()
    simulators_log = logging.getLogger("simulators")
    simulators_log.addHandler(collect)
    try:
        status, text = await call(sim, "POST", path, data=b"not gzip at all",
                                  headers={**headers, "Content-Encoding": "gzip"})
        await asyncio.wait_for(collect.logged.wait(), 5)
        await asyncio.sleep(0.05)  # nothing more follows
    finally:
        simulators_log.removeHandler(collect)
    assert status == 400, text
    assert says in text
    [warning] = collect.records
    assert (warning.levelname, warning.exc_info) == ("WARNING", None)
    assert "content-encoding" in warning.getMessage().lower()
    await listings_still_work(sim)


async def test_a_receipt_secret_that_is_not_base64_is_refused(sim: SimulatorServer) -> None:
    status, text = await call(sim, "POST", "/_sim/receipts",
                              json={"url": "http://127.0.0.1:9/hook",
                                    "secret": "whsec_!!!notbase64"})
    assert status == 400
    assert "secret" in text


@pytest.mark.parametrize("request_head", [
    b"GET /_sim/stats HTTP/1.1\r\nHost: sim\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
    b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: sim\r\n\r\n",
])
async def test_a_request_too_big_to_parse_is_a_400_and_one_log_line(
    sim: SimulatorServer, request_head: bytes,
) -> None:
    records: list[logging.LogRecord] = []
    logged = asyncio.Event()

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)
            logged.set()

    server_log = logging.getLogger("simulators.http")
    handler = Collect()
    server_log.addHandler(handler)
    try:
        reader, writer = await asyncio.open_connection(sim.host, sim.port)
        writer.write(request_head)
        await writer.drain()
        status_line = await reader.readline()
        writer.close()
        assert status_line.split()[1] == b"400"
        await asyncio.wait_for(logged.wait(), 5)  # the record may follow the answer
    finally:
        server_log.removeHandler(handler)
    assert all(r.exc_info is None and r.levelname == "WARNING" for r in records)
    assert "8190 bytes" in records[0].getMessage()
    await listings_still_work(sim)
