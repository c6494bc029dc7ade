"""Real SMTP clients (aiosmtplib and the standard library's smtplib) against the SMTP
simulator: delivery, 4xx/5xx faults, stalls, lost replies and rate limits."""

from __future__ import annotations

import asyncio
import io
import logging
import re
import smtplib
from collections.abc import Iterator
from email.message import EmailMessage
from typing import Any

import aiohttp
import aiosmtplib
import pytest

from scenarios.harness import fault_hits
from simulators import SimulatorServer
from simulators.logs import TEXT_FORMAT
from simulators.providers import smtp as smtp_provider

SHORT_TIMEOUT_S = 0.5


def mail(to: str = "ada@example.com", task_id: str = "task-s") -> EmailMessage:
    message = EmailMessage()
    message["From"] = "Notifkit <noreply@example.com>"
    message["To"] = to
    message["Subject"] = "Your receipt"
    message["X-Notifkit-Task-Id"] = task_id
    message.set_content("Plain body")
    message.add_alternative("<p>HTML body</p>", subtype="html")
    return message


async def send(
    sim: SimulatorServer, message: EmailMessage, **options: Any
) -> tuple[object, str]:
    return await aiosmtplib.send(  # type: ignore[no-any-return]
        message, hostname=sim.smtp_host, port=sim.smtp_port, timeout=5, **options
    )


async def test_delivery_is_250_and_recorded(sim: SimulatorServer) -> None:
    _, reply = await send(sim, mail())

    [record] = await sim.messages("smtp")
    assert reply == f"2.0.0 Ok: queued as {record['id']}"
    assert record["to"] == "ada@example.com"
    assert record["taskId"] == "task-s"
    assert record["content"]["subject"] == "Your receipt"
    assert record["content"]["text"].strip() == "Plain body"
    assert record["content"]["html"].strip() == "<p>HTML body</p>"


async def test_stdlib_smtplib_with_auth_delivers(sim: SimulatorServer) -> None:
    def deliver() -> None:
        with smtplib.SMTP(sim.smtp_host, sim.smtp_port, timeout=5) as client:
            client.login("notifkit", "secret")
            client.send_message(mail())

    await asyncio.to_thread(deliver)
    assert len(await sim.messages("smtp")) == 1


async def test_invalid_token_fault_is_550_mailbox_unavailable(sim: SimulatorServer) -> None:
    await sim.add_fault("invalid_token", "smtp", to="*@gone.example.com")

    def deliver() -> None:
        with smtplib.SMTP(sim.smtp_host, sim.smtp_port, timeout=5) as client:
            client.send_message(mail(to="old@gone.example.com"))

    # Refused at RCPT TO, as a real server refuses an unknown mailbox
    with pytest.raises(smtplib.SMTPRecipientsRefused) as caught:
        await asyncio.to_thread(deliver)
    [(code, reply)] = caught.value.recipients.values()
    assert code == 550
    assert b"old@gone.example.com" in reply
    assert await sim.messages("smtp") == []


async def test_recipients_are_refused_one_by_one_and_the_others_get_the_message(
    sim: SimulatorServer,
) -> None:
    await sim.add_fault("invalid_token", "smtp", to="bad@*")

    def deliver() -> dict[str, tuple[int, bytes]]:
        with smtplib.SMTP(sim.smtp_host, sim.smtp_port, timeout=5) as client:
            refused = client.sendmail("a@example.com", ["good@x.example.com",
                                                        "bad@x.example.com"],
                                      mail(to="good@x.example.com").as_bytes())
            client.mail("a@example.com")
            malformed = client.rcpt("notanaddress")
            client.rset()
            return {**refused, "notanaddress": malformed}

    refused = await asyncio.to_thread(deliver)
    assert refused["bad@x.example.com"][0] == 550
    assert b"bad@x.example.com" in refused["bad@x.example.com"][1]
    assert refused["notanaddress"][0] == 553
    [message] = await sim.messages("smtp")
    assert message["to"] == "good@x.example.com"


async def test_a_sender_that_is_not_an_address_is_refused_at_mail_from(
    sim: SimulatorServer,
) -> None:
    def senders() -> list[int]:
        with smtplib.SMTP(sim.smtp_host, sim.smtp_port, timeout=5) as client:
            client.ehlo()
            codes = [client.mail(sender)[0] for sender in ("a b", "noreply")]
            # The null sender is how bounces are sent: taken, and the message goes through.
            codes.append(client.mail("")[0])
            client.rcpt("ada@example.com")
            codes.append(client.data(mail().as_bytes())[0])
            return codes

    assert await asyncio.to_thread(senders) == [553, 553, 250, 250]
    [message] = await sim.messages("smtp")
    assert message["content"]["mail_from"] == "<>"


