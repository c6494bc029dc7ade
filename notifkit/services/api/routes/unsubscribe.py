"""``GET`` and ``POST /v1/unsubscribe?token=...`` (the POST is RFC 8058 one-click).

The token (notifkit/unsubscribe.py) is the authentication. It turns the named topic off, or
the channel when it names no topic; when it names the address it also records a suppression
(reason ``unsubscribe``) so that address is never contacted again in the project. Repeating it
changes nothing further and answers the same. A forged or altered token is a 400 that changes
nothing; a template preview's link (its token marked ``preview``) answers 200 with
``unsubscribed: false, preview: true`` and changes nothing either.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import datetime
from urllib.parse import parse_qs

from aiohttp import web

from notifkit.clock import to_ms
from notifkit.services.api.errors import ApiError, json_response
from notifkit.services.api.routing import Operations, Param, Reply, Schema
from notifkit.services.api.schemas import CONTACT_CHANNELS, ref
from notifkit.services.api.state import DB, SETTINGS
from notifkit.services.api.validation import parse_uuid, read_body
from notifkit.unsubscribe import (
    MAX_TOKEN_CHARS,
    TOKEN_PATTERN,
    InvalidToken,
    Unsubscribe,
    verify_token,
)

log = logging.getLogger("notifkit.api")

RECREATED_AFTER_MS = 3_600_000

ops = Operations("unsubscribe")

TOKEN = Param("token", "query", {"type": "string", "minLength": 3, "maxLength": MAX_TOKEN_CHARS,
                                 "pattern": TOKEN_PATTERN},
              "The signed token from the unsubscribe link.", required=True)
_RESULT: dict[int, Reply | Schema | None] = {200: ref("Unsubscribed"),
           400: Reply(ref("Error"), "The token is missing, forged, altered or given "
                                    "twice; nothing changed."),
           404: Reply(ref("Error"), "The token's project no longer exists; nothing changed.")}


@ops.route("GET", "/v1/unsubscribe", "Unsubscribe through a signed link", access="public",
           query=(TOKEN,), responses=_RESULT)
async def unsubscribe_get(request: web.Request) -> web.Response:
    if request.method == "HEAD":
        # HEAD comes with GET but must change nothing (RFC 9110): link checkers and mail
        # scanners send it to see whether a link works, not to unsubscribe anyone.
        _claims(request.app[SETTINGS].secret, _one_token(request.query.getall("token", [])))
        return web.Response(status=200, content_type="application/json")
    return await _apply(request, _one_token(request.query.getall("token", [])))


@ops.route("POST", "/v1/unsubscribe", "One-click unsubscribe (RFC 8058)", access="public",
           query=(TOKEN,), body={"type": "object", "properties": {
               "List-Unsubscribe": {"type": "string", "enum": ["One-Click"]}}},
           body_required=False,
           # RFC 8058: multipart/form-data is what mail clients should send, a URL-encoded
           # form what they may; the token is the link's either way.
           body_types=("multipart/form-data", "application/x-www-form-urlencoded"),
           responses=_RESULT,
           description="Mail clients POST 'List-Unsubscribe=One-Click' to the link from the "
                       "List-Unsubscribe header; the token may also come as a form field.")
async def unsubscribe_post(request: web.Request) -> web.Response:
    tokens = request.query.getall("token", [])
    if not tokens or request.content_type == "application/x-www-form-urlencoded":
        raw = await read_body(request)
        # A body that is no form names no token; the query's (or none) counts.
        with contextlib.suppress(UnicodeDecodeError, ValueError):
            tokens += parse_qs(raw.decode("utf-8"), max_num_fields=20).get("token", [])
    return await _apply(request, _one_token(tokens))


def _one_token(tokens: list[str]) -> str | None:
    """A link naming two tokens is ambiguous: a proxy or mail scanner may read the last one
    where this server would read the first, so which user is unsubscribed would depend on
    who reads it. Refused, as any query parameter given twice is."""
    if len(tokens) > 1:
        raise ApiError(400, "invalid_token", "The unsubscribe link names more than one token.",
                       [{"field": "token", "message": "must be given once"}])
    return tokens[0] if tokens else None


def _claims(secret: str, token: str | None) -> tuple[str, Unsubscribe]:
    """The project and claims of a link's token, or the 400 that says why there are none."""
    if not token:
        raise ApiError(400, "invalid_token", "The unsubscribe link has no token.",
                       [{"field": "token", "message": "is required"}])
    try:
        claims = verify_token(secret, token)
    except InvalidToken:
        raise ApiError(400, "invalid_token",
                       "The unsubscribe link is not valid; it may have been altered.",
                       [{"field": "token", "message": "is not a valid unsubscribe token"}]) \
            from None
    project = parse_uuid(claims.project_id)
    if project is None:
        raise ApiError(400, "invalid_token", "The unsubscribe link names no project.",
                       [{"field": "token", "message": "names no project"}])
    return project, claims


