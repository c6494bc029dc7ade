"""Resend: `POST /emails`, Bearer API key, JSON body, `Idempotency-Key` honoured;
`POST /emails/batch` (see `ResendBatch`); reads are in resend_reads.py.

Success is 200 `{"id": "<uuid>"}`. Errors are `{"statusCode", "name", "message"}`, with the
names the official SDKs map to their exception classes (missing_required_field,
validation_error, missing_api_key, invalid_api_key, rate_limit_exceeded,
daily_quota_exceeded, invalid_idempotent_request, application_error...).
Task id: `X-Notifkit-Task-Id` header, else a tag named `notifkit_task_id`, else that header
inside the payload's `headers`.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from aiohttp import web

from simulators.kinds import ErrorCase, Provider
from simulators.limits import retry_after_header
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
    drop_none,
    email_address,
    load_json,
    stored_text,
    task_id_text,
)
from simulators.records import MessageRecord
from simulators.replies import Reply, json_reply
from simulators.state import SimState

TASK_TAG = "notifkit_task_id"
MAX_RECIPIENTS = 50  # in `to`
DEFAULT_RATE_PER_S = 2  # Resend's default limit, stated by a fault rule's 429
MAX_BATCH_EMAILS = 100
BATCH_VALIDATION_HEADER = "x-batch-validation"
_TAG_TEXT = re.compile(r"^[A-Za-z0-9_-]{1,256}\Z")
_ADDRESS_FORMAT = (
    "The email address needs to follow the `email@example.com` or "
    "`Name <email@example.com>` format."
)
# (name, message) per case; `code` on a spec overrides the name.
_ERRORS: dict[ErrorCase, tuple[str, str]] = {
    ErrorCase.BAD_REQUEST: (
        "validation_error",
        "The request body is missing one or more required fields.",
    ),
    ErrorCase.MISSING_CREDENTIALS: (
        "missing_api_key",
        "Missing API key in the authorization header. Include the following header "
        "Authorization: Bearer YOUR_API_KEY in the request.",
    ),
    # What the sending endpoints answer, 401, for a key that does not exist or was deleted.
    ErrorCase.UNAUTHORIZED: ("validation_error", "API key is invalid"),
    ErrorCase.FORBIDDEN: ("invalid_api_key", "API key is invalid"),
    ErrorCase.NOT_FOUND: ("not_found", "The requested endpoint does not exist."),
    ErrorCase.CONFLICT: (
        "invalid_idempotent_request",
        "Same idempotency key used with a different request payload. "
        "Change your idempotency key or payload.",
    ),
    ErrorCase.TOO_LARGE: ("validation_error", "The request body is too large."),
    ErrorCase.INVALID_RECIPIENT: ("validation_error", f"Invalid `to` field. {_ADDRESS_FORMAT}"),
    ErrorCase.RATE_LIMITED: (
        "rate_limit_exceeded",
        "Too many requests. You can only make {rate} requests per second. See rate limit "
        "response headers for more information. Or contact support to increase rate limit.",
    ),
    ErrorCase.QUOTA_EXCEEDED: (
        "daily_quota_exceeded",
        "You have reached your daily email sending quota.",
    ),
    ErrorCase.SERVER_ERROR: ("application_error", "An unexpected error occurred."),
    ErrorCase.UNAVAILABLE: ("application_error", "The service is temporarily unavailable."),
}
_CODE_MESSAGES = {
    "concurrent_idempotent_requests": (
        "Same idempotency key used while original request is still in progress. "
        "Try the request again later."
    ),
    "invalid_idempotency_key": "The key must be between 1-256 chars.",
    "invalid_attachment": "Attachment must have either a `content` or `path`.",
}


class Resend(HttpProvider):
    provider = Provider.RESEND
    status_overrides: ClassVar[dict[ErrorCase, int]] = {
        ErrorCase.BAD_REQUEST: 422,
        ErrorCase.INVALID_RECIPIENT: 422,
    }
    idempotent = True

    def credentials(self, request: web.Request) -> str | None:
        return bearer_token(request)

    async def parse(self, request: web.Request, body: bytes, state: SimState) -> Submission:
        key = _idempotency_key(request)
        payload = load_json(body, status=400)
        if not isinstance(payload, dict):
            raise Rejection(ErrorCase.BAD_REQUEST, "The request body must be a JSON object.")
        submission = parse_email(payload)
        submission.task_id = header_task_id(request) or submission.task_id
        submission.idempotency_key = key
        return submission

    def new_message_id(self, state: SimState, submission: Submission) -> str:
        return state.ids.uuid4()

    def success(self, record: MessageRecord, submission: Submission, request: web.Request) -> Reply:
        return json_reply(200, {"id": record.id})

    def quota_headers(self, state: SimState, api_key: str) -> dict[str, str]:
        """Resend states its limit on every answer. Unmetered (no limit set), it states its
        default rate with the whole of it left, which paces no client down."""
        quota = state.limits.quota(self.provider, api_key)
        if quota is None:
            allowed = str(DEFAULT_RATE_PER_S)
            return {"ratelimit-limit": allowed, "ratelimit-remaining": allowed,
                    "ratelimit-reset": "1"}
        limit, remaining, refill_s = quota
        return {"ratelimit-limit": str(limit.burst), "ratelimit-remaining": str(remaining),
                "ratelimit-reset": retry_after_header(max(refill_s, 1.0))}

    def no_route(self, method: str, path: str, status: int) -> Reply:
        if status == 405:
            return self.render(
                ErrorCase.NOT_FOUND, status=405, code="method_not_allowed",
                detail="Method is not allowed for the requested path.",
            )
        return self.render(ErrorCase.NOT_FOUND, status=status)

    def error(self, spec: ErrorSpec) -> Reply:
        name, message = _ERRORS[spec.case]
        if spec.code is not None:
            name = spec.code
            message = _CODE_MESSAGES.get(spec.code, message)
        if spec.case is ErrorCase.INVALID_RECIPIENT and spec.field_name and not spec.detail:
            # The field of the recipient a fault rule matched: "bcc", or "emails[1].to" in a
            # batch, written as a strict batch writes an invalid email's error.
            where, _, field_name = spec.field_name.rpartition(".")
            message = f"Invalid `{field_name}` field. {_ADDRESS_FORMAT}"
            if where:
                message = f"{where}: {message}"
        # A fault rule's 429 states Resend's default rate, a configured limit its own.
        rate = f"{spec.limit.rate_per_s:g}" if spec.limit else str(DEFAULT_RATE_PER_S)
        message = message.replace("{rate}", rate)
        if spec.detail:
            message = spec.detail
        # Resend's headers are lower-case (HTTP/2); the SDK exposes them as a plain dict.
        headers: dict[str, str] = {}
        retry_after = (
            retry_after_header(spec.retry_after_s) if spec.retry_after_s is not None else None
        )
        if spec.status == 429:
            # ratelimit-reset is the seconds until the window refills: never sooner than
            # retry-after, or a client that trusts it comes back to another 429.
            # ratelimit-limit is what may be sent at once: Resend's default 2, else the burst
            # of the configured limit that refused the request.
            allowed = str(spec.limit.burst) if spec.limit else str(DEFAULT_RATE_PER_S)
            headers = {"ratelimit-limit": allowed, "ratelimit-remaining": "0",
                       "ratelimit-reset": retry_after or "1"}
        if retry_after is not None:
            headers["retry-after"] = retry_after
        body = {"statusCode": spec.status, "name": name, "message": message}
        return json_reply(spec.status, body, headers=headers)


class ResendBatch(Resend):
    """`POST /emails/batch`: a JSON array of up to 100 emails, each as `POST /emails` takes
    it (without `attachments` or `scheduled_at`); answered `{"data": [{"id"}...]}` in order.

    `x-batch-validation: strict` (the default) refuses the whole batch, 422, for one invalid
    email; `permissive` sends the valid ones and lists the others under `errors`. One request
    is one request to the rate limit, to fault rules (a rule matching any recipient in the
    batch decides the whole request, as the real provider fails a request as a whole) and to
    its `Idempotency-Key`; each email is recorded as its own message.
    """

    async def parse(self, request: web.Request, body: bytes, state: SimState) -> Submission:
        key = _idempotency_key(request)
        payload = load_json(body, status=400)
        if not isinstance(payload, list):
            raise Rejection(ErrorCase.BAD_REQUEST, "The `request.body` field must be an `array`.")
        if not payload:
            raise Rejection(ErrorCase.BAD_REQUEST, "The batch must contain at least one email.")
        if len(payload) > MAX_BATCH_EMAILS:
            raise Rejection(
                ErrorCase.BAD_REQUEST,
                f"Too many emails in the batch. The maximum is {MAX_BATCH_EMAILS}.",
            )
        mode = request.headers.get(BATCH_VALIDATION_HEADER, "strict").strip().lower()
        if mode not in ("strict", "permissive"):
            raise Rejection(
                ErrorCase.BAD_REQUEST,
                f"Invalid `{BATCH_VALIDATION_HEADER}` header: use `strict` or `permissive`.",
            )
        request_task_id = header_task_id(request)
        parts: list[Submission] = []
        errors: list[dict[str, Any]] = []
        for index, item in enumerate(payload):
            try:
                part = _batch_email(item)
            except Rejection as rejection:
                message = rejection.detail or _ERRORS[rejection.case][1]
                if mode == "strict":
                    raise Rejection(
                        rejection.case, f"emails[{index}]: {message}", code=rejection.code
                    ) from None
                errors.append({"index": index, "message": message})
                continue
            # The request's header names one task; an email's own tag tells batched tasks apart.
            part.task_id = part.task_id or request_task_id
            part.idempotency_key = key
            part.recipient_fields = [f"emails[{index}].{f}" for f in part.recipient_fields]
            parts.append(part)
        return Submission(
            recipients=[r for part in parts for r in part.recipients],
            recipient_fields=[f for part in parts for f in part.recipient_fields],
            content={},
            idempotency_key=key,
            # The mode is part of the request: the same emails under another mode are not a
            # replay of it.
            payload={"emails": payload, "validation": mode},
            meta={"errors": errors if mode == "permissive" else None},
            parts=parts,
        )

    def reply(
        self, records: list[MessageRecord], submission: Submission, request: web.Request
    ) -> Reply:
        answer: dict[str, Any] = {"data": [{"id": record.id} for record in records]}
        if submission.meta.get("errors") is not None:
            answer["errors"] = submission.meta["errors"]
        return json_reply(200, answer)


def parse_email(payload: dict[str, Any]) -> Submission:
    """One email as `POST /emails` takes it; the task id from its tag or its headers."""
    template = _template(payload)
    # A template supplies its own sender and subject when the email leaves them out; the
    # simulator holds no templates, so it takes each one to have them.
    required = ("to",) if template is not None else ("from", "to", "subject")
    for name in required:
        if payload.get(name) in (None, "", []):
            raise Rejection(
                ErrorCase.BAD_REQUEST, f"Missing `{name}` field.", code="missing_required_field"
            )
    sender = payload.get("from")
    if sender is not None and email_address(sender) is None:
        raise Rejection(ErrorCase.BAD_REQUEST, f"Invalid `from` field. {_ADDRESS_FORMAT}")
    to = _addresses(payload, "to")
    cc = _addresses(payload, "cc")
    bcc = _addresses(payload, "bcc")
    # Resend's limit is on `to` alone; cc and bcc do not count towards it.
    if len(to) > MAX_RECIPIENTS:
        raise Rejection(
            ErrorCase.BAD_REQUEST,
            f"Too many recipients in `to`. The maximum is {MAX_RECIPIENTS}.",
        )
    if payload.get("subject") is not None and not isinstance(payload["subject"], str):
        raise Rejection(ErrorCase.BAD_REQUEST, "Invalid `subject` field.")
    for name in ("html", "text"):
        if payload.get(name) is not None and not isinstance(payload[name], str):
            raise Rejection(ErrorCase.BAD_REQUEST, f"Invalid `{name}` field.")
    # An email needs a body: html, text (an empty one counts) or a template that has one.
    if all(payload.get(name) is None for name in ("html", "text", "template")):
        raise Rejection(
            ErrorCase.BAD_REQUEST, "Missing `html` or `text` field.", code="missing_required_field"
        )
    _addresses(payload, "reply_to")
    scheduled_at = payload.get("scheduled_at")
    if scheduled_at is not None and not isinstance(scheduled_at, str):
        raise Rejection(ErrorCase.BAD_REQUEST, "Invalid `scheduled_at` field.")
    _check_attachments(payload.get("attachments"))
    tags = _tags(payload.get("tags"))
    headers = payload.get("headers")
    if headers is not None and not (
        isinstance(headers, dict) and all(isinstance(v, str) for v in headers.values())
    ):
        raise Rejection(ErrorCase.BAD_REQUEST, "Invalid `headers` field.")
    task_id = task_id_text(tags.get(TASK_TAG)) or _header_value(headers)
    content = drop_none(
        {
            "from": sender,
            "to": to,
            "cc": cc or None,
            "bcc": bcc or None,
            "reply_to": payload.get("reply_to"),
            "subject": payload.get("subject"),
            "html": stored_text(payload.get("html")),
            "text": stored_text(payload.get("text")),
            "headers": headers,
            "tags": payload.get("tags"),
            "scheduled_at": payload.get("scheduled_at"),
            "template": template,
        }
    )
    return Submission(
        recipients=to + cc + bcc,
        recipient_fields=["to"] * len(to) + ["cc"] * len(cc) + ["bcc"] * len(bcc),
        content=content,
        task_id=task_id,
        payload=payload,
        meta={"tags": tags, "scheduled_at": scheduled_at},
    )


def _check_attachments(attachments: object) -> None:
    """Each attachment carries its `content` (base64, or the SDK's list of bytes) or a `path`
    Resend fetches it from; one with neither is Resend's 422 invalid_attachment."""
    if attachments is None:
        return
    if not isinstance(attachments, list):
        raise Rejection(ErrorCase.BAD_REQUEST, "Invalid `attachments` field.")
    for attachment in attachments:
        if not isinstance(attachment, dict) or all(
            attachment.get(name) in (None, "", []) for name in ("content", "path")
        ):
            raise Rejection(ErrorCase.BAD_REQUEST, code="invalid_attachment")


def _template(payload: dict[str, Any]) -> dict[str, Any] | None:
    """The email's `template`, an `id` and optional `variables`; it is the body, so an email
    naming one may not also carry `html` or `text`, as at Resend."""
    template = payload.get("template")
    if template is None:
        return None
    if not (
        isinstance(template, dict)
        and isinstance(template.get("id"), str) and template["id"]
        and isinstance(template.get("variables"), dict | None)
    ):
        raise Rejection(ErrorCase.BAD_REQUEST, "Invalid `template` field. It must be an object "
                                               "with a template `id` and optional `variables`.")
    for name in ("html", "text"):
        if payload.get(name) is not None:
            raise Rejection(ErrorCase.BAD_REQUEST,
                            f"The `{name}` field cannot be sent with a `template`.")
    return template


def _batch_email(item: object) -> Submission:
    if not isinstance(item, dict):
        raise Rejection(ErrorCase.BAD_REQUEST, "Each email in the batch must be a JSON object.")
    for name in ("attachments", "scheduled_at"):
        if item.get(name) not in (None, "", []):
            raise Rejection(
                ErrorCase.BAD_REQUEST, f"The `{name}` field is not supported in batch emails."
            )
    return parse_email(item)


def _idempotency_key(request: web.Request) -> str | None:
    key = request.headers.get(IDEMPOTENCY_HEADER)
    if key is not None and not 1 <= len(key) <= 256:
        raise Rejection(ErrorCase.BAD_REQUEST, status=400, code="invalid_idempotency_key")
    return key


def _addresses(payload: dict[str, Any], name: str) -> list[str]:
    value = payload.get(name)
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    addresses = []
    for item in values:
        address = email_address(item)
        if address is None:
            raise Rejection(ErrorCase.BAD_REQUEST, f"Invalid `{name}` field. {_ADDRESS_FORMAT}")
        addresses.append(address)
    return addresses


def _tags(value: object) -> dict[str, str]:
    if value is None:
        return {}
    invalid = Rejection(
        ErrorCase.BAD_REQUEST,
        "Tags should only contain ASCII letters, numbers, underscores, or dashes.",
    )
    if not isinstance(value, list):
        raise invalid
    tags: dict[str, str] = {}
    for tag in value:
        if not isinstance(tag, dict):
            raise invalid
        name, text = tag.get("name"), tag.get("value")
        if not isinstance(name, str) or not _TAG_TEXT.match(name):
            raise invalid
        if text is not None and (not isinstance(text, str) or not _TAG_TEXT.match(text)):
            raise invalid
        tags[name] = text or ""
    return tags


def _header_value(headers: object) -> str | None:
    if not isinstance(headers, dict):
        return None
    for name, value in headers.items():
        if isinstance(name, str) and name.lower() == TASK_ID_HEADER.lower():
            return task_id_text(value)
    return None

