"""Twilio Messages: `POST /2010-04-01/Accounts/{AccountSid}/Messages.json`.

HTTP Basic auth (Account SID or API key SID : Auth Token or secret; an Account SID other
than the path's is 401 20003, as Twilio answers it), form-encoded body with
`To`, `From` (or `MessagingServiceSid`) and `Body` (or `MediaUrl` / `ContentSid`).
Success is 201 with the Message resource (`sid` "SM" + 32 hex, `status` "queued"; "scheduled"
for one sent later, `ScheduleType` fixed with a `SendAt`, until its time).
Errors are `{"code", "message", "more_info", "status"}` with Twilio's error codes.

Twilio's test credentials answer fixed errors for "magic" To numbers; so does the simulator:
+15005550001 (21211 invalid number), +15005550002 (21612 cannot route),
+15005550003 (21408 no permission for region), +15005550004 (21610 unsubscribed recipient),
+15005550009 (21614 not a mobile number); and for From numbers: +15005550001 (21212 invalid
sender), +15005550007 (21606 not a message-capable number), +15005550008 (21611 queue full).
A From that is neither a phone number, a short code nor an alphanumeric sender ID is 21212.
An `error` fault with status 400 answers 21610.
Task id: `X-Notifkit-Task-Id` header, else a `notifkit_task_id` query parameter on the
message's StatusCallback URL.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import re
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

from aiohttp import web

from simulators.bodies import unsupported_message
from simulators.kinds import ErrorCase, Provider
from simulators.pipeline import (
    IDEMPOTENCY_HEADER,
    UNREADABLE_BODY,
    ErrorSpec,
    HttpProvider,
    Rejection,
    Submission,
    header_task_id,
)
from simulators.providers.common import drop_none, is_phone_number, stored_text, task_id_text
from simulators.receipts import due_in_s
from simulators.records import CANCELED, MessageRecord
from simulators.replies import Reply, json_reply
from simulators.state import SimState
from simulators.validation import http_url_problem

API_VERSION = "2010-04-01"
TASK_PARAM = "notifkit_task_id"
MAGIC_NUMBERS: dict[str, tuple[int, str]] = {
    "+15005550001": (21211, "The 'To' number {to} is not a valid phone number."),
    "+15005550002": (
        21612,
        "The 'To' phone number: {to}, is not currently reachable using the 'From' phone number "
        "via SMS.",
    ),
    "+15005550003": (
        21408,
        "Permission to send an SMS has not been enabled for the region indicated by the 'To' "
        "number: {to}.",
    ),
    "+15005550004": (21610, "Attempt to send to unsubscribed recipient"),
    "+15005550009": (21614, "'To' number is not a valid mobile number"),
}
# The test credentials' magic From numbers (+15005550006 is the one that works).
MAGIC_SENDERS: dict[str, tuple[int, str]] = {
    "+15005550001": (21212, "The 'From' number {sender} is not a valid phone number, shortcode, "
                     "or alphanumeric sender ID."),
    "+15005550007": (21606, "The 'From' phone number provided is not a valid, message-capable "
                     "Twilio phone number for this destination."),
    "+15005550008": (21611, "This 'From' number has exceeded the maximum number of queued "
                     "messages"),
}
# A sender is a phone number (E.164, optionally channel-prefixed), a short code, or an
# alphanumeric sender ID: up to 11 letters, digits and spaces, at least one letter.
_SHORT_CODE = re.compile(r"^\d{3,8}\Z")
_ALPHANUMERIC_ID = re.compile(r"^(?=.*[A-Za-z])[A-Za-z0-9 ]{1,11}\Z")
# (code, message) per case.
_ERRORS: dict[ErrorCase, tuple[int, str]] = {
    # An `error` fault with status 400 stands for the commonest per-recipient refusal.
    ErrorCase.BAD_REQUEST: (21610, "Attempt to send to unsubscribed recipient"),
    ErrorCase.MISSING_CREDENTIALS: (20003, "Authenticate"),
    ErrorCase.UNAUTHORIZED: (20003, "Authenticate"),
    ErrorCase.FORBIDDEN: (20003, "Permission Denied"),
    ErrorCase.NOT_FOUND: (20404, "The requested resource was not found"),
    ErrorCase.CONFLICT: (20409, "Conflict"),
    ErrorCase.TOO_LARGE: (21617, "The concatenated message body exceeds the 1600 character limit."),
    ErrorCase.INVALID_RECIPIENT: (21211, "The 'To' number {to} is not a valid phone number."),
    ErrorCase.RATE_LIMITED: (20429, "Too Many Requests"),
    ErrorCase.QUOTA_EXCEEDED: (20429, "Too Many Requests"),
    ErrorCase.SERVER_ERROR: (20500, "An internal server error has occurred"),
    ErrorCase.UNAVAILABLE: (20503, "Service unavailable"),
}
MAX_BODY_CHARS = 1600
MAX_VALIDITY_S = 36_000  # ValidityPeriod: at most 10 hours
MAX_SCHEDULE_AHEAD_S = 35 * 86_400  # SendAt: at most 35 days ahead


class Twilio(HttpProvider):
    provider = Provider.TWILIO
    status_overrides: ClassVar[dict[ErrorCase, int]] = {}

    def credentials(self, request: web.Request) -> str | None:
        """Twilio meters the account in the path, whether the request authenticates with the
        account's own SID and token or with one of its API keys (SK...). An account SID as the
        user authenticates that account only: another account's path is a 401 (20003)."""
        user, token = basic_auth(request)
        account_sid = request.match_info["sid"]
        if not user or not token or (user.startswith("AC") and user != account_sid):
            return None
        return "account:" + account_sid

    async def parse(self, request: web.Request, body: bytes, state: SimState) -> Submission:
        account_sid = request.match_info["sid"]
        try:
            form = parse_qs(body.decode("utf-8"), keep_blank_values=True)
        except UnicodeDecodeError:
            raise twilio_error(21602, "Message body is required.") from None
        fields = {name: values[0] for name, values in form.items() if values}
        to = fields.get("To", "").strip()
        sender = fields.get("From", "").strip()
        service = fields.get("MessagingServiceSid", "").strip()
        text = fields.get("Body", "")
        media = form.get("MediaUrl", [])
        if not to:
            raise twilio_error(21604, "A 'To' phone number is required.")
        if not sender and not service:
            raise twilio_error(21603, "A 'From' phone number is required.")
        if not text and not media and not fields.get("ContentSid"):
            raise twilio_error(21602, "Message body is required.")
        if len(text) > MAX_BODY_CHARS:
            raise twilio_error(21617, _ERRORS[ErrorCase.TOO_LARGE][1])
        if not is_phone_number(to):
            raise twilio_error(21211, _ERRORS[ErrorCase.INVALID_RECIPIENT][1].format(to=to))
        if sender and not _valid_sender(sender):
            raise twilio_error(21212, MAGIC_SENDERS["+15005550001"][1].format(sender=sender))
        if sender in MAGIC_SENDERS:
            code, message = MAGIC_SENDERS[sender]
            raise twilio_error(code, message.format(sender=sender))
        if sender == to:
            # A number cannot message itself; a channel address (whatsapp:...) has its own code.
            if ":" in to:
                raise twilio_error(63031, "Channels message cannot have same 'From' and 'To'")
            raise twilio_error(21266, "'To' and 'From' numbers cannot be the same")
        if to in MAGIC_NUMBERS:
            code, message = MAGIC_NUMBERS[to]
            raise twilio_error(code, message.format(to=to))
        bad_media = [url for url in media if not _absolute_http_url(url)]
        if bad_media:
            raise twilio_error(21620, f"Invalid media URL(s): {', '.join(bad_media)[:200]}")
        validity = fields.get("ValidityPeriod")
        if validity is not None and not _valid_period(validity):
            raise twilio_error(21624, "Validity period can only be set to integers between 1 and "
                                f"{MAX_VALIDITY_S:,} seconds ({MAX_VALIDITY_S // 3600} hours max).")
        callback = fields.get("StatusCallback") or None
        if callback is not None and not _absolute_http_url(callback):
            raise twilio_error(21609, f"The StatusCallback URL {callback} is not a valid URL.")
        send_at = _schedule(fields, service)
        _, auth_token = basic_auth(request)
        return Submission(
            recipients=[to],
            content=drop_none(
                {
                    "from": sender or None,
                    "to": to,
                    "body": stored_text(text),
                    "messaging_service_sid": service or None,
                    "media_url": media or None,
                    "status_callback": callback,
                    "send_at": send_at,
                }
            ),
            task_id=header_task_id(request) or _callback_task_id(callback),
            idempotency_key=request.headers.get(IDEMPOTENCY_HEADER),
            payload=form,
            meta={
                "account_sid": account_sid,
                "auth_token": auth_token,
                "status_callback": callback,
                "messaging_service_sid": service or None,
                "num_media": len(media),
                "send_at": send_at,
            },
        )

    def unreadable_body(self) -> Rejection:
        # Twilio's generic 400, "Bad Request": its default for a 400 here is 21610, an
        # unsubscribed recipient, which a client would take as the number being dead.
        return twilio_error(400, UNREADABLE_BODY)

    def malformed_request(self, status: int, detail: str) -> Reply:
        # The generic code again (400), not the 21610 an unsubscribed recipient gets.
        return self.render(ErrorCase.BAD_REQUEST, status=status, detail=detail, code=str(status))

    def unsupported_encoding(self, coding: str) -> Rejection:
        # The generic code again, not 21610: the recipient is not at fault.
        return Rejection(ErrorCase.BAD_REQUEST, unsupported_message(coding), status=415,
                         code="415")

    def new_message_id(self, state: SimState, submission: Submission) -> str:
        prefix = "MM" if submission.meta.get("num_media") else "SM"
        return prefix + state.ids.hex(32)

    def success(self, record: MessageRecord, submission: Submission, request: web.Request) -> Reply:
        return json_reply(201, message_resource(record, created=True))

    def no_route(self, method: str, path: str, status: int) -> Reply:
        if status == 405:
            return self.render(
                ErrorCase.NOT_FOUND, status=405, code="20004", detail="Method not allowed"
            )
        return self.render(
            ErrorCase.NOT_FOUND, status=status,
            detail=f"The requested resource {path} was not found",
        )

    def error(self, spec: ErrorSpec) -> Reply:
        code, message = _ERRORS[spec.case]
        if spec.code is not None:
            code = int(spec.code)
        if spec.detail:
            message = spec.detail
        message = message.replace("{to}", spec.recipient or "")
        body = {
            "code": code,
            "message": message,
            "more_info": f"https://www.twilio.com/docs/errors/{code}",
            "status": spec.status,
        }
        return json_reply(spec.status, body, retry_after_s=spec.retry_after_s)


