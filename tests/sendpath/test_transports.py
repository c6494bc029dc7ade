"""Every transport against its provider simulator: one contract, run per provider.

The contract: an accepted send is SENT with the provider's message id and the simulator
recorded the recipient and the task id; the simulator's faults map onto the failure classes
(error -> RETRY, rate_limit -> RATE_LIMITED with Retry-After, invalid_token ->
INVALID_RECIPIENT, timeout and lost_response -> RETRY that may have been accepted).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import email.utils
import json
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import aiosmtpd.smtp
import pytest
from aiohttp import web
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.transports.base import (
    MAX_RETRY_AFTER_S,
    HttpReply,
    Message,
    Outcome,
    SendResult,
    Transport,
    TransportContext,
    classify_status,
    error_detail,
    parse_retry_after,
)
from notifkit.transports.fcm import FcmTransport
from notifkit.transports.fcm import classify as fcm_classify
from notifkit.transports.registry import build_transports
from notifkit.transports.resend import ResendTransport
from notifkit.transports.resend import classify as resend_classify
from notifkit.transports.sendgrid import SendgridTransport
from notifkit.transports.sendgrid import classify as sendgrid_classify
from notifkit.transports.smtp import SmtpTransport
from notifkit.transports.twilio import TwilioTransport
from notifkit.transports.twilio import classify as twilio_classify
from notifkit.transports.webhook import WebhookTransport
from simulators import SimulatorServer
from tests.sendpath.conftest import simulated

# Long enough for a first request on a busy machine (0.5 s was not, once in CI), short enough
# that the held 'timeout' and 'lost_response' faults end quickly.
TIMEOUT_S = 2.0


@dataclass
class Case:
    provider: str
    channel: str
    to: str
    content: dict[str, Any]
    make: Callable[[SimulatorServer], Transport]
    # Whether a fault's HTTP status is part of the answer (SMTP has reply codes instead).
    http: bool = True


CASES = [
    Case("resend", "email", "ada@example.com",
         {"subject": "Hi", "text": "Hello", "html": "<p>Hello</p>"},
         lambda sim: ResendTransport(api_key="re_test", from_addr="notifkit <n@example.com>",
                                     base_url=sim.base_url, timeout_s=TIMEOUT_S)),
    Case("sendgrid", "email", "ada@example.com", {"subject": "Hi", "text": "Hello"},
         lambda sim: SendgridTransport(api_key="SG.test", from_addr="n@example.com",
                                       base_url=sim.base_url, timeout_s=TIMEOUT_S)),
    Case("smtp", "email", "ada@example.com", {"subject": "Hi", "text": "Hello"},
         lambda sim: SmtpTransport(url=f"smtp://{sim.smtp_host}:{sim.smtp_port}",
                                   from_addr="n@example.com", timeout_s=TIMEOUT_S), http=False),
    Case("twilio", "sms", "+15557654321", {"text": "Hello"},
         lambda sim: TwilioTransport(account_sid="AC" + "1" * 32, auth_token="tok",
                                     from_number="+15550001111", base_url=sim.base_url,
                                     timeout_s=TIMEOUT_S)),
    Case("fcm", "push", "device-token-1", {"title": "Hi", "body": "Hello", "data": {"n": 1}},
         lambda sim: FcmTransport(project_id="p1", access_token="ya29.test",
                                  base_url=sim.base_url, timeout_s=TIMEOUT_S)),
]


@pytest.fixture(params=CASES, ids=[c.provider for c in CASES])
async def case(request: pytest.FixtureRequest, sim: SimulatorServer,
               settings: Settings, redis: Redis) -> AsyncIterator[tuple[Case, Transport]]:
    spec: Case = request.param
    transport = spec.make(sim)
    await transport.open(TransportContext(settings, redis, None))
    try:
        yield spec, transport
    finally:
        await transport.close()


def message(spec: Case, task_id: str = "task-0001", **extra: Any) -> Message:
    return Message(task_id=task_id, event_id="event-1", project_id="project-1",
                   user_id="user-1", channel=spec.channel, to=spec.to, content=spec.content,
                   **extra)


async def test_an_accepted_send_names_the_recipient_and_the_task(
    case: tuple[Case, Transport], sim: SimulatorServer
) -> None:
    spec, transport = case
    result = await transport.send(message(spec, "task-accepted"))

    assert result.outcome is Outcome.SENT, result.detail
    assert result.provider_message_id
    [record] = await sim.messages(spec.provider)
    assert record["to"].lower() == spec.to.lower()
    assert record["taskId"] == "task-accepted"
    assert record["acceptCount"] == 1


# Where each provider's webhooks name the task: a field of the request body, the only part of
# the request a provider echoes (the X-Notifkit-Task-Id header never comes back in an event).
TASK_ID_IN_BODY: dict[str, Callable[[dict[str, Any]], object]] = {
    "sendgrid": lambda content: (content.get("custom_args") or {}).get("notifkit_task_id"),
    "resend": lambda content: [tag for tag in content.get("tags") or []
                               if tag.get("name") == "notifkit_task_id"],
    "fcm": lambda content: (content.get("data") or {}).get("notifkit_task_id"),
}
BODY_TASK_ID_EXPECTED: dict[str, object] = {
    "sendgrid": "task-in-body",
    "resend": [{"name": "notifkit_task_id", "value": "task-in-body"}],
    "fcm": "task-in-body",
}


@pytest.mark.parametrize("case", [c for c in CASES if c.provider in TASK_ID_IN_BODY],
                         indirect=True, ids=[c.provider for c in CASES
                                             if c.provider in TASK_ID_IN_BODY])
async def test_an_accepted_send_carries_the_task_id_in_the_body_field_its_webhooks_echo(
    case: tuple[Case, Transport], sim: SimulatorServer
) -> None:
    # The simulator reads the task id from the header first, so record["taskId"] alone would
    # not show the body field missing; without it, the provider's delivery events could not be
    # matched to the task.
    spec, transport = case
    result = await transport.send(message(spec, "task-in-body"))

    assert result.outcome is Outcome.SENT, result.detail
    [record] = await sim.messages(spec.provider)
    assert TASK_ID_IN_BODY[spec.provider](record["content"]) == (
        BODY_TASK_ID_EXPECTED[spec.provider])


@pytest.mark.parametrize(("fault", "outcome"), [
    ("error", Outcome.RETRY),
    ("rate_limit", Outcome.RATE_LIMITED),
    ("invalid_token", Outcome.INVALID_RECIPIENT),
    ("timeout", Outcome.RETRY),
    ("lost_response", Outcome.RETRY),
])
async def test_faults_map_onto_the_failure_classes(
    case: tuple[Case, Transport], sim: SimulatorServer, fault: str, outcome: Outcome
) -> None:
    spec, transport = case
    await sim.add_fault(fault, spec.provider, times=1,
                        retry_after_s=7 if fault == "rate_limit" else None)

    result = await transport.send(message(spec))

    assert result.outcome is outcome, result.detail
    if outcome is Outcome.RATE_LIMITED:
        # SMTP says "421 4.7.0": rate limited like a 429, but with no Retry-After to obey.
        assert result.retry_after_s == (7 if spec.http else None)
    assert result.maybe_accepted is (fault in ("timeout", "lost_response"))
    recorded = await sim.messages(spec.provider)
    assert len(recorded) == (1 if fault == "lost_response" else 0)


async def test_a_provider_that_stops_answering_holds_the_send_no_longer_than_its_timeout(
    case: tuple[Case, Transport], sim: SimulatorServer
) -> None:
    # PROVIDER_TIMEOUT_SECONDS bounds the call: nothing after it (an SMTP QUIT that the
    # stalled server would never answer, say) keeps the delivery slot for longer.
    spec, transport = case
    await sim.add_fault("timeout", spec.provider, times=1)

    started = time.monotonic()
    result = await transport.send(message(spec))

    assert result.outcome is Outcome.RETRY, result.detail
    assert time.monotonic() - started < TIMEOUT_S + 0.5


async def test_a_provider_slower_than_the_timeout_is_given_up_on_within_the_timeout(
    case: tuple[Case, Transport], sim: SimulatorServer
) -> None:
    # PROVIDER_TIMEOUT_SECONDS bounds the whole call: the SMTP transport then said QUIT to the
    # server that had not answered and waited up to 1 s more for its reply, so a 1 s timeout
    # took 2 s per send.
    spec, transport = case
    await sim.add_fault("latency", spec.provider, times=1, delay_ms=int(TIMEOUT_S * 3000))

    started = time.monotonic()
    result = await transport.send(message(spec))
    elapsed = time.monotonic() - started

    assert result.outcome is Outcome.RETRY, result.detail
    assert elapsed < TIMEOUT_S + 0.5, elapsed


async def test_an_unreadable_answer_to_a_recorded_send_is_never_a_permanent_failure(
    case: tuple[Case, Transport], sim: SimulatorServer
) -> None:
    # The provider took the message and answered something the client cannot parse: like a
    # lost answer, it may have been accepted. Dead-lettering it called a delivered message
    # failed, and replaying it from the DLQ sent it again.
    spec, transport = case
    await sim.add_fault("malformed", spec.provider, times=1)

    result = await transport.send(message(spec))

    assert len(await sim.messages(spec.provider)) == 1
    assert result.outcome is Outcome.SENT or (
        result.outcome is Outcome.RETRY and result.maybe_accepted), result


def smtp_transport(port: int, from_addr: str = "n@example.com") -> SmtpTransport:
    return SmtpTransport(url=f"smtp://127.0.0.1:{port}", from_addr=from_addr,
                         timeout_s=TIMEOUT_S)


async def smtp_send(settings: Settings, redis: Redis, port: int,
                    from_addr: str = "n@example.com") -> SendResult:
    """One e-mail sent through a fresh SMTP transport to the server on ``port``."""
    transport = smtp_transport(port, from_addr)
    await transport.open(TransportContext(settings, redis, None))
    try:
        return await transport.send(message(next(c for c in CASES if c.provider == "smtp")))
    finally:
        await transport.close()


async def test_an_smtp_servers_configured_rate_limit_parks_like_a_429(
    sim: SimulatorServer, settings: Settings, redis: Redis
) -> None:
    # The simulator's limit answers "451 4.7.1 Rate limit exceeded": a rate limit to wait
    # out, not a failure for the reclaim cycle to send again at once.
    await sim.set_limit("smtp", 0.001, burst=1)
    transport = smtp_transport(sim.smtp_port)
    await transport.open(TransportContext(settings, redis, None))
    spec = next(c for c in CASES if c.provider == "smtp")
    try:
        first = await transport.send(message(spec, "task-first"))
        second = await transport.send(message(spec, "task-second"))
    finally:
        await transport.close()

    assert first.outcome is Outcome.SENT, first.detail
    assert (second.outcome, second.status, second.retry_after_s) == (
        Outcome.RATE_LIMITED, 451, None), second.detail
    assert "4.7.1" in second.detail
    assert not second.maybe_accepted


@pytest.mark.parametrize(("provider", "status"), [
    ("smtp", None), ("smtp", 421), ("smtp", 451), ("*", 451), ("*", 429),
])
async def test_the_smtp_simulators_rate_limit_rules_are_rate_limits_to_notifkit(
    sim: SimulatorServer, settings: Settings, redis: Redis, provider: str, status: int | None
) -> None:
    await sim.add_fault("rate_limit", provider, status=status)
    transport = smtp_transport(sim.smtp_port)
    await transport.open(TransportContext(settings, redis, None))
    spec = next(c for c in CASES if c.provider == "smtp")
    try:
        result = await transport.send(message(spec))
    finally:
        await transport.close()

    assert result.outcome is Outcome.RATE_LIMITED, result.detail
    assert result.status == (status if status in (421, 451) else 421)


class Refusing:
    """An aiosmtpd handler that answers ``reply`` to MAIL FROM, RCPT TO or DATA."""

    def __init__(self, stage: str, reply: str) -> None:
        self.stage = stage
        self.reply = reply

    async def handle_MAIL(self, server: Any, session: Any, envelope: Any, address: str,
                          mail_options: list[str]) -> str:
        if self.stage == "mail":
            return self.reply
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return "250 OK"

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str,
                          rcpt_options: list[str]) -> str:
        if self.stage == "rcpt":
            return self.reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        return self.reply


@contextlib.asynccontextmanager
async def refusing_server(stage: str, reply: str) -> AsyncIterator[int]:
    """A local SMTP server that refuses every message with ``reply``: as its greeting
    (stage "connect"), at RCPT TO or at DATA. Yields its port."""
    loop = asyncio.get_running_loop()
    server: asyncio.AbstractServer
    if stage == "connect":
        async def greet(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(f"{reply}\r\n".encode())
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(greet, "127.0.0.1", 0)
    else:
        handler = Refusing(stage, reply)
        server = await loop.create_server(
            lambda: aiosmtpd.smtp.SMTP(handler, hostname="localhost", loop=loop),
            "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()
        await server.wait_closed()


# A refused recipient is an invalid address when the reply says the mailbox is bad (5.1.x,
# 5.2.1 disabled) or gives no enhanced status at all.
ADDRESS_REFUSED = [
    ("rcpt", "550 5.1.1 <ada@example.com>: Recipient address rejected: User unknown"),
    ("rcpt", "553 5.1.3 <ada@example.com>: Bad recipient address syntax"),
    ("rcpt", "550 No such user here"),
    ("rcpt", "550 5.2.1 The email account that you tried to reach is disabled"),
    ("data", "550 5.1.1 <ada@example.com>: user unknown"),
]
# A relay that refuses us, or a refusal of our sender (which servers such as Postfix give in
# reply to RCPT TO), says nothing of the recipient: disabling the contact for it would
# disable every user's address at once.
SENDER_REFUSED = [
    ("rcpt", "554 5.7.1 <ada@example.com>: Relay access denied"),
    ("rcpt", "550 5.7.1 <ada@example.com>: Relay access denied"),
    ("rcpt", "553 5.7.1 <n@example.com>: Sender address rejected: not owned by user n"),
    ("rcpt", "550 5.1.8 <n@example.com>: Sender address rejected: Domain not found"),
    ("rcpt", "550 5.1.7 <n@example.com>: Sender address rejected: bad syntax"),
    ("mail", "553 5.1.7 <n@example.com>: Bad sender address syntax"),
    ("mail", "550 5.1.0 <n@example.com>: Sender address rejected: User unknown"),
]


@pytest.mark.parametrize(("stage", "reply", "outcome"), [
    # 421 or 451 with an enhanced status 4.7.x is how SMTP servers say "too many": parked.
    ("data", "451 4.7.1 Rate limit exceeded, try again later", Outcome.RATE_LIMITED),
    ("data", "421 4.7.0 Too many messages, closing transmission channel", Outcome.RATE_LIMITED),
    ("rcpt", "451 4.7.1 <ada@example.com>: too many recipients this hour",
     Outcome.RATE_LIMITED),
    ("connect", "421 4.7.0 Too many concurrent SMTP connections", Outcome.RATE_LIMITED),
    # Any other temporary reply is a failed attempt, as before.
    ("data", "451 4.3.0 Error: temporary server failure", Outcome.RETRY),
    ("data", "421 4.3.2 Service not available, closing transmission channel", Outcome.RETRY),
    ("data", "451 Rate limit exceeded", Outcome.RETRY),
    # 4.7.x also says "not now" for policy and security: a host name that did not resolve, a
    # TLS or login failure. Those are no rate and keep their fallback.
    ("rcpt", "450 4.7.1 Client host rejected: cannot find your hostname", Outcome.RETRY),
    ("data", "454 4.7.0 Temporary authentication failure", Outcome.RETRY),
    ("data", "554 5.7.1 Message rejected as spam", Outcome.PERMANENT),
    # A bare 550 to DATA names no address: the message was refused, not the recipient (a bare
    # 550 to RCPT TO is about the address it answers, see ADDRESS_REFUSED).
    ("data", "550 Message content rejected", Outcome.PERMANENT),
    *[(stage, reply, Outcome.INVALID_RECIPIENT) for stage, reply in ADDRESS_REFUSED],
    *[(stage, reply, Outcome.PERMANENT) for stage, reply in SENDER_REFUSED],
    ("mail", "451 4.3.0 Error: queue file write error", Outcome.RETRY),
])
async def test_an_smtp_rate_limit_reply_is_rate_limited_and_other_replies_keep_their_class(
    settings: Settings, redis: Redis, stage: str, reply: str, outcome: Outcome
) -> None:
    async with refusing_server(stage, reply) as port:
        result = await smtp_send(settings, redis, port)

    assert result.outcome is outcome, result.detail
    assert result.status == int(reply[:3])
    assert result.retry_after_s is None


@contextlib.asynccontextmanager
async def hanging_up_server(command: str) -> AsyncIterator[int]:
    """A local SMTP server that drops the connection when it reads ``command`` (``"."``: the
    end of the message's data), before answering it. Yields its port."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"220 localhost ESMTP\r\n")
        in_data = False
        while line := await reader.readline():
            word = line.decode("ascii", "replace").strip().upper()
            if in_data and word != ".":
                continue
            if word.startswith(command.upper()):
                writer.transport.abort()
                return
            if word.startswith("EHLO"):
                writer.write(b"250-localhost\r\n250 8BITMIME\r\n")
            elif word == "DATA":
                in_data = True
                writer.write(b"354 go ahead\r\n")
            else:
                in_data = False
                writer.write(b"250 OK\r\n")
            await writer.drain()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(("command", "maybe_accepted"), [
    ("EHLO", False), ("MAIL", False), ("RCPT", False), (".", True),
])
async def test_an_smtp_connection_lost_before_the_message_was_sent_is_no_possible_duplicate(
    settings: Settings, redis: Redis, command: str, maybe_accepted: bool
) -> None:
    """Only a connection lost once the message's data went out can have been accepted: one
    lost earlier (or never made) was flagged as a lost answer too, so the outbox kept the
    destination 'sending' and the retry's send was recorded as a possible duplicate."""
    async with hanging_up_server(command) as port:
        result = await smtp_send(settings, redis, port)

    assert result.outcome is Outcome.RETRY, result.detail
    assert result.maybe_accepted is maybe_accepted, result.detail


async def test_a_unicode_address_to_an_smtp_server_without_smtputf8_is_a_permanent_failure(
    settings: Settings, redis: Redis
) -> None:
    """The server cannot take the address on any attempt: this was called a lost connection,
    retried until dead-lettered and flagged as a possible duplicate though nothing went out."""
    async with refusing_server("none", "250 OK") as port:  # a server without SMTPUTF8
        result = await smtp_send(settings, redis, port, from_addr="n@exämple.com")

    assert result.outcome is Outcome.PERMANENT, result.detail
    assert "SMTPUTF8" in result.detail
    assert not result.maybe_accepted


async def test_an_unreadable_smtp_greeting_is_no_possible_duplicate(
    settings: Settings, redis: Redis
) -> None:
    # Something that is no SMTP server answered the connection: no message went out.
    async with refusing_server("connect", "HTTP/1.1 400 Bad Request") as port:
        result = await smtp_send(settings, redis, port)

    assert result.outcome is Outcome.RETRY, result.detail
    assert not result.maybe_accepted


async def test_an_smtp_server_that_is_not_there_is_no_possible_duplicate(
    settings: Settings, redis: Redis
) -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    result = await smtp_send(settings, redis, port)

    assert result.outcome is Outcome.RETRY, result.detail
    assert not result.maybe_accepted


async def test_email_carries_the_one_click_unsubscribe_headers(sim: SimulatorServer) -> None:
    transport = ResendTransport(api_key="re_test", from_addr="n@example.com",
                                base_url=sim.base_url)
    await transport.open(None)  # type: ignore[arg-type]
    try:
        await transport.send(Message(
            task_id="t-unsub", event_id="e", project_id="p", user_id="u", channel="email",
            to="ada@example.com", content={"subject": "s", "text": "t"},
            unsubscribe_url="https://notifkit.example/v1/unsubscribe?token=abc"))
    finally:
        await transport.close()
    [record] = await sim.messages("resend")
    headers = record["content"]["headers"]
    assert headers["List-Unsubscribe"] == "<https://notifkit.example/v1/unsubscribe?token=abc>"
    assert headers["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert headers["X-Notifkit-Task-Id"] == "t-unsub"


@pytest.mark.parametrize(("message", "expected"), [
    ("The registration token is not a valid FCM registration token", Outcome.INVALID_RECIPIENT),
    # A malformed request is INVALID_ARGUMENT too; it says nothing about the device
    ("Exactly one of token, topic or condition must be set.", Outcome.PERMANENT),
])
def test_fcm_invalid_argument_disables_a_token_only_when_it_is_about_the_token(
    message: str, expected: Outcome,
) -> None:
    body = {"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT",
                      "details": [{"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError",
                                   "errorCode": "INVALID_ARGUMENT"}]}}
    reply = HttpReply(400, {}, json.dumps(body).encode())
    assert fcm_classify(reply).outcome is expected


@pytest.mark.parametrize("status", [429, 403, 500])
def test_fcm_quota_exceeded_is_rate_limited_whatever_the_http_status(status: int) -> None:
    """FCM's own error code says what went wrong, as UNREGISTERED does: a quota answer is
    waited out (honouring its Retry-After) and tried again, never failed for good nor retried
    at once, even under a status a gateway in between rewrote."""
    body = {"error": {"code": status, "message": "Quota exceeded for quota metric",
                      "status": "RESOURCE_EXHAUSTED",
                      "details": [{"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError",
                                   "errorCode": "QUOTA_EXCEEDED"}]}}
    result = fcm_classify(HttpReply(status, {"Retry-After": "30"}, json.dumps(body).encode()))
    assert (result.outcome, result.retry_after_s, result.status) == (
        Outcome.RATE_LIMITED, 30.0, status)


@pytest.mark.parametrize(("field", "text", "expected"), [
    ("personalizations.0.to.0.email", "Does not contain a valid address.",
     Outcome.INVALID_RECIPIENT),
    # Another field of the personalization says nothing about the address: disabling the
    # contact for it would lose a good address for a fault of the message.
    ("personalizations.0.subject", "The subject of a personalization must be a string.",
     Outcome.PERMANENT),
])
def test_sendgrid_400_disables_an_address_only_when_it_names_a_recipient_field(
    field: str, text: str, expected: Outcome,
) -> None:
    body = {"errors": [{"message": text, "field": field, "help": None}]}
    reply = HttpReply(400, {}, json.dumps(body).encode())
    assert sendgrid_classify(reply).outcome is expected


@pytest.mark.parametrize(("text", "expected"), [
    ("Invalid `to` field. The email address needs to follow the `email@example.com` or "
     "`Name <email@example.com>` format.", Outcome.INVALID_RECIPIENT),
    # Resend answers every invalid field with validation_error: only one about `to` is the
    # address's fault.
    ("Invalid `subject` field.", Outcome.PERMANENT),
])
def test_resend_validation_error_disables_an_address_only_when_it_is_about_to(
    text: str, expected: Outcome,
) -> None:
    body = {"statusCode": 422, "name": "validation_error", "message": text}
    reply = HttpReply(422, {}, json.dumps(body).encode())
    assert resend_classify(reply).outcome is expected


@pytest.mark.parametrize("case", [c for c in CASES if c.provider == "twilio"], indirect=True,
                         ids=["twilio"])
@pytest.mark.parametrize(("number", "expected"), [
    ("+15005550001", Outcome.INVALID_RECIPIENT),  # 21211 not a valid phone number
    ("+15005550002", Outcome.INVALID_RECIPIENT),  # 21612 not reachable from our number
    ("+15005550004", Outcome.INVALID_RECIPIENT),  # 21610 the recipient replied STOP
    ("+15005550009", Outcome.INVALID_RECIPIENT),  # 21614 not a mobile number
    # 21408: the account may not send to the region yet, which Twilio's console fixes; the
    # number itself is fine, so the contact stays enabled.
    ("+15005550003", Outcome.PERMANENT),
])
async def test_twilio_codes_that_mean_the_number_cannot_receive_are_invalid_recipients(
    case: tuple[Case, Transport], sim: SimulatorServer, number: str, expected: Outcome
) -> None:
    # The simulator answers Twilio's test numbers with their documented error codes.
    spec, transport = case
    result = await transport.send(message(dataclasses.replace(spec, to=number)))

    assert (result.outcome, result.status) == (expected, 400), result.detail
    assert await sim.messages("twilio") == []


def test_an_accepted_send_whose_answer_is_nested_too_deep_to_parse_is_still_sent() -> None:
    """Twilio answered 201: the SMS went out. A body Python's parser cannot descend (a
    RecursionError, not a ValueError) failed the attempt as a bug, and the retry sent the
    message again through a provider without idempotency keys."""
    deep = b"{\"a\":" * 200_000 + b"1" + b"}" * 200_000
    assert HttpReply(201, {}, deep).json() is None
    assert twilio_classify(HttpReply(201, {}, deep)).outcome is Outcome.SENT
    assert twilio_classify(HttpReply(503, {}, deep)).outcome is Outcome.RETRY


GMAIL_NO_SUCH_USER = (
    "550-5.1.1 The email account that you tried to reach does not exist. Please try\r\n"
    "550-5.1.1 double-checking the recipient's email address for typos or\r\n"
    "550-5.1.1 unnecessary spaces. For more information, go to\r\n"
    "550 5.1.1  https://support.google.com/mail/?p=NoSuchUser")


@pytest.mark.parametrize(("reply", "quoted"), [
    (GMAIL_NO_SUCH_USER,
     "5.1.1 The email account that you tried to reach does not exist. Please try 5.1.1 "
     "double-checking the recipient's email address for typos or 5.1.1 unnecessary spaces. "
     "For more information, go to 5.1.1  https://support.google.com/mail/?p=NoSuchUser"),
    ("550-5.1.1 " + "x" * 400 + "\r\n550 5.1.1 unknown", "5.1.1 " + "x" * 291 + "..."),
])
async def test_an_smtp_reply_of_several_lines_is_quoted_on_one_line_as_http_answers_are(
    settings: Settings, redis: Redis, reply: str, quoted: str
) -> None:
    """A timeline row quotes the answer on one line and at most 300 characters: an SMTP
    reply of several lines (Gmail's to an unknown address has four) kept its line breaks,
    and a server's long reply was quoted whole."""
    async with refusing_server("rcpt", reply) as port:
        result = await smtp_send(settings, redis, port)

    assert result.outcome is Outcome.INVALID_RECIPIENT
    assert result.detail == f"SMTP 550: {quoted}"


@pytest.mark.parametrize(("status", "expected"), [
    (200, Outcome.SENT), (202, Outcome.SENT), (299, Outcome.SENT), (300, Outcome.PERMANENT),
    (400, Outcome.PERMANENT), (401, Outcome.PERMANENT), (404, Outcome.PERMANENT),
    # A provider that timed out the request (408) failed this attempt, as a 5xx did
    (408, Outcome.RETRY), (429, Outcome.RATE_LIMITED), (499, Outcome.PERMANENT),
    (500, Outcome.RETRY), (503, Outcome.RETRY), (599, Outcome.RETRY),
])
def test_an_http_status_maps_onto_its_failure_class(status: int, expected: Outcome) -> None:
    """The generic mapping every HTTP provider starts from (CONTRACT §5: a provider timeout
    or 5xx is a failed attempt, retried; any other refusal is final)."""
    result = classify_status(HttpReply(status, {"Retry-After": "3"}, b""), "detail", "m-1")
    assert result.outcome is expected
    assert result.provider_message_id == ("m-1" if expected is Outcome.SENT else None)
    assert result.status == status
    if expected in (Outcome.RETRY, Outcome.RATE_LIMITED):
        assert result.retry_after_s == 3.0


def test_a_provider_error_answer_holding_a_nul_is_described_without_it() -> None:
    """The description goes to the timeline, whose text column takes no NUL: a proxy's error
    page with one in it failed the batch's timeline write, the attempts' rows were lost."""
    reply = HttpReply(502, {}, b"upstream \x00 broke\nagain")
    assert error_detail(reply) == "HTTP 502: upstream \ufffd broke again"


@pytest.mark.parametrize("content", [
    {"subject": "s", "text": "t", "html": ""}, {"subject": "s", "text": "", "html": "<p>h</p>"},
])
async def test_sendgrid_leaves_out_empty_content_blocks(
    sim: SimulatorServer, content: dict[str, str],
) -> None:
    # SendGrid answers 400 to a content block whose value is empty.
    transport = SendgridTransport(api_key="SG.test", from_addr="n@example.com",
                                  base_url=sim.base_url)
    await transport.open(None)  # type: ignore[arg-type]
    try:
        result = await transport.send(Message(
            task_id="t-empty", event_id="e", project_id="p", user_id="u", channel="email",
            to="ada@example.com", content=content))
    finally:
        await transport.close()
    assert result.outcome is Outcome.SENT, result.detail
    [record] = await sim.messages("sendgrid")
    assert record["taskId"] == "t-empty"


@pytest.mark.parametrize(("from_addr", "sender"), [
    ("n@example.com", {"email": "n@example.com"}),
    ("Acme <n@example.com>", {"email": "n@example.com", "name": "Acme"}),
    ('"Doe, Jane" <n@example.com>', {"email": "n@example.com", "name": "Doe, Jane"}),
    ('"Jane \\"JJ\\" Doe" <n@example.com>', {"email": "n@example.com", "name": 'Jane "JJ" Doe'}),
    ('"Ops <team>" <n@example.com>', {"email": "n@example.com", "name": "Ops <team>"}),
    ("n@example.com (Acme Ops)", {"email": "n@example.com", "name": "Acme Ops"}),
])
async def test_sendgrid_sends_the_from_name_and_address_as_the_header_means_them(
    from_addr: str, sender: dict[str, str]
) -> None:
    """EMAIL_FROM is a From header's value; SendGrid takes its name and address apart. A
    quoted name holding '<' was cut there into an address SendGrid refused on every send,
    and an escaped quote kept its backslash in the name every recipient saw."""
    received: list[Any] = []
    routes = web.RouteTableDef()

    @routes.post("/v3/mail/send")
    async def mail_send(request: web.Request) -> web.Response:
        received.append(await request.json())
        return web.Response(status=202, headers={"X-Message-Id": "m-1"})

    app = web.Application()
    app.add_routes(routes)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    transport = SendgridTransport(api_key="SG.test", from_addr=from_addr,
                                  base_url=f"http://127.0.0.1:{runner.addresses[0][1]}")
    transport.check_arguments()  # EMAIL_FROM's own check takes each of them
    await transport.open(None)  # type: ignore[arg-type]
    try:
        result = await transport.send(Message(
            task_id="t-from", event_id="e", project_id="p", user_id="u", channel="email",
            to="ada@example.com", content={"subject": "s", "text": "t"}))
    finally:
        await transport.close()
        await runner.cleanup()
    assert result.outcome is Outcome.SENT, result.detail
    [body] = received
    assert body["from"] == sender


async def test_an_email_with_a_subject_alone_is_sent_by_every_email_transport(
    sim: SimulatorServer, settings: Settings, redis: Redis
) -> None:
    """A template's email may hold a subject alone (html and text are each optional): each
    email transport sends it, with an empty body, rather than having the provider refuse it
    at every attempt until it is dead-lettered."""
    for spec in (c for c in CASES if c.channel == "email"):
        transport = spec.make(sim)
        await transport.open(TransportContext(settings, redis, None))
        try:
            result = await transport.send(Message(
                task_id=f"t-subject-{spec.provider}", event_id="e", project_id="p",
                user_id="u", channel="email", to=spec.to, content={"subject": "Hi"}))
        finally:
            await transport.close()
        assert result.outcome is Outcome.SENT, (spec.provider, result.detail)
        [record] = await sim.messages(spec.provider)
        assert record["taskId"] == f"t-subject-{spec.provider}"


async def test_sms_asks_twilio_for_receipts_at_the_projects_webhook(
    sim: SimulatorServer, settings: Settings, redis: Redis
) -> None:
    # Twilio posts delivered/undelivered only to the message's StatusCallback; the webhook
    # verifies the signature over NOTIFKIT_PUBLIC_URL + path, so that is the URL to give it.
    configured = simulated(settings, sim).replace(public_url="https://notifkit.example/")
    transport = build_transports(configured)["sms"]
    await transport.open(TransportContext(configured, redis, None))
    try:
        result = await transport.send(Message(
            task_id="t-sms", event_id="e", project_id="0193a0a0-0000-7000-8000-000000000001",
            user_id="u", channel="sms", to="+15557654321", content={"text": "hi"}))
    finally:
        await transport.close()
    assert result.outcome is Outcome.SENT, result.detail
    [record] = await sim.messages("twilio")
    assert record["content"]["status_callback"] == (
        "https://notifkit.example/v1/webhooks/twilio/0193a0a0-0000-7000-8000-000000000001")


async def test_push_addresses_a_device_token_never_an_fcm_topic(
    sim: SimulatorServer, settings: Settings, redis: Redis
) -> None:
    # A push contact is a device token: even one spelled like a topic goes out as the message's
    # token (FCM then calls it an invalid token), never as a topic ("/topics/..." is refused).
    spec = next(c for c in CASES if c.provider == "fcm")
    transport = spec.make(sim)
    await transport.open(TransportContext(settings, redis, None))
    try:
        result = await transport.send(Message(
            task_id="t-push", event_id="e", project_id="p", user_id="u", channel="push",
            to="/topics/news", content={"title": "Hi", "body": "Hello"}))
    finally:
        await transport.close()
    assert result.outcome is Outcome.SENT, result.detail
    [record] = await sim.messages("fcm")
    assert record["content"]["token"] == "/topics/news"
    assert "topic" not in record["content"]


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("7", 7.0),
        ("0", 0.0),
        ("-3", 0.0),
        # A wait past what any provider asks for is parked for the longest wait, not converted
        # into a due time no clock holds: "inf" raised OverflowError in delivery, failing the
        # whole batch, and a year past 9999 broke the scheduler's row.
        ("inf", MAX_RETRY_AFTER_S),
        ("1e400", MAX_RETRY_AFTER_S),
        ("1000000000000", MAX_RETRY_AFTER_S),
        ("nan", None),
        ("soon", None),
    ],
)
def test_retry_after_is_a_finite_bounded_wait(header: str, expected: float | None) -> None:
    assert parse_retry_after(header) == expected


