"""Email through SendGrid's v3 Mail Send API (``POST /v3/mail/send``).

SendGrid has no idempotency key: a retry after a lost response sends the email again (the
documented duplicate). The task id travels in ``custom_args.notifkit_task_id``, which SendGrid
echoes in its event webhooks, and in the ``X-Notifkit-Task-Id`` header.
"""

from __future__ import annotations

import dataclasses
from email.utils import parseaddr
from typing import Any

from notifkit.transports.base import (
    METADATA_FIELD,
    HttpReply,
    Message,
    Outcome,
    SendResult,
    classify_status,
    error_detail,
    header,
    parse_reset_at,
)
from notifkit.transports.email import HttpEmailTransport, build_email


class SendgridTransport(HttpEmailTransport):
    provider: str = "sendgrid"
    idempotent: bool = False

    def __init__(self, *, api_key: str, from_addr: str,
                 base_url: str = "https://api.sendgrid.com", **options: Any) -> None:
        super().__init__(api_key=api_key, from_addr=from_addr, base_url=base_url, **options)

    async def _send(self, message: Message) -> SendResult:
        email = build_email(message, self.from_addr)
        name, address = _split_address(email.from_addr)
        sender: dict[str, str] = {"email": address}
        if name:
            sender["name"] = name
        content = []
        if email.text:
            content.append({"type": "text/plain", "value": email.text})
        if email.html:
            content.append({"type": "text/html", "value": email.html})
        if not content:  # SendGrid refuses an empty block and a message without one
            content.append({"type": "text/plain", "value": " "})
        body: dict[str, Any] = {
            "personalizations": [{"to": [{"email": email.to}]}],
            "from": sender,
            "subject": email.subject,
            "content": content,
            "headers": email.headers,
            "custom_args": {METADATA_FIELD: message.task_id},
        }
        reply = await self._request(
            "POST", f"{self.base_url}/v3/mail/send", task_id=message.task_id, json_body=body,
            headers={"Authorization": f"Bearer {self.api_key}"},
        )
        return classify(reply)


def classify(reply: HttpReply) -> SendResult:
    detail = error_detail(reply)
    if reply.ok:
        return SendResult(Outcome.SENT, header(reply, "X-Message-Id"), "accepted",
                          reply.status)
    payload = reply.json()
    errors = payload.get("errors") if isinstance(payload, dict) else None
    if reply.status == 400 and isinstance(errors, list):
        for error in errors:
            where = str(error.get("field") or "") if isinstance(error, dict) else ""
            if where.startswith("personalizations") and ".to" in where:
                return SendResult(Outcome.INVALID_RECIPIENT, None, detail, reply.status)
    result = classify_status(reply, detail)
    if result.outcome is Outcome.RATE_LIMITED and result.retry_after_s is None:
        # SendGrid names when its window reopens (X-RateLimit-Reset, a Unix time), not a
        # Retry-After: parked for the default second, a task met another 429 each time and was
        # dead-lettered long before the window reopened.
        reset = parse_reset_at(header(reply, "X-RateLimit-Reset"))
        result = dataclasses.replace(result, retry_after_s=reset)
    return result


def _split_address(value: str) -> tuple[str, str]:
    """``"Name <a@b>"`` -> ("Name", "a@b"); a bare address has no name.

    Read by RFC 5322, as EMAIL_FROM is checked: a quoted name may hold ``<`` and escaped
    quotes. Cut at its first ``<``, ``"Ops <team>" <a@b>`` gave an address SendGrid refused
    on every send, and a name's escaped quote kept its backslash in the recipient's inbox."""
    return parseaddr(value)
