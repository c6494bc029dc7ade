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
    # A segment (or a list of users too large for one go) is fanned out a page at a time: the
    # enricher handles one page and writes the rest back as a continuation of the same
    # message that starts after this member id.
    segmentAfter: NotRequired[str]


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
    # notification:failed from the worker's dead-lettering (worker.failed_event), which
    # also carries `attempt`: the last attempt's number after any earlier DLQ rounds
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
    eventId: NotRequired[str]  # the custom event's id, as POST /v1/events answered it


SCHEDULE_REASONS: tuple[str, ...] = ("sendAt", "quietHours", "rateLimited")


class ScheduledTask(TypedDict):
    """``notifkit:stream:scheduled`` — a task to re-emit on ``stream`` at ``dueAt``.

    Written by the engine (sendAt, quiet hours), delivery and ai (429 parking). ``payload`` is
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


def count_of(value: Any) -> int:
    """An attempt count carried in a payload: a whole number above zero, else 0 (missing,
    negative, a bool or anything else a hand-made entry may hold)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def require(payload: dict[str, Any], field: str, kind: type | tuple[type, ...]) -> Any:
    value = payload.get(field)
    if not isinstance(value, kind):
        raise MalformedPayload(f"field {field!r} is missing or has the wrong type")
    return value


# The span of due times (ms since the epoch) a task can carry: what Python's datetime holds,
# 0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999Z.
FIRST_MS = -62_135_596_800_000
LAST_MS = 253_402_300_799_999


def parse_inbound(payload: dict[str, Any]) -> InboundMessage:
    require(payload, "eventId", str)
    require(payload, "projectId", str)
    require(payload, "template", str)
    to = require(payload, "to", dict)
    if not any(k in to for k in ("userId", "userIds", "segment")):
        raise MalformedPayload("field 'to' names no recipient")
    for name in ("userId", "segment"):
        if name in to and not isinstance(to[name], str):
            raise MalformedPayload(f"field 'to.{name}' is not a string")
    if "userIds" in to and not _str_list(to["userIds"]):
        raise MalformedPayload("field 'to.userIds' is not a list of user ids")
    if payload.get("priority") not in PRIORITIES:
        raise MalformedPayload("field 'priority' is not critical, normal or low")
    if not isinstance(payload.setdefault("data", {}), dict):
        raise MalformedPayload("field 'data' is not an object")
    channels = payload.setdefault("channels", None)
    if channels is not None and not _str_list(channels):
        raise MalformedPayload("field 'channels' is not a list of channel names")
    if not isinstance(payload.get("createdAt", ""), str):
        raise MalformedPayload("field 'createdAt' is not a string")
    _optional_strings(payload, "sendAt", "campaignId", "idempotencyKey")
    return payload  # type: ignore[return-value]


def parse_scheduled_task(payload: dict[str, Any]) -> ScheduledTask:
    require(payload, "taskId", str)
    require(payload, "projectId", str)
    due = payload.get("dueAt")
    if isinstance(due, bool) or not isinstance(due, int | float):
        raise MalformedPayload("field 'dueAt' is missing or not a number of milliseconds")
    if not FIRST_MS <= due <= LAST_MS:
        # No time in the calendar (NaN or infinite too): converting it failed the batch it
        # was read with, and every task beside it went to the dead-letter queue with it.
        raise MalformedPayload("field 'dueAt' is not a time between the years 1 and 9999")
    payload["dueAt"] = int(due)
    require(payload, "stream", str)
    require(payload, "payload", dict)
    payload.setdefault("reason", "sendAt")
    return payload  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------
# The send path: enricher -> engine -> (ai | scheduler) -> delivery


class UserProfile(TypedDict):
    """What templates see as ``user``."""

    id: str
    attributes: dict[str, Any]
    timezone: str | None
    locale: str | None


class Preferences(TypedDict):
    """Explicit choices only: a channel or topic missing from the map is allowed."""

    channels: dict[str, bool]
    topics: dict[str, bool]
    quietHours: dict[str, str] | None  # {"start": "22:00", "end": "07:00"}, user's timezone


