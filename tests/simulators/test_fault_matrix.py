"""SIMULATORS.md's `malformed`, `lost_response` and `latency` faults, with and without
`delayMs`, for every provider: each does what the fault table says, the same way for all."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from email.message import EmailMessage
from typing import Any

import aiohttp
import aiosmtplib
import pytest

from simulators import SimulatorServer

EMAIL = {"from": "a@example.com", "to": "b@example.com", "subject": "s", "text": "t"}
TWILIO_AUTH = "Basic " + base64.b64encode(b"AC1:token").decode()
# provider -> (path, request options, the status of its normal answer)
SENDS: dict[str, tuple[str, dict[str, Any], int]] = {
    "resend": ("/emails", {"json": EMAIL, "headers": {"Authorization": "Bearer re_1"}}, 200),
    "sendgrid": ("/v3/mail/send", {"json": {
        "personalizations": [{"to": [{"email": "b@example.com"}]}],
        "from": {"email": "a@example.com"}, "subject": "s",
        "content": [{"type": "text/plain", "value": "t"}],
    }, "headers": {"Authorization": "Bearer SG.key"}}, 202),
    "twilio": ("/2010-04-01/Accounts/AC1/Messages.json", {
        "data": {"To": "+15558675310", "From": "+15005550006", "Body": "hi"},
        "headers": {"Authorization": TWILIO_AUTH}}, 201),
    "fcm": ("/v1/projects/p/messages:send", {"json": {"message": {
        "token": "device-1", "notification": {"title": "Hi", "body": "there"}}},
        "headers": {"Authorization": "Bearer ya29.test"}}, 200),
    "openai": ("/v1/chat/completions", {"json": {
        "model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]},
        "headers": {"Authorization": "Bearer sk-test"}}, 200),
}
HTTP = sorted(SENDS)
ALL = [*HTTP, "smtp"]
DELAY_MS = 200


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
        yield s


async def post(http: aiohttp.ClientSession, sim: SimulatorServer, provider: str,
               timeout_s: float = 10) -> tuple[int, bytes]:
    path, options, _ = SENDS[provider]
    async with http.post(sim.base_url + path, timeout=aiohttp.ClientTimeout(total=timeout_s),
                         **options) as response:
        return response.status, await response.read()


def mail() -> EmailMessage:
    message = EmailMessage()
    message["From"] = "noreply@example.com"
    message["To"] = "ada@example.com"
    message["Subject"] = "Hi"
    message.set_content("there")
    return message


async def smtp_send(sim: SimulatorServer, timeout_s: float = 10) -> str:
    _, reply = await aiosmtplib.send(mail(), hostname=sim.smtp_host, port=sim.smtp_port,
                                     timeout=timeout_s)
    return str(reply)


async def unanswered(http: aiohttp.ClientSession, sim: SimulatorServer, provider: str,
                     timeout_s: float, http_error: type[Exception],
                     smtp_error: type[Exception]) -> None:
    """Send one message; the client gets no answer, but ``http_error``/``smtp_error``."""
    if provider == "smtp":
        with pytest.raises(smtp_error):
            await smtp_send(sim, timeout_s)
    else:
        with pytest.raises(http_error):
            await post(http, sim, provider, timeout_s)


async def counted(sim: SimulatorServer, provider: str, kind: str) -> None:
    """The fault was counted and the message recorded once."""
    assert (await sim.stats())[provider]["faults"][kind] == 1
    [record] = await sim.messages(provider)
    assert record["acceptCount"] == 1


@pytest.mark.parametrize("provider", ALL)
async def test_malformed_records_the_message_and_answers_what_no_client_parses(
    http: aiohttp.ClientSession, sim: SimulatorServer, provider: str
) -> None:
    await sim.add_fault("malformed", provider)
    if provider == "smtp":
        with pytest.raises(aiosmtplib.SMTPException):
            await smtp_send(sim)
    else:
        status, body = await post(http, sim, provider)
        assert status == 200
        with pytest.raises(ValueError, match=r"Unterminated|Expecting"):
            json.loads(body)
    await counted(sim, provider, "malformed")


@pytest.mark.parametrize("provider", ALL)
async def test_lost_response_records_the_message_and_never_answers(
    http: aiohttp.ClientSession, sim: SimulatorServer, provider: str
) -> None:
    await sim.add_fault("lost_response", provider)
    await unanswered(http, sim, provider, 0.5, TimeoutError, aiosmtplib.SMTPTimeoutError)
    await counted(sim, provider, "lost_response")


@pytest.mark.parametrize("provider", ALL)
async def test_lost_response_with_delay_ms_closes_the_connection_unanswered_after_it(
    http: aiohttp.ClientSession, sim: SimulatorServer, provider: str
) -> None:
    """`delayMs` bounds how long the lost answer is held: then the connection is closed, with
    no answer, well before the client's own timeout."""
    await sim.add_fault("lost_response", provider, delay_ms=DELAY_MS)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await unanswered(http, sim, provider, 30, aiohttp.ServerDisconnectedError,
                     aiosmtplib.SMTPServerDisconnected)
    assert loop.time() - started >= DELAY_MS / 1000
    await counted(sim, provider, "lost_response")


@pytest.mark.parametrize("delay_ms", [DELAY_MS, (DELAY_MS, DELAY_MS + 100)],
                         ids=["fixed", "range"])
@pytest.mark.parametrize("provider", ALL)
async def test_latency_with_delay_ms_waits_then_answers_normally(
    http: aiohttp.ClientSession, sim: SimulatorServer, provider: str,
    delay_ms: int | tuple[int, int],
) -> None:
    await sim.add_fault("latency", provider, delay_ms=delay_ms)
    loop = asyncio.get_running_loop()
    started = loop.time()
    if provider == "smtp":
        assert "queued as" in await smtp_send(sim)
    else:
        status, _ = await post(http, sim, provider)
        assert status == SENDS[provider][2]
    assert loop.time() - started >= DELAY_MS / 1000
    await counted(sim, provider, "latency")
