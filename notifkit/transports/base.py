"""The Transport protocol and how a provider's answer is classified.

A transport sends one :class:`Message` to one destination and answers a :class:`SendResult`
whose :class:`Outcome` is one of the contract's failure classes (CONTRACT §5); it never raises
for a provider failure. Delivery maps outcomes to actions in one place
(:mod:`notifkit.services.delivery.outcomes`):

    SENT               the provider accepted; provider_message_id when it gave one
    RETRY              timeout, connection error, 5xx: a failed attempt (fallback, then retry)
    RATE_LIMITED       429 (SMTP: 421/451 4.7.x): park until ``retry_after_s``
    INVALID_RECIPIENT  the token/address is invalid: disable the contact, never retry it
    PERMANENT          a rejection retrying cannot fix (bad credentials, rejected payload):
                       the fallback chain's next channel, else the DLQ at once

``maybe_accepted`` marks a RETRY whose request may have reached the provider (a timeout or a
connection lost after sending): retrying it on a provider without idempotency keys is the one
documented way to send a message twice.

HTTP transports share :class:`HttpTransport`: one ``aiohttp.ClientSession`` per transport with
a sized, keep-alive connector, every call bounded by ``PROVIDER_TIMEOUT_SECONDS``, and the task
id in ``X-Notifkit-Task-Id``.
"""

from __future__ import annotations

import asyncio
import contextvars
import email.utils
import json
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final, Protocol, runtime_checkable

import aiohttp
import asyncpg
from redis.asyncio import Redis

from notifkit import codec
from notifkit.config import Settings, check_base_url, check_connections, check_timeout
from notifkit.keys import Keys

# The longest a provider's Retry-After parks a task: a day (no provider asks for more).
MAX_RETRY_AFTER_S: Final = 24 * 3600.0
TASK_ID_HEADER = "X-Notifkit-Task-Id"
# The most of a reply body a transport reads. Providers answer in a few hundred bytes; a
# webhook receiver may answer with anything, and reading all of a huge (or endless) body
# held it in memory and made an accepted send time out, so the receiver got it again on
# every retry.
MAX_REPLY_BYTES: Final = 1 << 20
METADATA_FIELD = "notifkit_task_id"  # the provider metadata field that carries the task id
# The timeout bounding the current send() call, so that a reply's body can be read up to the
# same deadline without that deadline discarding the status already received.
_CALL_TIMEOUT: contextvars.ContextVar[asyncio.Timeout | None] = contextvars.ContextVar(
    "notifkit_transport_call_timeout", default=None)


class Outcome(StrEnum):
    SENT = "sent"
    RETRY = "retry"
    RATE_LIMITED = "rate_limited"
    INVALID_RECIPIENT = "invalid_recipient"
    PERMANENT = "permanent"


@dataclass(frozen=True)
class SendResult:
    outcome: Outcome
    provider_message_id: str | None = None
    detail: str = ""
    status: int | None = None  # the provider's HTTP (or SMTP) status, when it answered
    retry_after_s: float | None = None
    maybe_accepted: bool = False
    # The destination is gone (its user erased) as the send was made, after delivery's check:
    # nothing was sent, and the task is left out as one erased before that check would be.
    removed: bool = False

    @property
    def sent(self) -> bool:
        return self.outcome is Outcome.SENT


@dataclass(frozen=True)
class Message:
    """One message to one destination, built by delivery from an outbound task."""

    task_id: str
    event_id: str
    project_id: str
    user_id: str
    channel: str
    to: str
    content: Mapping[str, Any]
    template: str = ""
    topic: str | None = None
    campaign_id: str | None = None
    unsubscribe_url: str | None = None
    created_at: str = ""


@dataclass
class TransportContext:
    """What transports may need at run time (the in-app one writes PostgreSQL and Redis)."""

    settings: Settings
    redis: Redis
    db: asyncpg.Pool | None
    keys: Keys = field(init=False)

    def __post_init__(self) -> None:
        self.keys = Keys(self.settings.namespace)


@runtime_checkable
class Transport(Protocol):
    channel: str  # email | sms | push | inapp | webhook
    provider: str  # resend, sendgrid, smtp, twilio, fcm, webhook, inapp, ...
    idempotent: bool  # the provider honours the task id as an idempotency key
    rate_per_s: float | None  # the provider's documented rate; None = no notifkit bucket

    async def open(self, ctx: TransportContext) -> None: ...

    async def close(self) -> None: ...

    async def send(self, message: Message) -> SendResult: ...


# ---------------------------------------------------------------------------------------------
# HTTP