def _valid_period(value: str) -> bool:
    """A ValidityPeriod Twilio takes: whole seconds, 1 to 36,000, in ASCII digits."""
    text = value.strip()
    # The length first: int() will not read a number of thousands of digits at all.
    return (text.isascii() and text.isdigit() and len(text) <= 6
            and 1 <= int(text) <= MAX_VALIDITY_S)


def _schedule(fields: dict[str, str], service: str) -> str | None:
    """`SendAt` of a message scheduled for later (`ScheduleType` fixed), checked as Twilio
    checks it: only a Messaging Service schedules, and the time must be one ahead; None for
    a message sent now."""
    kind = fields.get("ScheduleType", "").strip()
    if not kind:
        return None
    if kind != "fixed":
        raise twilio_error(35126, "The ScheduleType value provided is not supported for this "
                            "channel.")
    send_at = fields.get("SendAt", "").strip()
    if not send_at:
        raise twilio_error(35111, "SendAt timestamp is missing.")
    if not service:
        raise twilio_error(35118, "MessagingServiceSid is required to schedule a message.")
    try:
        moment = datetime.fromisoformat(send_at.replace("Z", "+00:00"))
    except ValueError:
        moment = None
    if moment is not None and moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    # Comparing the offsets out: a time at the end of the calendar cannot be moved to UTC.
    ahead_s = moment.timestamp() - datetime.now(UTC).timestamp() if moment else 0.0
    if not 0 < ahead_s <= MAX_SCHEDULE_AHEAD_S:
        raise twilio_error(35114, "Scheduling does not support this timestamp.")
    return send_at


