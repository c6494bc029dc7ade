"""The dead-letter queue, scoped to the caller's project (the admin key sees every project's,
or the one it names).

A DLQ record (``dlq_record`` in notifkit/worker/entry.py) holds the origin ``stream`` and
``group``, the ``payload``, the last ``error``, ``attempts``, ``failedAt``, ``projectId`` and
``replayOf`` (who owns the entry's dedup marks). Replaying XADDs the payload back to its origin
stream with ``"_replayOf"`` set, so the dedup marks the original claimed are honoured as its own
(``Entry.owner``), and XDELs the record, in one Lua call: two concurrent replays of one
record enqueue it once. The new entry id has no attempt counter, so the count starts afresh;
``"_replayedAttempts"`` carries the attempts made before, for the timeline's numbering only.
Work of a notification canceled since is not replayed (409): the cancel said nothing more of it
is sent (checked holding the notification FOR SHARE, so a cancel under way is waited for).
Work of a notification gets a ``replayed`` timeline row (status ``processing``; an entry of the
events or workflow service, a record rather than a task's work, gets none),
written before the XADD so that no row of the replayed work can precede it, and committed
after it, so that of two concurrent replays only the one that moved the entry leaves a row.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

import asyncpg
from aiohttp import web
from redis.asyncio import Redis

from notifkit import codec
from notifkit.db.logs import Kind, LogRow, Status, insert_one
from notifkit.errors import MalformedPayload
from notifkit.ids import untasked_row_id
from notifkit.messages import CHANNELS, count_of
from notifkit.services.api.auth import Principal
from notifkit.services.api.errors import ApiError, invalid_field, json_response
from notifkit.services.api.middleware import principal
from notifkit.services.api.routing import CURSOR, LIMIT, Operations, Param, Reply
from notifkit.services.api.schemas import ref
from notifkit.services.api.state import DB, KEYS, REDIS, SETTINGS
from notifkit.services.api.validation import (
    QueryChecks,
    encode_cursor,
    enum_query,
    page_query,
    parse_uuid,
    query_value,
)
from notifkit.streams import as_str, decode
from notifkit.transports.base import storable
from notifkit.worker import REPLAYED_ATTEMPTS, attempts_before, held_task, payload_user

log = logging.getLogger("notifkit.api")

ops = Operations("dlq")

ENTRY_ID = re.compile(r"^\d{1,20}-\d{1,20}\Z")
_MAX_ID_PART = 2**64 - 1
SCAN_CHUNK = 500
SCAN_BUDGET = 10_000  # entries read per list request, whatever the filter keeps

# KEYS[1] = dlq, KEYS[2] = origin stream; ARGV = entry id, maxlen, payload. The XADD happens
# only if this call removed the record, so a record is replayed at most once.
_REPLAY = """
if redis.call('XDEL', KEYS[1], ARGV[1]) == 0 then return false end
return redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'data', ARGV[3])
"""

ENTRY_NOT_FOUND = ("dlq_entry_not_found", "No dead-lettered entry with that id exists for "
                                          "this project.")


@ops.route("GET", "/v1/dlq", "Dead-lettered entries of the project", access="ops",
           query=(
               LIMIT,
               CURSOR,
               Param("projectId", "query", {"type": "string", "format": "uuid"},
                     "Admin key only: one project's entries (default: every project's)."),
               Param("stream", "query", {"type": "string"},
                     "Only entries that came from this stream, as items name it "
                     "(e.g. notifkit:stream:outbound:normal)."),
               Param("eventId", "query", {"type": "string", "format": "uuid"},
                     "Only entries about this notification (a scheduler entry's is the "
                     "notification of the task it holds)."),
           ),
           responses={200: ref("DlqList")})
async def list_dlq(request: web.Request) -> web.Response:
    who = principal(request)
    keys = request.app[KEYS]
    checks = QueryChecks()  # one 400 names every bad parameter
    page = checks(page_query, request, 1, lambda parts: isinstance(parts[0], str)
                  and is_entry_id(parts[0]))
    stream = checks(enum_query, request, "stream", tuple(keys.all_streams()))
    event = checks(_event_query, request)
    checks.done()
    limit, cursor = page
    start = "-" if cursor is None else "(" + cursor[0]
    redis = request.app[REDIS]
    dlq = request.app[KEYS].dlq
    items: list[dict[str, Any]] = []
    ids: list[str] = []
    scanned = 0
    last_id: str | None = None
    more = True  # entries past last_id may exist
    # One visible entry past the page tells whether there is a next page, so a page is never
    # followed by an empty one just because other projects' entries come after it.
    while len(items) <= limit and scanned < SCAN_BUDGET and more:
        chunk: list[Any] = await redis.xrange(dlq, min=start, max="+", count=SCAN_CHUNK) or []
        more = len(chunk) == SCAN_CHUNK
        for raw_id, fields in chunk:
            scanned += 1
            last_id = as_str(raw_id)
            record = _record(fields)
            if record is not None and _visible(who, record) \
                    and (stream is None or record.get("stream") == stream) \
                    and (event is None or _event_of(record) == event):
                items.append(entry_json(last_id, record))
                ids.append(last_id)
                if len(items) > limit:
                    break
        if last_id is not None:
            start = "(" + last_id
    next_cursor = None
    if len(items) > limit:
        del items[limit:]
        next_cursor = encode_cursor(request, ids[limit - 1])
    elif more and last_id is not None:
        # The scan budget ran out before the page filled: go on from where it stopped.
        next_cursor = encode_cursor(request, last_id)
    return json_response({"items": items, "nextCursor": next_cursor})


@ops.route("GET", "/v1/dlq/{entryId}", "One dead-lettered entry", access="ops",
           responses={200: ref("DlqEntry")})
async def get_dlq(request: web.Request) -> web.Response:
    entry_id, record = await _find(request)
    return json_response(entry_json(entry_id, record))


@ops.route("POST", "/v1/dlq/{entryId}/replay", "Send an entry back to its stream",
           access="ops",
           responses={202: Reply(ref("Replayed"), "Back on its origin stream with a fresh "
                                                  "attempt count; gone from the DLQ."),
                      409: Reply(ref("Error"), "The entry names no notifkit stream to go back "
                                               "to, or holds no payload (not_replayable); or "
                                               "its notification was canceled "
                                               "(notification_canceled): it stays, to be "
                                               "deleted.")})
async def replay_dlq(request: web.Request) -> web.Response:
    app = request.app
    entry_id, record = await _find(request)
    keys = app[KEYS]
    stream = record.get("stream")
    if stream not in keys.all_streams() or stream == keys.dlq:
        raise ApiError(409, "not_replayable",
                       "This entry does not name a notifkit stream to go back to.")
    payload = record.get("payload")
    if not isinstance(payload, dict):
        raise ApiError(409, "not_replayable", "This entry has no payload to replay.")
    replay_of = record.get("replayOf") or f"{stream}/{record.get('entryId') or entry_id}"
    # A fresh start: attempts a parked task carried in its payload do not count again.
    replayed = {k: v for k, v in payload.items() if k not in ("priorAttempts", "parkCount")}
    replayed["_replayOf"] = replay_of
    # They still happened: the timeline numbers the new attempts after them, so the rows of
    # a replay that fails again are not taken for repeats of the first round's.
    replayed[REPLAYED_ATTEMPTS] = attempts_before(payload) + count_of(record.get("attempts"))
    # The timeline's row goes first: once the entry is back on its stream, its next row may
    # be written at any moment, and the replay must not come after it. It is committed only
    # once the entry is back, and a concurrent replay's row (the same one) waits on it: the
    # request that moved the entry keeps the row, and one that found it gone leaves none.
    # The events service's entries record what happened to a task, and the workflow
    # service's are triggers, wakes and custom events: replaying one redoes no task's work,
    # so no timeline goes back to 'processing' (nothing would end it again).
    records = stream in (keys.events_inbound, keys.workflow_inbound)
    row = None if records else _replay_row(record, replayed[REPLAYED_ATTEMPTS], entry_id)
    script = app[REDIS].register_script(_REPLAY)
    async with app[DB].acquire() as conn, conn.transaction():
        # Checked holding the notification FOR SHARE until the entry is back: a cancel under
        # way (FOR UPDATE) is waited for, and one that comes after finds the task handed on.
        if not records and await _canceled(conn, record, stream == keys.scheduled):
            raise ApiError(409, "notification_canceled",
                           "This entry's notification was canceled, so it is not sent; "
                           "delete the entry to discard it.")
        if row is not None:
            await insert_one(conn, row)
        new_id = await script(keys=[keys.dlq, stream],
                              args=[entry_id, app[SETTINGS].queue_max_len,
                                    codec.dumps(replayed)])
        if new_id is None:  # another request replayed or deleted it meanwhile
            raise ApiError(404, *ENTRY_NOT_FOUND)
    log.info("Replayed dead-lettered entry %s to %s as %s.", entry_id, stream, as_str(new_id),
             extra=_log_ids(record))
    return json_response({"id": as_str(new_id), "stream": stream, "replayOf": replay_of}, 202)


async def _canceled(db: asyncpg.Connection, record: dict[str, Any], scheduled: bool) -> bool:
    """Whether the entry is work of a notification canceled since: nothing more of it is
    sent. The events service's entries only record what happened, and are replayed."""
    work = record["payload"]
    if scheduled and isinstance(work.get("payload"), dict):
        # A scheduler entry wraps the task it holds; the scheduler would refuse it anyway.
        work = work["payload"]
    event_id = _uuid_field(work, "eventId")
    project = _uuid_field(record, "projectId")
    if event_id is None or project is None:
        return False
    return bool(await db.fetchval(
        "SELECT canceled_at IS NOT NULL FROM notifications WHERE id = $1 AND project_id = $2 "
        "FOR SHARE", event_id, project))


