"""The enricher: one inbound notification -> one enriched message per recipient.

    inbound:{p}  --dedup (caller key 24 h, else event id 1 h)-->  resolve recipients
                 --one query per read batch-->  profiles, contacts, preferences, quiet hours
                 --> enriched:{p} (one message per known user; unknown users are logged)

A segment is streamed with keyset pagination: each entry handles one page of members and, if
more follow, emits a *continuation* (the same inbound message with ``segmentAfter`` = the last
member id) to its own stream, atomically with its ack. No entry ever does unbounded work or
holds more than a page of recipients, and a crash loses nothing: the continuation either was
written together with the page's outputs or neither was.

Every recipient's message carries the send's data, so pages are bounded by bytes too: a read
batch fans out about ``BYTES_PER_BATCH`` of copied payload, shared among its entries. A list of
users whose messages would exceed its share is paged the same way, by id in sorted order.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from notifkit.codec import dumps
from notifkit.config import Settings
from notifkit.db.logs import Kind, LogRow, Status, insert_logs
from notifkit.db.recipients import Recipient, load_recipients, segment_page
from notifkit.dedup import Dedup, enricher_key, enricher_page_key
from notifkit.errors import MalformedPayload
from notifkit.ids import derived_uuid7
from notifkit.messages import InboundMessage, parse_inbound
from notifkit.services.base import WorkerService
from notifkit.services.payloads import parse_each, parse_one
from notifkit.streams import as_str, decode
from notifkit.worker import Entry

log = logging.getLogger("notifkit.enricher")

# Recipients one read batch may fan out, shared among the batch's segment pages, so a batch
# of segment entries holds a bounded number of enriched messages however large the segments.
RECIPIENTS_PER_BATCH = 2000
MIN_SEGMENT_PAGE = 50
# Bytes of copied payload (the send's data, digest items, ...) one read batch may fan out:
# 2,000 recipients of a send carrying 1 MiB of data would otherwise be 2 GB in one write.
BYTES_PER_BATCH = 32 * 1024 * 1024
# What a recipient's profile, contacts and preferences add to a message, roughly.
PROFILE_BYTES = 1024

# Fields the enriched message copies from the inbound one.
_COPIED = ("eventId", "projectId", "template", "priority", "data", "channels", "sendAt",
           "campaignId", "createdAt", "workflowInstanceId", "workflowStep", "digestItems")


class _Duplicate(NamedTuple):
    message: InboundMessage
    first: str | None  # the event id of the notification holding the mark, if known


@dataclass
class _Work:
    entry: Entry
    message: InboundMessage
    user_ids: list[str]
    continuation: str | None = None  # segment: the member id the next page starts after


class EnricherService(WorkerService):
    name: ClassVar[str] = "enricher"
    # Key probes and batch writes only: short-lived generic plans (notifkit.db.pool).
    generic_plans: ClassVar[bool] = True
    # One batch in flight per priority stream: entries arriving meanwhile go in the next,
    # larger batch, which shares its round trips (about 40 % lower latency at 500/s offered,
    # see benchmarks/RESULTS.md). Per stream, so critical entries never wait for
    # a batch of low ones.
    max_batches: ClassVar[int | None] = 1

    def __init__(self, settings: Settings, **options: Any) -> None:
        super().__init__(settings, **options)
        self.recipients_per_batch = int(options.get("recipients_per_batch",
                                                    RECIPIENTS_PER_BATCH))
        self.bytes_per_batch = int(options.get("bytes_per_batch", BYTES_PER_BATCH))

    claims_on_read = True

    def streams(self) -> list[str]:
        return self.keys.inbound_all()

    @property
    def dedup(self) -> Dedup:
        return Dedup(self.redis, self.keys, "enricher", self.settings.idempotency_ttl_s)

    async def process(self, batch: list[Entry]) -> None:
        parsed = parse_each(self.name, batch, parse_inbound)
        fresh, duplicates = await self._claim(parsed)
        segments = sum(1 for _e, m in fresh if "segment" in m["to"])
        page = max(MIN_SEGMENT_PAGE, self.recipients_per_batch // max(segments, 1))
        share = self.bytes_per_batch // max(len(fresh), 1)
        work: list[_Work] = []
        for entry, message in fresh:
            try:
                fits = max(1, share // _message_bytes(message))
                work.append(await self._resolve(entry, message, page, fits))
            except Exception as exc:  # this entry alone fails; its batch neighbours go on
                entry.fail(exc)

        # No write to the notification row: GET /v1/notifications/{id} reads its progress
        # from the timeline, which the engine starts moments later, and a status UPDATE
        # here cost a statement and a WAL flush on every notification's way to the provider.
        recipients = await load_recipients(
            self.pool, [(w.message["projectId"], uid) for w in work for uid in w.user_ids])
        for w in work:
            if len(w.user_ids) > 1:
                _fit(w, recipients, share)
        logs: list[LogRow] = await self._duplicate_rows(duplicates)
        unknown: list[int] = []  # per work item, like its log line below
        for w in work:
            m = w.message
            if not w.user_ids and "segment" in m["to"] and "segmentAfter" not in m:
                logs.append(_empty_segment(m))
            unknown.append(0)
            for user_id in w.user_ids:
                recipient = recipients.get((m["projectId"], user_id))
                if recipient is None:
                    logs.append(_unknown_user(m, user_id))
                    unknown[-1] += 1
                    continue
                enriched: dict[str, Any] = {k: m[k] for k in _COPIED if k in m}  # type: ignore[literal-required]
                recipient.fill(enriched)  # type: ignore[arg-type]
                w.entry.emit(self.keys.enriched(m["priority"]), enriched)
            if w.continuation is not None:
                rest = {**m, "segmentAfter": w.continuation}
                w.entry.emit(self.keys.inbound(m["priority"]), rest)
                if "segmentAfter" not in m:
                    logs.append(_fanout(m, Kind.FANOUT, "recipients are enriched in pages; "
                                                        "more follow"))
            elif "segmentAfter" in m:
                logs.append(_fanout(m, Kind.FANNED_OUT, "every recipient enriched"))
        await insert_logs(self.pool, logs)
        for w, skipped in zip(work, unknown, strict=True):
            log.info("Enriched %d recipients of the notification%s%s.",
                     len(w.user_ids) - skipped,
                     f"; skipped {skipped} unknown user(s)" if skipped else "",
                     "; the rest follows" if w.continuation else "",
                     extra=_ids(w.message))

    def _mark(self, m: InboundMessage) -> tuple[str, int | None]:
        """The notification's dedup key and its TTL (None: the default)."""
        caller_key = m.get("idempotencyKey")
        key = enricher_key(m["projectId"], idempotency_key=caller_key, event_id=m["eventId"])
        if "segmentAfter" in m:
            key = enricher_page_key(key, m["segmentAfter"])
        return key, self.settings.caller_idempotency_ttl_s if caller_key else None

    def claim_key(self, stream: str, payload: dict[str, Any]) -> tuple[str, int] | None:
        m = parse_one(payload, parse_inbound)
        return None if m is None else self.dedup.mark_of(*self._mark(m))

    async def _claim(
        self, parsed: list[tuple[Entry, InboundMessage]]
    ) -> tuple[list[tuple[Entry, InboundMessage]], list[_Duplicate]]:
        """The entries to enrich, and the duplicates dropped."""
        claims: list[tuple[Entry, str, int | None]] = []
        claimed: list[tuple[Entry, InboundMessage]] = []
        for entry, m in parsed:
            try:
                key, ttl = self._mark(m)
            except Exception as exc:  # a key of the wrong type: this entry alone fails
                entry.fail(exc)
                continue
            claims.append((entry, key, ttl))
            claimed.append((entry, m))
        allowed = await self.dedup.claim_many(claims)
        fresh = []
        duplicates = []
        for (entry, m), ok in zip(claimed, allowed, strict=True):
            first: dict[str, Any] | None = None
            if not ok and m.get("idempotencyKey") and "segmentAfter" not in m:
                first = await self._holder(self._mark(m)[0])
                if first is not None and first.get("idempotencyKey") != m["idempotencyKey"]:
                    # The mark is a notification sent without a key, under its own id, and
                    # this caller chose that id as its key: no notification used the key
                    # before, and the API took this one for new. It goes on, unmarked (the
                    # engine's and delivery's marks still stop a repeat of its own entry).
                    ok = True
            if ok:
                fresh.append((entry, m))
            else:
                held_by = first.get("eventId") if first is not None else None
                duplicates.append(_Duplicate(m, held_by if isinstance(held_by, str) else None))
                log.info("Skipped a duplicate of a notification already enriched.",
                         extra=_ids(m))
        return fresh, duplicates

    async def _duplicate_rows(self, duplicates: list[_Duplicate]) -> list[LogRow]:
        """A skipped row for each duplicate that is another notification than the one that
        took its caller's idempotency key. The API answers a repeated key with the first
        notification, so this takes a lost answer (its record of the key gone while the
        enricher's mark stayed); without the row the second would read 'accepted' for ever.
        The same notification written twice is dropped silently: it goes on under its
        first entry."""
        rows = []
        for m, first in duplicates:
            if not m.get("idempotencyKey") or "segmentAfter" in m or first == m["eventId"]:
                continue
            which = f"notification {first}" if first else "an earlier notification"
            rows.append(LogRow(
                project_id=m["projectId"], event_id=m["eventId"], task_id=m["eventId"],
                user_id=None, channel="", kind=Kind.SKIPPED, status=Status.SKIPPED,
                detail=f"duplicate of {which} (the same idempotency key); not sent again",
                campaign_id=m.get("campaignId"),
            ))
        return rows

    async def _holder(self, key: str) -> dict[str, Any] | None:
        """The inbound message of the entry holding the dedup mark ``key`` (None if gone)."""
        owner = await self.redis.get(self.dedup.mark_of(key)[0])
        if owner is None:
            return None
        stream, _, entry_id = as_str(owner).rpartition("/")
        found = await self.redis.xrange(stream, entry_id, entry_id) if stream else []
        if not found:
            return None
        try:
            message = decode(found[0][1])  # type: ignore[arg-type]
        except MalformedPayload:
            return None
        return message if isinstance(message, dict) else None

    async def _resolve(self, entry: Entry, m: InboundMessage, page: int, fits: int) -> _Work:
        """The entry's recipients: a segment's page of at most ``page`` members, and at most
        ``fits`` recipients of a segment or a list (the messages' bytes)."""
        to = m["to"]
        after = m.get("segmentAfter")
        if "segment" in to:
            page = min(page, fits)
            members = await segment_page(
                self.pool, m["projectId"], str(to["segment"]), after, page + 1
            )
            more = len(members) > page
            members = members[:page]
            return _Work(entry, m, members, members[-1] if more else None)
        if "userIds" in to:
            ids = list(dict.fromkeys(u for u in to["userIds"] if isinstance(u, str)))
            if after is None and len(ids) <= fits:
                return _Work(entry, m, ids)
            # Too large for one go: paged by id, as a segment is.
            ids = sorted(u for u in ids if after is None or u > after)
            return _Work(entry, m, ids[:fits], ids[fits - 1] if len(ids) > fits else None)
        user_id = to.get("userId")
        return _Work(entry, m, [user_id] if isinstance(user_id, str) else [])