def sent_at(record: MessageRecord) -> datetime | None:
    """When the message went out: None while a scheduled one waits for its time, which is
    then when it went; any other when it was accepted."""
    if due_in_s(record) > 0:
        return None
    when = record.meta.get("send_at")
    if isinstance(when, str):
        with contextlib.suppress(ValueError):
            moment = datetime.fromisoformat(when.replace("Z", "+00:00"))
            return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return record.received_at


def message_resource(record: MessageRecord, *, created: bool = False) -> dict[str, Any]:
    """The Message resource: as the create call answers it (`created`), or as it reads later,
    its status from the receipts the simulator has drawn for it."""
    account_sid = record.meta["account_sid"]
    uri = f"/{API_VERSION}/Accounts/{account_sid}/Messages/{record.id}"
    text = record.content.get("body") or ""
    received = _rfc2822(record.received_at)
    if record.meta.get(CANCELED):
        # Canceled while it waited: it never went out.
        status, date_sent = CANCELED, None
        date_updated = _rfc2822(record.last_event_at or record.received_at)
    elif due_in_s(record) > 0:
        # Until its time comes a scheduled message is only that, whatever fate it will meet.
        status, date_sent, date_updated = "scheduled", None, received
    elif created:
        status = "accepted" if record.meta.get("messaging_service_sid") else "queued"
        date_sent, date_updated = None, received
    else:
        status = _STATUS.get(record.last_event, "delivered")
        date_sent = _rfc2822(sent_at(record) or record.received_at)
        date_updated = _rfc2822(record.last_event_at or record.received_at)
    error_code, error_message = _DELIVERY_ERROR if status == "undelivered" else (None, None)
    return {
        "account_sid": account_sid,
        "api_version": API_VERSION,
        "body": text,
        "date_created": received,
        "date_sent": date_sent,
        "date_updated": date_updated,
        "direction": "outbound-api",
        "error_code": error_code,
        "error_message": error_message,
        "from": record.content.get("from"),
        "messaging_service_sid": record.meta.get("messaging_service_sid"),
        "num_media": str(record.meta.get("num_media", 0)),
        "num_segments": str(_segments(text)),
        "price": None,
        "price_unit": "USD",
        "sid": record.id,
        "status": status,
        "subresource_uris": {"media": f"{uri}/Media.json"},
        "to": record.to,
        "uri": f"{uri}.json",
    }


