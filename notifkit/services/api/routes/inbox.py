"""The in-app inbox: list, mark read, and a server-sent-event stream of new messages.

Delivery stores in-app messages in ``inapp_messages`` and publishes each on
``Keys.inbox_channel(projectId, userId)``; the stream forwards whatever it publishes as the
``data`` of a ``message`` event whose ``id`` is the message's id. A comment line every
``SSE_HEARTBEAT_S`` keeps proxies from closing an idle stream.

A client that reconnects with ``Last-Event-ID`` (browsers' EventSource does so by itself) first
gets the messages stored after that one, oldest first, up to ``RESUME_LIMIT``, then the live
ones: the stream subscribes before it reads the backlog, so a message stored meanwhile arrives
once, not never. With more than ``RESUME_LIMIT`` missed the stream ends after those, and the
reconnect continues the replay; a stream that falls ``QUEUE_SIZE`` messages behind is ended by
the hub after those, to be resumed the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from aiohttp import web

from notifkit import codec
from notifkit.inbox_token import MAX_TOKEN_CHARS, make_inbox_token
from notifkit.inbox_token import QUERY_PARAM as INBOX_TOKEN
from notifkit.services.api.auth import unauthorized
from notifkit.services.api.errors import ApiError, invalid_field, json_response, not_found
from notifkit.services.api.middleware import principal, project_id
from notifkit.services.api.pubsub import CLOSE, Hub
from notifkit.services.api.routing import CURSOR, LIMIT, Operations, Param, Reply
from notifkit.services.api.schemas import ref
from notifkit.services.api.state import (
    DB,
    HUB,
    KEYS,
    REDIS,
    SETTINGS,
    SSE_HEARTBEAT_S,
    SSE_LIVE_WAIT_S,
)
from notifkit.services.api.validation import (
    Fields,
    QueryChecks,
    encode_cursor,
    iso,
    limit_param,
    lookup_id,
    parse_uuid,
    query_bool,
    read_json,
    read_raw,
    time_uuid_cursor,
    uuid_id,
)
from notifkit.streams import xadd

ops = Operations("inbox")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
RESUME_LIMIT = 1_000  # messages a reconnecting stream replays before going live
LAST_EVENT_ID = "Last-Event-ID"


# The inbox routes take an inbox token instead of a key (notifkit/inbox_token.py).
TOKEN = Param(INBOX_TOKEN, "query", {"type": "string", "maxLength": MAX_TOKEN_CHARS},
              "An inbox token (POST /v1/users/{userId}/inbox/token) instead of the "
              "Authorization header, for a browser or app: EventSource cannot send a header, "
              "and a project key must not reach a user's device.")
DEFAULT_TOKEN_TTL_S = 3600
MIN_TOKEN_TTL_S = 60
MAX_TOKEN_TTL_S = 7 * 86_400


@ops.route("POST", "/v1/users/{userId}/inbox/token",
           "A token for one user's own inbox, to hand to their browser or app",
           body={"type": "object", "additionalProperties": False, "properties": {
               "ttlSeconds": {"type": "integer", "minimum": MIN_TOKEN_TTL_S,
                              "maximum": MAX_TOKEN_TTL_S,
                              "description": "How long it lasts (default 3600)."}}},
           body_required=False,
           responses={201: Reply({"type": "object", "required": ["token", "userId",
                                                                  "expiresAt"],
                                  "properties": {"token": {"type": "string"},
                                                 "userId": {"type": "string"},
                                                 "expiresAt": {"type": "string",
                                                               "format": "date-time"}}},
                                 "The token: `?token=` on this user's inbox routes until "
                                 "`expiresAt`. It cannot be revoked before then.")})
async def inbox_token(request: web.Request) -> web.Response:
    project = project_id(request)
    user_id = lookup_id(request, "userId", "user")
    ttl_s = DEFAULT_TOKEN_TTL_S
    if (await read_raw(request)).strip():
        fields = Fields(await read_json(request))
        fields.only(("ttlSeconds",))
        asked = fields.integer("ttlSeconds", minimum=MIN_TOKEN_TTL_S, maximum=MAX_TOKEN_TTL_S)
        fields.raise_if_invalid()
        ttl_s = asked or ttl_s
    created_us = await _require_user(request, project, user_id)
    expires_at_s = int(time.time()) + ttl_s
    token = make_inbox_token(request.app[SETTINGS].secret, project, user_id, expires_at_s,
                             created_us)
    return json_response({"token": token, "userId": user_id,
                          "expiresAt": iso(datetime.fromtimestamp(expires_at_s, UTC))},
                         status=201)


@ops.route("GET", "/v1/users/{userId}/inbox", "A user's in-app messages, newest first",
           query=(
               Param("unread", "query", {"type": "boolean"}, "Only messages not yet read"),
               LIMIT,
               CURSOR,
               TOKEN,
           ),
           responses={200: ref("InboxList")})
async def list_inbox(request: web.Request) -> web.Response:
    project = project_id(request)
    user_id = lookup_id(request, "userId", "user")
    checks = QueryChecks()  # one 400 names every bad parameter, not only the first
    unread = checks(query_bool, request, "unread")
    limit = checks(limit_param, request)
    cursor = checks(time_uuid_cursor, request)
    checks.done()
    pool = request.app[DB]
    await _require_user(request, project, user_id)
    where = ["project_id = $1", "user_id = $2"]
    args: list[Any] = [project, user_id]
    if unread:
        where.append("read_at IS NULL")
    if cursor is not None:
        args.extend(cursor)
        where.append(f"(created_at, id) < (${len(args) - 1}, ${len(args)}::uuid)")
    args.append(limit + 1)
    rows = await pool.fetch(
        "SELECT id, task_id, event_id, content, read_at, created_at FROM inapp_messages "
        f"WHERE {' AND '.join(where)} ORDER BY created_at DESC, id DESC LIMIT ${len(args)}",
        *args,
    )
    page = rows[:limit]
    next_cursor = None
    if len(rows) > limit:
        last = page[-1]
        next_cursor = encode_cursor(request, last["created_at"].isoformat(), str(last["id"]))
    return json_response({"items": [inbox_json(r, user_id) for r in page],
                          "nextCursor": next_cursor})


@ops.route("POST", "/v1/users/{userId}/inbox/{messageId}/read", "Mark an in-app message read",
           query=(TOKEN,),
           responses={204: Reply(None, "Marked read (again, if it was already); the first "
                                       "read is the message's `opened` receipt.")})
async def mark_read(request: web.Request) -> web.Response:
    project = project_id(request)
    user_id = lookup_id(request, "userId", "user")
    message_id = uuid_id(request, "messageId", "message")
    app = request.app
    if principal(request).user_created_us is not None:
        await _require_user(request, project, user_id)  # the token's user, not a later one
    read = await app[DB].fetchrow(
        "UPDATE inapp_messages SET read_at = coalesce(read_at, now()) "
        "WHERE id = $1 AND project_id = $2 AND user_id = $3 RETURNING task_id, read_at",
        message_id, project, user_id,
    )
    if read is None:
        # Another user's message is as unknown here as a message of another project, but
        # "in this project" would read as if it did not exist at all.
        raise ApiError(404, "message_not_found",
                       f"No in-app message {message_id!r} exists for user {user_id!r}.")
    # Reading is the in-app channel's open, as a provider's open receipt is an e-mail's: the
    # events service puts it on the send's timeline and campaign log and wakes a workflow
    # waiting for "opened". It goes out on every call, so a retry after Redis failed still
    # records it; the same webhookId and first read time make a repeat the same receipt.
    await xadd(app[REDIS], app[KEYS].events_inbound, {
        "type": "receipt", "projectId": project, "provider": "inapp", "channel": "inapp",
        "providerMessageId": message_id, "taskId": read["task_id"], "kind": "opened",
        "at": iso(read["read_at"]), "webhookId": f"inapp:read:{message_id}",
    }, app[SETTINGS].queue_max_len)
    return web.Response(status=204)


@ops.route("GET", "/v1/users/{userId}/inbox/stream", "Server-sent events of new in-app messages",
           query=(TOKEN,),
           headers=(Param(LAST_EVENT_ID, "header", {"type": "string", "format": "uuid"},
                          "Resume: first the messages stored after this one (the `id` of the "
                          "last event seen), oldest first, up to 1,000; with more, the stream "
                          "ends after those for the reconnect to go on."),),
           responses={200: Reply({"type": "string"},
                                 "An endless text/event-stream: `event: message` with the "
                                 "message as JSON data and its id as the event id, and a "
                                 "comment heartbeat. One opened with `?token=` ends when the "
                                 "token expires.",
                                 content_type="text/event-stream")})
async def inbox_stream(request: web.Request) -> web.StreamResponse:
    project = project_id(request)
    user_id = lookup_id(request, "userId", "user")
    resume_after = _last_event_id(request)
    pool = request.app[DB]
    await _require_user(request, project, user_id)
    hub = request.app[HUB]
    heartbeat_s = request.app[SSE_HEARTBEAT_S]
    caller = principal(request)
    key_id = caller.key_id  # None for the admin key, which is never revoked
    # A token grants the inbox until it expires, so a stream it opened ends then: the
    # client's reconnect is refused and its page asks for a new token.
    ends_at_s = caller.expires_at_s
    await _subscribed(hub, request.app[SSE_LIVE_WAIT_S])
    queue = hub.listen(project, user_id, key_id)
    response = web.StreamResponse(headers={
        "Content-Type": "text/event-stream", "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no",
    })
    try:
        # A revocation heard between the authentication and listen() closed no queue of this
        # stream: asked again now that one heard later will, so it cannot stay open for good.
        if key_id is not None and not await pool.fetchval(
                "SELECT 1 FROM project_api_keys WHERE id = $1 AND revoked_at IS NULL", key_id):
            raise unauthorized("invalid_api_key", "The API key is unknown or has been revoked.")
        # Likewise an erasure of the user heard in between ended no stream of this one: the
        # user is looked up again now that an erasure committed later will end it (a token's
        # user created again meanwhile is another user, refused as at the first look).
        await _require_user(request, project, user_id)
        missed = [] if resume_after is None else await _stored_after(
            pool, project, user_id, resume_after)
        await response.prepare(request)
        await response.write(b"retry: 3000\n: connected\n\n")
        replayed: set[str] = set()
        for row in missed[:RESUME_LIMIT]:
            item = inbox_json(row, user_id)
            replayed.add(item["id"])
            await response.write(sse_event("message", codec.dumps(item), item["id"]))
        # More were missed than one replay holds: the stream ends here, and the client's
        # reconnect (with the last id it got) continues the replay. Going live now would
        # skip the rest for good.
        while len(missed) <= RESUME_LIMIT:
            wait_s = heartbeat_s
            if ends_at_s is not None:
                wait_s = min(wait_s, ends_at_s - time.time())
                if wait_s <= 0:
                    break
            try:
                raw = await asyncio.wait_for(queue.get(), wait_s)
            except TimeoutError:
                if ends_at_s is None or time.time() < ends_at_s:
                    await response.write(b": heartbeat\n\n")
                continue
            if raw == CLOSE:
                break
            message_id = _message_id(raw)
            if message_id is not None and message_id in replayed:
                continue  # stored before the backlog was read: sent with it
            await response.write(sse_event("message", raw, message_id))
    except (ConnectionResetError, ConnectionError):
        pass  # the client went away
    finally:
        hub.unlisten(project, user_id, queue, key_id)
    with contextlib.suppress(ConnectionError):
        await response.write_eof()
    return response


async def _subscribed(hub: Hub, wait_s: float) -> None:
    """Wait for the process's pub/sub subscription. Without it a stream would hear nothing
    published, and nothing would end it for its client to resume from what it saw last
    (the hub ends the open streams only when the subscription drops)."""
    if hub.live.is_set():
        return
    try:
        async with asyncio.timeout(wait_s):
            await hub.live.wait()
    except TimeoutError:
        raise ApiError(503, "service_unavailable",
                       "The inbox stream cannot hear new messages right now (the Redis "
                       "subscription is reconnecting); retry shortly.",
                       headers={"Retry-After": "1"}) from None


def sse_event(event: str, data: bytes, event_id: str | None = None) -> bytes:
    lines = data.replace(b"\r\n", b"\n").split(b"\n")
    head = f"id: {event_id}\nevent: {event}\n" if event_id else f"event: {event}\n"
    return head.encode() + b"".join(b"data: " + ln + b"\n" for ln in lines) + b"\n"


def _message_id(raw: bytes) -> str | None:
    """The published message's id, if it is one an SSE ``id:`` line can carry."""
    try:
        message = codec.loads(raw)
    except ValueError:
        return None
    value = message.get("id") if isinstance(message, dict) else None
    return value if isinstance(value, str) and parse_uuid(value) is not None else None