def _fit(w: _Work, recipients: dict[tuple[str, str], Recipient], budget: int) -> None:
    """Cut ``w``'s recipients to those whose messages fit ``budget`` bytes, with its profile
    counted: every message carries its user's attributes, which a tenant may fill (2,000
    users of 1 MB each made one write of 2 GB). The rest follows as a continuation, after the
    last one kept, in the order pages are read (a list not yet paged is sorted first)."""
    m = w.message
    base = _message_bytes(m)

    def size(user_id: str) -> int:
        recipient = recipients.get((m["projectId"], user_id))
        attributes = recipient.user.get("attributes") if recipient is not None else None
        return base + (len(dumps(attributes)) if attributes else 0)

    sized = {u: size(u) for u in w.user_ids}
    if sum(sized.values()) <= budget:
        return
    ids = w.user_ids
    if "userIds" in m["to"] and w.continuation is None and "segmentAfter" not in m:
        ids = sorted(ids)  # a list paged from now on, by id, as _resolve pages one
    sizes = [sized[u] for u in ids]
    kept, total = 1, sizes[0]  # one at least, however large: a page always moves on
    while total + sizes[kept] <= budget:  # the sizes sum past the budget: this stops
        total += sizes[kept]
        kept += 1
    w.user_ids, w.continuation = ids[:kept], ids[kept - 1]


