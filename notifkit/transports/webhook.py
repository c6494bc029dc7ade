"""Webhooks: a JSON POST to the user's https URL, signed with ``NOTIFKIT_SECRET``.

    POST <contact target>
    Content-Type: application/json
    X-Notifkit-Task-Id: <task id>            (the same on every retry: deduplicate on it)
    X-Notifkit-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>

    {"id": taskId, "type": "notification", "eventId", "projectId", "userId", "template",
     "topic", "campaignId", "createdAt", "body": <the rendered body: parsed if it is
     strict JSON (no NaN or Infinity) Python can parse and write again, else the text>}

A receiver verifies by recomputing the HMAC over the timestamp and the raw body, comparing in
constant time and rejecting old timestamps. 2xx is sent; 410 Gone disables the URL; 429 parks;
408 and 5xx retry; any other 4xx, and a redirect (never followed), is a permanent failure.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any

from notifkit.transports.base import (
    HttpTransport,
    Message,
    Outcome,
    SendResult,
    classify_status,
    error_detail,
)

SIGNATURE_HEADER = "X-Notifkit-Signature"


def _parsed(rendered: Any) -> Any:
    """The rendered body as JSON when it is strict JSON, else the text itself. ``NaN`` and
    ``Infinity`` are not JSON (a receiver's parser refuses them), and JSON nested deeper than
    Python can parse or write again is sent as the text it is."""
    if not isinstance(rendered, str):
        return rendered
    try:
        return json.loads(rendered, parse_constant=_not_json)
    except (ValueError, RecursionError):
        return rendered


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _encode(document: dict[str, Any]) -> bytes:
    return json.dumps(document, ensure_ascii=False, separators=(",", ":"),
                      allow_nan=False).encode()


def sign(secret: str, body: bytes, timestamp_s: int) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp_s}.".encode() + body, hashlib.sha256)
    return f"t={timestamp_s},v1={mac.hexdigest()}"


def verify(secret: str, body: bytes, header: str, *, tolerance_s: int = 300,
           now_s: float | None = None) -> bool:
    """Check a signature header the way a receiver should (used by tests and examples)."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    now = time.time() if now_s is None else now_s
    if abs(now - timestamp) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret, body, timestamp), header)


class WebhookTransport(HttpTransport):
    channel: str = "webhook"
    provider: str = "webhook"
    idempotent: bool = False

    def __init__(self, *, secret: str, **options: Any) -> None:
        super().__init__(**options)
        self.secret = secret

    async def _send(self, message: Message) -> SendResult:
        rendered = message.content.get("body")
        document = {
            "id": message.task_id, "type": "notification", "eventId": message.event_id,
            "projectId": message.project_id, "userId": message.user_id,
            "template": message.template, "topic": message.topic,
            "campaignId": message.campaign_id, "createdAt": message.created_at,
            "body": _parsed(rendered),
        }
        try:
            raw = _encode(document)
        except (ValueError, RecursionError):
            document["body"] = rendered if isinstance(rendered, str) else str(rendered)
            raw = _encode(document)
        reply = await self._request(
            "POST", message.to, task_id=message.task_id, body=raw,
            headers={"Content-Type": "application/json",
                     SIGNATURE_HEADER: sign(self.secret, raw, int(time.time()))},
        )
        if reply.status == 410:
            return SendResult(Outcome.INVALID_RECIPIENT, None, error_detail(reply), 410)
        return classify_status(reply, "accepted" if reply.ok else error_detail(reply))
