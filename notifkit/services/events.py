"""The events service: outcomes and receipts become the record, and change what happens next.

Consumes ``notifkit:stream:events:inbound`` (CONTRACT §6). Per read batch:

    notification:sent | :failed | :invalid_token   -> message_logs rows (one INSERT), unless
                                                       the event says ``recorded`` (delivery
                                                       wrote the row before it acked)
    receipt (provider webhook, via the api)         -> provider message id resolved to its task
                                                       (one query), then message_logs rows and,
                                                       for hard bounces and complaints,
                                                       suppressions (one INSERT each); and
                                                       workflow:inbound {"type": "event",
                                                       "name": <the receipt's kind>} for the
                                                       message's user, which wakes a
                                                       waitForEvent on "clicked" (say)
    custom (POST /v1/events)                        -> workflow:inbound {"type": "event", ...},
                                                       written atomically with the ack
    notification:failed of a workflow:inbound       -> the instance marked failed, with the
      trigger or wake (``instanceId``)                 error (a DLQ replay of the entry
                                                       carries it on)

Every row is inserted with ON CONFLICT DO NOTHING on its natural key, so a replayed entry or
a provider repeating a webhook records nothing twice. A receipt whose message notifkit cannot
find yet (the webhook overtook delivery's own record) fails its attempt and is retried by the
reclaim cycle; after the attempt limit it is dead-lettered where an operator sees it. One
that echoes another project's task is acked and changes nothing here.

Statuses written (the recipient+channel status after the row): sent -> sent; failed ->
failed; dead-lettered (the worker's failed event, which carries ``attempts`` and ``stream``)
-> dead_lettered; receipts delivered, opened, clicked, complained -> delivered; bounced and
failed -> failed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import asyncpg

from notifkit import metrics
from notifkit.clock import utc_now_iso
from notifkit.db import events as events_db
from notifkit.db import workflows as workflows_db
from notifkit.db.events import MessageLookup, SentMessage, Suppression, TimelineRow
from notifkit.destinations import normalise_contact
from notifkit.errors import MalformedPayload, PermanentFailure, RetryLater
from notifkit.ids import derived_uuid7, is_uuid, untasked_row_id
from notifkit.messages import CHANNELS, RECEIPT_KINDS, WorkflowEvent, count_of
from notifkit.services.base import WorkerService
from notifkit.wording import counted
from notifkit.worker import Entry

log = logging.getLogger("notifkit.events")

RECEIPT_STATUS = {
    "delivered": "delivered",
    "opened": "delivered",
    "clicked": "delivered",
    "complained": "delivered",  # it arrived; the complaint suppresses the address
    "bounced": "failed",
    "failed": "failed",
}
SUPPRESSIBLE_CHANNELS = ("email", "sms", "push", "webhook")
# Words providers use for a bounce that says nothing about the address itself.
_SOFT_BOUNCE = frozenset({"transient", "soft", "softbounce", "soft_bounce", "blocked",
                          "deferred", "undetermined", "temporary"})
# Twilio error codes that say the number itself will never take a message.
TWILIO_PERMANENT_ERRORS = frozenset({"21211", "21610", "21614", "30004", "30005", "30006"})
_MAX_RAW_CHARS = 4000
# What PostgreSQL refuses in a row itself (a value too long for an index, bad data, a
# constraint), as opposed to an outage or a lock: writing the row again cannot help.
_REFUSED_ROWS = (asyncpg.ProgramLimitExceededError, asyncpg.DataError,
                 asyncpg.IntegrityConstraintViolationError)
# One receipt's writes: its timeline rows and suppressions, which stand or fall together.
_Write = tuple[Entry, list[TimelineRow], list[Suppression]]


class EventsService(WorkerService):
    name = "events"
    # Its batches only query Redis and PostgreSQL and are bounded by the slots: one at a time
    # keeps them large, and measured lowest latency at moderate load.
    max_batches = 1

    def streams(self) -> Sequence[str]:
        return [self.keys.events_inbound]

    async def process(self, batch: list[Entry]) -> None:
        rows: list[TimelineRow] = []
        receipts: list[tuple[Entry, dict[str, Any]]] = []
        dead_instances: list[tuple[str, str]] = []
        for entry in batch:
            try:
                kind = entry.payload.get("type")
                if kind in ("notification:sent", "notification:failed",
                            "notification:invalid_token"):
                    dead = dead_workflow_instance(entry.payload, self.keys.workflow_inbound)
                    if dead is not None:
                        dead_instances.append(dead)
                        continue
                    if entry.payload.get("recorded") is True:
                        continue  # delivery wrote this row itself before it acked
                    row = outcome_row(entry.payload)
                    if row is not None:
                        rows.append(row)
                elif kind == "receipt":
                    receipts.append((entry, parse_receipt(entry.payload)))
                elif kind == "custom":
                    entry.emit(self.keys.workflow_inbound, workflow_event(entry.payload))
                else:
                    raise MalformedPayload(f"unknown event type {kind!r}")
            except MalformedPayload as exc:
                metrics.MALFORMED.labels(self.name, entry.stream).inc()
                log.error("Acked an event that can never be recorded: %s.", exc,
                          extra={"service": self.name, "stream": entry.stream,
                                 "entry_id": entry.id,
                                 "event_id": entry.payload.get("eventId")})
        # Outcomes first: a receipt in the same batch may name a message sent just before.
        await events_db.insert_timeline(self.pool, rows)
        for instance_id, error in dead_instances:
            if await workflows_db.fail_dead_lettered(self.pool, instance_id, error,
                                                     datetime.now(UTC)):
                log.warning("Marked a workflow instance failed: its entry was dead-lettered "
                            "(%s). Replaying the entry from the DLQ carries it on.", error,
                            extra={"instance_id": instance_id})
        if receipts:
            await self._receipts(receipts)

    async def _receipts(self, receipts: list[tuple[Entry, dict[str, Any]]]) -> None:
        found = await events_db.resolve_messages(self.pool, [
            MessageLookup(r["projectId"], r["provider"], r["providerMessageId"],
                          _text(r.get("taskId")), _text(r.get("channel")))
            for _e, r in receipts
        ])
        writes: list[_Write] = []
        foreign = await self._foreign(receipts, found)
        for index, ((entry, receipt), message) in enumerate(zip(receipts, found, strict=True)):
            if index in foreign:
                # Another project's send, whose own endpoint gets the same event: retrying
                # would put that project's recipient in this one's DLQ, and its bounce would
                # suppress the address here. Done with.
                log.info("Ignored a %s receipt about another project's send.",
                         receipt["kind"], extra={"project_id": receipt["projectId"],
                                                 "task_id": receipt.get("taskId")})
                continue
            if message is None or message.event_id is None:
                # Not matched yet (delivery's record may still be on its way) or ever (the
                # send was not notifkit's, or its record is lost). The signed receipt names
                # the address, so a hard bounce or complaint suppresses it at once rather than
                # after the retries (minutes with the default reclaim), during which new sends
                # would still go to it; the insert is idempotent across attempts.
                orphan = unmatched_suppression(
                    receipt, final=entry.attempt >= self.worker.max_attempts)
                if orphan is not None:
                    writes.append((entry, [], [orphan]))
                entry.fail(RetryLater(
                    f"no message with {receipt['provider']} id {receipt['providerMessageId']!r}"
                    " is recorded yet"))
                continue
            suppression = suppression_for(receipt, message)
            writes.append((entry, [receipt_row(receipt, message, suppression)],
                           [suppression] if suppression is not None else []))
            engagement = receipt_event(receipt, message)
            if engagement is not None:
                entry.emit(self.keys.workflow_inbound, engagement)
            if suppression is not None:
                log.info("Suppressed an address on %s after a %s receipt; it is never contacted "
                         "again in this project.", suppression.channel, receipt["kind"],
                         extra={"project_id": receipt["projectId"], "task_id": message.task_id,
                                "event_id": message.event_id})
        try:
            await self._write(writes)
        except _REFUSED_ROWS:
            # A signed receipt may still carry what PostgreSQL will never store (a message id
            # or address of kilobytes is more than an index holds). Failing the batch would
            # fail every receipt read with it, attempt after attempt, into the DLQ: write one
            # entry at a time instead, and dead-letter only those refused. (One still waiting
            # for its send keeps waiting: the send names the address to suppress.)
            for write in writes:
                try:
                    await self._write([write])
                except _REFUSED_ROWS as exc:
                    if write[0].error is None:
                        write[0].fail(PermanentFailure(
                            f"PostgreSQL refuses to store the receipt: {exc}"))

    async def _foreign(self, receipts: list[tuple[Entry, dict[str, Any]]],
                       found: list[SentMessage | None]) -> set[int]:
        """The receipts matching no send here that echo a task of another project."""
        unmatched = [(index, receipt["projectId"], task) for index, ((_e, receipt), message)
                     in enumerate(zip(receipts, found, strict=True))
                     if (message is None or message.event_id is None)
                     and (task := _text(receipt.get("taskId"))) is not None]
        if not unmatched:
            return set()
        hits = await events_db.foreign_tasks(self.pool, [(p, t) for _i, p, t in unmatched])
        return {unmatched[hit][0] for hit in hits}

    async def _write(self, writes: Sequence[_Write]) -> None:
        async with self.pool.acquire() as conn, conn.transaction():
            await events_db.insert_timeline(conn, [r for _e, rows, _s in writes for r in rows])
            await events_db.insert_suppressions(conn, [s for _e, _r, sups in writes
                                                       for s in sups])


# -- outcome events ------------------------------------------------------------------------


def dead_workflow_instance(event: Mapping[str, Any], workflow_stream: str
                           ) -> tuple[str, str] | None:
    """(instance id, error) when ``event`` is a dead-lettered workflow trigger or wake: its
    instance would otherwise look in progress for good (a timer's wake names no project, so
    it is found by its globally unique id)."""
    if event.get("type") != "notification:failed" or event.get("stream") != workflow_stream:
        return None
    instance_id = event.get("instanceId")
    if not isinstance(instance_id, str) or not is_uuid(instance_id):
        return None
    attempts = count_of(event.get("attempts"))
    error = _text(event.get("error")) or "unknown error"
    return instance_id, (f"dead-lettered after {counted(attempts, 'attempt')}: "
                         f"{error.replace(chr(0), chr(0xFFFD))}")


def outcome_row(event: Mapping[str, Any]) -> TimelineRow | None:
    """The timeline row of a delivery outcome or a dead-lettering; None when the event names
    nothing the timeline can hold (no notification id: e.g. a dead-lettered scheduler entry)."""
    project_id = event.get("projectId")
    if not isinstance(project_id, str) or not is_uuid(project_id):
        raise MalformedPayload("field 'projectId' is not a UUID")
    event_id = event.get("eventId")
    if not isinstance(event_id, str) or not is_uuid(event_id):
        log.info("A %s event names no notification; nothing to add to a timeline.",
                 event.get("type"), extra={"project_id": project_id,
                                           "task_id": event.get("taskId")})
        return None
    task_id = _text(event.get("taskId"))
    channel = _channel(event.get("channel"))
    if task_id is None:
        task_id, channel = untasked_row_id(event_id, _text(event.get("userId"))), ""
    kind = event["type"]
    provider = _text(event.get("provider"))
    # An error can quote a provider's answer, any byte of it; a text column takes no NUL.
    error = _text(event.get("error"))
    error = error.replace("\x00", "\ufffd") if error is not None else None
    metadata: dict[str, Any] = {"at": event.get("at")}
    earlier_attempts = 0
    if kind == "notification:sent":
        row_kind, status = "sent", "sent"
        attempt = count_of(event.get("attempt"))
        detail = f"accepted by {provider}" if provider else "accepted by the provider"
    elif kind == "notification:invalid_token":
        row_kind, status = "failed", "failed"
        attempt = count_of(event.get("attempt"))
        detail = f"invalid recipient, contact disabled: {error or 'rejected by the provider'}"
        metadata["reason"] = "invalid_recipient"
    elif "attempts" in event and "stream" in event:  # the worker's dead-lettering
        row_kind, status = "dead_lettered", "dead_lettered"
        attempts = count_of(event.get("attempts"))
        attempt = max(count_of(event.get("attempt")), attempts)
        earlier_attempts = attempt - attempts
        detail = f"dead-lettered after {counted(attempts, 'attempt')}: {error or 'unknown error'}"
        metadata.update(stream=event.get("stream"), entryId=event.get("entryId"))
    else:
        row_kind, status = "failed", "failed"
        attempt = count_of(event.get("attempt"))
        detail = error or "the send failed"
    return TimelineRow(
        project_id=project_id, event_id=event_id, task_id=task_id,
        user_id=_text(event.get("userId")), channel=channel, attempt=attempt, kind=row_kind,
        status=status, detail=detail, provider=provider,
        provider_message_id=_text(event.get("providerMessageId")),
        campaign_id=_text(event.get("campaignId")), metadata=metadata,
        earlier_attempts=earlier_attempts,
    )


# -- receipts ---------------------------------------------------------------------------------


def parse_receipt(event: dict[str, Any]) -> dict[str, Any]:
    project_id = event.get("projectId")
    if not isinstance(project_id, str) or not is_uuid(project_id):
        raise MalformedPayload("field 'projectId' is not a UUID")
    for name in ("provider", "providerMessageId"):
        if not isinstance(event.get(name), str) or not event[name]:
            raise MalformedPayload(f"field {name!r} is missing")
    if event.get("kind") not in RECEIPT_KINDS:
        raise MalformedPayload(f"receipt kind {event.get('kind')!r} is not one of "
                               f"{', '.join(RECEIPT_KINDS)}")
    return event


def receipt_row(
    receipt: Mapping[str, Any], message: SentMessage, suppression: Suppression | None
) -> TimelineRow:
    kind = receipt["kind"]
    detail = _receipt_detail(receipt)
    # A provider's sentence may end in a full stop; the clause after it goes in its place.
    if suppression is not None:
        detail = f"{detail.rstrip('.')}; address suppressed"
    elif kind == "bounced" and not is_hard_bounce(receipt):
        # A reader who sees the next send go out to the address learns why here.
        detail = f"{detail.rstrip('.')}; a soft bounce: the address is not suppressed"
    metadata: dict[str, Any] = {"at": receipt.get("at")}
    raw = receipt.get("raw")
    if raw is not None and len(repr(raw)) <= _MAX_RAW_CHARS:
        metadata["raw"] = raw
    link = _click_link(raw)
    if link is not None:
        metadata["link"] = link
    return TimelineRow(
        project_id=receipt["projectId"], event_id=str(message.event_id),
        task_id=message.task_id, user_id=message.user_id, channel=message.channel,
        attempt=message.attempt, kind=kind, status=RECEIPT_STATUS[kind], detail=detail,
        provider=receipt["provider"], provider_message_id=receipt["providerMessageId"],
        campaign_id=message.campaign_id, metadata=metadata,
    )


def receipt_event(receipt: Mapping[str, Any], message: SentMessage) -> WorkflowEvent | None:
    """The receipt as a workflow event named by its kind (``delivered``, ``opened``,
    ``clicked``, ...) for the user the message went to; None for a message with no user."""
    if not message.user_id:
        return None
    kind = receipt["kind"]
    data: dict[str, Any] = {
        "notificationId": message.event_id, "taskId": message.task_id,
        "channel": message.channel, "provider": receipt["provider"],
        "providerMessageId": receipt["providerMessageId"],
    }
    link = _click_link(receipt.get("raw"))
    if link is not None:
        data["link"] = link
    at = receipt.get("at")
    return {
        "type": "event", "projectId": receipt["projectId"], "name": kind,
        "userId": message.user_id, "data": data,
        "at": at if isinstance(at, str) and at else utc_now_iso(),
        "eventId": receipt_event_id(receipt, message),
    }


def receipt_event_id(receipt: Mapping[str, Any], message: SentMessage) -> str:
    """The workflow event's id: one per webhook delivery. The provider retrying a delivery
    (same ``webhookId``) is the same event, which resolves the waiters it resolved the first
    time and no others; the user opening or clicking again is a delivery of its own, a new
    event for whatever began waiting since. A receipt naming no delivery is one event per
    message and kind, every copy taken for a retry."""
    parts = [message.task_id, "receipt", receipt["kind"], receipt["providerMessageId"]]
    webhook_id = _text(receipt.get("webhookId"))
    if webhook_id is not None:
        parts.append(webhook_id)
    return derived_uuid7(*parts)


def _click_link(raw: Any) -> str | None:
    link = _find(raw, ("data", "click", "link"), ("click", "link"), ("url",))
    return link if isinstance(link, str) else None


def _suppression_reason(receipt: Mapping[str, Any]) -> str | None:
    kind = receipt["kind"]
    if kind == "complained":
        return "complaint"
    if kind == "bounced" and is_hard_bounce(receipt):
        return "bounce"
    if kind == "failed" and _twilio_code(receipt.get("raw")) in TWILIO_PERMANENT_ERRORS:
        # Twilio reports a number that can never receive (invalid, not mobile, replied STOP)
        # as status "failed" rather than "undelivered": as permanent as a hard bounce.
        return "bounce"
    return None


def _twilio_code(raw: Any) -> str | None:
    code = _find(raw, ("ErrorCode",))
    if isinstance(code, bool):  # an int to Python, but "True" is no code: it would read as soft
        return None
    return str(code).strip() if isinstance(code, str | int) else None


def unmatched_suppression(receipt: Mapping[str, Any], final: bool = True) -> Suppression | None:
    """The suppression a hard bounce or complaint that matches no recorded send (yet, or on
    its ``final`` attempt ever) calls for: the address and channel the receipt itself names."""
    reason = _suppression_reason(receipt)
    channel = _text(receipt.get("channel"))
    target = _text(receipt.get("to")) or _raw_recipient(receipt.get("raw"))
    if reason is None or channel not in SUPPRESSIBLE_CHANNELS or not target:
        return None
    # A provider may spell the domain in capitals; contacts store it lower-cased, and a
    # suppression stops sends only to a contact spelled exactly as it is.
    target = normalise_contact(channel, target)
    if final:
        log.warning("A %s matches no send notifkit recorded; its address is suppressed "
                    "anyway.", receipt["kind"], extra={"project_id": receipt["projectId"]})
    return Suppression(receipt["projectId"], channel, target, reason, _receipt_detail(receipt))


def suppression_for(receipt: Mapping[str, Any], message: SentMessage) -> Suppression | None:
    """A hard bounce or a complaint suppresses the address the message went to."""
    kind = receipt["kind"]
    reason = _suppression_reason(receipt)
    if reason is None:
        return None
    if message.channel not in SUPPRESSIBLE_CHANNELS:
        return None
    named = _text(receipt.get("to")) or _raw_recipient(receipt.get("raw"))
    target = message.destination or (named and normalise_contact(message.channel, named))
    if not target:
        log.warning("A %s names no address notifkit can find; nothing is suppressed.", kind,
                    extra={"project_id": receipt["projectId"], "task_id": message.task_id,
                           "event_id": message.event_id})
        return None
    return Suppression(receipt["projectId"], message.channel, target, reason,
                       _receipt_detail(receipt))


def is_hard_bounce(receipt: Mapping[str, Any]) -> bool:
    """Bounces are hard unless the receipt says otherwise: ``hard: false`` (on the receipt, or
    in the provider's event at its top level or under ``data``), a provider's bounce
    type such as Resend's ``Transient``/``Undetermined`` or SendGrid's ``blocked``, or a Twilio
    error code that names a temporary condition (30003: handset unreachable, ...)."""
    raw = receipt.get("raw")
    hard = receipt.get("hard")
    if not isinstance(hard, bool):
        # A receipt from a webhook carries only what the provider's event says.
        hard = _find(raw, ("hard",), ("data", "hard"))
    if isinstance(hard, bool):
        return hard
    code = _twilio_code(raw)
    if code:
        return code in TWILIO_PERMANENT_ERRORS
    for path in (("bounce", "type"), ("data", "bounce", "type"), ("bounceType",),
                 ("data", "bounceType"), ("bounce_classification",), ("type",)):
        value = _find(raw, path)
        if isinstance(value, str) and value.strip().lower().replace(" ", "") in _SOFT_BOUNCE:
            return False
    return True


def _receipt_detail(receipt: Mapping[str, Any]) -> str:
    raw = receipt.get("raw")
    # Resend's bounce message and failure reason, SendGrid's reason, Twilio's error message.
    message = _find(raw, ("data", "bounce", "message"), ("bounce", "message"), ("reason",),
                    ("data", "reason"), ("data", "failed", "reason"), ("ErrorMessage",))
    base = f"{receipt['kind']} ({receipt['provider']})"
    if isinstance(message, str) and message:
        return f"{base}: {message}"
    code = _twilio_code(raw)  # Twilio's callbacks carry a code and no message
    return f"{base}: error {code}" if code else base


def _raw_recipient(raw: Any) -> str | None:
    value = _find(raw, ("data", "to"), ("to",), ("email",), ("To",))
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    return value if isinstance(value, str) and value else None


def _find(raw: Any, *paths: tuple[str, ...]) -> Any:
    """The first value found at one of ``paths`` in a nested mapping (None if none is)."""
    for path in paths:
        node = raw
        for part in path:
            node = node.get(part) if isinstance(node, Mapping) else None
        if node is not None:
            return node
    return None


# -- custom events -------------------------------------------------------------------------


def workflow_event(event: Mapping[str, Any]) -> WorkflowEvent:
    project_id, name, user_id = event.get("projectId"), event.get("name"), event.get("userId")
    if not isinstance(project_id, str) or not is_uuid(project_id):
        raise MalformedPayload("field 'projectId' is not a UUID")
    if not isinstance(name, str) or not name:
        raise MalformedPayload("field 'name' is missing")
    if not isinstance(user_id, str) or not user_id:
        raise MalformedPayload("field 'userId' is missing")
    data = event.get("data")
    forwarded: WorkflowEvent = {
        "type": "event", "projectId": project_id, "name": name, "userId": user_id,
        "data": data if isinstance(data, dict) else {},
        "at": event["at"] if isinstance(event.get("at"), str) else utc_now_iso(),
    }
    if isinstance(event.get("eventId"), str):
        forwarded["eventId"] = event["eventId"]
    return forwarded


# -- field helpers -------------------------------------------------------------------------


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _channel(value: Any) -> str:
    return value if value in CHANNELS else ""