def _message_bytes(m: InboundMessage) -> int:
    """About the bytes one recipient's enriched message takes."""
    copied = {k: m[k] for k in _COPIED if k in m}  # type: ignore[literal-required]
    return len(dumps(copied)) + PROFILE_BYTES


def _unknown_user(m: InboundMessage, user_id: str) -> LogRow:
    return LogRow(
        project_id=m["projectId"], event_id=m["eventId"],
        task_id=derived_uuid7(m["eventId"], user_id, ""), user_id=user_id, channel="",
        kind=Kind.SKIPPED, status=Status.SKIPPED, detail="unknown user",
        campaign_id=m.get("campaignId"),
    )


def _empty_segment(m: InboundMessage) -> LogRow:
    """A row about the whole event (task id = event id, no channel), so a send to a segment
    without members reads as skipped instead of accepted for ever."""
    return LogRow(
        project_id=m["projectId"], event_id=m["eventId"], task_id=m["eventId"], user_id=None,
        channel="", kind=Kind.SKIPPED, status=Status.SKIPPED,
        detail=f"segment {m['to']['segment']!r} has no members",
        campaign_id=m.get("campaignId"),
    )


def _fanout(m: InboundMessage, kind: Kind, detail: str) -> LogRow:
    """A row about the whole event: a continuation can wait long (at the end of the inbound
    stream, or for the reclaim after a crash) while the first pages' recipients are all sent,
    and without it the notification would read as done meanwhile. One of each kind per
    notification (rows are unique per task, channel, attempt and kind), so a page retried
    after a crash adds nothing."""
    return LogRow(
        project_id=m["projectId"], event_id=m["eventId"], task_id=m["eventId"], user_id=None,
        channel="", kind=kind, status=Status.PROCESSING, detail=detail,
        campaign_id=m.get("campaignId"),
    )


def _ids(m: InboundMessage) -> dict[str, Any]:
    return {"service": "enricher", "event_id": m["eventId"], "project_id": m["projectId"]}
