"""The API's hot round trips, shared by concurrent requests.

Every authenticated request takes a token from its project's rate bucket, and every send looks
up its template, writes its ``notifications`` row with the ``accepted`` timeline row and XADDs
its message. Done one request at a time that is four round trips per send; here each is a
:class:`~notifkit.coalesce.Coalescer`, so a busy process issues one call for all the requests
that arrived while the previous call was out. The answers are exactly the one-at-a-time ones:
every request still gets its own script call, lookup, row pair and stream entry.

A template once found is remembered for ``KNOWN_TEMPLATE_TTL_S``: at moderate load (one
request per coalesced call) the lookup was one of a send's four round trips. Deleting a
template (``DELETE /v1/templates/{id}``) publishes the deletion, and every API process forgets
it when the message arrives (see :mod:`notifkit.services.api.pubsub`); one whose subscription
was down, and every process after a deletion by hand, refuses it again within that time. A
send accepted meanwhile records "template not found" on its timeline, as one whose template
vanished after acceptance always has. Unknown ids are never remembered, so a template created a
moment ago is found at once.

Accepting keeps its guarantee per send: a send whose rows are written but whose XADD fails has
its rows deleted again and the caller gets an error (503 for an unreachable Redis), so nothing
is left half-accepted; a send whose rows cannot be written is never enqueued. When the XADDs
went out but their replies never came (the connection broke or timed out), Redis may have run
them: before anything is undone, a new connection searches each stream from just before the
call for the sends' entries. A send found there is accepted (202); one provably absent is
rolled back as above; one Redis cannot tell about (still unreachable, or the stream trimmed
past the call) keeps its rows and gets the 503, and the scheduler's reconciliation
(:mod:`notifkit.reconcile`) settles it later from what the stream holds.

For 24 h after Redis lost its data, a send under an idempotency key Redis does not know looks
the key up here first (:meth:`Admission.first_keyed_send`; see
:mod:`notifkit.services.api.idempotency`); those lookups are coalesced like the rest.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
from redis.asyncio import ConnectionPool, Redis
from redis.exceptions import RedisError

from notifkit.coalesce import Coalescer
from notifkit.codec import json_text
from notifkit.config import Settings
from notifkit.keys import Keys
from notifkit.messages import InboundMessage
from notifkit.ratelimit import Bucket, TokenBuckets
from notifkit.redis_pipe import ReplyLost, pipe
from notifkit.services.api.errors import store_unavailable
from notifkit.services.api.idempotency import MaybeDone, Remember
from notifkit.streams import XADD_AND_SET, find_notifications, queue_xadd, xadd_and_set_args

log = logging.getLogger("notifkit.api")

KNOWN_TEMPLATE_TTL_S = 60.0
MAX_KNOWN_TEMPLATES = 10_000
# After a lost reply the streams are searched from this long before the call, by Redis's own
# clock (its TIME less the time the call took here), so clock steps that small still find it.
LOST_REPLY_SLACK_MS = 1000
# How long the search after a lost reply may take before Redis counts as unable to tell.
LOST_REPLY_CHECK_S = 5.0

# One statement for the whole batch, rows as parallel arrays (jsonb as JSON text): one plan
# and one execution where an executemany would make one of each per request. A row whose
# project is gone is left out (its send is refused with ProjectMissing); the command tag
# counts the timeline rows written, one per send written.
_INSERT_ACCEPTED = """
WITH n AS (
    INSERT INTO notifications (id, project_id, template_id, priority, status, recipients_spec,
                               data, channels, send_at, campaign_id, idempotency_key)
    SELECT r.id, r.project_id, r.template_id, r.priority, 'accepted', r.spec::jsonb,
           r.data::jsonb, r.channels::jsonb, r.send_at::timestamptz, r.campaign_id, r.idem
    FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::text[], $6::text[],
                $7::text[], $8::text[], $9::text[], $10::text[])
         AS r (id, project_id, template_id, priority, spec, data, channels, send_at,
               campaign_id, idem)
    -- The project is read, not locked: the table has no foreign key (migration 0009).
    WHERE EXISTS (SELECT 1 FROM projects p WHERE p.id = r.project_id)
    RETURNING id, project_id, campaign_id, priority)
INSERT INTO message_logs (project_id, event_id, task_id, channel, kind, status, campaign_id,
                          detail)
SELECT project_id, id, id::text, '', 'accepted', 'accepted', campaign_id,
       'accepted by the API for ' || priority || ' delivery'
