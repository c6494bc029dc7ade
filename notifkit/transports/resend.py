"""Email through Resend's HTTP API (``POST /emails``), or anything that speaks it.

The task id is the ``Idempotency-Key`` (Resend keeps keys 24 h and answers a repeated request
with the first answer), so a retry after a lost response sends nothing twice. The task id is
also a tag (``notifkit_task_id``) that comes back in Resend's webhooks.
"""

from __future__ import annotations

from typing import Any

from notifkit.transports.base import (
    METADATA_FIELD,
    HttpReply,
    Message,
    Outcome,
    SendResult,
    TransportContext,
    classify_status,
    error_detail,
)
from notifkit.transports.email import HttpEmailTransport, build_email

# Resend's error names (``{"name": ..., "message": ...}``) that mean the address is bad.
_INVALID_RECIPIENT_NAMES = {"invalid_to_address", "invalid_recipient"}


class ResendTransport(HttpEmailTransport):
    provider: str = "resend"
    idempotent: bool = True

    def __init__(self, *, api_key: str, from_addr: str,
                 base_url: str = "https://api.resend.com", **options: Any) -> None:
        super().__init__(api_key=api_key, from_addr=from_addr, base_url=base_url, **options)
        self._send_idempotency_key = True

    async def open(self, ctx: TransportContext) -> None:
        await super().open(ctx)
        # Test-only fault (config.FAULT_INJECTIONS): the scenarios show what the key prevents.
        settings = getattr(ctx, "settings", None)  # tests may open a transport without one
        self._send_idempotency_key = not (settings and settings.injects("drop_idempotency_key"))

    async def _send(self, message: Message) -> SendResult:
        email = build_email(message, self.from_addr)
        body: dict[str, Any] = {
            "from": email.from_addr,
            "to": [email.to],
            "subject": email.subject,
            "headers": email.headers,
            "tags": [{"name": METADATA_FIELD, "value": message.task_id}],
        }
        if email.html is not None:
            body["html"] = email.html
        if email.text is not None:
            body["text"] = email.text
        headers = {"Authorization": f"Bearer {self.api_key}"}
        if self._send_idempotency_key:
            headers["Idempotency-Key"] = message.task_id
        reply = await self._request(
            "POST", f"{self.base_url}/emails", task_id=message.task_id, json_body=body,
            headers=headers,
        )
        return classify(reply)


def classify(reply: HttpReply) -> SendResult:
    payload = reply.json()
    detail = error_detail(reply)
    if reply.ok:
        message_id = payload.get("id") if isinstance(payload, dict) else None
        return SendResult(Outcome.SENT, message_id if isinstance(message_id, str) else None,
                          "accepted", reply.status)
    name = payload.get("name") if isinstance(payload, dict) else None
    text = str(payload.get("message", "")) if isinstance(payload, dict) else ""
    if name in _INVALID_RECIPIENT_NAMES or (
        reply.status == 422 and name == "validation_error" and "`to`" in text
    ):
        return SendResult(Outcome.INVALID_RECIPIENT, None, detail, reply.status)
    if reply.status == 409 and name == "concurrent_idempotent_requests":
        # The first request under this key is still being processed: try again later.
        return SendResult(Outcome.RETRY, None, detail, reply.status, maybe_accepted=True)
    return classify_status(reply, detail)
