"""What the simulators remember: accepted messages and how often each task was accepted.

Memory is bounded: messages live in a ring buffer (`max_messages`, oldest dropped first) and
the per-task acceptance counters in an LRU map a few times larger, so a long staging run
keeps a steady footprint while recent duplicates are still detected.
"""

from __future__ import annotations

import json
from collections import OrderedDict, deque
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, TypedDict

from notifkit.clock import iso
from simulators.kinds import Provider
from simulators.recipients import same_recipient

try:  # orjson (notifkit's "fast" extra) when installed
    import orjson as _orjson
except ImportError:  # pragma: no cover - the plain json module does the same, slower
    _orjson = None  # type: ignore[assignment]

DEFAULT_MAX_MESSAGES = 10_000
# A task id is kept to this many characters, wherever it came from; a `taskId` filter is
# cut the same way, so an over-long id still finds its messages.
MAX_TASK_ID_CHARS = 256
# Task counters outlive their messages so a duplicate is still seen after the buffer turned.
TASK_COUNTERS_PER_MESSAGE = 4


class MessageItem(TypedDict):
    """A record as `GET /_sim/messages` shows it."""

    id: str
    provider: str
    to: str
    taskId: str | None
    idempotencyKey: str | None
    receivedAt: str
    acceptCount: int
    content: dict[str, Any]


def scrub(value: Any) -> Any:
    """``value`` with every string writable as UTF-8: a lone surrogate (an SMTP envelope or a
    header byte that was not UTF-8) becomes U+FFFD, so listing what was stored never fails."""
    if isinstance(value, str):
        if value.isascii():
            return value
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
        return value
    # Containers are copied only when something inside changed: every accepted message
    # passes through here, and almost none needs it.
    if isinstance(value, dict):
        items = [(scrub(k), scrub(v)) for k, v in value.items()]
        if all(k is k0 and v is v0 for (k, v), (k0, v0) in zip(items, value.items(),
                                                                 strict=True)):
            return value
        return dict(items)
    if isinstance(value, list):
        scrubbed = [scrub(v) for v in value]
        return value if all(a is b for a, b in zip(scrubbed, value, strict=True)) else scrubbed
    return value


def has_lone_surrogate(value: Any) -> bool:
    return scrub(value) is not value


# A message canceled before it went out (a scheduled Twilio message): its mark in ``meta``,
# and the status it reads from then on.
CANCELED = "canceled"


class MessageRecord:
    """One accepted message.

    Once stored, its content is kept as compact JSON text and parsed when read. As dicts and
    lists, a full store (the benchmark keeps 150,000 messages) was about six objects per
    message for the garbage collector, and each full collection walked them all: it paused
    the simulator 90-160 ms under load, which showed up as notifkit's p99. Text is one
    object the collector never visits, and smaller.
    """

    __slots__ = ("_content", "accept_count", "id", "idempotency_key", "last_event",
                 "last_event_at", "meta", "provider", "received_at", "recipients", "task_id")

    def __init__(
        self,
        id: str,  # the provider's own message id, as returned to the client
        provider: Provider,
        recipients: list[str],
        task_id: str | None,
        idempotency_key: str | None,
        content: dict[str, Any],
        received_at: datetime | None = None,
        accept_count: int = 1,
        meta: dict[str, Any] | None = None,
        last_event: str = "sent",
        last_event_at: datetime | None = None,
    ) -> None:
        self.id = id
        self.provider = provider
        self.recipients = recipients
        self.task_id = task_id
        self.idempotency_key = idempotency_key
        self._content: dict[str, Any] | str = content
        self.received_at = received_at or datetime.now(UTC)
        self.accept_count = accept_count
        # Provider-side facts that receipts need but the control API does not show.
        self.meta: dict[str, Any] = meta if meta is not None else {}
        # What the provider last knows of the message's fate, as its own read API reports it
        # (Resend `last_event`, Twilio `status`): "sent" until a receipt event happens.
        self.last_event = last_event
        self.last_event_at = last_event_at

    def __repr__(self) -> str:
        return (f"MessageRecord(id={self.id!r}, provider={self.provider.value!r}, "
                f"to={self.to!r}, task_id={self.task_id!r})")

    @property
    def content(self) -> dict[str, Any]:
        """The content as accepted (a new dict on every read once stored)."""
        content = self._content
        return json.loads(content) if isinstance(content, str) else content

    @content.setter
    def content(self, value: dict[str, Any]) -> None:
        self._content = value

    def pack(self) -> None:
        """Keep the content as JSON text from now on (see the class docstring)."""
        if not isinstance(self._content, str):
            self._content = _compact_json(self._content)

    def note_event(self, event: str) -> None:
        self.last_event = event
        self.last_event_at = datetime.now(UTC)

    @property
    def to(self) -> str:
        return self.recipients[0] if self.recipients else ""

    def to_item(self) -> MessageItem:
        return {
            "id": self.id,
            "provider": self.provider.value,
            "to": self.to,
            "taskId": self.task_id,
            "idempotencyKey": self.idempotency_key,
            "receivedAt": iso(self.received_at),
            "acceptCount": self.accept_count,
            "content": self.content,
        }


