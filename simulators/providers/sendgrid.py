"""SendGrid v3: `POST /v3/mail/send`, Bearer API key, JSON body.

Success is 202 with an empty body and the message id in `X-Message-Id`; with
`mail_settings.sandbox_mode.enable` it is 200 and nothing is sent, as at SendGrid.
Errors are `{"errors": [{"message", "field", "help"}]}`.
Task id: `X-Notifkit-Task-Id` header, else `custom_args.notifkit_task_id` (top level or in the
first personalization), else that header in the payload's `headers`.
"""

from __future__ import annotations

import base64
import binascii
import math
import string
import time
from datetime import UTC, datetime
from typing import Any, ClassVar

from aiohttp import web

from notifkit.clock import iso
from simulators.kinds import ErrorCase, Provider
from simulators.pipeline import (
    IDEMPOTENCY_HEADER,
    TASK_ID_HEADER,
    ErrorSpec,
    HttpProvider,
    Rejection,
    Submission,
    bearer_token,
    header_task_id,
)
from simulators.providers.common import (
    bare_address,
    drop_none,
    load_json,
    stored_text,
    task_id_text,
)
from simulators.records import MessageRecord
from simulators.replies import Reply, json_reply
from simulators.schema_instance import json_type
from simulators.state import SimState

TASK_ARG = "notifkit_task_id"
MAX_BODY_BYTES = 30 * 1024 * 1024
# SendGrid's limits per request: personalizations, and recipients (to + cc + bcc) across them.
MAX_PERSONALIZATIONS = 1000
MAX_RECIPIENTS = 1000
# What SendGrid's mail-send error table refuses beside the recipients and content.
MAX_SCHEDULE_AHEAD_S = 72 * 3600
MAX_CATEGORIES = 10
MAX_CATEGORY_CHARS = 255
RESERVED_HEADERS = frozenset({
    "x-sg-id", "x-sg-eid", "received", "dkim-signature", "content-type",
    "content-transfer-encoding", "to", "from", "subject", "reply-to", "cc", "bcc",
})
_HELP = "http://sendgrid.com/docs/API_Reference/Web_API_v3/Mail/errors.html"
_ID_ALPHABET = string.ascii_letters + string.digits + "-_"
_PERSONALIZATIONS_REQUIRED = (
    "The personalizations field is required and must have at least one personalization."
)
_ERRORS: dict[ErrorCase, str] = {
    ErrorCase.BAD_REQUEST: "Bad Request",
    ErrorCase.MISSING_CREDENTIALS: "authorization required",
    ErrorCase.UNAUTHORIZED: "The provided authorization grant is invalid, expired, or revoked",
    ErrorCase.FORBIDDEN: "access forbidden",
    ErrorCase.NOT_FOUND: "Not Found",
    ErrorCase.CONFLICT: "Conflict",
    ErrorCase.TOO_LARGE: "The JSON payload you have included in your request is too large.",
    ErrorCase.INVALID_RECIPIENT: "Does not contain a valid address.",
    ErrorCase.RATE_LIMITED: "too many requests",
    ErrorCase.QUOTA_EXCEEDED: "Maximum credits exceeded",
    ErrorCase.SERVER_ERROR: "An internal server error occurred.",
    ErrorCase.UNAVAILABLE: "Service Unavailable",
}


