"""SMS through Twilio's Messages API (form POST, Basic auth with the account SID and token).

Twilio has no idempotency key: a retry after a lost response sends the SMS again (the
documented duplicate). Twilio has no metadata field either; the task id travels in the
``X-Notifkit-Task-Id`` header only. Each message names ``NOTIFKIT_PUBLIC_URL`` +
``/v1/webhooks/twilio/{projectId}`` as its ``StatusCallback``, the URL its receipts are
verified against.
"""

from __future__ import annotations

import base64
from typing import Any
from urllib.parse import quote

from notifkit.config import check_base_url, check_path_segment, check_sender_number
from notifkit.transports.base import (
    HttpReply,
    HttpTransport,
    Message,
    Outcome,
    SendResult,
    classify_status,
    error_detail,
)

# Error codes that mean the number can never receive from us: invalid number, unsubscribed
# (the recipient replied STOP), not a mobile number, unreachable/blocked destination. Not
# 21408 ("permission to send an SMS has not been enabled for the region"): that is the
# account's geographic permissions, fixed in Twilio's console, after which the number works;
# disabling the contact would have lost every number of that country for good, so it is a
# rejection like any other (dead-lettered, replayed once the region is enabled).
INVALID_NUMBER_CODES = frozenset({21211, 21610, 21614, 21612})
RATE_LIMIT_CODES = frozenset({20429})


class TwilioTransport(HttpTransport):
    channel: str = "sms"
    provider: str = "twilio"
    idempotent: bool = False

    def __init__(self, *, account_sid: str, auth_token: str, from_number: str,
                 base_url: str = "https://api.twilio.com", public_url: str | None = None,
                 **options: Any) -> None:
        super().__init__(base_url=base_url, **options)
        self.account_sid = account_sid
        credentials = base64.b64encode(f"{account_sid}:{auth_token}".encode()).decode()
        self.authorization = f"Basic {credentials}"
        self.from_number = from_number
        self.public_url = public_url.rstrip("/") if public_url else None

    def check_arguments(self) -> None:
        super().check_arguments()
        check_path_segment(self.argument("account_sid"), self.account_sid)
        check_sender_number(self.argument("from_number"), self.from_number)
        if self.public_url is not None:
            check_base_url(self.argument("public_url"), self.public_url)

    async def _send(self, message: Message) -> SendResult:
        text = message.content.get("text")
        form = {"To": message.to, "From": self.from_number,
                "Body": text if isinstance(text, str) else str(text or "")}
        if self.public_url:
            # Twilio reports delivered/undelivered only to a message's own StatusCallback (or
            # a Messaging Service's); without it no SMS receipt would ever reach the project.
            form["StatusCallback"] = (f"{self.public_url}/v1/webhooks/twilio/"
                                      f"{quote(message.project_id, safe='')}")
        reply = await self._request(
            "POST", f"{self.base_url}/2010-04-01/Accounts/{self.account_sid}/Messages.json",
            task_id=message.task_id, data=form, headers={"Authorization": self.authorization},
        )
        return classify(reply)


def classify(reply: HttpReply) -> SendResult:
    payload = reply.json()
    detail = error_detail(reply)
    if reply.ok:
        sid = payload.get("sid") if isinstance(payload, dict) else None
        return SendResult(Outcome.SENT, sid if isinstance(sid, str) else None, "accepted",
                          reply.status)
    code = payload.get("code") if isinstance(payload, dict) else None
    if code in INVALID_NUMBER_CODES:
        return SendResult(Outcome.INVALID_RECIPIENT, None, detail, reply.status)
    if code in RATE_LIMIT_CODES:
        return SendResult(Outcome.RATE_LIMITED, None, detail, reply.status,
                          retry_after_s=reply.retry_after_s)
    return classify_status(reply, detail)