@dataclass(frozen=True)
class HttpReply:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        """The body as JSON, or None when it is not JSON."""
        try:
            return json.loads(self.body, parse_int=_json_int)
        except UnicodeDecodeError:
            # Not UTF-8, as JSON must be (a gateway that re-encodes): read with the bytes
            # UTF-8 has no place for as U+FFFD, since a paid-for answer is readable all the
            # same.
            try:
                return json.loads(self.body.decode("utf-8", "replace"), parse_int=_json_int)
            except (ValueError, RecursionError):
                return None
        except (ValueError, RecursionError):
            # Nested deeper than the parser descends: as unreadable as a cut-off body, not a
            # bug that fails the attempt (of a send the provider may have accepted).
            return None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def retry_after_s(self) -> float | None:
        return parse_retry_after(header(self, "Retry-After"))


def _json_int(digits: str) -> int | float:
    """A JSON integer; one longer than ``int()`` reads (4,300 digits) as a float, infinite,
    since refusing it would make the whole answer unreadable (a paid-for AI text with it)."""
    try:
        return int(digits)
    except ValueError:
        return float(digits)


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After as seconds: delta-seconds or an HTTP date, at most ``MAX_RETRY_AFTER_S``
    (a longer wait, ``inf`` included, is parked for that long: a due time must stay one that
    delivery and the scheduler can compute and store). None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    if math.isnan(seconds):
        return None
    return bounded_wait(seconds)


def bounded_wait(seconds: float) -> float:
    return min(max(0.0, seconds), MAX_RETRY_AFTER_S)


def header(reply: HttpReply, name: str) -> str | None:
    """A reply header by name in any case: aiohttp spells only the names it knows its own way,
    and a provider behind HTTP/2 writes every name in lower case."""
    wanted = name.lower()
    return next((v for k, v in reply.headers.items() if k.lower() == wanted), None)


def parse_reset_at(value: str | None) -> float | None:
    """A rate limit's reset given as the Unix time (whole seconds) its window reopens, as a
    wait in seconds bounded as :func:`parse_retry_after`'s; None when absent or unreadable."""
    if value is None or not value.strip().isdigit():
        return None
    return bounded_wait(int(value.strip()) - time.time())


def classify_status(reply: HttpReply, detail: str, message_id: str | None = None) -> SendResult:
    """The generic meaning of an HTTP status; providers refine it (invalid recipients)."""
    if reply.ok:
        return SendResult(Outcome.SENT, message_id, detail, reply.status)
    if reply.status == 429:
        return SendResult(Outcome.RATE_LIMITED, None, detail, reply.status,
                          retry_after_s=reply.retry_after_s)
    if reply.status == 408 or reply.status >= 500:
        return SendResult(Outcome.RETRY, None, detail, reply.status,
                          retry_after_s=reply.retry_after_s)
    return SendResult(Outcome.PERMANENT, None, detail, reply.status)


def argument_of(transport: object, name: str) -> str:
    """How a refusal names a transport's argument: ``ResendTransport(api_key)``."""
    return f"{type(transport).__name__}({name})"