class SendGrid(HttpProvider):
    provider = Provider.SENDGRID
    status_overrides: ClassVar[dict[ErrorCase, int]] = {}

    def credentials(self, request: web.Request) -> str | None:
        return bearer_token(request)

    async def parse(self, request: web.Request, body: bytes, state: SimState) -> Submission:
        if len(body) > MAX_BODY_BYTES:
            raise Rejection(ErrorCase.TOO_LARGE)
        payload = load_json(body)
        if not isinstance(payload, dict):
            raise Rejection(ErrorCase.BAD_REQUEST, "Bad Request", field_name=None)
        personalizations = payload.get("personalizations")
        if not isinstance(personalizations, list) or not personalizations:
            raise _invalid(
                _PERSONALIZATIONS_REQUIRED, "personalizations", "#-Personalizations-Errors"
            )
        if len(personalizations) > MAX_PERSONALIZATIONS:
            raise _invalid(
                f"The personalization block is limited to {MAX_PERSONALIZATIONS} "
                f"personalizations per API request. You have provided {len(personalizations)} "
                "personalizations. Please consider splitting this into multiple requests and "
                "resending your request.",
                "personalizations",
                "#-Personalizations-Errors",
            )
        recipients: list[str] = []
        recipient_fields: list[str] = []
        for index, personalization in enumerate(personalizations):
            for address, where in _personalization_recipients(personalization, index):
                recipients.append(address)
                recipient_fields.append(where)
        if len(recipients) > MAX_RECIPIENTS:
            raise _invalid(
                f"There is a limit of {MAX_RECIPIENTS} total recipients (to + cc + bcc) per "
                "request.",
                "personalizations",
                "#-Personalizations-Errors",
            )
        sender = payload.get("from")
        if not isinstance(sender, dict) or bare_address(sender.get("email")) is None:
            raise _invalid(
                "The from object must be provided for every email send. It is an object that "
                "requires the email parameter, but may also contain a name parameter.  e.g. "
                '{"email" : "example@example.com"}  or '
                '{"email" : "example@example.com", "name" : "Example Recipient"}.',
                "from.email",
                "#message.from",
            )
        template = payload.get("template_id")
        subject = payload.get("subject")
        every_has_subject = all(isinstance(p, dict) and p.get("subject") for p in personalizations)
        if not template and not every_has_subject and not (isinstance(subject, str) and subject):
            raise _invalid(
                "The subject is required. You can get around this requirement if you use a "
                "template with a subject defined or if every personalization has a subject "
                "defined.",
                "subject",
                "#message.subject",
            )
        content = payload.get("content")
        if not template and not (isinstance(content, list) and content):
            raise _invalid(
                "Unless a valid template_id is provided, the content parameter is required. There "
                "must be at least one defined content block. We typically suggest both text/plain "
                "and text/html blocks are included, but only one block is required.",
                "content",
                "#message.content",
            )
        blocks = content if isinstance(content, list) else []
        for index, block in enumerate(blocks):
            if (
                not isinstance(block, dict)
                or not isinstance(block.get("type"), str)
                or not isinstance(block.get("value"), str)
                or not block["value"]
            ):
                raise _invalid(
                    "The content value must be a string at least one character in length.",
                    f"content.{index}.value",
                    "#message.content.value",
                )
        _check_content_order(blocks)
        _check_reply_to(payload)
        send_at = payload.get("send_at")
        _check_timestamp(send_at, "send_at")
        _check_custom_args(payload.get("custom_args"), "custom_args")
        for index, personalization in enumerate(personalizations):
            _check_custom_args(personalization.get("custom_args"),
                               f"personalizations.{index}.custom_args")
            _check_timestamp(personalization.get("send_at"), f"personalizations.{index}.send_at")
            _check_scheduling(personalization.get("send_at"),
                              f"personalizations.{index}.send_at")
            _check_headers(personalization.get("headers"), f"personalizations.{index}.headers")
        _check_scheduling(send_at, "send_at")
        _check_headers(payload.get("headers"), "headers")
        _check_categories(payload.get("categories"))
        _check_attachments(payload.get("attachments"))
        _check_asm_and_batch(payload)
        first = personalizations[0] if isinstance(personalizations[0], dict) else {}
        headers = payload.get("headers") if isinstance(payload.get("headers"), dict) else None
        task_id = (
            header_task_id(request)
            or _custom_arg(payload.get("custom_args"))
            or _custom_arg(first.get("custom_args"))
            or _header_value(headers)
        )
        bodies = {str(b.get("type")): stored_text(b.get("value")) for b in blocks}
        settings = payload.get("mail_settings")
        sandbox = isinstance(settings, dict) and _enabled(settings.get("sandbox_mode"))
        # A personalization's send_at overrides the message's, as SendGrid reads them.
        later = first.get("send_at") if type(first.get("send_at")) is int else send_at
        return Submission(
            recipients=recipients,
            recipient_fields=recipient_fields,
            content=drop_none(
                {
                    "from": sender.get("email"),
                    "to": recipients,
                    "subject": subject or first.get("subject"),
                    "text": bodies.get("text/plain"),
                    "html": bodies.get("text/html"),
                    "template_id": template,
                    "custom_args": payload.get("custom_args") or first.get("custom_args"),
                    "headers": headers,
                    "categories": payload.get("categories"),
                    "dynamic_template_data": first.get("dynamic_template_data"),
                }
            ),
            task_id=task_id,
            idempotency_key=request.headers.get(IDEMPOTENCY_HEADER),
            payload=payload,
            meta={"send_at": iso(datetime.fromtimestamp(later, UTC))}
            if type(later) is int else {},
            deliver=not sandbox,
        )

    def new_message_id(self, state: SimState, submission: Submission) -> str:
        return state.ids.token(22, _ID_ALPHABET)

    def success(self, record: MessageRecord, submission: Submission, request: web.Request) -> Reply:
        if not submission.deliver:
            return Reply(status=200, content_type=None)
        return Reply(status=202, content_type=None, headers={"X-Message-Id": record.id})

    def error(self, spec: ErrorSpec) -> Reply:
        message = spec.detail or _ERRORS[spec.case]
        field_name = spec.field_name
        help_url: str | None = None
        if spec.case is ErrorCase.INVALID_RECIPIENT and not spec.detail:
            field_name = field_name or "personalizations.0.to.0.email"
            help_url = f"{_HELP}#message.personalizations.to"
        elif spec.code is not None:
            help_url = f"{_HELP}{spec.code}"
        headers: dict[str, str] = {}
        if spec.status == 429:
            # X-RateLimit-Reset is the Unix time the limit resets, as SendGrid sends it.
            wait_s = math.ceil(spec.retry_after_s) if spec.retry_after_s is not None else 1
            # X-RateLimit-Limit counts by the minute: 600 unless a configured limit refused.
            per_minute = spec.limit.per_minute if spec.limit else 600
            headers = {"X-RateLimit-Limit": str(per_minute), "X-RateLimit-Remaining": "0",
                       "X-RateLimit-Reset": str(int(time.time()) + max(wait_s, 1))}
        body = {"errors": [{"message": message, "field": field_name, "help": help_url}]}
        return json_reply(spec.status, body, headers=headers, retry_after_s=spec.retry_after_s)


