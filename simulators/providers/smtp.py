"""SMTP (aiosmtpd): a mail server that records what it is given and fails on command.

Any client may connect; AUTH PLAIN/LOGIN is offered without TLS and accepts any credentials
(the login names the rate-limit bucket; unauthenticated clients share "anonymous").
A sender that is not an address is refused at MAIL FROM (553 5.1.7; the null sender `<>` is
taken). A recipient is refused where a real server refuses it, at RCPT TO, one address at a time:
a malformed address gets 553 5.1.3, a non-ASCII one in a transaction whose MAIL FROM did not
declare SMTPUTF8 553 5.6.7, an address an invalid_token rule matches 550 5.1.1 (or the
rule's status); the others still get the message. The other faults are decided once per
message, at the end of DATA, when recipients and headers are known:

    timeout        no reply to DATA until the client gives up; nothing recorded
    error          451 4.3.0 (or the rule's status; 421 also closes the connection)
    rate_limit     421 4.7.0 and the connection is closed (or the rule's status: 451 is
                   451 4.7.1, the limit's reply; any other code its usual reply)
    lost_response  recorded, then no reply until the client gives up
    latency        the reply comes late
    malformed      a reply line that is not SMTP

"The rule's status" is the code an `smtp` rule gives, as given. A `*` rule's status is an
HTTP status and is used only if it is also an SMTP failure reply (421, 450-452, 550-554);
otherwise (a 503, say, which SMTP reads as a permanent "bad sequence of commands") the kind
answers its SMTP default above (invalid_token: 550).

Task id: the message's `X-Notifkit-Task-Id` header, in the message's record and in the log
line of a fault decided at DATA; a recipient refused at RCPT TO comes before any header, so
its fault's line says `task_id=None`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any, AnyStr, NoReturn

from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

from simulators.faults import FaultDecision
from simulators.kinds import FaultKind, Provider
from simulators.pipeline import TASK_ID_HEADER, accept, log_fault
from simulators.providers.common import email_address, task_id_text
from simulators.providers.smtp_content import header_text, message_content, parse_message
from simulators.records import MessageRecord, scrub
from simulators.state import SimState

log = logging.getLogger("simulators")

ANONYMOUS = "anonymous"
# Give up waiting for the connection to be torn down after we closed it ourselves.
CLOSE_GRACE_S = 5.0
_REPLIES = {
    421: "421 4.3.2 Service not available, closing transmission channel",
    450: "450 4.2.1 Mailbox temporarily unavailable, try again later",
    451: "451 4.3.0 Error: temporary server failure, try again later",
    452: "452 4.3.1 Insufficient system storage",
    550: "550 5.1.1 <{to}>: Recipient address rejected: User unknown in virtual mailbox table",
    552: "552 5.3.4 Message size exceeds fixed limit",
    553: "553 5.1.3 <{to}>: Bad recipient address syntax",
    554: "554 5.0.0 Transaction failed",
}
RATE_LIMITED_BY_FAULT = "421 4.7.0 Too many messages, slow down; closing transmission channel"
RATE_LIMITED_BY_LIMIT = "451 4.7.1 Rate limit exceeded, try again later"
# A rate limit says so in its enhanced status (4.7.x), which is how clients, notifkit among
# them, tell it from any other temporary failure; only 421 and 451 are read that way.
_RATE_LIMIT_REPLIES = {421: RATE_LIMITED_BY_FAULT, 451: RATE_LIMITED_BY_LIMIT}
MALFORMED = "2x0 this is not an SMTP reply"
# RFC 6531: a non-ASCII envelope address is allowed only once MAIL FROM declared SMTPUTF8.
# Postfix's words; a client that forgets the declaration fails here as at a real server.
UNDECLARED_UTF8 = "553 5.6.7 Must declare SMTPUTF8 to send unicode address"
INTERNAL_ERROR = "451 4.3.0 Error: internal simulator error (logged)"
# Set on an envelope once its transaction is counted in the stats.
_COUNTED = "notifkit_sim_counted"
# RFC 3463's code for each reply that aiosmtpd or the handler writes without one, as Postfix
# gives them; any other reply gets its class's x.0.0.
_ENHANCED = {500: "5.5.2", 501: "5.5.4", 502: "5.5.1", 503: "5.5.1", 504: "5.5.4",
             530: "5.7.0", 552: "5.3.4", 553: "5.1.3"}
_ENHANCED_AFTER = {("MAIL", 250): "2.1.0", ("RCPT", 250): "2.1.5"}
_REPLY = re.compile(r"([245])\d\d([ -])(.*)", re.DOTALL)
_HAS_ENHANCED = re.compile(r"[245]\.\d{1,3}\.\d{1,3}(?: |$)")


def with_enhanced_code(reply: str, command: str | None) -> str:
    """``reply`` with RFC 2034's enhanced status code after its own, unless it has one; a 3xx
    reply (354, an AUTH challenge) or a line that is no reply stays as it is."""
    match = _REPLY.fullmatch(reply)
    if match is None or _HAS_ENHANCED.match(match[3]):
        return reply
    status = int(reply[:3])
    code = _ENHANCED_AFTER.get((command or "", status)) or _ENHANCED.get(status)
    return f"{reply[:4]}{code or match[1] + '.0.0'} {match[3]}"


def reply_text(status: int, recipient: str) -> str:
    if status in _REPLIES:
        return _REPLIES[status].replace("{to}", recipient)
    klass = "4.0.0" if status < 500 else "5.0.0"
    return f"{status} {klass} Error: requested action not taken"


class SmtpHandler:
    """The aiosmtpd handler: one `handle_DATA` per message."""

    def __init__(self, state: SimState) -> None:
        self.state = state

    async def handle_EHLO(self, server: SMTP, session: Session, envelope: Envelope,
                          hostname: str, responses: list[str]) -> list[str]:
        """aiosmtpd's own list, plus what the server does without saying so: it reads
        pipelined commands in order (RFC 2920) and its replies carry enhanced status codes
        (RFC 2034), as the providers' SMTP servers advertise both."""
        session.host_name = hostname  # aiosmtpd leaves this to a handler with this hook
        *features, last = responses
        return [*features, "250-PIPELINING", "250-ENHANCEDSTATUSCODES", last]

    async def handle_exception(self, error: Exception) -> str:
        """A failure of the simulator's own is a local error, as Postfix reports one (451
        4.3.0: try again later), not aiosmtpd's 500, which a client reads as a syntax error."""
        log.error("An SMTP session failed: %s: %s", type(error).__name__, error,
                  exc_info=error)
        return INTERNAL_ERROR

    async def handle_MAIL(self, server: SMTP, session: Session, envelope: Envelope,
                          address: str, mail_options: list[str]) -> str:
        address = scrub(address)
        # The null sender `<>` (aiosmtpd hands it over with its brackets) is how bounces are
        # sent; a real server takes it.
        if address not in ("", "<>") and email_address(address) != address:
            return f"553 5.1.7 <{address}>: Bad sender address syntax"
        if not (address.isascii() or envelope.smtp_utf8):
            return UNDECLARED_UTF8
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return "250 OK"

    async def handle_RCPT(self, server: SMTP, session: Session, envelope: Envelope,
                          address: str, rcpt_options: list[str]) -> str:
        self._count_request(envelope)
        address = scrub(address)
        if email_address(address) != address:
            return reply_text(553, address)
        if not (address.isascii() or envelope.smtp_utf8):
            return UNDECLARED_UTF8
        decision = self.state.faults.decide(Provider.SMTP, [address],
                                            kinds=(FaultKind.INVALID_TOKEN,))
        if decision is not None:
            self.state.stats[Provider.SMTP].faults[decision.kind] += 1
            # The task id is a header of the message, which a refused recipient never sends.
            log_fault(Provider.SMTP, decision, [address], None)
            status = decision.rule.status_for(Provider.SMTP) or 550
            return self._closing_if_421(server, status, reply_text(status, address))
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.extend(rcpt_options)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        state = self.state
        stats = state.stats[Provider.SMTP]
        recipients = [str(r) for r in envelope.rcpt_tos]
        first = recipients[0] if recipients else ""

        wait_s = state.limits.check(Provider.SMTP, _login(session))
        if wait_s is not None:
            stats.rate_limited += 1
            return RATE_LIMITED_BY_LIMIT

        message = parse_message(envelope.original_content or b"")
        task_id = None if message is None else task_id_text(header_text(message, TASK_ID_HEADER))
        decision = state.faults.decide(Provider.SMTP, recipients,
                                       skip=(FaultKind.INVALID_TOKEN,))  # taken at RCPT
        if decision is not None:
            stats.faults[decision.kind] += 1
            log_fault(Provider.SMTP, decision, recipients, task_id)
            early = await self._before_accept(server, decision, first)
            if early is not None:
                return early

        content: dict[str, Any] = {"mail_from": envelope.mail_from,
                                   "rcpt_tos": list(envelope.rcpt_tos)}
        if message is not None:
            content |= message_content(message)
        record = MessageRecord(
            id=state.ids.token(12, "0123456789ABCDEF"),
            provider=Provider.SMTP,
            recipients=recipients,
            task_id=task_id,
            idempotency_key=None,
            content=content,
        )
        accept(state, stats, record)

        if decision is not None and decision.kind is FaultKind.LOST_RESPONSE:
            await self._hold_then_drop(server, decision.delay_s)
        if decision is not None and decision.kind is FaultKind.MALFORMED:
            return MALFORMED
        return f"250 2.0.0 Ok: queued as {record.id}"

    def _count_request(self, envelope: Envelope) -> None:
        """One request per mail transaction, counted at its first RCPT TO: a transaction
        whose every recipient is refused never reaches DATA, yet it was a send, and the
        fault that refused it is counted against it (aiosmtpd starts a fresh envelope for
        each transaction)."""
        if not getattr(envelope, _COUNTED, False):
            setattr(envelope, _COUNTED, True)
            self.state.stats[Provider.SMTP].requests += 1

    async def _before_accept(
        self, server: SMTP, decision: FaultDecision, recipient: str
    ) -> str | None:
        status = decision.rule.status_for(Provider.SMTP)
        kind = decision.kind
        if kind is FaultKind.TIMEOUT:
            await self._hold_then_drop(server, decision.delay_s)
        if kind is FaultKind.LATENCY:
            await self.state.pause(decision.delay_s)
            return None
        if kind is FaultKind.ERROR:
            status = status or 451
            return self._closing_if_421(server, status, reply_text(status, recipient))
        if kind is FaultKind.RATE_LIMIT:
            status = status or 421
            reply = _RATE_LIMIT_REPLIES.get(status) or reply_text(status, recipient)
            return self._closing_if_421(server, status, reply)
        return None

    def _closing_if_421(self, server: SMTP, status: int, reply: str) -> str:
        """421 means the server is going away: close right after the reply is written."""
        transport = server.transport
        if status == 421 and transport is not None:
            asyncio.get_running_loop().call_soon(transport.close)
        return reply

    async def _hold_then_drop(self, server: SMTP, seconds: float) -> NoReturn:
        """Say nothing until the client hangs up (aiosmtpd then cancels us), or time/shutdown."""
        await self.state.pause(seconds)
        transport = server.transport
        if transport is not None:
            transport.close()
        # Closing makes aiosmtpd cancel this handler; wait for that rather than reply.
        await asyncio.sleep(CLOSE_GRACE_S)
        raise asyncio.CancelledError