@pytest.mark.parametrize(("offset_s", "zone", "low", "high"), [
    (30, "GMT", 25, 30),  # the IMF-fixdate form HTTP servers send
    (30, "-0000", 25, 30),  # UTC with no zone said: read as UTC
    (-30, "GMT", 0, 0),  # already past: send now
])
def test_retry_after_may_be_an_http_date(offset_s: int, zone: str, low: float,
                                         high: float) -> None:
    when = datetime.now(UTC) + timedelta(seconds=offset_s)
    text = (email.utils.format_datetime(when, usegmt=True) if zone == "GMT"
            else email.utils.format_datetime(when.replace(tzinfo=None)))
    assert text.endswith(zone)
    wait = parse_retry_after(text)
    assert wait is not None, text
    assert low <= wait <= high, (text, wait)


@pytest.mark.parametrize("name", ["Retry-After", "retry-after", "RETRY-AFTER"])
def test_a_reply_reads_retry_after_in_any_case(name: str) -> None:
    # Header names are case-insensitive; a reply built from a plain mapping keeps the wire's.
    assert HttpReply(429, {name: "7"}, b"").retry_after_s == 7.0


@pytest.mark.parametrize("case", [c for c in CASES if c.channel == "email"], indirect=True,
                         ids=[c.provider for c in CASES if c.channel == "email"])