async def test_a_transaction_refused_at_rcpt_counts_as_a_request(sim: SimulatorServer) -> None:
    # Its fault is counted, so the request must be too: faults never outnumber requests.
    await sim.add_fault("invalid_token", "smtp", to="gone@*")
    with pytest.raises(aiosmtplib.SMTPRecipientsRefused):
        await send(sim, mail(to="gone@example.com"))
    await send(sim, mail())

    smtp = (await sim.stats())["smtp"]
    assert (smtp["requests"], smtp["accepted"]) == (2, 1)
    assert {kind: n for kind, n in smtp["faults"].items() if n} == {"invalid_token": 1}


async def test_rate_limit_fault_is_421_and_closes(sim: SimulatorServer) -> None:
    await sim.add_fault("rate_limit", "smtp", times=1)
    with pytest.raises(aiosmtplib.SMTPResponseException) as caught:
        await send(sim, mail())
    assert caught.value.code == 421
    assert caught.value.message.startswith("4.7.0 ")
    # A fresh connection succeeds once the rule is spent.
    await send(sim, mail())
    assert len(await sim.messages("smtp")) == 1


async def test_a_failure_of_the_simulator_is_a_temporary_local_error(
    sim: SimulatorServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """As Postfix reports a local failure (451 4.3.0, try again), not aiosmtpd's 500, which a
    client reads as its own syntax error; and the failure is logged with its traceback."""
    def broken(*args: Any) -> dict[str, Any]:
        raise RuntimeError("disk full")

    monkeypatch.setattr(smtp_provider, "message_content", broken)
    with pytest.raises(aiosmtplib.SMTPDataError) as refused:
        await send(sim, mail())
    assert (refused.value.code, refused.value.message) == (
        451, "4.3.0 Error: internal simulator error (logged)")
    [record] = [r for r in caplog.records if r.getMessage().startswith("An SMTP session")]
    assert record.exc_info is not None
    assert await sim.messages("smtp") == []


async def test_timeout_fault_stalls_and_records_nothing(sim: SimulatorServer) -> None:
    await sim.add_fault("timeout", "smtp")
    with pytest.raises(aiosmtplib.SMTPTimeoutError):
        await aiosmtplib.send(
            mail(), hostname=sim.smtp_host, port=sim.smtp_port, timeout=SHORT_TIMEOUT_S
        )
    assert await sim.messages("smtp") == []


async def test_lost_response_is_recorded_but_unanswered(sim: SimulatorServer) -> None:
    await sim.add_fault("lost_response", "smtp")
    with pytest.raises(aiosmtplib.SMTPTimeoutError):
        await aiosmtplib.send(
            mail(), hostname=sim.smtp_host, port=sim.smtp_port, timeout=SHORT_TIMEOUT_S
        )
    [record] = await sim.messages("smtp")
    assert record["taskId"] == "task-s"


async def test_malformed_reply_is_a_protocol_error(sim: SimulatorServer) -> None:
    await sim.add_fault("malformed", "smtp")
    with pytest.raises(aiosmtplib.SMTPException):
        await send(sim, mail())


async def test_latency_then_delivery(sim: SimulatorServer) -> None:
    await sim.add_fault("latency", "smtp", delay_ms=150)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await send(sim, mail())
    assert loop.time() - started >= 0.15


async def test_rate_limit_per_login(sim: SimulatorServer) -> None:
    await sim.set_limit("smtp", 0.5, burst=1)
    await send(sim, mail(), username="a", password="p")
    with pytest.raises(aiosmtplib.SMTPResponseException) as caught:
        await send(sim, mail(), username="a", password="p")
    assert caught.value.code == 451
    assert caught.value.message.startswith("4.7.1 ")
    await send(sim, mail(), username="b", password="p")
    assert (await sim.stats())["smtp"]["rateLimited"] == 1


@pytest.mark.parametrize(
    ("provider", "kind", "status", "code", "text"),
    [
        # An `smtp` rule's reply code is used as given, temporary or permanent.
        ("smtp", "error", 451, 451, "4.3.0"),
        ("smtp", "error", 421, 421, "4.3.2"),
        ("smtp", "error", 452, 452, "4.3.1"),
        ("smtp", "error", 552, 552, "5.3.4"),
        ("smtp", "error", 503, 503, "5.0.0"),
        ("smtp", "error", 450, 450, "4.2.1"),
        # A `*` rule's HTTP status has no SMTP meaning (503 would be SMTP's permanent "bad
        # sequence of commands"): SMTP answers its own reply for the kind.
        ("*", "error", 503, 451, "4.3.0"),
        ("*", "error", 500, 451, "4.3.0"),
        ("*", "error", 429, 451, "4.3.0"),
        ("*", "rate_limit", 503, 421, "4.7.0"),
        ("*", "rate_limit", 429, 421, "4.7.0"),
        # An SMTP reply code in a `*` rule is meant for SMTP and kept.
        ("*", "error", 421, 421, "4.3.2"),
        ("*", "error", 452, 452, "4.3.1"),
        ("*", "error", 554, 554, "5.0.0"),
        # A rate limit's 421 or 451 says so in its enhanced status 4.7.x, as real servers do
        # and as notifkit reads it; a rate_limit rule's other codes answer as for any error.
        ("*", "rate_limit", 451, 451, "4.7.1 Rate limit exceeded"),
        ("*", "rate_limit", 421, 421, "4.7.0 Too many messages"),
        ("smtp", "rate_limit", 451, 451, "4.7.1 Rate limit exceeded"),
        ("smtp", "rate_limit", 421, 421, "4.7.0 Too many messages"),
        ("smtp", "rate_limit", 450, 450, "4.2.1"),
        ("smtp", "rate_limit", 552, 552, "5.3.4"),
    ],
)
async def test_an_error_or_rate_limit_rule_answers_an_smtp_reply(
    sim: SimulatorServer, provider: str, kind: str, status: int, code: int, text: str
) -> None:
    await sim.add_fault(kind, provider, status=status)

    with pytest.raises(aiosmtplib.SMTPResponseException) as caught:
        await send(sim, mail())

    assert caught.value.code == code
    assert text in caught.value.message
    assert await sim.messages("smtp") == []


@pytest.mark.parametrize(("status", "code"), [(404, 550), (400, 550), (503, 550), (553, 553)])
async def test_an_invalid_token_rule_for_every_provider_refuses_the_rcpt_in_smtp_terms(
    sim: SimulatorServer, status: int, code: int
) -> None:
    await sim.add_fault("invalid_token", "*", to="gone@*", status=status)
    with pytest.raises(aiosmtplib.SMTPRecipientsRefused) as caught:
        await send(sim, mail(to="gone@example.com"))
    [refused] = caught.value.recipients
    assert refused.code == code


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            b"From: Ada <a@example.com>\r\nTo: b@example.com\r\nSubject: =?utf-8?B?!!!?=\r\n"
            b"X-Notifkit-Task-Id: task-raw\r\n"
            b"Content-Type: text/plain; charset=bogus-charset\r\n\r\nhello body \xff\r\n",
            # The subject does not decode: kept as written. The unknown charset: read as UTF-8.
            {"from": "Ada <a@example.com>", "to": "b@example.com",
             "subject": "=?utf-8?B?!!!?=", "text": "hello body \N{REPLACEMENT CHARACTER}"},
        ),
        (
            b"From: a@example.com\r\nTo: b@example.com\r\nSubject: multi\r\n"
            b"X-Notifkit-Task-Id: task-raw\r\nMIME-Version: 1.0\r\n"
            b"Content-Type: multipart/alternative; boundary=XX\r\n\r\n"
            b"--XX\r\nContent-Type: text/plain; charset=unknown-8bit-x\r\n"
            b"Content-Transfer-Encoding: base64\r\n\r\ncGxhaW4gdGV4dCBoZXJlIP8=\r\n"
            b"--XX\r\nContent-Type: text/html; charset=utf-8\r\n\r\n<p>html</p>\r\n--XX--\r\n",
            {"subject": "multi", "text": "plain text here \N{REPLACEMENT CHARACTER}",
             "html": "<p>html</p>"},
        ),
    ],
    ids=["bad-subject-and-charset", "multipart-with-unknown-charset"],
)
async def test_a_header_or_part_that_does_not_decode_keeps_the_rest_of_the_message(
    sim: SimulatorServer, raw: bytes, expected: dict[str, str]
) -> None:
    """One part that does not decode must not erase the others: each header and part is
    decoded on its own, falling back to its raw text with replacement characters."""

    def deliver() -> None:
        with smtplib.SMTP(sim.smtp_host, sim.smtp_port, timeout=5) as client:
            client.sendmail("a@example.com", ["b@example.com"], raw)

    await asyncio.to_thread(deliver)

    [record] = await sim.messages("smtp")
    assert record["taskId"] == "task-raw"
    assert {name: record["content"][name].strip() for name in expected} == expected


