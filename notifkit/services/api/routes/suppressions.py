"""Suppressions: the addresses a project never contacts again (hard bounces, complaints,
unsubscribe links), listed and removed.

Removing one takes effect at the next send: the engine reads ``suppressions`` at every read
batch and delivery re-checks it before each provider call, neither through a cache. A task
already recorded ``suppressed`` stays so; only new sends go out to the address again.
"""

from __future__ import annotations

from typing import Any

import asyncpg
from aiohttp import web

from notifkit.services.api.errors import json_response, not_found
from notifkit.services.api.middleware import project_id
from notifkit.services.api.routing import CURSOR, LIMIT, Operations, Param, Reply
from notifkit.services.api.schemas import CONTACT_CHANNELS, ref
from notifkit.services.api.state import DB
from notifkit.services.api.validation import (
    QueryChecks,
    encode_cursor,
    enum_query,
    iso,
    limit_param,
    query_string,
    time_uuid_cursor,
    uuid_id,
)

ops = Operations("suppressions")

# As a contact's target: at most 1,024 bytes.
MAX_TARGET_CHARS = 1024


@ops.route("GET", "/v1/suppressions", "The project's suppressed addresses, newest first",
           query=(
               Param("channel", "query",
                     {"type": "string", "enum": list(CONTACT_CHANNELS)}),
               Param("target", "query",
                     {"type": "string", "minLength": 1, "maxLength": MAX_TARGET_CHARS},
                     "The address exactly as it was suppressed."),
               LIMIT,
               CURSOR,
           ),
           responses={200: ref("SuppressionList")})
async def list_suppressions(request: web.Request) -> web.Response:
    checks = QueryChecks()  # one 400 names every bad parameter
    limit = checks(limit_param, request)
    channel = checks(enum_query, request, "channel", CONTACT_CHANNELS)
    target = checks(_target, request)
    cursor = checks(time_uuid_cursor, request)
    checks.done()
    after_at, after_id = cursor if cursor is not None else (None, None)
    # One row past the page says whether another page follows.
    rows = await request.app[DB].fetch(
        "SELECT id, channel, target, reason, detail, created_at FROM suppressions "
        "WHERE project_id = $1 AND ($2::text IS NULL OR channel = $2) "
        "AND ($3::text IS NULL OR target = $3) "
        "AND ($4::timestamptz IS NULL OR (created_at, id) < ($4, $5::uuid)) "
        "ORDER BY created_at DESC, id DESC LIMIT $6",
        project_id(request), channel, target, after_at, after_id, limit + 1,
    )
    page = rows[:limit]
    next_cursor = None
    if len(rows) > limit:
        last = page[-1]
        next_cursor = encode_cursor(last["created_at"].isoformat(), str(last["id"]))
    return json_response({"items": [suppression_json(r) for r in page],
                          "nextCursor": next_cursor})


@ops.route("DELETE", "/v1/suppressions/{suppressionId}", "Remove a suppression",
           responses={204: Reply(None, "The address is sent to again from the next send on.")})
async def delete_suppression(request: web.Request) -> web.Response:
    suppression_id = uuid_id(request, "suppressionId", "suppression")
    deleted = await request.app[DB].fetchval(
        "DELETE FROM suppressions WHERE project_id = $1 AND id = $2 RETURNING true",
        project_id(request), suppression_id,
    )
    if not deleted:
        raise not_found("suppression", suppression_id)
    return web.Response(status=204)


def suppression_json(row: asyncpg.Record) -> dict[str, Any]:
    return {"id": str(row["id"]), "channel": row["channel"], "target": row["target"],
            "reason": row["reason"], "detail": row["detail"],
            "createdAt": iso(row["created_at"])}


def _target(request: web.Request) -> str | None:
    return query_string(request, "target", max_len=MAX_TARGET_CHARS)