def _replay_row(record: dict[str, Any], attempt: int, entry_id: str) -> LogRow | None:
    """The notification's timeline row saying the work is back in progress, where its
    dead_lettered row is: on the task's timeline, else the recipient's, else the whole
    notification's; none for work of no notification. A scheduler entry's row is about the
    task it holds, as its dead_lettered row is."""
    payload = held_task(record["payload"])
    event_id = _uuid_field(payload, "eventId")
    project = _uuid_field(record, "projectId")
    if event_id is None or project is None:
        return None
    # The same task and channel as the events service's dead_lettered row (outcome_row): a
    # poison's own fields are often what no timeline row holds as they are.
    user, campaign = payload_user(payload), payload.get("campaignId")
    task, channel = payload.get("taskId"), payload.get("channel")
    if isinstance(task, str) and task:
        channel = channel if channel in CHANNELS else ""
    else:
        task, channel = untasked_row_id(event_id, user), ""
    return LogRow(
        project_id=project, event_id=event_id, task_id=storable(task),
        user_id=storable(user) if user is not None else None, channel=channel,
        kind=Kind.REPLAYED, status=Status.PROCESSING, attempt=attempt,
        detail="replayed from the dead-letter queue",
        campaign_id=storable(campaign) if isinstance(campaign, str) else None,
        metadata={"dlqEntry": entry_id},
    )


