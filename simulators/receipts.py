"""Delivery receipts: after a message is accepted, post its fate to a webhook, signed.

`POST /_sim/receipts {"url", "secret", "delayMs"?, "delivered"?, "bounced"?, "complained"?,
"opened"?, "clicked"?}` turns receipts on. For each accepted message the simulator draws,
always in the same order and from its own seeded random source:

    bounced?                  -> a bounce (Twilio: "undelivered") and nothing else
    otherwise delivered?      -> a delivery, then each of complained?, opened?, clicked?
    otherwise                 -> no receipt at all (the provider never reported)

Defaults: delivered 1, everything else 0. Resend's test addresses decide for themselves:
delivered@resend.dev, bounced@resend.dev and complained@resend.dev.

Formats, as each provider posts them:
- Resend: JSON event `{"type": "email.delivered", "created_at", "data": {...}}`, Svix-signed
  with `secret`.
- Twilio: the form-encoded status callback (MessageSid, MessageStatus, ...) to the message's
  own StatusCallback if it had one, else to `url`; signed with X-Twilio-Signature using the
  Auth Token the message was sent with, as Twilio does.
- SendGrid: its Event Webhook's JSON list, one event per post: `[{"email", "timestamp",
  "event": "delivered" | "bounce" | "spamreport" | "open" | "click", "sg_event_id",
  "sg_message_id": "{X-Message-Id}.filter…", "smtp-id", ...the send's custom_args}]`,
  Svix-signed with `secret` (the scheme SIMULATORS.md gives every provider but Twilio).
- SMTP, FCM: JSON `{"type": "email.delivered" | "push.delivered" ..., "created_at",
  "data": {"provider", "message_id", "to", "task_id"}}`, Svix-signed with `secret`.
OpenAI completions get no receipts.
"""

from __future__ import annotations

import asyncio
import binascii
import hashlib
import json
import logging
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypedDict
from urllib.parse import urlencode

import aiohttp

from notifkit.clock import iso
from simulators.kinds import Provider
from simulators.records import CANCELED, MessageRecord
from simulators.signing import svix_headers, svix_key, twilio_sign
from simulators.validation import (
    ControlError,
    get_int,
    get_number,
    get_str,
    http_url_problem,
    reject_unknown,
    require_object,
)

log = logging.getLogger("simulators.receipts")

EVENTS = ("delivered", "bounced", "complained", "opened", "clicked")
ATTEMPTS = 3
FIRST_BACKOFF_S = 0.25
POST_TIMEOUT_S = 10.0
MAX_DELAY_MS = 3_600_000
RESEND_TEST_ADDRESSES = {
    "delivered@resend.dev": ("delivered",),
    "bounced@resend.dev": ("bounced",),
    "complained@resend.dev": ("delivered", "complained"),
}
# Which events a channel can report at all.
_CHANNEL_EVENTS: dict[Provider, tuple[str, ...]] = {
    Provider.RESEND: EVENTS,
    Provider.SENDGRID: EVENTS,
    Provider.SMTP: EVENTS,
    Provider.TWILIO: ("delivered", "bounced"),
    Provider.FCM: ("delivered", "bounced", "opened", "clicked"),
    Provider.OPENAI: (),
}
_CHANNEL = {Provider.FCM: "push", Provider.TWILIO: "sms"}


class ReceiptsItem(TypedDict):
    enabled: bool
    url: str | None
    delayMs: int
    probabilities: dict[str, float]
    sent: int
    failed: int
    pending: int


@dataclass(frozen=True)
class ReceiptConfig:
    url: str
    secret: str
    delay_ms: int = 0
    probabilities: dict[str, float] = field(default_factory=lambda: {"delivered": 1.0})

    def p(self, event: str) -> float:
        return self.probabilities.get(event, 0.0)


def parse_config(payload: object) -> ReceiptConfig:
    body = require_object(payload, "receipts")
    reject_unknown(body, ("url", "secret", "delayMs", *EVENTS), "receipts")
    url = get_str(body, "url", required=True)
    assert url is not None
    problem = http_url_problem(url)
    if problem is not None:
        raise ControlError(f"'url' must be an absolute http(s) URL ({problem}), got {url[:80]!r}")
    secret = get_str(body, "secret", required=True, max_len=512)
    assert secret is not None
    try:
        svix_key(secret)
    except (ValueError, binascii.Error):
        raise ControlError("'secret' starting whsec_ must continue in base64") from None
    delay_ms = get_int(body, "delayMs", minimum=0, maximum=MAX_DELAY_MS) or 0
    probabilities = {"delivered": 1.0}
    for event in EVENTS:
        value = get_number(body, event, minimum=0.0, maximum=1.0)
        if value is not None:
            probabilities[event] = value
    return ReceiptConfig(url=url, secret=secret, delay_ms=delay_ms, probabilities=probabilities)


