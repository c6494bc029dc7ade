"""Requests aiohttp's HTTP parser refuses before any route sees them: a JSON 400 saying what is
wrong (in the addressed provider's format where the request line names a provider's path),
never aiohttp's text/plain page, and at most one warning line in the log, no traceback."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from aiohttp import web

from notifkit.refusals import refusal
from simulators import SimulatorServer
from simulators.app import answer_refusal
from tests.simulators.test_bad_bytes import Collect

BEARER = b"Authorization: Bearer sk-1\r\n"
CHUNKED = b"Transfer-Encoding: chunked\r\n"
BAD_CHUNK = b"zz\r\nabc\r\n0\r\n\r\n"
LONG = b"X-Big: " + b"a" * 9000 + b"\r\n"


def head(request_line: bytes, *headers: bytes) -> bytes:
    return request_line + b"\r\nHost: sim\r\n" + b"".join(headers) + b"\r\n"


def resend(body: dict[str, Any]) -> str:
    assert body["name"] == "validation_error"
    return str(body["message"])


def sendgrid(body: dict[str, Any]) -> str:
    [error] = body["errors"]
    return str(error["message"])


def twilio(body: dict[str, Any]) -> str:
    assert (body["code"], body["status"]) == (400, 400)  # Twilio's generic 400, not 21610
    return str(body["message"])


def fcm(body: dict[str, Any]) -> str:
    assert body["error"]["status"] == "INVALID_ARGUMENT"
    return str(body["error"]["message"])


def openai(body: dict[str, Any]) -> str:
    assert body["error"]["type"] == "invalid_request_error"
    return str(body["error"]["message"])


def own(body: dict[str, Any]) -> str:
    assert set(body) == {"error"}
    return str(body["error"])


# (raw request, how the answer's format is read, what its message must name)
REFUSED = [
    (head(b"G@T /emails HTTP/1.1"), resend, "method"),
    (head(b"GET /emails/\xc3\xa9 HTTP/1.1"), resend, "path"),
    (head(b"POST /emails HTTP/1.1", b"Content-Length: 5\r\n", CHUNKED), resend,
     "Content-Length"),
    (head(b"POST /v3/mail/send HTTP/1.1", b"Bad Header\r\n"), sendgrid, "headers"),
    (head(b"POST /2010-04-01/Accounts/AC1/Messages.json HTTP/1.1", LONG), twilio,
     "8190 bytes"),
    (head(b"POST /v1/projects/p/messages:send HTTP/1.1", b"Content-Length: abc\r\n"), fcm,
     "Content-Length"),
    (head(b"POST /v1/chat/completions HTTP/1.1", BEARER, CHUNKED) + BAD_CHUNK, openai,
     "chunk size"),
    (head(b"GET /_sim/stats HTTP/1.1", b"X-Probe: \x00\r\n"), own, "headers"),
    (head(b"POST /_sim/faults HTTP/1.1", CHUNKED) + BAD_CHUNK, own, "body"),
    (head(b"GET /" + b"a" * 9000 + b" HTTP/1.1"), own, "8190 bytes"),
]
IDS = ["bad-method", "non-ascii-path", "length-and-chunked", "bad-header", "header-too-long",
       "length-not-a-number", "invalid-chunked-body", "nul-in-header", "control-bad-chunk",
       "request-line-too-long"]


async def exchange(sim: SimulatorServer, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection(sim.host, sim.port)
    try:
        writer.write(raw)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
    status_line, _, rest = answer.partition(b"\r\n")
    header_block, _, body = rest.partition(b"\r\n\r\n")
    headers = {}
    for line in header_block.decode("latin-1").split("\r\n"):
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, body


@pytest.mark.parametrize(("raw", "read", "names"), REFUSED, ids=IDS)
async def test_a_request_the_parser_refuses_is_a_json_400_saying_what_is_wrong(
    sim: SimulatorServer, raw: bytes, read: Any, names: str
) -> None:
    collect = Collect()
    simulators_log = logging.getLogger("simulators")
    simulators_log.addHandler(collect)
    try:
        status, headers, body = await exchange(sim, raw)
        if read is not resend or names != "method":  # a bad method is logged at DEBUG only
            await asyncio.wait_for(collect.logged.wait(), 5)  # may follow the answer
    finally:
        simulators_log.removeHandler(collect)
    assert status == 400, body
    assert headers["content-type"].startswith("application/json"), headers
    message = read(json.loads(body))
    assert "malformed" in message, message
    assert names in message, message
    # What is wrong, not the offending bytes back (the parser quotes a long line's start,
    # as b'aaa...' or, for a request line, bytearray(b'/aaa...')).
    assert "aaaa" not in message, message
    assert "b'" not in message, message
    assert len(collect.records) <= 1, [r.getMessage() for r in collect.records]
    for record in collect.records:
        assert (record.levelname, record.exc_info) == ("WARNING", None), record.getMessage()
    assert await sim.messages() == []
    async with asyncio.timeout(5):
        status, _, _ = await exchange(sim, head(b"GET /_sim/stats HTTP/1.1",
                                                b"Connection: close\r\n"))
    assert status == 200


async def test_a_chunked_body_that_breaks_off_later_is_the_providers_400_and_one_warning(
    sim: SimulatorServer,
) -> None:
    """The request line and headers parse and the route starts reading; the broken chunk
    arrives afterwards. The provider answers its own unreadable-body 400."""
    collect = Collect()
    server_log = logging.getLogger("simulators")
    server_log.addHandler(collect)
    try:
        reader, writer = await asyncio.open_connection(sim.host, sim.port)
        writer.write(head(b"POST /v1/chat/completions HTTP/1.1", BEARER, CHUNKED))
        await writer.drain()
        writer.write(b"5\r\nabcde\r\n")
        await writer.drain()
        writer.write(b"zz\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        await asyncio.wait_for(collect.logged.wait(), 5)
    finally:
        server_log.removeHandler(collect)
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.split()[1] == b"400", answer
    body = json.loads(rest.partition(b"\r\n\r\n")[2])
    assert body["error"]["type"] == "invalid_request_error"
    assert all(r.exc_info is None and r.levelno <= logging.WARNING for r in collect.records), [
        (r.levelname, r.getMessage()) for r in collect.records]
    assert await sim.messages() == []


@pytest.mark.parametrize("target", ["/emails", "/_sim/stats", None])
def test_a_server_error_through_the_same_seam_does_not_blame_the_request(
    target: str | None,
) -> None:
    answer = answer_refusal(refusal(500, None, target))
    assert answer.status == 500
    assert isinstance(answer, web.Response)
    assert answer.text is not None
    assert "malformed" not in answer.text