FROM n
ON CONFLICT (task_id, channel, attempt, kind) DO NOTHING
"""

# Per wanted (project, key, before: epoch ms), the first send that took the key before then and
# within the last $4 seconds, and the seconds its key has left, from
# notifications_idempotency_idx (migration 0018). A workflow's
# send (its accepted row names the user) holds a key of the instance's making, and a send
# reconciliation settled as never enqueued was never answered 202: neither is a first answer.
_KEYED_SENDS = """
SELECT w.i, x.id::text AS id, x.ttl_s
FROM unnest($1::uuid[], $2::text[], $3::bigint[]) WITH ORDINALITY AS w (project_id, key,
                                                                        before_ms, i)
CROSS JOIN LATERAL (
    SELECT n.id, ceil(extract(epoch FROM n.created_at - now()) + $4::int)::int AS ttl_s
    FROM notifications n
    WHERE n.project_id = w.project_id AND n.idempotency_key = w.key
      AND n.idempotency_key IS NOT NULL
      AND n.created_at > now() - make_interval(secs => $4::int)
      AND n.created_at < to_timestamp(w.before_ms / 1000.0)
      AND NOT EXISTS (SELECT 1 FROM message_logs m
                      WHERE m.project_id = n.project_id AND m.event_id = n.id
                        AND ((m.kind = 'accepted' AND m.user_id IS NOT NULL)
                             OR (m.kind = 'failed'
                                 AND m.metadata->>'reason' = 'never_enqueued')))
    ORDER BY n.created_at, n.id
    LIMIT 1) x