@pytest.mark.parametrize("subject", ["Hi\r\nBcc: eve@example.com", "Hi\nBcc: eve@example.com",
                                     "Hi\u2028Bcc: eve@example.com"])
async def test_a_subject_with_line_breaks_is_sent_as_one_line(
    case: tuple[Case, Transport], sim: SimulatorServer, subject: str
) -> None:
    """Data a template puts in a subject may hold line breaks: they become spaces, so the
    subject injects no header and an SMTP message can still be built (it raised on every
    attempt, dead-lettering the send)."""
    spec, transport = case
    content = {**spec.content, "subject": subject}
    result = await transport.send(Message(
        task_id="t-subject", event_id="e", project_id="p", user_id="u", channel="email",
        to=spec.to, content=content))

    assert result.outcome is Outcome.SENT, result.detail
    [record] = await sim.messages(spec.provider)
    assert record["content"]["subject"] == "Hi Bcc: eve@example.com"
    assert "eve@example.com" not in json.dumps(
        {k: v for k, v in record["content"].items() if k != "subject"})


async def send_to_hook(routes: web.RouteTableDef, body: str) -> SendResult:
    """Send ``body`` with the webhook transport to ``/hook`` of a local app serving
    ``routes`` (on loopback, so private networks are allowed). A handler still running when
    the transport hangs up is cancelled."""
    app = web.Application()
    app.add_routes(routes)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    transport = WebhookTransport(secret="webhook-secret-0123456789", timeout_s=TIMEOUT_S,
                                 allow_private_networks=True)
    await transport.open(None)  # type: ignore[arg-type]
    try:
        return await transport.send(Message(
            task_id="t-hook", event_id="e", project_id="p", user_id="u", channel="webhook",
            to=f"http://127.0.0.1:{runner.addresses[0][1]}/hook", content={"body": body}))
    finally:
        await transport.close()
        await runner.cleanup()