class HttpTransport:
    """Base of the HTTP transports: session, connector, timeout and failure mapping.

    Subclasses implement :meth:`_send` with :meth:`_request` and classify the reply.
    """

    channel: str = ""
    provider: str = ""
    idempotent: bool = False
    # Whether requests go to paths under base_url (a webhook's go to each contact's own URL).
    has_base_url: bool = True

    def __init__(
        self,
        *,
        base_url: str = "",
        timeout_s: float = 10.0,
        connections: int = 64,
        rate_per_s: float | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.connections = connections
        self.rate_per_s = rate_per_s
        self._session: aiohttp.ClientSession | None = None

    def check_arguments(self) -> None:
        """Refuses what would fail every send, naming the argument, as the environment's
        variables are refused at start: ``NotifkitServer(transports=[...])`` calls it."""
        # Empty: a subclass of one's own that builds whole URLs itself, as webhooks do.
        if self.has_base_url and self.base_url:
            check_base_url(self.argument("base_url"), self.base_url)
        check_timeout(self.argument("timeout_s"), self.timeout_s)
        check_connections(self.argument("connections"), self.connections)

    def argument(self, name: str) -> str:
        return argument_of(self, name)

    async def open(self, ctx: TransportContext) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self.connections, limit_per_host=self.connections, keepalive_timeout=30,
                resolver=self._resolver(),
            )
            # No session timeout: send() bounds the whole call (token exchange included)
            # with asyncio.timeout, and aiohttp's own timer per request costs about 4 % of
            # the client's CPU for nothing.
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(),
            )

    def _resolver(self) -> aiohttp.abc.AbstractResolver | None:
        """The resolver the connector looks host names up with; None for aiohttp's own."""
        return None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def send(self, message: Message) -> SendResult:
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout_s) as call_timeout:
                token = _CALL_TIMEOUT.set(call_timeout)
                try:
                    return await self._send(message)
                finally:
                    _CALL_TIMEOUT.reset(token)
        except TimeoutError:
            return SendResult(
                Outcome.RETRY,
                detail=f"no answer within {self.timeout_s:g} s "
                f"(waited {time.perf_counter() - started:.2f} s)",
                maybe_accepted=True,
            )
        except aiohttp.ClientConnectorError as exc:
            return SendResult(Outcome.RETRY, detail=f"could not connect: {exc}")
        except (aiohttp.ClientError, OSError) as exc:
            # The request may have been written before the connection broke.
            return SendResult(Outcome.RETRY, detail=f"connection failed: {exc!r}",
                              maybe_accepted=True)

    async def _send(self, message: Message) -> SendResult:
        raise NotImplementedError

    async def _request(
        self,
        method: str,
        url: str,
        *,
        task_id: str,
        headers: Mapping[str, str] | None = None,
        json_body: Any = None,
        data: Any = None,
        body: bytes | None = None,
    ) -> HttpReply:
        if self._session is None:
            raise RuntimeError(f"the {self.provider} transport is not open")
        all_headers = {TASK_ID_HEADER: task_id, **(headers or {})}
        if json_body is not None:
            # notifkit's codec (orjson when installed) rather than aiohttp's json.dumps.
            body = codec.dumps(json_body)
            all_headers.setdefault("Content-Type", "application/json")
        # Never follow a redirect: a 301/302/303 would turn the POST into a bodiless GET
        # whose 200 reads as accepted, and a 307/308 would re-send the request (a webhook's
        # signed payload) to any host the Location names. A 3xx is answered as it is.
        response = await self._session.request(
            method, url, headers=all_headers, data=body if body is not None else data,
            allow_redirects=False,
        )
        # The status is the answer. The body is read until the call's deadline and what came
        # by then is used: a receiver that answers 200 and keeps its body open (or trickles
        # it, or drops the connection before its end) has still answered, and timing the call
        # out or calling it lost would send it again on retry.
        call_timeout = _CALL_TIMEOUT.get()
        deadline = call_timeout.when() if call_timeout is not None else None
        parts: list[bytes] = []
        complete = False
        try:
            if call_timeout is not None:
                call_timeout.reschedule(None)  # the body read below keeps the deadline
            try:
                async with asyncio.timeout_at(deadline):
                    complete = await read_head(response.content, MAX_REPLY_BYTES, parts)
            except (TimeoutError, aiohttp.ClientPayloadError, aiohttp.ClientConnectionError,
                    OSError):
                pass
        finally:
            if complete:
                response.release()
            else:  # the rest is never read: the connection cannot be reused
                response.close()
            if call_timeout is not None:
                call_timeout.reschedule(deadline)
        return HttpReply(response.status, dict(response.headers), b"".join(parts)[:MAX_REPLY_BYTES])


async def read_head(stream: aiohttp.StreamReader, limit: int,
                    parts: list[bytes] | None = None) -> bool:
    """Read the body into ``parts`` until its end or ``limit`` bytes, whichever comes first;
    the rest is left unread. True when the whole body was read. ``parts`` holds what came
    even when the read is cancelled (a deadline)."""
    parts = [] if parts is None else parts
    size = 0
    async for chunk in stream.iter_any():
        parts.append(chunk)
        size += len(chunk)
        if size >= limit:
            return stream.at_eof()
    return True


# What no PostgreSQL text column or stream payload can hold: NUL, and a lone surrogate (how
# Python keeps a byte that was no UTF-8, as aiosmtplib reads a reply in Latin-1).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable(text: str) -> str:
    """``text`` with each character no timeline row or outcome event can hold as U+FFFD."""
    return _UNSTORABLE.sub("\ufffd", text)


def quoted(text: str, limit: int = 300) -> str:
    """A provider's words as a timeline row quotes them: one line, at most ``limit``
    characters, and nothing the row's text column refuses."""
    # The timeline's text column takes no NUL, whatever a proxy's error page holds.
    text = storable(" ".join(text.strip().splitlines()))
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def error_detail(reply: HttpReply, limit: int = 300) -> str:
    """A short description of a provider's error answer for logs and the timeline."""
    text = quoted(reply.body.decode("utf-8", "replace"), limit)
    return f"HTTP {reply.status}: {text}" if text else f"HTTP {reply.status}"
