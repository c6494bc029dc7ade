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

from notifkit.destinations import normalise_contact
from notifkit.services.api.errors import json_response, not_found
from notifkit.services.api.middleware import project_id
from notifkit.services.api.routes.users import contact_fields
from notifkit.services.api.routing import CURSOR, LIMIT, Operations, Param, Reply
from notifkit.services.api.schemas import CONTACT_CHANNELS, ref
from notifkit.services.api.state import DB
from notifkit.services.api.validation import (
    Fields,
    QueryChecks,
    contact_problem,
    encode_cursor,
    enum_query,
    iso,
    limit_param,
    query_string,
    read_json,
    time_uuid_cursor,
    uuid_id,
)

ops = Operations("suppressions")

# As a contact's target: at most 1,024 bytes.
MAX_TARGET_CHARS = 1024
MAX_DETAIL_CHARS = 1000
COLUMNS = "id, channel, target, reason, detail, created_at"


@ops.route("GET", "/v1/suppressions", "The project's suppressed addresses, newest first",
           query=(
               Param("channel", "query",
                     {"type": "string", "enum": list(CONTACT_CHANNELS)}),
               Param("target", "query",
                     {"type": "string", "minLength": 1, "maxLength": MAX_TARGET_CHARS},
                     "The address, in any spelling a suppression or contact of it takes "
                     "(an e-mail domain, a webhook's scheme and host in any case)."),
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
        f"SELECT {COLUMNS} FROM suppressions "
        "WHERE project_id = $1 AND ($2::text IS NULL OR channel = $2) "
        "AND ($3::text[] IS NULL OR target = ANY($3)) "
        "AND ($4::timestamptz IS NULL OR (created_at, id) < ($4, $5::uuid)) "
        "ORDER BY created_at DESC, id DESC LIMIT $6",
        project_id(request), channel, _spellings(target, channel), after_at, after_id,
        limit + 1,
    )
    page = rows[:limit]
    next_cursor = None
    if len(rows) > limit:
        last = page[-1]
        next_cursor = encode_cursor(request, last["created_at"].isoformat(), str(last["id"]))
    return json_response({"items": [suppression_json(r) for r in page],
                          "nextCursor": next_cursor})


@ops.route("POST", "/v1/suppressions", "Suppress an address by hand",
           body=ref("SuppressionCreate"),
           responses={201: ref("Suppression"),
                      200: Reply(ref("Suppression"), "The address was suppressed already; "
                                                     "that suppression, unchanged.")},
           description="An address not to send to any more (one that bounced at a former "
                       "provider, say), checked and stored as a contact's is; reason manual.")
async def add_suppression(request: web.Request) -> web.Response:
    project = project_id(request)
    fields = Fields(await read_json(request))
    fields.only(("channel", "target", "detail"))
    # Any https URL may be suppressed: the private-network rule guards what is sent to.
    channel, target = contact_fields(fields, allow_private=True)
    detail = fields.string("detail", nullable=True, max_len=MAX_DETAIL_CHARS)
    fields.raise_if_invalid()
    pool = request.app[DB]
    while True:
        row = await pool.fetchrow(
            "INSERT INTO suppressions (project_id, channel, target, reason, detail) "
            "VALUES ($1, $2, $3, 'manual', $4) ON CONFLICT (project_id, channel, target) "
            f"DO NOTHING RETURNING {COLUMNS}",
            project, channel, target, detail,
        )
        if row is not None:
            return json_response(suppression_json(row), 201)
        row = await pool.fetchrow(
            f"SELECT {COLUMNS} FROM suppressions "
            "WHERE project_id = $1 AND channel = $2 AND target = $3",
            project, channel, target,
        )
        if row is not None:
            return json_response(suppression_json(row), 200)
        # Lifted by a DELETE between the two statements: add it after all.


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


def _spellings(target: str | None, channel: str | None) -> list[str] | None:
    """The stored spellings ``target`` may stand for: as it came, and as each channel it is
    an address of (the one asked for, else any) stores it, so the filter finds a suppression
    by the spelling that added it."""
    if target is None:
        return None
    channels = (channel,) if channel is not None else CONTACT_CHANNELS
    return list(dict.fromkeys([target, *(
        normalise_contact(kind, target) for kind in channels
        if contact_problem(kind, target, allow_private_networks=True) is None)]))


def _target(request: web.Request) -> str | None:
    return query_string(request, "target", max_len=MAX_TARGET_CHARS)