def _rfc2822(moment: datetime) -> str:
    return format_datetime(moment.astimezone(UTC), usegmt=False)


# Receipt events as Twilio statuses; "sent" until a receipt event is due.
_STATUS = {"sent": "sent", "delivered": "delivered", "bounced": "undelivered"}
_DELIVERY_ERROR = (30003, "Unreachable destination handset")


# The GSM 03.38 basic character set; the extension table's characters take two septets.
_GSM7 = frozenset(
    "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞÆæßÉ !\"#¤%&'()*+,-./0123456789:;<=>?"
    "¡ABCDEFGHIJKLMNOPQRSTUVWXYZÄÖÑÜ§¿abcdefghijklmnopqrstuvwxyzäöñüà")
_GSM7_EXTENDED = frozenset("^{}\\[~]|€\f")


def _segments(text: str) -> int:
    """Segments as Twilio counts them: GSM-7 fits 160 septets (153 per part of a longer
    message); any other character makes the whole message UCS-2, 70 UTF-16 code units (67 per
    part), so an emoji counts twice."""
    if all(ch in _GSM7 or ch in _GSM7_EXTENDED for ch in text):
        septets = len(text) + sum(1 for ch in text if ch in _GSM7_EXTENDED)
        return 1 if septets <= 160 else -(-septets // 153)
    units = len(text.encode("utf-16-le")) // 2
    return 1 if units <= 70 else -(-units // 67)


def _absolute_http_url(url: str) -> bool:
    return http_url_problem(url) is None


def _valid_sender(sender: str) -> bool:
    return bool(
        is_phone_number(sender) or _SHORT_CODE.match(sender) or _ALPHANUMERIC_ID.match(sender)
    )


def basic_auth(request: web.Request) -> tuple[str, str]:
    scheme, _, encoded = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return "", ""
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return "", ""
    user, _, password = decoded.partition(":")
    return user, password


def twilio_error(code: int, message: str) -> Rejection:
    """A 400 carrying Twilio's error ``code``."""
    return Rejection(ErrorCase.BAD_REQUEST, message, code=str(code))


def _callback_task_id(callback: str | None) -> str | None:
    if not callback:
        return None
    values = parse_qs(urlsplit(callback).query).get(TASK_PARAM)
    return task_id_text(values[0]) if values else None