@pytest.mark.parametrize(("rendered", "body"), [
    ('{"amount": 7}', {"amount": 7}),
    ("NaN", "NaN"),
    ('{"x": Infinity}', '{"x": Infinity}'),
    ("[" * 5000 + "]" * 5000, "[" * 5000 + "]" * 5000),
    ('{"a":' * 3000 + "1" + "}" * 3000, '{"a":' * 3000 + "1" + "}" * 3000),
])
async def test_a_webhook_body_goes_as_strict_json_or_as_its_text(
    rendered: str, body: Any
) -> None:
    """A rendered body is sent parsed when it is strict JSON, else as text: NaN or Infinity
    made the document invalid JSON for the receiver, and JSON nested deeper than Python
    parses raised RecursionError on every attempt."""
    received: list[bytes] = []
    routes = web.RouteTableDef()

    @routes.post("/hook")
    async def hook(request: web.Request) -> web.Response:
        received.append(await request.read())
        return web.Response(status=204)

    result = await send_to_hook(routes, rendered)

    assert result.outcome is Outcome.SENT, result.detail
    [raw] = received
    assert json.loads(raw, parse_constant=lambda name: pytest.fail(name))["body"] == body


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_a_webhook_answered_with_a_redirect_is_not_followed_nor_counted_as_sent(
    status: int,
) -> None:
    """A receiver that redirects has not taken the notification: following a 301/302/303
    turned the POST into a bodiless GET whose 200 was recorded as sent (the payload lost),
    and a 307/308 re-sent the signed payload to whatever host the Location named, an http
    one included."""
    posts: list[bytes] = []
    landed: list[str] = []
    routes = web.RouteTableDef()

    @routes.post("/hook")
    async def hook(request: web.Request) -> web.Response:
        posts.append(await request.read())
        return web.Response(status=status, headers={"Location": "/elsewhere"})

    @routes.route("*", "/elsewhere")
    async def elsewhere(request: web.Request) -> web.Response:
        landed.append(request.method)
        return web.Response(text="a landing page")

    result = await send_to_hook(routes, "{}")

    assert len(posts) == 1
    assert landed == []
    assert result.outcome is Outcome.PERMANENT, result
    assert f"HTTP {status}" in (result.detail or "")