class FallbackFrom(TypedDict):
    """Why an enriched message is a fallback re-entry: the task whose channel failed, or was
    not sent at all (``outcome`` skipped or suppressed; absent = failed)."""

    taskId: str
    channel: str
    reason: str
    outcome: NotRequired[str]


class EnrichedMessage(TypedDict):
    """``notifkit:stream:enriched:{p}`` — one recipient of a notification, with everything the
    engine needs to choose channels and render (written by the enricher, and by delivery when
    a channel fails and the fallback chain goes on)."""

    eventId: str
    projectId: str
    template: str
    priority: str
    data: dict[str, Any]
    channels: list[str] | None  # requested; None = the template's channels
    sendAt: str | None
    campaignId: str | None
    createdAt: str
    user: UserProfile
    contacts: dict[str, list[str]]  # channel -> enabled targets, oldest first
    preferences: Preferences
    # channel -> why its contacts were disabled (e.g. invalid_recipient); only channels with
    # a disabled contact, and absent when there is none.
    disabledContacts: NotRequired[dict[str, str]]
    # Set on a fallback re-entry: the rest of the chain, tried in order (first available wins).
    fallbackChain: NotRequired[list[str]]
    fallbackFrom: NotRequired[FallbackFrom]
    workflowInstanceId: NotRequired[str]
    workflowStep: NotRequired[int]
    digestItems: NotRequired[list[dict[str, Any]]]


class FallbackContext(TypedDict):
    """Carried by a task sent on a fallback-chain channel: where to go if it fails."""

    chain: list[str]  # the channels after this one the user can be reached on, in order
    # The channels after this one as the template lists them, up to the last of ``chain``: the
    # re-entry's chain, so one passed over (no contact, say) is on the timeline. Absent in
    # tasks queued before it existed: ``chain`` then.
    route: NotRequired[list[str]]
    recipient: EnrichedMessage  # the recipient as the engine saw it (contacts of the chain)


class OutboundTask(TypedDict):
    """``notifkit:stream:outbound:{p}`` — one rendered message for one recipient on one channel
    (engine, ai, scheduler -> delivery). ``taskId`` is the provider idempotency key."""

    taskId: str
    eventId: str
    projectId: str
    userId: str
    channel: str
    priority: str
    template: str
    topic: str | None
    to: list[str]  # destinations: address, number, device tokens, URL; the user id for inapp
    content: dict[str, Any]  # the rendered channel content (subject/html/text, text, ...)
    campaignId: str | None
    createdAt: str
    unsubscribeUrl: NotRequired[str]  # email: List-Unsubscribe target
    parkCount: NotRequired[int]  # times parked after a provider 429
    priorAttempts: NotRequired[int]  # attempts made by earlier (parked) entries of this task
    # Parked for its turn in notifkit's own token bucket (ratelimit.py): back at that turn, it
    # does not queue for another.
    bucketTurn: NotRequired[bool]
    # Set on a task that waited on the scheduler (sendAt, quiet hours): when it was due, UTC.
    # The user's quiet hours were read before it waited, so delivery reads them again.
    heldUntil: NotRequired[str]
    fallback: NotRequired[FallbackContext]
    workflowInstanceId: NotRequired[str]
    workflowStep: NotRequired[int]


class AiSpec(TypedDict):
    model: str
    prompt: str


class AiTask(OutboundTask):
    """``notifkit:stream:ai:pending`` — an outbound task whose content the AI service writes.

    ``content`` is empty; ``ai`` is the template's model and prompt (not yet rendered) and
    ``context`` the template render context. :func:`outbound_from_ai` makes the outbound task.
    """

    ai: AiSpec
    context: dict[str, Any]