def _compact_json(value: Any) -> str:
    """``value`` as JSON text writable as UTF-8. Writing it is what finds a lone surrogate,
    so :func:`scrub` walks the value only when one is there: almost never."""
    if _orjson is not None:
        try:
            return _orjson.dumps(value).decode()
        except TypeError:  # a lone surrogate, or what orjson cannot write (big integers)
            pass
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode()
    except UnicodeEncodeError:
        return json.dumps(scrub(value), ensure_ascii=False, separators=(",", ":"))
    return text


class MessageStore:
    def __init__(self, max_messages: int = DEFAULT_MAX_MESSAGES) -> None:
        self.max_messages = max_messages
        self._messages: deque[MessageRecord] = deque(maxlen=max_messages)
        # Keyed by the provider's name, not the enum: a tuple of strings is one the collector
        # stops tracking.
        self._accepts: OrderedDict[tuple[str, str, str], int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._messages)

    def __iter__(self) -> Iterator[MessageRecord]:
        return iter(self._messages)

    def add(self, record: MessageRecord) -> MessageRecord:
        """Store an accepted message; its `accept_count` says how often its task was accepted
        for this recipient (a push task to two devices is two messages, not a duplicate)."""
        record.recipients = scrub(record.recipients)
        record.task_id = scrub(record.task_id)
        record.idempotency_key = scrub(record.idempotency_key)
        record.pack()  # the content, scrubbed where it needs it
        if record.task_id is not None:
            key = (record.provider.value, record.task_id, record.to)
            record.accept_count = self._accepts.pop(key, 0) + 1
            self._accepts[key] = record.accept_count
            while len(self._accepts) > self.max_messages * TASK_COUNTERS_PER_MESSAGE:
                self._accepts.popitem(last=False)
        self._messages.append(record)
        return record

    def query(
        self,
        *,
        provider: Provider | None = None,
        to: str | None = None,
        task_id: str | None = None,
        limit: int = 1000,
    ) -> list[MessageRecord]:
        """Newest first. `to` matches any recipient of a message (see recipients.py)."""
        found: list[MessageRecord] = []
        for record in reversed(self._messages):
            if len(found) >= limit:
                break
            if provider is not None and record.provider is not provider:
                continue
            if task_id is not None and record.task_id != task_id:
                continue
            if to is not None and not any(same_recipient(r, to) for r in record.recipients):
                continue
            found.append(record)
        return found

    def find(self, provider: Provider, message_id: str) -> MessageRecord | None:
        """The newest record of ``provider`` with the provider's message id ``message_id``."""
        for record in reversed(self._messages):
            if record.id == message_id and record.provider is provider:
                return record
        return None

    def clear(self) -> None:
        self._messages.clear()
        self._accepts.clear()
