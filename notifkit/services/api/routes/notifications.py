"""Sending: ``POST /v1/notifications``, its status and timeline, and ``GET /v1/messages``.

Accepting a send writes the ``notifications`` row and the event's ``accepted`` timeline row in
one transaction, then XADDs the :class:`~notifkit.messages.InboundMessage` to
``inbound:{priority}``. If the XADD fails the rows are deleted again and the caller gets a 503:
nothing is left half-accepted (after a lost reply, only once the stream shows the XADD never
ran; see :mod:`notifkit.services.api.admission`).

A recipient+channel status is the status of its latest timeline row, except that a terminal row
outranks a later ``processing`` one (a retry that had already been decided) unless that row is
a DLQ replay's ``replayed`` row, and a receipt saying a message arrived does not outrank an
earlier bounce or failure of that message (webhooks come in any order). The notification's
own status summarises its recipients: still in progress while any is, else the best outcome.
A large send's recipients come in pages; its status is summarised in PostgreSQL, so no answer
reads every row of it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from aiohttp import web

from notifkit.clock import utc_now_iso
from notifkit.db.logs import insert_logs
from notifkit.ids import uuid7
from notifkit.messages import CHANNELS, PRIORITIES, InboundMessage, Recipients
from notifkit.services.api.errors import (
    ApiError,
    invalid_field,
    json_response,
    not_found,
    note_log_fields,
)
from notifkit.services.api.idempotency import (
    REPLAY_HEADER,
    Earlier,
    Remember,
    answer_once,
    header_key,
    replay_earlier,
)
from notifkit.services.api.middleware import project_id
from notifkit.services.api.routing import CURSOR, LIMIT, SEND, Operations, Param, Reply
from notifkit.services.api.schemas import (
    DATETIME,
    ID,
    MAX_RECIPIENTS,
    RECIPIENT_STATUSES,
    name_string,
    ref,
)
from notifkit.services.api.state import ADMISSION, DB, KEYS, REDIS
from notifkit.services.api.validation import (
    Fields,
    QueryChecks,
    cursor_time,
    decode_cursor,
    encode_cursor,
    enum_query,
    iso,
    limit_param,
    list_scope,
    name_problem,
    parse_rfc3339,
    parse_uuid,
    query_string,
    query_value,
    read_json,
    scoped_cursor,
    time_query,
    time_range_order,
    uuid_id,
)
from notifkit.services.scheduler import cancel_waiting, release_throttle, waiting_tasks
from notifkit.services.timeline import canceled_row
from notifkit.text import identifier_problem
from notifkit.wording import counted

log = logging.getLogger("notifkit.api")

ops = Operations("notifications")

# A throttled send is dropped, not retried later: like a skip, it is an outcome.
TERMINAL = frozenset({"delivered", "sent", "failed", "dead_lettered", "skipped", "suppressed",
                      "throttled"})
IN_PROGRESS = ("accepted", "processing", "scheduled")
# Rows of a provider's receipt saying the message never arrived.
UNDELIVERED_RECEIPTS = frozenset({"bounced", "failed"})
# The notification's status when every recipient is done: the best outcome any reached. A
# dead-lettered task can still be replayed, so it ranks above a failure; this also keeps a
# fallback chain that ended in the DLQ from reading 'failed' after its earlier channels.
OUTCOME_ORDER = ("delivered", "sent", "dead_lettered", "failed", "throttled", "suppressed",
                 "skipped")

# Recipients one answer lists when the caller names no limit, and the most a limit may ask
# for: a send to a list of users (up to 1,000, with several channels each) comes whole; a
# campaign to a large segment (100,000 users are some 500,000 timeline rows) comes in pages
# rather than all in memory and in one answer.
RECIPIENTS_PER_ANSWER = 10_000
RECIPIENT_LIMIT = Param("limit", "query",
                        {"type": "integer", "minimum": 1, "maximum": RECIPIENTS_PER_ANSWER},
                        f"Recipients per answer (default and at most {RECIPIENTS_PER_ANSWER:,}).")

_ROW_COLUMNS = ("task_id, user_id, channel, attempt, kind, status, detail, provider_message_id, "
                "created_at")
# The event's own rows ($3 = the event id), by the (task_id, channel, ...) unique index.
_EVENT_ROWS = (
    f"SELECT {_ROW_COLUMNS} FROM message_logs WHERE project_id = $1 AND event_id = $2 "
    "AND task_id = $3 AND channel = '' ORDER BY created_at, id"
)
# A page of recipients, in the order of each one's first row (the order the whole timeline
# lists them in): the first rows after the cursor's ($4, $5), at most $6 of them. The event's
# rows are walked in order by message_logs_event_idx, and whether a row is its recipient's
# first is one probe of the (task_id, channel, ...) unique index. A subquery, not NOT EXISTS,
# which the planner makes a join hashing every row of the event for every page; OFFSET 0 keeps
# the project and event out of the probe, which the planner would otherwise AND with a bitmap
# of every row of the event, again for each row.
FIRST_ROWS_SQL = (
    "SELECT r.task_id, r.channel, r.created_at, r.id FROM message_logs r "
    "WHERE r.project_id = $1 AND r.event_id = $2 AND (r.created_at, r.id) > ($4, $5) "
    "AND NOT (r.task_id = $3 AND r.channel = '') "
    "AND r.id = (SELECT e.id FROM (SELECT id, created_at, project_id, event_id "
    "FROM message_logs WHERE task_id = r.task_id AND channel = r.channel OFFSET 0) e "
    "WHERE e.project_id = r.project_id AND e.event_id = r.event_id "
    "ORDER BY e.created_at, e.id LIMIT 1) "
    "ORDER BY r.created_at, r.id LIMIT $6"
)
# Every row of the recipients ($3, $4: task ids and channels) of a page: a probe of the
# (task_id, channel, ...) unique index for each, the project and event kept out of it as above
# (else the planner hashes every row of the event to join them with the page).
RECIPIENT_ROWS_SQL = (
    f"SELECT {', '.join('m.' + column for column in _ROW_COLUMNS.split(', '))} "
    "FROM unnest($3::text[], $4::text[]) AS p(task_id, channel) CROSS JOIN LATERAL ("
    f"SELECT id, project_id, event_id, {_ROW_COLUMNS} FROM message_logs "
    "WHERE task_id = p.task_id AND channel = p.channel OFFSET 0) m "
    "WHERE m.project_id = $1 AND m.event_id = $2 ORDER BY m.created_at, m.id"
)

# GET /v1/messages, given its conditions (project_id first) and its LIMIT parameter.
MESSAGES_SQL = (
    "SELECT id, event_id, task_id, user_id, channel, attempt, kind, status, detail, "
    "provider, provider_message_id, campaign_id, metadata, created_at FROM message_logs "
    "WHERE {where} ORDER BY created_at DESC, id DESC LIMIT {limit}"
)

IDEMPOTENCY_PARAM = Param(
    # Printable ASCII, not white space alone: the server takes any printable characters, but
    # HTTP clients differ in how they put others on the wire (Latin-1 or UTF-8).
    "x-idempotency-key", "header", {"type": "string", "minLength": 1, "maxLength": 255,
                                    "pattern": "^[ -~]*[!-~][ -~]*$"},
    "Replays the first response (same id, header x-idempotent-replay: true) for 24 h; "
    "nothing is enqueued again. The body is checked first: one that is a 400 without the "
    "key is the same 400 with it. 1 to 255 printable characters.",
)
_SEND_ROUTE = "POST /v1/notifications"
REPLAY_REPLY_HEADERS = {REPLAY_HEADER: {"type": "string", "enum": ["true"]}}


@ops.route("POST", "/v1/notifications", "Send a notification", roles=SEND,
           body=ref("NotificationCreate"), headers=(IDEMPOTENCY_PARAM,),
           responses={202: Reply(ref("Accepted"), "Accepted and enqueued.",
                                 headers=REPLAY_REPLY_HEADERS)},
           errors=(409,))
async def send_notification(request: web.Request) -> web.Response:
    project = project_id(request)
    key = header_key(request)
    body = await read_json(request)
    message = _validate(project, body)
    if (earlier := await replay_earlier(request, project, key, _SEND_ROUTE)) is not None:
        return earlier
    message["idempotencyKey"] = key

    async def accept(remember: Remember | None) -> None:
        # After the replay (from Redis, or from PostgreSQL once Redis lost the key's record):
        # a template deleted since the first request does not take its answer from a retry.
        # A requested channel the template has no content for is no error: the engine sends
        # generic content built from the template id and the data there (CONTRACT §6).
        if not await request.app[ADMISSION].template_exists(project, message["template"]):
            raise invalid_field("template", "no template with this id exists in this project")
        await _accept(request, message, remember)

    return await answer_once(request, project, key, _SEND_ROUTE, body, 202,
                             {"id": message["eventId"], "status": "accepted"}, accept,
                             recover=lambda before_ms: _first_send(request, project, key,
                                                                   before_ms))


async def _first_send(request: web.Request, project: str, key: str | None,
                      before_ms: int) -> Earlier | None:
    """The first answer to ``key``, from the send PostgreSQL holds under it, made before Redis
    lost the key's record: the answer the Redis path replays, ``{"id", "status": "accepted"}``.
    A send made since then that Redis has no record of was never answered 202 (its enqueue
    failed or was never known to run), so it is no first answer."""
    assert key is not None
    found = await request.app[ADMISSION].first_keyed_send(project, key, before_ms)
    if found is None:
        return None
    return Earlier(202, {"id": found.event_id, "status": "accepted"}, found.ttl_s)


@ops.route("GET", "/v1/notifications/{eventId}", "A notification's status and timelines",
           query=(RECIPIENT_LIMIT, CURSOR),
           responses={200: ref("Notification")},
           description=(
               "Recipients are listed in the order of their first timeline entry, up to "
               f"{RECIPIENTS_PER_ANSWER:,} (or limit) per answer; nextCursor (null when the "
               "list is complete) fetches the next ones. The notification's status and its "
               "own timeline always cover every recipient."))
async def get_notification(request: web.Request) -> web.Response:
    project = project_id(request)
    event_id = uuid_id(request, "eventId", "notification")
    checks = QueryChecks()
    limit = checks(limit_param, request, RECIPIENTS_PER_ANSWER, RECIPIENTS_PER_ANSWER)
    after = checks(_recipient_cursor, request, event_id)
    checks.done()
    body = await notification_body(request.app[DB], project, event_id, limit, after)
    if body is None:
        raise not_found("notification", event_id)
    return json_response(body)


@ops.route("POST", "/v1/notifications/{eventId}/cancel",
           "Cancel a notification's sends that are still waiting",
           responses={200: Reply(ref("Notification"), "The notification after the cancel, as "
                                 "GET shows it: each task taken out of the scheduler is "
                                 "skipped, with a 'canceled' timeline entry."),
                      409: Reply(ref("Error"), "Nothing is left to cancel: every task was "
                                               "handed to delivery, no sendAt lies ahead "
                                               "(nothing_to_cancel).")},
           description=(
               "Every task of the notification not yet handed to delivery (waiting for its "
               "sendAt, for the end of the user's quiet hours, or after a provider's rate "
               "limit, or still on its way to the scheduler) is dropped and never sent; tasks "
               "already handed to delivery are not affected. Canceling again answers 200. "
               "409 nothing_to_cancel when nothing waits and no sendAt lies ahead."))
async def cancel_notification(request: web.Request) -> web.Response:
    project = project_id(request)
    event_id = uuid_id(request, "eventId", "notification")
    pool, redis, keys = request.app[DB], request.app[REDIS], request.app[KEYS]
    async with pool.acquire() as conn:
        async with conn.transaction():
            # FOR UPDATE: the scheduler persists a batch holding its notifications FOR SHARE
            # until the tasks are in their shards, so after this lock every task that reached
            # the scheduler is in a shard (or moved), and every one still on its way will
            # find the cancel when it gets there.
            row = await conn.fetchrow(
                "SELECT send_at, canceled_at, campaign_id, now() AS now FROM notifications "
                "WHERE id = $1 AND project_id = $2 FOR UPDATE", event_id, project)
            if row is None:
                raise not_found("notification", event_id)
            await _without_jit(conn)
            scheduled = await _scheduled_recipients(conn, project, event_id)
            if row["canceled_at"] is None:
                ahead = row["send_at"] is not None and row["send_at"] > row["now"]
                if not ahead and not await waiting_tasks(redis, keys, scheduled) \
                        and not await _due_later(conn, project, event_id, scheduled, row["now"]):
                    raise ApiError(409, "nothing_to_cancel",
                                   "Nothing of this notification is left to cancel: every "
                                   "task was handed to delivery already (or it had no "
                                   "sendAt and nothing waits in the scheduler).")
                await conn.execute("UPDATE notifications SET canceled_at = now(), "
                                   "updated_at = now() WHERE id = $1 AND project_id = $2",
                                   event_id, project)
                await insert_logs(conn, [canceled_row(
                    project, event_id, event_id, None, "", row["campaign_id"],
                    "; what was not handed to delivery yet is never sent")])
        # After the commit: a task moved meanwhile is not claimed, and is reported as it is.
        claimed = await cancel_waiting(redis, keys, project, scheduled)
        await insert_logs(conn, [
            canceled_row(project, event_id, task_id, r["userId"], r["channel"],
                         row["campaign_id"], " before it was due")
            for task_id, r in scheduled.items() if task_id in claimed
        ])
        # The claimed sends never go out: they no longer count against their users' throttle.
        await release_throttle(conn, redis, keys, [
            (project, event_id, r["userId"]) for task_id, r in scheduled.items()
            if task_id in claimed and r["userId"] is not None])
    if claimed:
        log.info("Canceled %s of a notification.", counted(len(claimed), "waiting task"),
                 extra={"event_id": event_id, "project_id": project})
    body = await notification_body(pool, project, event_id)
    if body is None:  # the project was deleted meanwhile, and its notifications with it
        raise not_found("notification", event_id)
    return json_response(body)


# Each scheduled task's latest 'scheduled' row: the engine's (sendAt, quiet hours) names its
# due time, a 429 park's its wait.
_SCHEDULED_ROWS = (
    "SELECT DISTINCT ON (task_id, channel) task_id, metadata, created_at FROM message_logs "
    "WHERE project_id = $1 AND event_id = $2 AND task_id = ANY($3::text[]) "
    "AND status = 'scheduled' ORDER BY task_id, channel, created_at DESC, id DESC"
)


async def _due_later(conn: asyncpg.Connection, project: str, event_id: str,
                     scheduled: dict[str, Any], now: datetime) -> bool:
    """Whether a task not in its shard is still due later, so on its way to the scheduler
    (routed, not taken in yet: a backlog, every scheduler down) rather than moved, which the
    scheduler does only once it is due. A quiet-hours deferral or a 429 park has no sendAt to
    say so."""
    if not scheduled:
        return False
    for row in await conn.fetch(_SCHEDULED_ROWS, project, event_id, list(scheduled)):
        due = scheduled_due(row["metadata"], row["created_at"])
        if due is not None and due > now:
            return True
    return False


def scheduled_due(metadata: Any, logged_at: datetime) -> datetime | None:
    """When a 'scheduled' row's task is due: its ``dueAt``, else when it was parked plus the
    wait (``retryAfterSeconds``); None when the row says neither."""
    if not isinstance(metadata, dict):
        return None
    due_at = metadata.get("dueAt")
    if isinstance(due_at, str) and (parsed := parse_rfc3339(due_at)) is not None:
        return parsed
    wait_s = metadata.get("retryAfterSeconds")
    if isinstance(wait_s, int | float) and not isinstance(wait_s, bool) \
            and math.isfinite(wait_s):
        try:
            return logged_at + timedelta(seconds=wait_s)
        except OverflowError:
            return None
    return None


async def notification_body(
    db: asyncpg.Pool, project: str, event_id: str, limit: int = RECIPIENTS_PER_ANSWER,
    after: tuple[datetime, int] | None = None,
) -> dict[str, Any] | None:
    """What GET /v1/notifications/{eventId} answers: up to ``limit`` recipients, those whose
    first row comes after ``after`` (a cursor's (created_at, id)); None for no such
    notification."""
    async with db.acquire() as conn, conn.transaction(isolation="repeatable_read",
                                                       readonly=True):
        # One snapshot: the status and the recipients listed agree, as one query made them.
        await _without_jit(conn)
        row = await conn.fetchrow(
            "SELECT id, template_id, priority, recipients_spec, channels, campaign_id, "
            "send_at, created_at FROM notifications WHERE id = $1 AND project_id = $2",
            event_id, project,
        )
        if row is None:
            return None
        firsts = await conn.fetch(FIRST_ROWS_SQL, project, event_id, event_id,
                                  *(after or (datetime.min.replace(tzinfo=UTC), 0)), limit + 1)
        page = firsts[:limit]
        logs = await conn.fetch(RECIPIENT_ROWS_SQL, project, event_id,
                                [r["task_id"] for r in page], [r["channel"] for r in page])
        recipients, _ = timelines(event_id, logs)
        _, timeline = timelines(event_id, await conn.fetch(_EVENT_ROWS, project, event_id,
                                                            event_id))
        statuses = {r["status"] for r in await conn.fetch(_STATUSES, project, event_id,
                                                           event_id)}
    next_cursor = None
    if len(firsts) > limit:
        last = page[-1]
        next_cursor = scoped_cursor(_recipients_scope(event_id), last["created_at"].isoformat(),
                                    last["id"])
    return {
        "id": event_id,
        "status": summary_status(statuses, timeline),
        "template": row["template_id"],
        "priority": row["priority"],
        "to": row["recipients_spec"],
        "channels": row["channels"],
        "campaignId": row["campaign_id"],
        "sendAt": iso(row["send_at"]),
        "createdAt": iso(row["created_at"]),
        "recipients": recipients,
        "timeline": timeline,
        "nextCursor": next_cursor,
    }


async def _without_jit(conn: asyncpg.Connection) -> None:
    """No JIT compiling for the rest of the transaction. The planner cannot tell how few of
    an event's rows are a recipient's first, so it prices a page walk far above what it costs
    and PostgreSQL compiles it: 240 ms of compiling for a 3 ms walk of a 50,000-recipient
    send, and the status query gained nothing from it either."""
    await conn.execute("SET LOCAL jit = off")


def _recipients_scope(event_id: str) -> str:
    """The list a notification's recipient cursor walks: GET's, whichever route answered the
    page (a cancel answers the first one), and only this notification's."""
    return list_scope(f"/v1/notifications/{event_id}", {})


def _recipient_cursor(request: web.Request, event_id: str) -> tuple[datetime, int] | None:
    """The (created_at, id) of the first row of the recipient a cursor's page ended with."""
    cursor = decode_cursor(request, 2, scope=_recipients_scope(event_id))
    if cursor is None:
        return None
    return cursor_time(cursor[0]), _log_id(cursor[1])


async def _scheduled_recipients(conn: asyncpg.Connection, project: str,
                                event_id: str) -> dict[str, dict[str, Any]]:
    """The recipients whose status is 'scheduled', by task id, as GET shows them."""
    rows = await conn.fetch(_SCHEDULED_RECIPIENTS, project, event_id, event_id)
    return {r["task_id"]: {"userId": r["user_id"], "channel": r["channel"] or None,
                           "taskId": r["task_id"], "status": "scheduled"} for r in rows}


@ops.route("GET", "/v1/messages", "Message-log entries, newest first",
           query=(
               Param("userId", "query", ID),
               Param("campaignId", "query", name_string(255)),
               Param("eventId", "query", {"type": "string", "format": "uuid"}),
               Param("status", "query", {"type": "string", "enum": list(RECIPIENT_STATUSES)}),
               Param("channel", "query", {"type": "string", "enum": list(CHANNELS)}),
               Param("since", "query", DATETIME,
                     "Only entries logged at or after this time (RFC 3339)."),
               Param("until", "query", DATETIME,
                     "Only entries logged before this time (RFC 3339)."),
               LIMIT,
               CURSOR,
           ),
           responses={200: ref("MessageList")})
async def list_messages(request: web.Request) -> web.Response:
    project = project_id(request)
    checks = QueryChecks()  # one 400 names every bad parameter, not only the first
    limit = checks(limit_param, request)
    user_id = checks(_user_query, request, "userId")
    campaign = checks(_campaign_query, request, "campaignId")
    event = checks(_uuid_query, request, "eventId")
    status = checks(enum_query, request, "status", RECIPIENT_STATUSES)
    channel = checks(enum_query, request, "channel", CHANNELS)
    since = checks(time_query, request, "since")
    until = checks(time_query, request, "until")
    cursor = checks(_message_cursor, request)
    checks.done()
    time_range_order(since, until)
    where = ["project_id = $1"]
    args: list[Any] = [project]

    def add(condition: str, value: Any) -> None:
        args.append(value)
        where.append(condition.format(f"${len(args)}"))

    if user_id is not None:
        add("user_id = {}", user_id)
    if campaign is not None:
        add("campaign_id = {}", campaign)
    if event is not None:
        add("event_id = {}", event)
    if status is not None:
        add("status = {}", status)
    if channel is not None:
        add("channel = {}", channel)
    if since is not None:
        add("created_at >= {}", since)
    if until is not None:
        add("created_at < {}", until)
    if cursor is not None:
        args.extend(cursor)
        where.append(f"(created_at, id) < (${len(args) - 1}, ${len(args)})")
    args.append(limit + 1)
    rows = await request.app[DB].fetch(
        MESSAGES_SQL.format(where=" AND ".join(where), limit=f"${len(args)}"), *args)
    page = rows[:limit]
    next_cursor = None
    if len(rows) > limit:
        last = page[-1]
        next_cursor = encode_cursor(request, last["created_at"].isoformat(), last["id"])
    return json_response({"items": [message_json(r) for r in page], "nextCursor": next_cursor})


# ---------------------------------------------------------------------------------------------
# Accepting


def _validate(project: str, body: dict[str, Any]) -> InboundMessage:
    """The send ``body`` asks for, checked for what depends on the request alone; whether its
    template exists is the caller's to ask, after any replay."""
    fields = Fields(body)
    fields.only(("to", "template", "data", "channels", "priority", "sendAt", "campaignId"))
    to = _recipients(fields)
    template = fields.identifier("template", required=True)
    # An optional field sent as null is the field left out, as GET shows it.
    data = fields.obj("data", nullable=True)
    channels = fields.channel_list("channels", CHANNELS, nullable=True)
    priority = fields.choice("priority", PRIORITIES, nullable=True) or "normal"
    send_at = fields.timestamp("sendAt", nullable=True)
    campaign = fields.name("campaignId", nullable=True)
    fields.raise_if_invalid()
    assert template is not None
    assert to is not None
    return {
        "eventId": uuid7(),
        "projectId": project,
        "template": template,
        "to": to,
        "data": data or {},
        "channels": channels,
        "priority": priority,
        "sendAt": iso(send_at),
        "campaignId": campaign,
        "idempotencyKey": None,
        "createdAt": utc_now_iso(),
    }


def _recipients(fields: Fields) -> Recipients | None:
    if "to" not in fields.body:
        fields.fail("to", "is required")
        return None
    to = fields.body["to"]
    if isinstance(to, str):
        if problem := identifier_problem(to):
            fields.fail("to", problem)
            return None
        return {"userId": to}
    if isinstance(to, list):
        if not 1 <= len(to) <= MAX_RECIPIENTS:
            fields.fail("to", f"must list 1 to {MAX_RECIPIENTS} user ids; use a segment for "
                              "larger audiences")
            return None
        ids: list[str] = []
        for index, item in enumerate(to):
            problem = identifier_problem(item) if isinstance(item, str) else "must be a string"
            if problem:
                fields.fail(f"to[{index}]", problem)
            else:
                ids.append(item)
        return {"userIds": list(dict.fromkeys(ids))} if len(ids) == len(to) else None
    if isinstance(to, dict):
        inner = fields.child("to", to)
        inner.only(("segment",))
        segment = inner.name("segment", required=True, max_len=100)
        return {"segment": segment} if segment is not None else None
    fields.fail("to", 'must be a user id, a list of user ids or {"segment": name}')
    return None


async def _accept(request: web.Request, message: InboundMessage,
                  remember: Remember | None) -> None:
    note_log_fields(request, event_id=message["eventId"])
    await request.app[ADMISSION].accept(message, remember)
    log.info("Accepted a notification and queued it for the enricher.",
             extra={"event_id": message["eventId"], "project_id": message["projectId"]})


# ---------------------------------------------------------------------------------------------
# Reading


def timelines(
    event_id: str, logs: list[asyncpg.Record]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per recipient+channel timelines, and the event's own rows (channel '' on the event)."""
    recipients: dict[tuple[str, str], dict[str, Any]] = {}
    # Per recipient, the (attempt, provider message id) pairs a provider said never arrived.
    bounced: dict[tuple[str, str], set[tuple[int, str | None]]] = {}
    event_rows: list[dict[str, Any]] = []
    for row in logs:
        entry = {"kind": row["kind"], "at": iso(row["created_at"]), "detail": row["detail"],
                 "status": row["status"], "attempt": row["attempt"]}
        if row["channel"] == "" and row["task_id"] == event_id:
            event_rows.append(entry)
            continue
        key = (row["task_id"], row["channel"])
        recipient = recipients.get(key)
        if recipient is None:
            recipient = recipients[key] = {
                "userId": row["user_id"], "channel": row["channel"] or None,
                "taskId": row["task_id"], "status": row["status"], "timeline": [],
            }
        if recipient["userId"] is None:
            recipient["userId"] = row["user_id"]
        message = (row["attempt"], row["provider_message_id"])
        if row["kind"] in UNDELIVERED_RECEIPTS:
            bounced.setdefault(key, set()).add(message)
        # Webhooks come in any order: a provider's word that a message arrived (delivered,
        # opened), posted after its bounce of that message, does not undo the bounce. (A push
        # to two devices is two messages: one may bounce and the other arrive.)
        if not (row["status"] == "delivered" and message in bounced.get(key, ())):
            recipient["status"] = next_status(recipient["status"], row["status"], row["kind"])
        recipient["timeline"].append(entry)
    return list(recipients.values()), event_rows


def next_status(current: str, row_status: str, kind: str = "") -> str:
    # A late 'processing' row does not undo an outcome, unless an operator replayed the
    # dead-lettered work: then it is in progress again.
    if row_status == "processing" and current in TERMINAL and kind != "replayed":
        return current
    return row_status


def summary_status(statuses: Collection[str], event_rows: list[dict[str, Any]]) -> str:
    """The notification's status, from its recipients' distinct ``statuses`` and its own
    rows."""
    if not statuses:
        # Before any recipient's row, the event's own latest row tells: accepted, or e.g.
        # dead_lettered, or skipped for a segment without members.
        latest = event_rows[-1]["status"] if event_rows else "accepted"
        return latest if latest in RECIPIENT_STATUSES else "processing"
    kinds = [row["kind"] for row in event_rows]
    if "fanout" in kinds and "fanned_out" not in kinds and kinds[-1] != "dead_lettered":
        # More recipients follow, on pages the enricher has not reached yet (a page that was
        # dead-lettered waits for an operator instead, until its replay).
        return "processing"
    for status in IN_PROGRESS:
        if status in statuses:
            return "processing" if status == "accepted" else status
    for status in OUTCOME_ORDER:
        if status in statuses:
            return status
    return "processing"


def _sql_list(values: Iterable[str]) -> str:
    return ", ".join(f"'{value}'" for value in sorted(values))


# Each recipient's status as timelines() folds its rows, computed in PostgreSQL so that a
# notification of any size is summarised without reading its rows into the API ($1 project,
# $2 event, $3 the event id as the task id of the event's own rows). Of a recipient's rows in
# (created_at, id) order, its first always sets the status, and a later 'delivered' one does
# not when an undelivered receipt of the same (attempt, provider message id) came at or before
# it. Of the rows that count, each sets the status but a 'processing' one not from a replay,
# which only turns a status still in progress into 'processing': so the status is that of the
# last row that is no such 'processing' row, unless that status is in progress and such a row
# follows it (then 'processing'), and 'processing' when there is no such row at all.
RECIPIENT_STATUS_SQL = f"""
WITH numbered AS (
  SELECT task_id, channel, user_id, status, kind, created_at, id,
         row_number() OVER (PARTITION BY task_id, channel ORDER BY created_at, id) AS n,
         bool_or(kind IN ({_sql_list(UNDELIVERED_RECEIPTS)})) OVER (
           PARTITION BY task_id, channel, attempt, provider_message_id
           ORDER BY created_at, id ROWS UNBOUNDED PRECEDING) AS undelivered
  FROM message_logs
  WHERE project_id = $1 AND event_id = $2 AND NOT (task_id = $3 AND channel = '')
), weighed AS (
  SELECT *, n = 1 OR NOT (status = 'delivered' AND undelivered) AS counts,
         NOT (status = 'processing' AND kind <> 'replayed') AS settles
  FROM numbered
), recipients AS (
  SELECT task_id, channel,
         (array_agg(user_id ORDER BY n) FILTER (WHERE user_id IS NOT NULL))[1] AS user_id,
         max(created_at) FILTER (WHERE n = 1) AS first_at,
         max(id) FILTER (WHERE n = 1) AS first_id,
         (array_agg(status ORDER BY n DESC) FILTER (WHERE counts AND settles))[1] AS settled,
         max(n) FILTER (WHERE counts AND settles) AS settled_n,
         max(n) FILTER (WHERE counts) AS last_n
  FROM weighed GROUP BY task_id, channel
)
SELECT task_id, channel, user_id, first_at, first_id,
       CASE WHEN settled_n = last_n OR settled IN ({_sql_list(TERMINAL)}) THEN settled
            ELSE 'processing' END AS status
FROM recipients
"""
_STATUSES = f"SELECT DISTINCT status FROM ({RECIPIENT_STATUS_SQL}) s"
_SCHEDULED_RECIPIENTS = (
    f"SELECT task_id, channel, user_id FROM ({RECIPIENT_STATUS_SQL}) s "
    "WHERE status = 'scheduled' ORDER BY first_at, first_id"
)


def message_json(row: asyncpg.Record) -> dict[str, Any]:
    return {
        "id": str(row["id"]), "eventId": str(row["event_id"]), "taskId": row["task_id"],
        "userId": row["user_id"], "channel": row["channel"] or None, "attempt": row["attempt"],
        "kind": row["kind"], "status": row["status"], "detail": row["detail"],
        "provider": row["provider"], "providerMessageId": row["provider_message_id"],
        "campaignId": row["campaign_id"], "metadata": row["metadata"],
        "createdAt": iso(row["created_at"]),
    }


def _user_query(request: web.Request, name: str) -> str | None:
    """A user id, refused as a send refuses it: a filter no user could match is a mistake."""
    value = query_value(request, name)
    if value is not None and (problem := identifier_problem(value)):
        raise invalid_field(name, problem)
    return value


def _campaign_query(request: web.Request, name: str) -> str | None:
    """A campaignId, refused as a send refuses it: no send could have stored the value."""
    value = query_string(request, name)
    if value is not None and (problem := name_problem(value)):
        raise invalid_field(name, problem)
    return value


def _uuid_query(request: web.Request, name: str) -> str | None:
    value = query_value(request, name)
    if value is None:
        return None
    parsed = parse_uuid(value)
    if parsed is None:
        raise invalid_field(name, "must be a notification id (UUID)")
    return parsed


def _message_cursor(request: web.Request) -> tuple[Any, int] | None:
    """The (created_at, id) a /v1/messages cursor names, None without one."""
    cursor = decode_cursor(request, 2)
    if cursor is None:
        return None
    return cursor_time(cursor[0]), _log_id(cursor[1])


def _log_id(value: Any) -> int:
    # message_logs.id is a bigint; a bool is an int to Python but not an id.
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 2**63:
        raise invalid_field("cursor", "is not a cursor this API returned")
    return value