def parse_enriched(payload: dict[str, Any]) -> EnrichedMessage:
    for name in ("eventId", "projectId", "template", "createdAt"):
        require(payload, name, str)
    if payload.get("priority") not in PRIORITIES:
        raise MalformedPayload("field 'priority' is not critical, normal or low")
    user = require(payload, "user", dict)
    if not isinstance(user.get("id"), str):
        raise MalformedPayload("field 'user.id' is missing")
    user.setdefault("attributes", {})
    user.setdefault("timezone", None)
    user.setdefault("locale", None)
    channels = payload.setdefault("channels", None)
    if channels is not None and not _str_list(channels):
        raise MalformedPayload("field 'channels' is not a list of channel names")
    if not isinstance(payload.setdefault("data", {}), dict):
        raise MalformedPayload("field 'data' is not an object")
    contacts = payload.setdefault("contacts", {})
    if not isinstance(contacts, dict) or not all(_str_list(v) for v in contacts.values()):
        raise MalformedPayload("field 'contacts' is not a map of channel -> targets")
    prefs = payload.setdefault("preferences", {})
    if not isinstance(prefs, dict):
        raise MalformedPayload("field 'preferences' is not an object")
    prefs.setdefault("channels", {})
    prefs.setdefault("topics", {})
    prefs.setdefault("quietHours", None)
    chain = payload.get("fallbackChain")
    if chain is not None and not _str_list(chain):
        raise MalformedPayload("field 'fallbackChain' is not a list of channel names")
    came_from = payload.get("fallbackFrom")
    if came_from is not None and (
        not isinstance(came_from, dict) or not isinstance(came_from.get("channel"), str)
        or not isinstance(came_from.get("outcome", ""), str)
    ):
        raise MalformedPayload("field 'fallbackFrom' is not {taskId, channel, reason}")
    _optional_strings(payload, "sendAt", "campaignId")
    return payload  # type: ignore[return-value]


def parse_outbound(payload: dict[str, Any]) -> OutboundTask:
    for name in ("taskId", "eventId", "projectId", "userId", "template"):
        require(payload, name, str)
    if payload.get("channel") not in CHANNELS:
        raise MalformedPayload("field 'channel' is not one of the five channels")
    if payload.get("priority") not in PRIORITIES:
        raise MalformedPayload("field 'priority' is not critical, normal or low")
    if not _str_list(payload.get("to")) or not payload["to"]:
        raise MalformedPayload("field 'to' is not a non-empty list of destinations")
    require(payload, "content", dict)
    if not isinstance(payload.get("bucketTurn", False), bool):
        raise MalformedPayload("field 'bucketTurn' is not true or false")
    for name in ("parkCount", "priorAttempts"):
        value = payload.setdefault(name, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise MalformedPayload(f"field {name!r} is not a non-negative integer")
    fallback = payload.get("fallback")
    if fallback is not None and (
        not isinstance(fallback, dict)
        or not _str_list(fallback.get("chain"))
        or not _str_list(fallback.get("route", []))
        or not isinstance(fallback.get("recipient"), dict)
    ):
        raise MalformedPayload("field 'fallback' is not {chain, recipient}")
    _optional_strings(payload, "topic", "campaignId")
    for name in ("createdAt", "unsubscribeUrl", "heldUntil"):
        if not isinstance(payload.get(name, ""), str):
            raise MalformedPayload(f"field {name!r} is not a string")
    payload.setdefault("createdAt", "")
    return payload  # type: ignore[return-value]


def outbound_from_ai(task: AiTask, content: dict[str, Any]) -> OutboundTask:
    """The outbound task of an AI task once its content is written."""
    # The AI stage's own attempts (priorAttempts, parkCount, and those before a DLQ replay
    # of the AI task) and its turn in the model's bucket are not delivery's.
    out = {k: v for k, v in task.items()
           if k not in ("ai", "context", "priorAttempts", "parkCount", "_replayedAttempts",
                        "bucketTurn")}
    out["content"] = content
    return out  # type: ignore[return-value]


def _optional_strings(payload: dict[str, Any], *names: str) -> None:
    """Each field a string or null (null when absent). Checked here, with the rest of the
    shape: a number there failed the batch's INSERT, and so every message read with it, on
    every attempt, into the dead-letter queue (CONTRACT §3: acked at once, alone)."""
    for name in names:
        if not isinstance(payload.setdefault(name, None), str | None):
            raise MalformedPayload(f"field {name!r} is not a string or null")


def _str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)