# Where each provider that schedules keeps a message's time (an ISO 8601 text): Resend's
# `scheduled_at`, Twilio's `SendAt`, SendGrid's `send_at` (a Unix time on the wire).
_SCHEDULED_AT = {Provider.RESEND: "scheduled_at", Provider.TWILIO: "send_at",
                 Provider.SENDGRID: "send_at"}


def due_in_s(record: MessageRecord) -> float:
    """Seconds until a message scheduled for later (a Resend email's `scheduled_at`, a Twilio
    message's `SendAt`, a SendGrid message's `send_at`) is sent; 0 for one sent now, or whose
    time the simulator does not read (Resend's natural language, "in 1 min")."""
    key = _SCHEDULED_AT.get(record.provider)
    when = record.meta.get(key) if key else None
    if not isinstance(when, str):
        return 0.0
    try:
        moment = datetime.fromisoformat(when.strip().replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return max((moment - datetime.now(UTC)).total_seconds(), 0.0)


def draw_events(config: ReceiptConfig, record: MessageRecord, rng: random.Random) -> list[str]:
    """The receipts one message gets; always five draws so the sequence stays replayable."""
    draws = {event: rng.random() for event in EVENTS}
    allowed = _CHANNEL_EVENTS[record.provider]
    forced = RESEND_TEST_ADDRESSES.get(record.to.lower()) if allowed == EVENTS else None
    if forced is not None:
        return list(forced)
    if not allowed:
        return []
    if draws["bounced"] < config.p("bounced"):
        return ["bounced"]
    if draws["delivered"] >= config.p("delivered"):
        return []
    extra = [e for e in ("complained", "opened", "clicked") if draws[e] < config.p(e)]
    return [e for e in ["delivered", *extra] if e in allowed]


@dataclass(frozen=True)
class Delivery:
    """One HTTP post of one receipt."""

    url: str
    body: bytes
    headers: dict[str, str]


def build_delivery(config: ReceiptConfig, record: MessageRecord, event: str) -> Delivery:
    now = iso(datetime.now(UTC))
    if record.provider is Provider.TWILIO:
        return _twilio_delivery(config, record, event)
    if record.provider is Provider.SENDGRID:
        body = json.dumps([_sendgrid_event(record, event)], ensure_ascii=False).encode()
        return Delivery(url=config.url, body=body, headers={
            "Content-Type": "application/json", **svix_headers(config.secret, body)})
    if record.provider is Provider.RESEND:
        payload: dict[str, Any] = {
            "type": f"email.{event}",
            "created_at": now,
            "data": _resend_data(record, event),
        }
    else:
        channel = _CHANNEL.get(record.provider, "email")
        payload = {
            "type": f"{channel}.{event}",
            "created_at": now,
            "data": {
                "provider": record.provider.value,
                "message_id": record.id,
                "to": record.to,
                "task_id": record.task_id,
            },
        }
    body = json.dumps(payload, ensure_ascii=False).encode()
    headers = {"Content-Type": "application/json", **svix_headers(config.secret, body)}
    return Delivery(url=config.url, body=body, headers=headers)


# The simulators' event names in SendGrid's words.
_SENDGRID_EVENTS = {"delivered": "delivered", "bounced": "bounce", "complained": "spamreport",
                    "opened": "open", "clicked": "click"}


def _sendgrid_event(record: MessageRecord, event: str) -> dict[str, Any]:
    now = datetime.now(UTC)
    content = record.content
    # SendGrid echoes a send's custom_args as top-level fields of each of its events.
    custom = content.get("custom_args")
    item: dict[str, Any] = dict(custom) if isinstance(custom, dict) else {}
    item.update({
        "email": record.to,
        "timestamp": int(now.timestamp()),
        "event": _SENDGRID_EVENTS[event],
        # One id per message and event, as SendGrid keeps an event's id when it posts again.
        "sg_event_id": hashlib.sha256(f"{record.id}:{event}".encode()).hexdigest()[:22],
        # The message id SendGrid answered (X-Message-Id) plus its filter suffix.
        "sg_message_id": f"{record.id}.filterdrecv-0-0",
        "smtp-id": f"<{record.id}@ismtpd0001p1mdw1.sendgrid.net>",
    })
    if event == "bounced":
        item.update({"type": "bounce", "status": "5.1.1",
                     "bounce_classification": "Invalid Address",
                     "reason": "550 5.1.1 The email account that you tried to reach does "
                               "not exist."})
    elif event == "clicked":
        item.update({"url": "https://example.com/", "useragent": "notifkit-simulators",
                     "ip": "127.0.0.1"})
    elif event == "opened":
        item.update({"useragent": "notifkit-simulators", "ip": "127.0.0.1",
                     "sg_machine_open": False})
    return item


def _resend_data(record: MessageRecord, event: str) -> dict[str, Any]:
    content = record.content
    data: dict[str, Any] = {
        "created_at": iso(record.received_at),
        "email_id": record.id,
        "from": content.get("from"),
        "to": list(record.recipients),
        "subject": content.get("subject"),
    }
    tags = record.meta.get("tags")
    if tags:
        data["tags"] = tags
    if event == "bounced":
        data["bounce"] = {
            "message": "The recipient's email provider sent a hard bounce message.",
            "subType": "General",
            "type": "Permanent",
        }
    elif event == "clicked":
        data["click"] = {
            "ipAddress": "127.0.0.1",
            "link": "https://example.com/",
            "timestamp": iso(datetime.now(UTC)),
            "userAgent": "notifkit-simulators",
        }
    return data


def _twilio_delivery(config: ReceiptConfig, record: MessageRecord, event: str) -> Delivery:
    status = "delivered" if event == "delivered" else "undelivered"
    params = {
        "AccountSid": record.meta.get("account_sid", ""),
        "ApiVersion": "2010-04-01",
        "From": record.content.get("from") or "",
        "MessageSid": record.id,
        "MessageStatus": status,
        "SmsSid": record.id,
        "SmsStatus": status,
        "To": record.to,
    }
    if status == "undelivered":
        params["ErrorCode"] = "30003"  # Unreachable destination handset
    url = record.meta.get("status_callback") or config.url
    signature = twilio_sign(record.meta.get("auth_token", ""), url, params)
    return Delivery(
        url=url,
        body=urlencode(params).encode(),
        headers={
            "Content-Type": "application/x-www-form-urlencoded",
            "X-Twilio-Signature": signature,
        },
    )


class ReceiptSender:
    """Posts receipts in the background; `drain()` waits until every scheduled one is done."""

    def __init__(self, seed: int) -> None:
        self.config: ReceiptConfig | None = None
        self.sent = 0
        self.failed = 0
        self._rng = random.Random(f"receipts:{seed}")
        self._tasks: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None

    def reseed(self, seed: int) -> None:
        self._rng = random.Random(f"receipts:{seed}")

    def configure(self, payload: object) -> ReceiptsItem:
        self.config = parse_config(payload)
        return self.item()

    def disable(self) -> None:
        self.config = None

    def item(self) -> ReceiptsItem:
        config = self.config
        return {
            "enabled": config is not None,
            "url": config.url if config else None,
            "delayMs": config.delay_ms if config else 0,
            "probabilities": dict(config.probabilities) if config else {},
            "sent": self.sent,
            "failed": self.failed,
            "pending": len(self._tasks),
        }

    def schedule(self, record: MessageRecord) -> None:
        config = self.config
        if config is None:
            # No receipts to tell of it: the message simply reached its recipient (or met
            # the fate a Resend test address forces), and the provider's read API says so.
            forced = RESEND_TEST_ADDRESSES.get(record.to.lower())
            if record.provider is Provider.RESEND and forced is not None:
                record.note_event(forced[-1])
            elif _CHANNEL_EVENTS[record.provider]:
                record.note_event("delivered")
            return
        events = draw_events(config, record, self._rng)
        if not events:
            return
        task = asyncio.get_running_loop().create_task(self._send_all(config, record, events))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self, timeout_s: float = 30.0) -> None:
        if self._tasks:
            await asyncio.wait_for(asyncio.gather(*self._tasks, return_exceptions=True), timeout_s)

    def cancel_pending(self) -> None:
        """Drop every receipt not yet posted: their messages are being forgotten, and a
        receipt arriving after a reset would land in the next test's webhook endpoint."""
        for task in self._tasks:
            task.cancel()
        # Not pending any more, even before the loop runs their cancellation.
        self._tasks.clear()

    async def close(self) -> None:
        tasks = list(self._tasks)
        self.cancel_pending()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    def reset_counters(self) -> None:
        self.sent = 0
        self.failed = 0

    async def _send_all(
        self, config: ReceiptConfig, record: MessageRecord, events: list[str]
    ) -> None:
        # Nothing happens to a scheduled message before it is sent.
        wait_s = config.delay_ms / 1000.0 + due_in_s(record)
        if wait_s:
            await asyncio.sleep(wait_s)
        if record.meta.get(CANCELED):
            return  # canceled while it waited (Twilio): it never went out
        for event in events:
            # The event has happened whether or not its webhook gets through.
            record.note_event(event)
            if self.config is None:
                # Receipts were turned off while this one waited: nobody is told any more.
                continue
            await self._post(build_delivery(config, record, event), record, event)

    async def _post(self, delivery: Delivery, record: MessageRecord, event: str) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=POST_TIMEOUT_S)
            )
        problem = ""
        for attempt in range(ATTEMPTS):
            if attempt:
                await asyncio.sleep(FIRST_BACKOFF_S * 2 ** (attempt - 1))
            try:
                async with self._session.post(
                    delivery.url, data=delivery.body, headers=delivery.headers
                ) as response:
                    if response.status < 300:
                        self.sent += 1
                        return
                    problem = f"HTTP {response.status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                problem = repr(exc)
        self.failed += 1
        log.warning(
            "Receipt %s for %s message %s could not be posted to %s after %d attempts (%s); "
            "it is dropped.",
            event,
            record.provider.value,
            record.id,
            delivery.url,
            ATTEMPTS,
            problem,
        )