async def test_a_webhook_answered_with_an_endless_body_is_sent_once_not_timed_out() -> None:
    """Only the head of a reply is read: a receiver that took the payload and then answered
    200 with a body larger than a transport can read within its timeout (here one that
    never ends) had every attempt time out, so it got the notification again on each retry,
    and delivery held whatever it had read of the body in memory."""
    posts: list[bytes] = []
    routes = web.RouteTableDef()

    @routes.post("/hook")
    async def hook(request: web.Request) -> web.StreamResponse:
        posts.append(await request.read())
        response = web.StreamResponse(status=200)
        await response.prepare(request)
        with contextlib.suppress(ConnectionError):
            while True:
                await response.write(b"x" * 65536)
        return response

    result = await send_to_hook(routes, "{}")

    assert result.outcome is Outcome.SENT, result.detail
    assert len(posts) == 1


@pytest.mark.parametrize(("status", "outcome"), [
    (200, Outcome.SENT), (204, Outcome.SENT), (404, Outcome.PERMANENT),
    (500, Outcome.RETRY), (410, Outcome.INVALID_RECIPIENT),
])
async def test_a_webhook_answer_whose_body_never_ends_is_classified_by_its_status(
    status: int, outcome: Outcome,
) -> None:
    """A receiver that answers its status and then keeps the body open (a few bytes, then
    nothing, never closing) has answered: its 200 had every attempt time out, so it got the
    notification again on each retry until the task was dead-lettered, and its 404 was
    retried as a timeout instead of failing at once."""
    posts: list[bytes] = []
    never = asyncio.Event()
    routes = web.RouteTableDef()

    @routes.post("/hook")
    async def hook(request: web.Request) -> web.StreamResponse:
        posts.append(await request.read())
        response = web.StreamResponse(status=status)
        if status != 204:
            response.content_length = 1000
        await response.prepare(request)
        with contextlib.suppress(ConnectionError):
            if status != 204:
                await response.write(b"still writing")
            await never.wait()
        return response

    result = await send_to_hook(routes, "{}")

    assert result.outcome is outcome, result.detail
    assert result.status == status
    assert len(posts) == 1
    if status == 404:
        assert "still writing" in result.detail