@pytest.fixture
def sim_log() -> Iterator[io.StringIO]:
    """The simulators' log lines, written as the scenario harness reads them."""
    text = io.StringIO()
    handler = logging.StreamHandler(text)
    handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    logger = logging.getLogger("simulators")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield text
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


async def test_the_harness_counts_smtp_faults_with_their_task(
    sim: SimulatorServer, sim_log: io.StringIO
) -> None:
    """The scenarios count faults per task from the simulators' log: an SMTP fault's line
    names its task (the X-Notifkit-Task-Id header) as an HTTP provider's does."""
    await sim.add_fault("error", "smtp", times=1)
    with pytest.raises(aiosmtplib.SMTPResponseException):
        await send(sim, mail(task_id="task-e"))
    await sim.add_fault("error", "resend", times=1)
    email = {"from": "a@example.com", "to": "b@example.com", "subject": "s", "text": "t"}
    headers = {"Authorization": "Bearer re_test", "X-Notifkit-Task-Id": "task-r"}
    async with aiohttp.ClientSession() as http, http.post(
            f"{sim.base_url}/emails", json=email, headers=headers) as response:
        assert response.status >= 500
    # A recipient refused at RCPT TO never sends the header: counted, with no task.
    await sim.add_fault("invalid_token", "smtp", to="gone@*")
    with pytest.raises(aiosmtplib.SMTPRecipientsRefused):
        await send(sim, mail(to="gone@example.com", task_id="task-i"))

    errors = fault_hits(sim_log.getvalue(), "error")
    assert [(h.provider, h.to, h.task_id) for h in errors] == [
        ("smtp", "ada@example.com", "task-e"), ("resend", "b@example.com", "task-r")]
    assert [(h.provider, h.to, h.task_id) for h in fault_hits(
        sim_log.getvalue(), "invalid_token")] == [("smtp", "gone@example.com", "None")]