def authenticate_anyone(
    server: SMTP, session: Session, envelope: Envelope, mechanism: str, auth_data: Any
) -> AuthResult:
    """aiosmtpd calls this synchronously; every login is welcome."""
    return AuthResult(success=True, auth_data=auth_data)


class _DropLoginDataWarning(logging.Filter):
    """aiosmtpd warns on every AUTH about a deprecated attribute it sets itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "login_data is deprecated" not in record.getMessage()


def quiet_aiosmtpd_logs() -> None:
    """Keep aiosmtpd's per-connection chatter out of the simulator's one-line-per-message log."""
    mail_log = logging.getLogger("mail.log")
    if not any(isinstance(f, _DropLoginDataWarning) for f in mail_log.filters):
        mail_log.addFilter(_DropLoginDataWarning())
    if mail_log.level == logging.NOTSET:
        mail_log.setLevel(logging.WARNING)


def _login(session: Session) -> str:
    data = session.auth_data
    if isinstance(data, LoginPassword):
        return data.login.decode("utf-8", errors="replace") or ANONYMOUS
    return ANONYMOUS


class TrackedSMTP(SMTP):
    """An aiosmtpd session that keeps itself in `connections` while open, for shutdown, and
    puts enhanced status codes on its replies once the client said EHLO (RFC 2034: all but the
    greeting and the answers to HELO and EHLO), which aiosmtpd writes only on some."""

    def __init__(self, handler: SmtpHandler, connections: set[TrackedSMTP], **options: Any) -> None:
        super().__init__(handler, **options)
        self._connections = connections
        self._command: str | None = None
        for name, method in list(self._smtp_methods.items()):
            self._smtp_methods[name] = self._noting(name, method)

    def _noting(
        self, name: str, method: Callable[[str], Awaitable[None]]
    ) -> Callable[[str], Awaitable[None]]:
        """``method`` noting its command while it runs, for the codes of the replies it writes
        (`wraps` keeps the syntax aiosmtpd's HELP reads off it)."""
        @functools.wraps(method)
        async def run(arg: str) -> None:
            self._command = name
            try:
                await method(arg)
            finally:
                self._command = None
        return run

    async def push(self, status: AnyStr) -> None:
        if (
            isinstance(status, str)
            and self.session is not None
            and self.session.extended_smtp
            and self._command not in ("EHLO", "HELO")
        ):
            status = with_enhanced_code(status, self._command)  # type: ignore[assignment]
        await super().push(status)

    def connection_made(self, transport: Any) -> None:
        self._connections.add(self)
        super().connection_made(transport)

    def connection_lost(self, error: Exception | None) -> None:
        self._connections.discard(self)
        super().connection_lost(error)


def smtp_factory(
    state: SimState, hostname: str, connections: set[TrackedSMTP]
) -> Callable[[], TrackedSMTP]:
    """A protocol factory for `loop.create_server`."""
    handler = SmtpHandler(state)

    def build() -> TrackedSMTP:
        return TrackedSMTP(
            handler,
            connections,
            hostname=hostname,
            ident="notifkit-simulators ESMTP",
            enable_SMTPUTF8=True,
            data_size_limit=state.settings.max_body_bytes,
            auth_require_tls=False,
            authenticator=authenticate_anyone,
            loop=asyncio.get_running_loop(),
        )

    return build