@pytest.mark.parametrize("name", ["X-RateLimit-Reset", "x-ratelimit-reset"])
def test_sendgrid_429_without_retry_after_parks_until_its_rate_limit_resets(name: str) -> None:
    # SendGrid's 429 names the Unix time its window reopens (X-RateLimit-Reset), never a
    # Retry-After: a task parked for the 1 s default came back to another 429 each time and
    # was dead-lettered long before the window reopened.
    reset = int(time.time()) + 40
    body = json.dumps({"errors": [{"message": "too many requests", "field": None}]}).encode()
    result = sendgrid_classify(HttpReply(429, {name: str(reset), "X-RateLimit-Remaining": "0"},
                                         body))
    assert result.outcome is Outcome.RATE_LIMITED
    assert result.retry_after_s is not None
    assert 38 <= result.retry_after_s <= 40


@pytest.mark.parametrize(("headers", "expected"), [
    # A Retry-After, where one is given, is the provider's own word and wins.
    ({"Retry-After": "7", "X-RateLimit-Reset": "{reset}"}, 7.0),
    ({"X-RateLimit-Reset": "{past}"}, 0.0),
    ({"X-RateLimit-Reset": "{far}"}, MAX_RETRY_AFTER_S),
    ({"X-RateLimit-Reset": "soon"}, None),
    ({"X-RateLimit-Reset": "1e400"}, None),
    ({}, None),
])
def test_sendgrid_429_reads_its_reset_time_as_a_bounded_wait(
    headers: dict[str, str], expected: float | None,
) -> None:
    now = int(time.time())
    times = {"reset": str(now + 40), "past": str(now - 100), "far": str(now + 10 ** 9)}
    reply = HttpReply(429, {k: v.format(**times) for k, v in headers.items()}, b"{}")
    assert sendgrid_classify(reply).retry_after_s == expected