async def test_an_undeclared_utf8_body_is_recorded_as_utf8(sim: SimulatorServer) -> None:
    """A text body in 8-bit UTF-8 that names no charset (as SMTPUTF8 clients and hand-written
    mail send it) is recorded as the text it is, not as replacement characters; bytes that
    are no UTF-8 still come out replaced."""
    raw = "Subject: Grüße\r\nX-Notifkit-Task-Id: task-u8\r\n\r\nGrüße aus Köln\r\n".encode()

    def deliver() -> None:
        with smtplib.SMTP(sim.smtp_host, sim.smtp_port, timeout=5) as client:
            client.sendmail("a@example.com", ["b@example.com"], raw, mail_options=["SMTPUTF8"])
            client.sendmail("a@example.com", ["c@example.com"],
                            b"Subject: latin\r\nX-Notifkit-Task-Id: task-l1\r\n\r\nK\xf6ln\r\n")

    await asyncio.to_thread(deliver)

    [utf8] = await sim.messages("smtp", task_id="task-u8")
    assert (utf8["content"]["subject"], utf8["content"]["text"].strip()) == (
        "Grüße", "Grüße aus Köln")
    [latin] = await sim.messages("smtp", task_id="task-l1")
    assert latin["content"]["text"].strip() == "K\ufffdln"


async def test_a_unicode_address_needs_smtputf8_declared(sim: SimulatorServer) -> None:
    """As at a real server offering SMTPUTF8 (RFC 6531), a non-ASCII envelope address is
    taken only in a transaction whose MAIL FROM declared SMTPUTF8; a client that forgets it
    gets 553 5.6.7 there rather than a delivery no real relay would make."""

    reader, writer = await asyncio.open_connection(sim.smtp_host, sim.smtp_port)

    async def command(line: str) -> str:
        writer.write(line.encode() + b"\r\n")
        await writer.drain()
        reply = b""
        while reply[3:4] != b" ":  # the last line of a multi-line reply has a space
            reply = await reader.readline()
        return reply.decode().strip()

    await reader.readline()  # the greeting
    try:
        await command("EHLO client.example")
        assert (await command("MAIL FROM:<a@example.com>")).startswith("250")
        refused_rcpt = await command("RCPT TO:<jö@exämple.com>")
        await command("RSET")
        refused_mail = await command("MAIL FROM:<jö@exämple.com>")
    finally:
        writer.close()
    assert refused_rcpt.startswith("553 5.6.7")
    assert "SMTPUTF8" in refused_rcpt
    assert refused_mail.startswith("553 5.6.7")

    # aiosmtplib declares SMTPUTF8 itself when an address needs it, as notifkit sends.
    await send(sim, mail(to="jö@exämple.com", task_id="task-idn"))
    [record] = await sim.messages("smtp", task_id="task-idn")
    assert record["to"] == "jö@exämple.com"