"""

# Which of the wanted templates exist: all that accepting a send needs to know of them.
_TEMPLATES = (
    "SELECT w.n "
    "FROM unnest($1::uuid[], $2::text[]) WITH ORDINALITY AS w (project_id, id, n) "
    "JOIN templates t ON t.project_id = w.project_id AND t.id = w.id"
)


@dataclass(frozen=True, slots=True)
class KeyedSend:
    """The send that first took an idempotency key, and how long (s) its key has left."""

    event_id: str
    ttl_s: int


class Admission:
    def __init__(self, settings: Settings, keys: Keys, redis: Redis, pool: asyncpg.Pool,
                 buckets: TokenBuckets) -> None:
        self.settings = settings
        self.keys = keys
        self.redis = redis
        self.pool = pool
        self.buckets = buckets
        self._rate: Coalescer[str, float] = Coalescer(self._take_rate)
        self._templates: Coalescer[tuple[str, str], bool] = Coalescer(self._load_templates)
        self._known_templates: dict[tuple[str, str], float] = {}  # -> when to ask again
        # Deletions heard so far: a lookup that began before one may have read the row just
        # before it went, so what it found is not remembered.
        self._deletions_heard = 0
        self.clock: Callable[[], float] = time.monotonic
        self._accept: Coalescer[tuple[InboundMessage, Remember | None], None] = Coalescer(
            self._accept_many)
        self._keyed_sends: Coalescer[tuple[str, str, int], KeyedSend | None] = Coalescer(
            self._load_keyed_sends)

    # -- what handlers call -------------------------------------------------------------
    async def rate_wait_s(self, project_id: str) -> float:
        """Take one token from the project's API bucket: 0.0, or the seconds to wait."""
        return await self._rate.submit(project_id)

    async def template_exists(self, project_id: str, template_id: str) -> bool:
        key = (project_id, template_id)
        now = self.clock()
        if self._known_templates.get(key, 0.0) > now:
            return True
        heard = self._deletions_heard
        found = await self._templates.submit(key)
        if found and heard == self._deletions_heard:
            if len(self._known_templates) >= MAX_KNOWN_TEMPLATES:
                self._known_templates.clear()  # rare: that many templates in use at once
            self._known_templates[key] = now + KNOWN_TEMPLATE_TTL_S
        return found

    def forget_template(self, project_id: str, template_id: str) -> None:
        """The template was deleted: this process asks PostgreSQL again at its next send."""
        self._deletions_heard += 1
        self._known_templates.pop((project_id, template_id), None)

    def forget_templates(self) -> None:
        """A deletion may have been missed: every template is looked up again."""
        self._deletions_heard += 1
        self._known_templates.clear()

    async def accept(self, message: InboundMessage, remember: Remember | None = None) -> None:
        """Write the send's rows, then enqueue it on ``inbound:{priority}`` (with its
        caller's idempotency record, written by the same script call, when it has one)."""
        await self._accept.submit((message, remember))

    async def first_keyed_send(self, project_id: str, key: str,
                               before_ms: int) -> KeyedSend | None:
        """The send accepted with ``key`` in the project within the key's lifetime (24 h) and
        before ``before_ms`` (epoch ms), if PostgreSQL holds one. Asked only while Redis may
        have lost the key's record."""
        return await self._keyed_sends.submit((project_id, key, before_ms))

    # -- the batches --------------------------------------------------------------------
    async def _take_rate(self, projects: list[str]) -> list[float]:
        rate, burst = self.settings.api_rate_per_second, self.settings.api_rate_burst
        return await self.buckets.take_many(
            [[Bucket(self.keys.api_rate(p), rate, burst)] for p in projects])

    async def _load_templates(self, wanted: list[tuple[str, str]]) -> list[bool]:
        rows = await self.pool.fetch(_TEMPLATES, [p for p, _t in wanted],
                                     [t for _p, t in wanted])
        found = [False] * len(wanted)
        for row in rows:
            found[row["n"] - 1] = True
        return found

    async def _load_keyed_sends(
        self, wanted: list[tuple[str, str, int]]
    ) -> list[KeyedSend | None]:
        rows = await self.pool.fetch(_KEYED_SENDS, [p for p, _k, _b in wanted],
                                     [k for _p, k, _b in wanted],
                                     [b for _p, _k, b in wanted],
                                     self.settings.caller_idempotency_ttl_s)
        found: list[KeyedSend | None] = [None] * len(wanted)
        for row in rows:
            found[row["i"] - 1] = KeyedSend(row["id"], max(1, row["ttl_s"]))
        return found

    async def _accept_many(
        self, items: list[tuple[InboundMessage, Remember | None]]
    ) -> list[BaseException | None]:
        messages = [m for m, _r in items]
        results: list[BaseException | None] = [None] * len(messages)
        await self._insert(messages, results)
        written = [i for i, r in enumerate(results) if r is None]
        if not written:
            return results
        enqueue = pipe(self.redis)
        for index in written:
            message, remember = items[index]
            stream = self.keys.inbound(message["priority"])
            if remember is None:
                queue_xadd(enqueue, stream, message, self.settings.queue_max_len)
            else:
                enqueue.eval(XADD_AND_SET, *xadd_and_set_args(
                    stream, message, self.settings.queue_max_len, remember.key,
                    remember.record, remember.ttl_s))
        started_s = time.monotonic()
        try:
            replies: Sequence[Any] = await enqueue.execute(raise_on_error=False)
        except ReplyLost as exc:  # they may have run: look before undoing anything
            replies = await self._after_lost_reply([messages[i] for i in written], started_s,
                                                   exc)
        except Exception as exc:  # the whole pipeline failed: none of them is enqueued
            replies = [exc] * len(written)
        failed: list[InboundMessage] = []
        unsure: list[InboundMessage] = []
        for index, reply in zip(written, replies, strict=True):
            if isinstance(reply, _Unsure):
                results[index] = reply.error
                unsure.append(messages[index])
            elif isinstance(reply, BaseException):
                results[index] = reply
                failed.append(messages[index])
        if unsure:
            log.warning("Redis cannot tell whether %d accepted notifications were enqueued (the "
                        "reply was lost, and Redis is unreachable or the stream was trimmed "
                        "past the call); their callers get a 503 and their rows stay for the "
                        "scheduler's reconciliation to settle.",
                        len(unsure), extra=_ids(unsure))
        if failed:
            log.warning("Enqueueing %d accepted notifications failed (%s); deleting their rows "
                        "so nothing is left half-accepted.", len(failed),
                        next(r for r in results if r is not None),
                        extra=_ids(failed))
            await self._forget(failed)
        return results

    async def _after_lost_reply(self, messages: list[InboundMessage], started_s: float,
                                error: ReplyLost) -> list[Any]:
        """Per message, as a pipeline reply would be: its event id if its entry is on its
        stream, ``error`` if provably not, an :class:`_Unsure` if Redis cannot tell."""
        try:
            async with asyncio.timeout(LOST_REPLY_CHECK_S):
                found, searched = await self._search_streams(messages, started_s)
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("Could not look for notifications whose enqueue reply was lost (%s).",
                        exc, extra=_ids(messages))
            return [_Unsure(error)] * len(messages)
        log.warning("Lost the reply to enqueueing %d notifications (%s); %d of them are on "
                    "their streams and stay accepted.", len(messages), error, len(found),
                    extra=_ids(messages))
        return [m["eventId"] if m["eventId"] in found
                else error if searched[self.keys.inbound(m["priority"])] else _Unsure(error)
                for m in messages]

    async def _search_streams(self, messages: list[InboundMessage],
                              started_s: float) -> tuple[set[str], dict[str, bool]]:
        """The event ids found on their streams, and per stream whether the search saw every
        entry added since the call (so what it did not find was never there)."""
        by_stream: dict[str, dict[str, str]] = {}
        for m in messages:
            by_stream.setdefault(self.keys.inbound(m["priority"]), {})[m["eventId"]] = (
                m["projectId"])
        # A connection of its own: the pool's may be the broken one's siblings.
        source = self.redis.connection_pool
        client = Redis.from_pool(ConnectionPool(
            connection_class=source.connection_class, max_connections=1,
            **source.connection_kwargs))
        try:
            seconds, micros = await client.time()
            elapsed_ms = int((time.monotonic() - started_s) * 1000)
            since_ms = seconds * 1000 + micros // 1000 - elapsed_ms - LOST_REPLY_SLACK_MS
            found: set[str] = set()
            complete: dict[str, bool] = {}
            for stream, wanted in by_stream.items():
                search = await find_notifications(client, stream, since_ms, wanted)
                found |= search.found
                complete[stream] = search.complete
        finally:
            await client.aclose()
        return found, complete

    async def _insert(self, messages: list[InboundMessage],
                      results: list[BaseException | None]) -> None:
        rows = [_accepted_row(m) for m in messages]
        try:
            written = _written(await self.pool.execute(_INSERT_ACCEPTED, *_columns(rows)))
        except (asyncpg.InterfaceError, OSError):
            raise  # unreachable or broken: every request of the batch gets the 503
        except asyncpg.PostgresError:
            if len(rows) == 1:
                raise
            # One statement is all or nothing: find the rows that fail on their own so the
            # rest of the batch is still accepted.
            for index, row in enumerate(rows):
                try:
                    if not _written(await self.pool.execute(_INSERT_ACCEPTED,
                                                            *_columns([row]))):
                        results[index] = ProjectMissing(messages[index]["projectId"])
                except asyncpg.PostgresError as exc:
                    results[index] = exc
            return
        if written < len(rows):
            # Committed without the sends of vanished projects: the rest stand as written.
            stored = (set() if len(rows) == 1
                      else await self._written_ids([m["eventId"] for m in messages]))
            for index, message in enumerate(messages):
                if message["eventId"] not in stored:
                    results[index] = ProjectMissing(message["projectId"])

    async def _written_ids(self, event_ids: list[str]) -> set[str]:
        found = await self.pool.fetch(
            "SELECT id::text AS id FROM notifications WHERE id = ANY($1::uuid[])", event_ids)
        return {r["id"] for r in found}

    async def _forget(self, messages: list[InboundMessage]) -> None:
        by_project: dict[str, list[str]] = {}
        for m in messages:
            by_project.setdefault(m["projectId"], []).append(m["eventId"])
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                for project, events in by_project.items():
                    await conn.execute(
                        "DELETE FROM message_logs WHERE project_id = $1 "
                        "AND event_id = ANY($2::uuid[])", project, events)
                    await conn.execute(
                        "DELETE FROM notifications WHERE project_id = $1 "
                        "AND id = ANY($2::uuid[])", project, events)
        except Exception as exc:
            # Left for the scheduler's reconciliation, which settles them as never enqueued.
            # A store that is down (both of them, as the enqueue failed) is no bug to trace.
            if not store_unavailable(exc):
                log.exception("Could not delete the rows of notifications that were never "
                              "enqueued; reconciliation settles them as never enqueued.",
                              extra=_ids(messages))
                return
            log.warning("Could not delete the rows of notifications that were never enqueued "
                        "(%s: %s); reconciliation settles them as never enqueued.",
                        type(exc).__name__, exc, extra=_ids(messages))


