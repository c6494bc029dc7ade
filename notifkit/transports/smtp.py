"""Email over SMTP (``SMTP_URL`` = ``smtp://user:pass@host:port``, ``smtps://`` for implicit
TLS; STARTTLS is used when the server offers it).

Connections are pooled (up to ``connections`` open at once, kept open between sends). SMTP has
no idempotency key: a retry after a lost answer (a timeout after DATA) sends the email again,
the documented duplicate. The task id travels in ``X-Notifkit-Task-Id`` and in the
``Message-ID`` (``<taskId@notifkit>``), which is also the provider message id.

Only a failure once the message's data was being sent (a timeout or a dropped connection
after DATA) may have been accepted (``maybe_accepted``); one before it, a connection never made
included, sent nothing.

Replies: 250 sent; 550/551/553 to RCPT with an enhanced status 5.1.x about the recipient or
5.2.1 (or none), or to DATA with one = invalid address; other 5xx = permanent (a refused sender
or relay, 5.7.x or 5.1.7/5.1.8, which servers such as Postfix give in reply to RCPT, says
nothing of the recipient); a non-ASCII address to a server that does not offer SMTPUTF8 =
permanent; 421 or 451 with an enhanced status 4.7.x ("451 4.7.1 Rate limit exceeded") = rate
limited, parked like a 429 (SMTP has no Retry-After, so for delivery's default wait); other 4xx
(421, 451, ...), timeouts and dropped connections = retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from email.message import EmailMessage
from typing import Any
from urllib.parse import unquote, urlsplit

import aiosmtplib

from notifkit.config import (
    check_connections,
    check_from_address,
    check_smtp_url,
    check_timeout,
)
from notifkit.transports.base import (
    Message,
    Outcome,
    SendResult,
    TransportContext,
    argument_of,
    quoted,
)
from notifkit.transports.email import build_email

INVALID_MAILBOX_CODES = frozenset({550, 551, 553})
# How servers refuse a sender over its rate (enhanced status 4.7.x, "temporary, by policy"),
# at the greeting, a recipient or the message. Only with 421 or 451: 4.7.x also comes with
# 450 ("cannot find your hostname") and 454 (a TLS or login failure), which are no rate to
# wait out, so those stay failed attempts, with their fallback.
RATE_LIMIT_CODES = frozenset({421, 451})
RATE_LIMIT_STATUS = re.compile(r"4\.7\.\d{1,3}(?!\S)")
# A reply's enhanced status code (RFC 3463), at the start of its text.
ENHANCED_STATUS = re.compile(r"([245])\.(\d{1,3})\.(\d{1,3})(?!\S)")
# 5.1.x is about an address; 5.1.7 and 5.1.8 about the sender's, not the recipient's.
SENDER_ADDRESS_DETAILS = frozenset({7, 8})
# 5.2.1: the mailbox exists but is disabled ("The email account that you tried to reach is
# disabled").
DISABLED_MAILBOX = ("2", 1)


class _Client(aiosmtplib.SMTP):
    """aiosmtplib's client, noting when a message's DATA began: a failure before it cannot
    have been accepted."""

    data_begun = False

    async def data(self, message: str | bytes, /, **options: Any) -> aiosmtplib.SMTPResponse:
        self.data_begun = True
        return await super().data(message, **options)


class SmtpTransport:
    channel: str = "email"
    provider: str = "smtp"
    idempotent: bool = False

    def __init__(self, *, url: str, from_addr: str, timeout_s: float = 10.0,
                 connections: int = 4, rate_per_s: float | None = None) -> None:
        self.url = url
        self.connections = connections
        parts = urlsplit(url)
        self.hostname = parts.hostname or "localhost"
        self.use_tls = parts.scheme == "smtps"
        self.port = parts.port or (465 if self.use_tls else 25)
        self.username = unquote(parts.username) if parts.username else None
        self.password = unquote(parts.password) if parts.password else None
        self.from_addr = from_addr
        self.timeout_s = timeout_s
        self.rate_per_s = rate_per_s
        self._slots = asyncio.Semaphore(connections)
        self._idle: list[_Client] = []

    def check_arguments(self) -> None:
        """As HttpTransport.check_arguments: SMTP_URL's and EMAIL_FROM's rules, naming the
        argument."""
        check_smtp_url(argument_of(self, "url"), self.url)
        check_from_address(argument_of(self, "from_addr"), self.from_addr)
        check_timeout(argument_of(self, "timeout_s"), self.timeout_s)
        check_connections(argument_of(self, "connections"), self.connections)

    async def open(self, ctx: TransportContext) -> None:
        return None

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for client in idle:
            await _quit(client)

    async def send(self, message: Message) -> SendResult:
        mail = self._compose(message)
        message_id = mail["Message-ID"]
        async with self._slots:
            client = self._idle.pop() if self._idle else None
            if client is not None:
                client.data_begun = False
            keep = False
            stalled = False  # a server that stopped answering would not answer a QUIT either
            try:
                async with asyncio.timeout(self.timeout_s):
                    if client is None or not client.is_connected:
                        client = await self._connect()
                    await client.send_message(mail)
                keep = True
                return SendResult(Outcome.SENT, message_id, "accepted", 250)
            except aiosmtplib.SMTPRecipientsRefused as exc:
                refused = exc.recipients[0] if exc.recipients else None
                code = refused.code if refused is not None else 550
                text = refused.message if refused is not None else str(exc)
                return _by_code(code, text, at_recipient=True)
            except aiosmtplib.SMTPSenderRefused as exc:  # our sender, whoever the recipient
                return _by_code(exc.code, exc.message, about_recipient=False)
            except aiosmtplib.SMTPResponseException as exc:
                if not 200 <= exc.code < 600:
                    # aiosmtplib's -1: a reply that is no SMTP reply. It may have been the
                    # server's 250 to the message, so it counts as an answer that was lost.
                    return SendResult(Outcome.RETRY, detail=f"unreadable SMTP reply: "
                                      f"{quoted(exc.message)}",
                                      maybe_accepted=_data_begun(client))
                return _by_code(exc.code, exc.message)
            except aiosmtplib.SMTPNotSupported as exc:
                # A non-ASCII address to a server without SMTPUTF8: the same on every attempt.
                return SendResult(Outcome.PERMANENT, detail=f"the SMTP server cannot take "
                                  f"this message: {exc}")
            except TimeoutError:
                stalled = True
                return SendResult(Outcome.RETRY, detail=f"no answer within {self.timeout_s:g} s",
                                  maybe_accepted=_data_begun(client))
            except (aiosmtplib.SMTPException, OSError) as exc:
                return SendResult(Outcome.RETRY, detail=f"SMTP connection failed: {exc}",
                                  maybe_accepted=_data_begun(client))
            finally:
                if client is not None:
                    if keep:
                        self._idle.append(client)
                    else:
                        # After a stall, closed at once: a QUIT waited its second for nothing,
                        # holding the send (and its delivery slot) past the timeout.
                        await _quit(client, polite=not stalled)

    async def _connect(self) -> _Client:
        client = _Client(
            hostname=self.hostname, port=self.port, username=self.username,
            password=self.password, use_tls=self.use_tls, timeout=self.timeout_s,
        )
        await client.connect()
        return client

    def _compose(self, message: Message) -> EmailMessage:
        email = build_email(message, self.from_addr)
        mail = EmailMessage()
        mail["From"] = email.from_addr
        mail["To"] = email.to
        mail["Subject"] = email.subject
        mail["Message-ID"] = f"<{message.task_id}@notifkit>"
        for name, value in email.headers.items():
            mail[name] = value
        if email.text is None and email.html is not None:
            # html alone is the message's one part, as Resend and SendGrid send it: an empty
            # text/plain alternative beside it is a blank message to a client showing text.
            mail.set_content(email.html, subtype="html")
            return mail
        mail.set_content(email.text if email.text is not None else "")
        if email.html is not None:
            mail.add_alternative(email.html, subtype="html")
        return mail


def _data_begun(client: _Client | None) -> bool:
    return client is not None and client.data_begun


def _by_code(code: int, text: str, *, at_recipient: bool = False,
             about_recipient: bool = True) -> SendResult:
    """``at_recipient``: the reply to RCPT TO; ``about_recipient``: False for one to MAIL
    FROM, which refuses our sender whoever the recipient is."""
    # A reply of several lines (Gmail's to an unknown address has four) is quoted on one.
    detail = f"SMTP {code}: {quoted(text)}"
    if code in RATE_LIMIT_CODES and RATE_LIMIT_STATUS.match(text.lstrip()):
        return SendResult(Outcome.RATE_LIMITED, None, detail, code)
    if 400 <= code < 500:
        return SendResult(Outcome.RETRY, None, detail, code)
    if about_recipient and code in INVALID_MAILBOX_CODES \
            and _bad_mailbox(text, at_recipient=at_recipient):
        return SendResult(Outcome.INVALID_RECIPIENT, None, detail, code)
    return SendResult(Outcome.PERMANENT, None, detail, code)


def _bad_mailbox(text: str, *, at_recipient: bool) -> bool:
    """Whether a 550/551/553 says the recipient's address is bad: its enhanced status is a
    5.1.x other than the sender's 5.1.7 and 5.1.8, or 5.2.1 (mailbox disabled). A refusal at
    RCPT TO without an enhanced status ("550 No such user here") is about that recipient too;
    servers that check recipients late answer DATA with 5.1.x, and we send one recipient per
    message, so it is that address. A 5.7.x (relaying denied, our sender refused by policy)
    is about us."""
    status = ENHANCED_STATUS.match(text.lstrip())
    if status is None:
        return at_recipient
    if status[1] != "5":
        return False
    if status[2] == "1":
        return int(status[3]) not in SENDER_ADDRESS_DETAILS
    return (status[2], int(status[3])) == DISABLED_MAILBOX


async def _quit(client: aiosmtplib.SMTP, *, polite: bool = True) -> None:
    with contextlib.suppress(Exception):
        if polite and client.is_connected:
            await asyncio.wait_for(client.quit(), 1.0)
    with contextlib.suppress(Exception):
        client.close()
