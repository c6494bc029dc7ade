"""Request bodies in a Content-Encoding: gzip and deflate are read on every route; any other
coding is the provider's own 415 naming Content-Encoding, never a plain-text 400 from the
HTTP server before the provider could answer."""

from __future__ import annotations

import gzip
import json
import zlib
from typing import Any
from urllib.parse import urlencode

import aiohttp
import pytest

from simulators import SimulatorServer
from tests.support.service_account import jwt_grant

RESEND = {"Authorization": "Bearer re_1", "Content-Type": "application/json"}
TWILIO = {"Authorization": "Basic QUMxOnRvaw==",
          "Content-Type": "application/x-www-form-urlencoded"}
BEARER = {"Authorization": "Bearer k", "Content-Type": "application/json"}

EMAIL = {"from": "a@example.com", "to": "b@example.com", "subject": "s", "text": "t"}
# (path, headers, a body the route accepts, the status it answers, a marker of the provider's
# own error format)
ROUTES: list[tuple[str, dict[str, str], bytes, int, str]] = [
    ("/emails", RESEND, json.dumps(EMAIL).encode(), 200, '"statusCode": 415'),
    ("/emails/batch", RESEND, json.dumps([EMAIL]).encode(), 200, '"statusCode": 415'),
    ("/v3/mail/send", BEARER, json.dumps({
        "personalizations": [{"to": [{"email": "b@example.com"}]}],
        "from": {"email": "a@example.com"}, "subject": "s",
        "content": [{"type": "text/plain", "value": "t"}]}).encode(), 202, '"errors"'),
    ("/2010-04-01/Accounts/AC1/Messages.json", TWILIO,
     b"To=%2B15551234567&From=%2B15557654321&Body=hi", 201, '"code": 415'),
    ("/v1/projects/p/messages:send", BEARER,
     json.dumps({"message": {"token": "t"}}).encode(), 200, '"status": "INVALID_ARGUMENT"'),
    ("/v1/chat/completions", BEARER, json.dumps({
        "model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}).encode(), 200,
     '"type": "invalid_request_error"'),
    ("/token", {"Content-Type": "application/x-www-form-urlencoded"},
     urlencode(jwt_grant()).encode(), 200,
     '"error": "invalid_request"'),
    ("/_sim/faults", {}, b'{"provider": "fcm", "kind": "error"}', 201, '"error"'),
]
IDS = [route[0] for route in ROUTES]


def fresh(path: str, body: bytes) -> bytes:
    """The route's body to be taken: the token endpoint's grant made now (it expires within
    the hour, and a long run may reach this test later than that)."""
    return urlencode(jwt_grant()).encode() if path == "/token" else body
# FCM answers a message too big with its 400 INVALID_ARGUMENT "Message is too big".
TOO_LARGE = {"/v1/projects/p/messages:send": 400}


async def call(sim: SimulatorServer, path: str, body: bytes,
               headers: dict[str, str]) -> tuple[int, str]:
    async with aiohttp.ClientSession(auto_decompress=False) as http, \
            http.post(sim.base_url + path, data=body, headers=headers) as response:
        return response.status, await response.text()


def raw_deflate(body: bytes) -> bytes:
    squeezer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return squeezer.compress(body) + squeezer.flush()


ENCODERS: dict[str, Any] = {
    "gzip": gzip.compress,
    "x-gzip": gzip.compress,
    "deflate": zlib.compress,
    "identity": lambda body: body,
    "GZIP": gzip.compress,
    "gzip, identity": gzip.compress,
    "deflate, gzip": lambda body: gzip.compress(zlib.compress(body)),
}


@pytest.mark.parametrize("coding", ENCODERS)
@pytest.mark.parametrize(("path", "headers", "body", "status", "says"), ROUTES, ids=IDS)
async def test_gzip_and_deflate_bodies_are_read(
    sim: SimulatorServer, path: str, headers: dict[str, str], body: bytes, status: int,
    says: str, coding: str,
) -> None:
    encoded = ENCODERS[coding](fresh(path, body))

    answered, text = await call(sim, path, encoded, {**headers, "Content-Encoding": coding})

    assert answered == status, text


async def test_raw_deflate_and_several_gzip_members_are_read(sim: SimulatorServer) -> None:
    """Many clients send deflate without its zlib wrapper, and RFC 1952 lets a gzip body be
    several members back to back: both read as the body they hold."""
    path, headers, body, status, _ = ROUTES[5]
    for encoded, coding in ((raw_deflate(body), "deflate"),
                            (gzip.compress(body[:20]) + gzip.compress(body[20:]), "gzip")):
        answered, text = await call(sim, path, encoded, {**headers, "Content-Encoding": coding})
        assert answered == status, text


@pytest.mark.parametrize("coding", ["br", "zstd", "compress", "x-snappy", "gzip, br"])
@pytest.mark.parametrize(("path", "headers", "body", "status", "says"), ROUTES, ids=IDS)
async def test_another_coding_is_the_providers_415(
    sim: SimulatorServer, path: str, headers: dict[str, str], body: bytes, status: int,
    says: str, coding: str,
) -> None:
    answered, text = await call(sim, path, body, {**headers, "Content-Encoding": coding})

    assert answered == 415, text
    assert says in text
    assert "Content-Encoding" in text
    assert coding.split(", ")[-1] in text
    assert await sim.messages() == []
    assert (await sim.faults()) == []


@pytest.mark.parametrize(("path", "headers", "body", "status", "says"), ROUTES, ids=IDS)
async def test_a_body_that_inflates_past_the_limit_is_413(
    sim: SimulatorServer, path: str, headers: dict[str, str], body: bytes, status: int,
    says: str,
) -> None:
    """The body limit holds for the decoded body too: a small gzip body must not inflate
    without bound. The answer is the route's own for a body too large."""
    limit = sim.state.settings.max_body_bytes
    bomb = gzip.compress(body + b" " * limit, compresslevel=9)
    assert len(bomb) < limit // 100

    answered, text = await call(sim, path, bomb, {**headers, "Content-Encoding": "gzip"})

    assert answered == TOO_LARGE.get(path, 413), text
    assert await sim.messages() == []
