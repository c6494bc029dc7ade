"""The payloads that cross streams: one definition per stream.

Every entry is ``{"data": <one of these, as JSON>}``. Field names are camelCase because the
same objects appear in the HTTP API, the DLQ and ``/v1/streams``. Parsing functions raise
:class:`~notifkit.errors.MalformedPayload` for anything that can never be processed.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

from notifkit.errors import MalformedPayload

Priority = Literal["critical", "normal", "low"]
Channel = Literal["email", "sms", "push", "inapp", "webhook"]
CHANNELS: tuple[str, ...] = ("email", "sms", "push", "inapp", "webhook")
PRIORITIES: tuple[str, ...] = ("critical", "normal", "low")


class Recipients(TypedDict, total=False):
    """Exactly one of the three."""

    userId: str
    userIds: list[str]
    segment: str


class InboundMessage(TypedDict):
    """``notifkit:stream:inbound:{p}`` — written by the api and the workflow service."""

    eventId: str  # UUIDv7, the notification's id
    projectId: str
    template: str
    to: Recipients
    data: dict[str, Any]
    channels: list[str] | None  # None = the template's channels
    priority: str
    sendAt: str | None  # RFC 3339, UTC
    campaignId: str | None
    idempotencyKey: str | None  # the caller's x-idempotency-key
    createdAt: str
    workflowInstanceId: NotRequired[str]
    workflowStep: NotRequired[int]
    digestItems: NotRequired[list[dict[str, Any]]]


class OutcomeEvent(TypedDict, total=False):
    """``notifkit:stream:events:inbound`` — delivery outcomes, receipts and custom events.

    ``type`` is one of ``notification:sent``, ``notification:failed``, ``receipt``
    (provider webhook), ``custom`` (``POST /v1/events``) ...
    """

    type: str
    projectId: str
    eventId: str
    taskId: str
    userId: str
    channel: str
    at: str
    # notification:sent | notification:failed | notification:invalid_token (delivery)
    provider: str
    providerMessageId: str | None
    attempt: int
    campaignId: str | None
    error: str
    # notification:failed from the worker's dead-lettering (worker.failed_event)
    stream: str
    entryId: str
    attempts: int
    # receipt: kind is delivered | bounced | complained | opened | clicked | failed
    kind: str
    raw: Any
    # custom
    name: str
    data: dict[str, Any]


OUTCOME_TYPES: tuple[str, ...] = (
    "notification:sent",
    "notification:failed",
    "notification:invalid_token",
    "receipt",
    "custom",
)
RECEIPT_KINDS: tuple[str, ...] = ("delivered", "bounced", "complained", "opened", "clicked",
                                  "failed")


class WorkflowEvent(TypedDict):
    """``notifkit:stream:workflow:inbound`` entry with ``type = "event"``: a custom event
    (``POST /v1/events``) forwarded by the events service to wake waiting instances."""

    type: Literal["event"]
    projectId: str
    name: str
    userId: str
    data: dict[str, Any]
    at: str


SCHEDULE_REASONS: tuple[str, ...] = ("sendAt", "quietHours", "rateLimited")


class ScheduledTask(TypedDict):
    """``notifkit:stream:scheduled`` — a task to re-emit on ``stream`` at ``dueAt``.

    Written by the engine (sendAt, quiet hours) and delivery (429 parking). ``payload`` is
    the entry to XADD when due, exactly as given; ``stream`` is its full key (e.g.
    ``Keys.outbound("normal")``). A task id appears at most once in the scheduler: adding
    it again replaces its due time and payload.
    """

    taskId: str
    projectId: str
    dueAt: int  # ms since the epoch, UTC
    stream: str
    payload: dict[str, Any]
    reason: str  # one of SCHEDULE_REASONS


def require(payload: dict[str, Any], field: str, kind: type | tuple[type, ...]) -> Any:
    value = payload.get(field)
    if not isinstance(value, kind):
        raise MalformedPayload(f"field {field!r} is missing or has the wrong type")
    return value


def parse_inbound(payload: dict[str, Any]) -> InboundMessage:
    require(payload, "eventId", str)
    require(payload, "projectId", str)
    require(payload, "template", str)
    to = require(payload, "to", dict)
    if not any(k in to for k in ("userId", "userIds", "segment")):
        raise MalformedPayload("field 'to' names no recipient")
    if payload.get("priority") not in PRIORITIES:
        raise MalformedPayload("field 'priority' is not critical, normal or low")
    payload.setdefault("data", {})
    payload.setdefault("channels", None)
    payload.setdefault("sendAt", None)
    payload.setdefault("campaignId", None)
    payload.setdefault("idempotencyKey", None)
    return payload  # type: ignore[return-value]


def parse_scheduled_task(payload: dict[str, Any]) -> ScheduledTask:
    require(payload, "taskId", str)
    require(payload, "projectId", str)
    due = payload.get("dueAt")
    if isinstance(due, bool) or not isinstance(due, int | float):
        raise MalformedPayload("field 'dueAt' is missing or not a number of milliseconds")
    payload["dueAt"] = int(due)
    require(payload, "stream", str)
    require(payload, "payload", dict)
    payload.setdefault("reason", "sendAt")
    return payload  # type: ignore[return-value]