@pytest.mark.parametrize("name", ["X-Message-Id", "x-message-id", "X-MESSAGE-ID"])
def test_sendgrid_reads_its_message_id_in_any_case(name: str) -> None:
    # Header names are case-insensitive: a proxy that writes them in lower case left the
    # send without the message id SendGrid's events name it by.
    result = sendgrid_classify(HttpReply(202, {name: "sg-msg-1"}, b""))
    assert (result.outcome, result.provider_message_id) == (Outcome.SENT, "sg-msg-1")


@pytest.mark.parametrize(("status", "outcome"), [
    (200, Outcome.SENT), (404, Outcome.PERMANENT), (500, Outcome.RETRY),
    (410, Outcome.INVALID_RECIPIENT),
])
async def test_a_webhook_answer_whose_body_breaks_off_is_classified_by_its_status(
    status: int, outcome: Outcome,
) -> None:
    """A receiver that answers its status and then drops the connection before the body it
    announced has answered: its 200 was taken for a lost answer, so it got the notification
    again on the retry (or the recipient got the fallback channel's too)."""
    posts: list[bytes] = []
    routes = web.RouteTableDef()

    @routes.post("/hook")
    async def hook(request: web.Request) -> web.StreamResponse:
        posts.append(await request.read())
        response = web.StreamResponse(status=status)
        response.content_length = 1000
        await response.prepare(request)
        await response.write(b"cut short")
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.abort()
        return response

    result = await send_to_hook(routes, "{}")

    assert result.outcome is outcome, result.detail
    assert result.status == status
    assert len(posts) == 1


@pytest.mark.parametrize(("content", "parts"), [
    ({"subject": "s", "html": "<p>h</p>"}, ["text/html"]),
    ({"subject": "s", "text": "t"}, ["text/plain"]),
    ({"subject": "s", "text": "t", "html": "<p>h</p>"}, ["text/plain", "text/html"]),
    ({"subject": "s"}, ["text/plain"]),
])
def test_smtp_sends_the_bodies_the_template_has_and_no_empty_text_beside_html(
    content: dict[str, str], parts: list[str],
) -> None:
    """An e-mail whose template has html alone went out as multipart/alternative with an
    empty text/plain part before the html, so a client showing text (or the text preview)
    showed a blank message; Resend and SendGrid send the html alone, and so does SMTP now."""
    mail = smtp_transport(25)._compose(Message(
        task_id="t-parts", event_id="e", project_id="p", user_id="u", channel="email",
        to="ada@example.com", content=content))
    shown = [part.get_content_type() for part in mail.walk() if not part.is_multipart()]
    assert shown == parts
    for part in mail.walk():
        if not part.is_multipart():
            assert part.get_content().strip() or content == {"subject": "s"}