def _check_content_order(blocks: list[Any]) -> None:
    """SendGrid takes text/plain first, then text/html, then any other type (the sendgrid
    libraries sort their content blocks so; a hand-built request in another order is a 400)."""
    rank = {"text/plain": 0, "text/html": 1}
    ranks = [rank.get(str(block.get("type")).lower(), 2) for block in blocks]
    if ranks != sorted(ranks):
        raise _invalid(
            "The content blocks are out of order: text/plain, when present, comes first, then "
            "text/html, then any other type.",
            "content",
            "#message.content",
        )


def _check_custom_args(args: object, field_name: str) -> None:
    """custom_args is an object of strings (left out or null: none): SendGrid's JSON Schema
    check words another type so, and its error table a value that is no string."""
    if args is None:
        return
    if not isinstance(args, dict):
        raise _invalid(f"Invalid type. Expected: object, given: {json_type(args)}.",
                       field_name, "#message.custom_args")
    if not all(isinstance(value, str) for value in args.values()):
        raise _invalid("All values of custom arguments object must be strings",
                       field_name, "#message.custom_args")


def _check_timestamp(send_at: object, field_name: str) -> None:
    """A send_at, the message's or a personalization's, is a Unix timestamp or absent."""
    if send_at is not None and (type(send_at) is not int or send_at < 0):
        raise _invalid("send_at must be a Unix timestamp: a whole number of seconds.",
                       field_name, "#message.send_at")


def _check_scheduling(send_at: object, field_name: str) -> None:
    if type(send_at) is int and send_at > time.time() + MAX_SCHEDULE_AHEAD_S:
        raise _invalid("Scheduling more than 72 hours in advance is forbidden.", field_name,
                       "#message.send_at")


def _check_headers(headers: object, field_name: str) -> None:
    if not isinstance(headers, dict):
        return
    if not all(isinstance(value, str) for value in headers.values()):
        raise _invalid("All values of the headers object must be strings.", field_name,
                       "#message.headers")
    if any(str(name).lower() in RESERVED_HEADERS for name in headers):
        raise _invalid("Header cannot be one of the reserved keys.", field_name,
                       "#message.headers")


def _check_categories(categories: object) -> None:
    if categories is None:
        return
    anchor = "#message.categories"
    if not isinstance(categories, list) or not all(isinstance(c, str) for c in categories):
        raise _invalid("Categories must be an array of strings.", "categories", anchor)
    if len(categories) > MAX_CATEGORIES:
        raise _invalid(f"There is a limit of {MAX_CATEGORIES} categories for each email that is "
                       f"sent. You provided {len(categories)} categories.", "categories", anchor)
    seen: set[str] = set()
    for category in categories:
        if len(category) > MAX_CATEGORY_CHARS:
            raise _invalid(f"Each category must not be longer than {MAX_CATEGORY_CHARS} "
                           f"characters. {category} exceeds this limit", "categories", anchor)
        if category in seen:
            raise _invalid("The categories must be a unique list, and you have included "
                           f"{category} more than once.", "categories", anchor)
        if not category.isascii():
            raise _invalid("Categories can not contain non-ASCII characters.", "categories",
                           anchor)
        seen.add(category)


