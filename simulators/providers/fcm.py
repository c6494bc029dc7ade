"""FCM HTTP v1: `POST /v1/projects/{project}/messages:send`, OAuth2 Bearer token, JSON body.

Success is 200 `{"name": "projects/{project}/messages/{id}"}`. The target is exactly one of
`fid`, `token`, `topic` or `condition`; `validate_only` checks the message and sends nothing.
A topic is a bare name (`news`): `/topics/news` is refused with INVALID_ARGUMENT, as FCM
refuses it.
`data` values are strings and its keys are not FCM's reserved ones (`from`, `message_type`,
`google…`, `gcm…`): either is refused whole with INVALID_ARGUMENT, as FCM refuses it. So is a
field FCM's proto types do not have, or a value of the wrong type, in the message and in its
`notification`, `android`, `apns`, `webpush` and `fcm_options` blocks (see fcm_fields.py).
Errors use Google's format:
`{"error": {"code", "message", "status", "details": [{"@type": ".../FcmError",
"errorCode": "UNREGISTERED"}]}}`. An `error` fault without a status is 503 UNAVAILABLE.
Any non-empty Bearer token is accepted; `POST /token` (oauth_token.py) hands out such tokens
to service accounts whose `token_uri` points at it.
Task id: `X-Notifkit-Task-Id` header, else `message.data.notifkit_task_id`.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from aiohttp import web

from simulators.kinds import ErrorCase, Provider
from simulators.pipeline import (
    IDEMPOTENCY_HEADER,
    ErrorSpec,
    HttpProvider,
    Rejection,
    Submission,
    bearer_token,
    header_task_id,
)
from simulators.providers.common import drop_none, load_json, task_id_text
from simulators.providers.fcm_fields import OBJECT_FIELDS, check_known, invalid, string_map
from simulators.records import MessageRecord
from simulators.replies import Reply, json_reply
from simulators.state import SimState

TASK_KEY = "notifkit_task_id"
# A message names exactly one target. `fid` (a Firebase Installation ID) is what current
# firebase-admin releases send in place of the deprecated `token`.
TARGETS = ("fid", "token", "topic", "condition")
TOPIC_NAME = re.compile(r"[a-zA-Z0-9\-_.~%]+")
MAX_CONDITION_TOPICS = 5
_CONDITION_TOKEN = re.compile(
    r"""\s*(?:(?P<topic>'[^']*'|"[^"]*")\s+in\s+topics\b|(?P<other>&&|\|\||[()]))\s*""")
RESERVED_DATA_KEYS = frozenset({"from", "message_type"})
RESERVED_DATA_PREFIXES = ("google", "gcm")
# Fields of the send request and its Message, in both spellings proto JSON accepts.
REQUEST_FIELDS = frozenset({"message", "validate_only", "validateOnly"})
MESSAGE_FIELDS = frozenset({
    "name", "data", "notification", "android", "webpush", "apns", "fcm_options", "fcmOptions",
    *TARGETS,
})
MAX_PAYLOAD_BYTES = 4096  # FCM's limit on a message's notification + data
FCM_ERROR_TYPE = "type.googleapis.com/google.firebase.fcm.v1.FcmError"
BAD_REQUEST_TYPE = "type.googleapis.com/google.rpc.BadRequest"
_EXPECTED_CREDENTIAL = (
    "Expected OAuth 2 access token, login cookie or other valid authentication credential. "
    "See https://developers.google.com/identity/sign-in/web/devconsole-project."
)
_UNAUTHENTICATED = f"Request had invalid authentication credentials. {_EXPECTED_CREDENTIAL}"
_NO_CREDENTIAL = f"Request is missing required authentication credential. {_EXPECTED_CREDENTIAL}"
# (google status, message, FcmError errorCode or None) per case.
_ERRORS: dict[ErrorCase, tuple[str, str, str | None]] = {
    ErrorCase.BAD_REQUEST: (
        "INVALID_ARGUMENT",
        "Request contains an invalid argument.",
        "INVALID_ARGUMENT",
    ),
    ErrorCase.MISSING_CREDENTIALS: ("UNAUTHENTICATED", _NO_CREDENTIAL, None),
    ErrorCase.UNAUTHORIZED: ("UNAUTHENTICATED", _UNAUTHENTICATED, None),
    ErrorCase.FORBIDDEN: ("PERMISSION_DENIED", "SenderId mismatch", "SENDER_ID_MISMATCH"),
    ErrorCase.NOT_FOUND: ("NOT_FOUND", "Requested entity was not found.", "UNREGISTERED"),
    ErrorCase.CONFLICT: ("ABORTED", "The request was aborted.", None),
    ErrorCase.TOO_LARGE: ("INVALID_ARGUMENT", "Message is too big", "INVALID_ARGUMENT"),
    ErrorCase.INVALID_RECIPIENT: ("NOT_FOUND", "Requested entity was not found.", "UNREGISTERED"),
    ErrorCase.RATE_LIMITED: (
        "RESOURCE_EXHAUSTED",
        "Quota exceeded for quota metric 'Send requests' and limit 'Send requests per minute' "
        "of service 'fcm.googleapis.com'.",
        "QUOTA_EXCEEDED",
    ),
    ErrorCase.QUOTA_EXCEEDED: (
        "RESOURCE_EXHAUSTED",
        "Quota exceeded for quota metric 'Send requests' and limit 'Send requests per minute' "
        "of service 'fcm.googleapis.com'.",
        "QUOTA_EXCEEDED",
    ),
    ErrorCase.SERVER_ERROR: ("INTERNAL", "Internal error encountered.", "INTERNAL"),
    ErrorCase.UNAVAILABLE: ("UNAVAILABLE", "The service is currently unavailable.", "UNAVAILABLE"),
}
_INVALID_TOKEN = "The registration token is not a valid FCM registration token"


class Fcm(HttpProvider):
    provider = Provider.FCM
    status_overrides: ClassVar[dict[ErrorCase, int]] = {
        ErrorCase.INVALID_RECIPIENT: 404,
        ErrorCase.TOO_LARGE: 400,
    }
    # FCM's documented server-side failure is 503 UNAVAILABLE (retry, honouring
    # Retry-After); 500 INTERNAL stays available as an `error` rule's explicit status.
    default_error_case: ClassVar[ErrorCase] = ErrorCase.UNAVAILABLE

    def credentials(self, request: web.Request) -> str | None:
        """FCM's quota is the project's, whichever of its access tokens a request carries:
        OAuth tokens are refreshed every hour and would otherwise each get a fresh bucket."""
        if bearer_token(request) is None:
            return None
        return "project:" + request.match_info["project"]

    async def parse(self, request: web.Request, body: bytes, state: SimState) -> Submission:
        payload = load_json(body)
        if not isinstance(payload, dict) or not isinstance(payload.get("message"), dict):
            raise invalid("message", "Required field 'message' is missing.")
        check_known(payload, REQUEST_FIELDS, None)
        message: dict[str, Any] = payload["message"]
        check_known(message, MESSAGE_FIELDS, "message")
        validate_only = payload.get("validate_only", payload.get("validateOnly"))
        if validate_only is not None and not isinstance(validate_only, bool):
            raise invalid(
                "validate_only",
                f"Invalid value at 'validate_only' (TYPE_BOOL), {json.dumps(validate_only)}",
            )
        recipient = _recipient(message)
        _check_fields(message)
        data = message.get("data")
        notification = message.get("notification")
        # Counted in UTF-8 bytes, as FCM does: escaped ASCII counts "日" six times over.
        size = len(json.dumps({"data": data, "notification": notification},
                              ensure_ascii=False).encode())
        if size > MAX_PAYLOAD_BYTES:
            raise Rejection(ErrorCase.TOO_LARGE)
        return Submission(
            recipients=[recipient],
            content=drop_none(
                {
                    "fid": message.get("fid"),
                    "token": message.get("token"),
                    "topic": message.get("topic"),
                    "condition": message.get("condition"),
                    "notification": notification,
                    "data": data,
                    "android": message.get("android"),
                    "apns": message.get("apns"),
                    "webpush": message.get("webpush"),
                }
            ),
            task_id=header_task_id(request) or task_id_text((data or {}).get(TASK_KEY)),
            idempotency_key=request.headers.get(IDEMPOTENCY_HEADER),
            payload=payload,
            meta={"project": request.match_info["project"]},
            deliver=validate_only is not True,
        )

    def new_message_id(self, state: SimState, submission: Submission) -> str:
        # FCM's shape (`0:<16 digits>%<16 hex>`), every part drawn from the seed so a
        # replayed run names its messages alike, as the other providers' ids do.
        return f"0:1{state.ids.token(15, '0123456789')}%{state.ids.hex(16)}"

    def success(self, record: MessageRecord, submission: Submission, request: web.Request) -> Reply:
        project = record.meta["project"]
        message_id = record.id if submission.deliver else "fake_message_id"
        return json_reply(200, {"name": f"projects/{project}/messages/{message_id}"})

    def no_route(self, method: str, path: str, status: int) -> Reply:
        # Google's plain error, without the FcmError detail: a wrong URL must not read as
        # UNREGISTERED, which tells a client to forget the device token.
        if status == 404:
            status_name, message = "NOT_FOUND", f"The requested URL {path} was not found."
        else:
            status_name, message = "UNIMPLEMENTED", f"Method {method} is not allowed for {path}."
        return json_reply(
            status, {"error": {"code": status, "message": message, "status": status_name}}
        )

    def error(self, spec: ErrorSpec) -> Reply:
        status_name, message, error_code = _ERRORS[spec.case]
        field_name = spec.field_name
        if spec.case is ErrorCase.INVALID_RECIPIENT and spec.status == 400:
            status_name, message, error_code = (
                "INVALID_ARGUMENT",
                _INVALID_TOKEN,
                "INVALID_ARGUMENT",
            )
            # FCM names the offending field too, as a BadRequest violation.
            field_name = field_name or "message.token"
        details: list[dict[str, Any]] = []
        if error_code is not None:
            details.append({"@type": FCM_ERROR_TYPE, "errorCode": error_code})
        if field_name is not None:
            # proto3 JSON leaves an empty field out: a request-level violation names none.
            violation = drop_none({"field": field_name or None,
                                   "description": spec.detail or message})
            details.append({"@type": BAD_REQUEST_TYPE, "fieldViolations": [violation]})
        error: dict[str, Any] = {
            "code": spec.status,
            "message": spec.detail or message,
            "status": status_name,
        }
        if details:
            error["details"] = details
        return json_reply(
            spec.status,
            {"error": error},
            retry_after_s=spec.retry_after_s,
            content_type="application/json; charset=UTF-8",
        )


def _recipient(message: dict[str, Any]) -> str:
    targets = [name for name in TARGETS if message.get(name)]
    if len(targets) != 1:
        raise invalid("message", "Exactly one of fid, token, topic or condition must be set.")
    target = targets[0]
    if not isinstance(message[target], str):
        raise invalid(f"message.{target}", f"Invalid value at 'message.{target}' (TYPE_STRING)")
    token = message["token"] if target == "token" else ""
    if not token.isprintable() or " " in token:
        # No registration token holds white space or a control character (one read from a
        # file with its line break, say): FCM's invalid-token answer.
        raise Rejection(ErrorCase.INVALID_RECIPIENT, status=400, field_name="message.token")
    if target == "condition" and not _condition_parses(message["condition"]):
        raise invalid("message.condition", "Invalid condition expression provided.")
    if target != "topic":
        return str(message[target])
    topic = message["topic"]
    if not TOPIC_NAME.fullmatch(topic):
        # FCM takes the bare name; the /topics/ prefix is legacy HTTP's (firebase-admin strips it).
        raise invalid("message.topic", f"Invalid topic name: {topic}. A topic name matches "
                                       "[a-zA-Z0-9-_.~%]+, without the /topics/ prefix.")
    return f"/topics/{topic}"


def _condition_parses(condition: str) -> bool:
    """FCM's condition grammar: `'topic' in topics` terms joined by && and ||, grouped by
    parentheses, five topics at most (there is no `!`)."""
    tokens: list[str] = []
    topics = 0
    position = 0
    while position < len(condition):
        match = _CONDITION_TOKEN.match(condition, position)
        if match is None:
            return False
        position = match.end()
        if match["topic"] is not None:
            if not TOPIC_NAME.fullmatch(match["topic"][1:-1]):
                return False
            topics += 1
            tokens.append("T")
        elif match["other"] is not None:
            tokens.append(match["other"])
    if not 1 <= topics <= MAX_CONDITION_TOPICS:
        return False
    rest = _condition_expression(tokens)
    return rest == []


def _condition_expression(tokens: list[str]) -> list[str] | None:
    """Consume one expression from the front of ``tokens``; what is left, or None if it is
    not one."""
    rest = _condition_term(tokens)
    while rest and rest[0] in ("&&", "||"):
        rest = _condition_term(rest[1:])
    return rest


def _condition_term(tokens: list[str] | None) -> list[str] | None:
    if not tokens:
        return None
    if tokens[0] == "T":
        return tokens[1:]
    if tokens[0] == "(":
        rest = _condition_expression(tokens[1:])
        return rest[1:] if rest and rest[0] == ")" else None
    return None


def _check_fields(message: dict[str, Any]) -> None:
    if message.get("data") is not None:
        _check_data(message["data"])
    for name, check in OBJECT_FIELDS.items():
        if message.get(name) is not None:
            check(message[name], f"message.{name}")


def _check_data(data: object) -> None:
    string_map(data, "message.data")
    assert isinstance(data, dict)  # string_map refused anything else
    for key in data:
        if _reserved_data_key(key):
            raise invalid("message.data", f"Invalid data payload key: {key}")


def _reserved_data_key(key: str) -> bool:
    """FCM's reserved data keys ("from", "message_type", anything starting with "google" or
    "gcm"): a message using one is refused whole, so a template that sets one must fail here
    as it would in production."""
    return key in RESERVED_DATA_KEYS or key.startswith(RESERVED_DATA_PREFIXES)