def _uuid_field(source: Mapping[str, Any], name: str) -> str | None:
    value = source.get(name)
    return parse_uuid(value) if isinstance(value, str) else None


@ops.route("DELETE", "/v1/dlq/{entryId}", "Discard a dead-lettered entry", access="ops",
           responses={204: Reply(None, "Discarded.")})
async def delete_dlq(request: web.Request) -> web.Response:
    entry_id, record = await _find(request)
    if not await request.app[REDIS].xdel(request.app[KEYS].dlq, entry_id):
        raise ApiError(404, *ENTRY_NOT_FOUND)
    # Nothing else keeps a trace of work given up on by hand: the timeline still ends in
    # dead_lettered.
    log.info("Discarded dead-lettered entry %s; its work is never retried.", entry_id,
             extra=_log_ids(record))
    return web.Response(status=204)


def _log_ids(record: dict[str, Any]) -> dict[str, Any]:
    payload = record.get("payload")
    payload = payload if isinstance(payload, dict) else {}
    ids = {"event_id": payload.get("eventId"), "task_id": payload.get("taskId"),
           "project_id": record.get("projectId"), "stream": record.get("stream")}
    return {k: v for k, v in ids.items() if isinstance(v, str)}


# ---------------------------------------------------------------------------------------------


def is_entry_id(text: str) -> bool:
    """A stream entry id Redis would take: two numbers within 64 bits."""
    return bool(ENTRY_ID.match(text)) and all(
        int(part) <= _MAX_ID_PART for part in text.split("-"))


async def _find(request: web.Request) -> tuple[str, dict[str, Any]]:
    entry_id = request.match_info["entryId"]
    if not is_entry_id(entry_id):
        raise ApiError(404, *ENTRY_NOT_FOUND)
    record = await read_entry(request.app[REDIS], request.app[KEYS].dlq, entry_id)
    if record is None or not _visible(principal(request), record):
        raise ApiError(404, *ENTRY_NOT_FOUND)
    return entry_id, record


async def read_entry(redis: Redis, dlq: str, entry_id: str) -> dict[str, Any] | None:
    try:
        found = await redis.xrange(dlq, min=entry_id, max=entry_id, count=1)
    except Exception as exc:  # an id past the 64-bit range is "Invalid stream ID"
        if "Invalid stream ID" in str(exc):
            return None
        raise
    return _record(found[0][1]) if found else None


def _record(fields: Any) -> dict[str, Any] | None:
    try:
        return decode(fields)
    except MalformedPayload:
        return None


def _event_query(request: web.Request) -> str | None:
    value = query_value(request, "eventId")
    if value is None:
        return None
    parsed = parse_uuid(value)
    if parsed is None:
        raise invalid_field("eventId", "must be a notification id (UUID)")
    return parsed


def _event_of(record: dict[str, Any]) -> str | None:
    """The notification a record's work belongs to, as its ``notification:failed`` names it."""
    payload = record.get("payload")
    if not isinstance(payload, dict):
        return None
    event = held_task(payload).get("eventId")
    return parse_uuid(event) if isinstance(event, str) else None


def _visible(who: Principal, record: dict[str, Any]) -> bool:
    if who.project_id is None:
        return who.is_admin
    return record.get("projectId") == who.project_id


def entry_json(entry_id: str, record: dict[str, Any]) -> dict[str, Any]:
    attempts = record.get("attempts")
    return {
        "id": entry_id,
        "stream": str(record.get("stream", "")),
        "group": record.get("group") if isinstance(record.get("group"), str) else None,
        "payload": record.get("payload"),
        "error": record.get("error") if isinstance(record.get("error"), str) else None,
        "attempts": attempts if isinstance(attempts, int) else None,
        "failedAt": record.get("failedAt") if isinstance(record.get("failedAt"), str) else None,
        "projectId": record.get("projectId") if isinstance(record.get("projectId"), str)
        else None,
        "service": record.get("service") if isinstance(record.get("service"), str) else None,
        "entryId": record.get("entryId") if isinstance(record.get("entryId"), str) else None,
    }