def _check_attachments(attachments: object) -> None:
    if not isinstance(attachments, list):
        return
    for index, attachment in enumerate(attachments):
        where = f"attachments.{index}"
        item = attachment if isinstance(attachment, dict) else {}
        content = item.get("content")
        if not isinstance(content, str) or not content:
            raise _invalid("The attachment content must be a string at least one character in "
                           "length.", f"{where}.content", "#message.attachments.content")
        try:
            # Line breaks are how MIME writes base64 (base64.encodebytes), so they are taken.
            base64.b64decode("".join(content.split()), validate=True)
        except binascii.Error:
            raise _invalid("The attachment content must be base64 encoded.", f"{where}.content",
                           "#message.attachments.content") from None
        filename = item.get("filename")
        if filename is None:
            raise _invalid("filename is required.", f"{where}.filename",
                           "#message.attachments.filename")
        if not isinstance(filename, str):
            raise _invalid("The filename of your attachment must be a string.",
                           f"{where}.filename", "#message.attachments.filename")
        disposition = item.get("disposition")
        if disposition is not None and disposition not in ("inline", "attachment"):
            raise _invalid('The disposition of your attachment can be either "inline" or '
                           f'"attachment". You provided {disposition}.', f"{where}.disposition",
                           "#message.attachments.disposition")


def _check_asm_and_batch(payload: dict[str, Any]) -> None:
    asm = payload.get("asm")
    if isinstance(asm, dict) and type(asm.get("group_id")) is not int:
        raise _invalid("The ASM group ID must be an integer.", "asm.group_id",
                       "#message.asm.group_id")
    batch_id = payload.get("batch_id")
    if batch_id is not None and not isinstance(batch_id, str):
        raise _invalid("The batch_id must be a string.", "batch_id", "#message.batch_id")


def _check_reply_to(payload: dict[str, Any]) -> None:
    """`reply_to` and each entry of `reply_to_list` name one address, as `from` does."""
    reply_to = payload.get("reply_to")
    if reply_to is not None and (
        not isinstance(reply_to, dict) or bare_address(reply_to.get("email")) is None
    ):
        raise _invalid("The reply_to email does not contain a valid address.",
                       "reply_to.email", "#message.reply_to")
    reply_list = payload.get("reply_to_list")
    if reply_list is None:
        return
    for index, entry in enumerate(reply_list if isinstance(reply_list, list) else [None]):
        if not isinstance(entry, dict) or bare_address(entry.get("email")) is None:
            raise _invalid("The reply_to_list email does not contain a valid address.",
                           f"reply_to_list.{index}.email", "#message.reply_to_list")


def _invalid(message: str, field_name: str, anchor: str) -> Rejection:
    # The help anchor rides in `code` so error() can build the documentation link.
    return Rejection(ErrorCase.BAD_REQUEST, message, field_name=field_name, code=anchor)


def _personalization_recipients(personalization: object, index: int) -> list[tuple[str, str]]:
    """Each recipient of a personalization, with its field ("personalizations.0.cc.1.email")."""
    if not isinstance(personalization, dict):
        raise _invalid(
            _PERSONALIZATIONS_REQUIRED,
            "personalizations",
            "#-Personalizations-Errors",
        )
    to = personalization.get("to")
    if not isinstance(to, list) or not to:
        raise _invalid(
            "The to array is required for all personalization objects, and must have at least "
            "one email object with a valid email address.",
            f"personalizations.{index}.to",
            "#message.personalizations.to",
        )
    found: list[tuple[str, str]] = []
    seen: set[str] = set()
    for kind in ("to", "cc", "bcc"):
        entries = personalization.get(kind) or []
        if not isinstance(entries, list):
            entries = [entries]
        for position, entry in enumerate(entries):
            address = bare_address(entry.get("email")) if isinstance(entry, dict) else None
            where = f"personalizations.{index}.{kind}.{position}.email"
            if address is None:
                raise _invalid(
                    "Does not contain a valid address.",
                    where,
                    "#message.personalizations.to",
                )
            if address.lower() in seen:
                raise _invalid(
                    "Each email address in the personalization block should be unique between "
                    "to, cc, and bcc. We found the first duplicate instance of "
                    f"[{address}] in the personalizations.{index}.{kind} field.",
                    f"personalizations.{index}.{kind}",
                    "#message.recipient-errors",
                )
            seen.add(address.lower())
            found.append((address, where))
    return found


def _custom_arg(args: object) -> str | None:
    return task_id_text(args.get(TASK_ARG)) if isinstance(args, dict) else None


def _header_value(headers: dict[str, Any] | None) -> str | None:
    for name, value in (headers or {}).items():
        if name.lower() == TASK_ID_HEADER.lower():
            return task_id_text(value)
    return None


def _enabled(setting: object) -> bool:
    return isinstance(setting, dict) and setting.get("enable") is True