def _last_event_id(request: web.Request) -> str | None:
    """The message a reconnecting client saw last; None on a first connection."""
    values = request.headers.getall(LAST_EVENT_ID, [])
    if not values or values == [""]:
        return None  # EventSource sends an empty one to say "none": a fresh start
    last = parse_uuid(values[0].strip()) if len(values) == 1 else None
    if last is None:
        raise invalid_field(LAST_EVENT_ID, "must be the id of a message this stream sent")
    return last


async def _stored_after(pool: asyncpg.Pool, project: str, user_id: str,
                        last_id: str) -> list[asyncpg.Record]:
    """The user's messages stored after ``last_id``, oldest first, up to one more than
    ``RESUME_LIMIT`` (so the caller knows whether there are more); none when that message is
    not the user's (or no longer exists)."""
    rows: list[asyncpg.Record] = await pool.fetch(
        """SELECT m.id, m.task_id, m.event_id, m.content, m.read_at, m.created_at
             FROM inapp_messages m,
                  LATERAL (SELECT created_at, id FROM inapp_messages
                            WHERE id = $3 AND project_id = $1 AND user_id = $2) AS seen
            WHERE m.project_id = $1 AND m.user_id = $2
              AND (m.created_at, m.id) > (seen.created_at, seen.id)
            ORDER BY m.created_at, m.id LIMIT $4""",
        project, user_id, last_id, RESUME_LIMIT + 1,
    )
    return rows


async def _require_user(request: web.Request, project: str, user_id: str) -> int:
    """When the user was created (unix microseconds); a 404 for no such user, and a 401 for an
    inbox token made for an earlier user of this id (deleted since: the id is the caller's,
    and may be given to someone else)."""
    created = await request.app[DB].fetchval(
        "SELECT created_at FROM users WHERE project_id = $1 AND id = $2", project, user_id)
    if created is None:
        raise not_found("user", user_id)
    created_us: int = (created - _EPOCH) // _MICROSECOND
    token_user = principal(request).user_created_us
    if token_user is not None and token_user != created_us:
        raise ApiError(401, "invalid_token",
                       "The inbox token is not valid (made for an earlier user with this id, "
                       "deleted since); ask your backend for a new one.")
    return created_us


def inbox_json(row: asyncpg.Record, user_id: str) -> dict[str, Any]:
    """One in-app message as the list and the event stream show it."""
    return {
        "id": str(row["id"]), "userId": user_id, "taskId": row["task_id"],
        "eventId": str(row["event_id"]),
        "content": row["content"], "read": row["read_at"] is not None,
        "readAt": iso(row["read_at"]), "createdAt": iso(row["created_at"]),
    }