async def test_ehlo_advertises_pipelining_and_enhanced_status_codes(
    sim: SimulatorServer,
) -> None:
    """What the server does, it says: it takes pipelined commands (RFC 2920) and prefixes its
    replies with enhanced status codes (RFC 2034), as the providers' SMTP servers do."""
    def features() -> dict[str, str]:
        with smtplib.SMTP(sim.smtp_host, sim.smtp_port, timeout=5) as client:
            client.ehlo("client.example.com")
            return dict(client.esmtp_features)

    found = await asyncio.to_thread(features)
    assert "pipelining" in found
    assert "enhancedstatuscodes" in found
    assert found["auth"].split() == ["LOGIN", "PLAIN"]
    assert "size" in found


async def dialogue(sim: SimulatorServer, greeting: bytes, *commands: bytes) -> list[bytes]:
    """The server's last reply line to each command, after ``greeting`` (EHLO or HELO)."""
    reader, writer = await asyncio.open_connection(sim.smtp_host, sim.smtp_port)
    try:
        assert (await reader.readline()).startswith(b"220 ")
        writer.write(greeting + b"\r\n")
        while (line := await reader.readline())[3:4] == b"-":
            pass
        replies = [line.rstrip()]
        for command in commands:
            writer.write(command + b"\r\n")
            await writer.drain()
            while (line := await reader.readline())[3:4] == b"-":
                pass
            replies.append(line.rstrip())
        return replies
    finally:
        writer.close()


async def test_after_ehlo_every_reply_carries_an_enhanced_status_code(
    sim: SimulatorServer,
) -> None:
    """RFC 2034: once advertised, every reply but the greeting, EHLO's and the 3xx ones
    carries one, those aiosmtpd words itself included (codes as Postfix gives them)."""
    replies = await dialogue(
        sim, b"EHLO client.example.com", b"MAIL FROM:<a@example.com>",
        b"MAIL FROM:<a@example.com>", b"FOO", b"RCPT TO:<b@example.com>", b"DATA",
        b"Subject: hi\r\n\r\nhello\r\n.", b"NOOP", b"RSET", b"RCPT TO:<b@example.com>",
        b"QUIT",
    )
    assert [reply[:10] for reply in replies] == [
        b"250 HELP", b"250 2.1.0 ", b"503 5.5.1 ", b"500 5.5.2 ", b"250 2.1.5 ", b"354 End da",
        b"250 2.0.0 ", b"250 2.0.0 ", b"250 2.0.0 ", b"503 5.5.1 ", b"221 2.0.0 ",
    ]
    [record] = await sim.messages("smtp")
    assert record["content"]["rcpt_tos"] == ["b@example.com"]


async def test_after_helo_replies_carry_no_enhanced_status_code(sim: SimulatorServer) -> None:
    replies = await dialogue(sim, b"HELO client.example.com", b"MAIL FROM:<a@example.com>",
                             b"FOO", b"QUIT")
    assert [reply[:3] for reply in replies] == [b"250", b"250", b"500", b"221"]
    assert not [reply for reply in replies if re.match(rb"\d{3} [245]\.\d+\.\d+ ", reply)]


async def test_pipelined_commands_are_answered_in_order(sim: SimulatorServer) -> None:
    reader, writer = await asyncio.open_connection(sim.smtp_host, sim.smtp_port)
    try:
        assert (await reader.readline()).startswith(b"220 ")
        writer.write(b"EHLO client.example.com\r\nMAIL FROM:<a@example.com>\r\n"
                     b"RCPT TO:<b@example.com>\r\nRCPT TO:<c@example.com>\r\nDATA\r\n")
        await writer.drain()
        while not (line := await reader.readline()).startswith(b"250 "):
            assert line.startswith(b"250-")
        replies = [(await reader.readline())[:3] for _ in range(4)]
        assert replies == [b"250", b"250", b"250", b"354"]
        writer.write(b"Subject: piped\r\n\r\nhello\r\n.\r\nQUIT\r\n")
        await writer.drain()
        assert (await reader.readline()).startswith(b"250 ")
        assert (await reader.readline()).startswith(b"221 ")
    finally:
        writer.close()
    [record] = await sim.messages("smtp")
    assert record["content"]["rcpt_tos"] == ["b@example.com", "c@example.com"]