async def _apply(request: web.Request, token: str | None) -> web.Response:
    project, claims = _claims(request.app[SETTINGS].secret, token)
    if claims.preview:
        if not await request.app[DB].fetchval("SELECT 1 FROM projects WHERE id = $1", project):
            raise _project_gone()
        return json_response({"unsubscribed": False, "channel": claims.channel,
                              "topic": claims.topic, "suppressed": False, "preview": True})
    suppressed = await _unsubscribe(request, project, claims)
    log.info("Unsubscribed a user through a signed link.",
             extra={"project_id": project, "channel": claims.channel, "topic": claims.topic})
    return json_response({"unsubscribed": True, "channel": claims.channel,
                          "topic": claims.topic, "suppressed": suppressed})


async def _unsubscribe(request: web.Request, project: str, claims: Unsubscribe) -> bool:
    async with request.app[DB].acquire() as conn, conn.transaction():
        if not await conn.fetchval("SELECT 1 FROM projects WHERE id = $1", project):
            raise _project_gone()
        # The preference rows need the user; a user erased since the e-mail was sent has no
        # preferences left to change, but the suppression below still applies, and so does it
        # for a new user given the erased one's id since. The row is held until the commit,
        # so an erasure under way is waited for, not written under.
        created = await conn.fetchval(
            "SELECT created_at FROM users WHERE project_id = $1 AND id = $2 FOR KEY SHARE",
            project, claims.user_id,
        )
        user_exists = created is not None and not _created_since(created, claims.sent_ms)
        if user_exists and claims.topic is not None:
            await conn.execute(
                "INSERT INTO user_topic_preferences (project_id, user_id, topic, enabled) "
                "VALUES ($1, $2, $3, false) ON CONFLICT (project_id, user_id, topic) "
                "DO UPDATE SET enabled = false",
                project, claims.user_id, claims.topic,
            )
        elif user_exists:
            await conn.execute(
                "INSERT INTO user_channel_preferences (project_id, user_id, channel, enabled) "
                "VALUES ($1, $2, $3, false) ON CONFLICT (project_id, user_id, channel) "
                "DO UPDATE SET enabled = false",
                project, claims.user_id, claims.channel,
            )
        if claims.target is None or claims.channel not in CONTACT_CHANNELS:
            return False
        await conn.execute(
            "INSERT INTO suppressions (project_id, channel, target, reason, detail) "
            "VALUES ($1, $2, $3, 'unsubscribe', $4) ON CONFLICT DO NOTHING",
            project, claims.channel, claims.target,
            f"unsubscribe link (topic {claims.topic})" if claims.topic else "unsubscribe link",
        )
        return True


def _project_gone() -> ApiError:
    return ApiError(404, "project_not_found", "The project of this link no longer exists.")


def _created_since(created: datetime, sent_ms: int | None) -> bool:
    """Whether the user was created well after the send the link came with: then it is
    another user under the same id. The enricher reads the user moments after the accept; an
    hour's margin keeps a user created meanwhile (or a slow enrichment) the link's own."""
    if sent_ms is None:
        return False
    return to_ms(created) > sent_ms + RECREATED_AFTER_MS