def _ids(messages: list[InboundMessage]) -> dict[str, Any]:
    """The fields of a record about a batch of sends: the first one's ids, as a record about
    one send names them, and every send's event id when there are more."""
    fields: dict[str, Any] = {"event_id": messages[0]["eventId"],
                              "project_id": messages[0]["projectId"]}
    if len(messages) > 1:
        fields["event_ids"] = [m["eventId"] for m in messages]
    return fields


class ProjectMissing(Exception):
    """A send named a project that no longer exists (deleted after its key was read); it
    was not written. The API answers it as it answers a key of a deleted project."""

    def __init__(self, project_id: str) -> None:
        super().__init__(f"project {project_id} no longer exists")
        self.project_id = project_id


def _written(command_tag: str) -> int:
    """Rows an ``INSERT`` wrote, from its command tag (``INSERT 0 3``)."""
    return int(command_tag.rsplit(" ", 1)[1])


class _Unsure:
    """A send Redis could not say it enqueued or not: answered with :class:`MaybeDone`
    (a 503 that keeps its idempotency key), its rows kept."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = MaybeDone(str(error))
        self.error.__cause__ = error


def _accepted_row(m: InboundMessage) -> tuple[Any, ...]:
    to = m["to"]
    # The request's "to" as the caller wrote it: a user id, a list, or {"segment": name}.
    spec: Any = to["userId"] if "userId" in to else to.get("userIds", to)
    return (
        m["eventId"], m["projectId"], m["template"], m["priority"], json_text(spec),
        json_text(m["data"]), json_text(m["channels"]), m["sendAt"], m["campaignId"],
        m["idempotencyKey"],
    )


def _columns(rows: list[tuple[Any, ...]]) -> list[list[Any]]:
    return [list(column) for column in zip(*rows, strict=True)]
