"""The OpenAPI 3.1 document (``GET /openapi.json``), built from the same
:class:`~notifkit.services.api.routing.Operation` objects the router mounts.

Each operation's error responses follow from what the middleware and handlers can answer: 401
and 403 for keyed routes, 429 for project keys, 400 for the admin key without a project, 400/
408/413/415 for bodies, 404 for path ids, 503 when Redis or PostgreSQL is unreachable, and
413/417 on every route for what its Expect header asks.
"""

from __future__ import annotations

import re
from typing import Any

from notifkit import __version__
from notifkit.inbox_token import QUERY_PARAM as INBOX_TOKEN
from notifkit.services.api.routing import Operation, Param, Reply
from notifkit.services.api.schemas import COMPONENTS, ID, UUID, ref

_PATH_PARAM = re.compile(r"{([^}]+)}")

PATH_PARAMS: dict[str, dict[str, Any]] = {
    "userId": ID, "templateId": ID, "workflowId": ID,
    "projectId": UUID, "keyId": UUID, "contactId": UUID, "eventId": UUID, "instanceId": UUID,
    "messageId": UUID, "suppressionId": UUID,
    "entryId": {"type": "string", "pattern": r"^[0-9]{1,20}-[0-9]{1,20}$"},
    "provider": {"type": "string", "enum": ["resend", "sendgrid", "fcm", "smtp", "twilio"]},
}

_ERROR_TEXT = {
    400: "Invalid JSON or fields; details name each field.",
    401: "Missing, unknown or revoked API key.",
    403: "The key's role does not allow this call.",
    404: "No such resource in this project (another project's id is also 404).",
    408: "The request body stopped arriving (nothing for 30 s) before its end.",
    409: "The idempotency key was first used on another route, or a request with it is still "
         "in progress (retry after Retry-After).",
    413: "The body is larger than the limit (1 MiB by default); a route that takes none "
         "answers so too when Expect: 100-continue announces one over it.",
    415: "The body is not application/json, declares a charset other than UTF-8, or is in a "
         "Content-Encoding other than gzip or deflate.",
    417: "An Expect header other than 100-continue.",
    429: "The project is over its API rate; retry after Retry-After seconds.",
    503: ("Redis or PostgreSQL cannot serve the request right now (unreachable, or a lock "
          "held elsewhere outlasted its wait); retry after Retry-After seconds."),
}

# The errors that tell the client when to try again. A 409 does so only for an idempotency key
# whose first request is still in progress; a key first used on another route stays a 409.
_RETRY_AFTER = {"Retry-After": {"type": "string"}}
_RETRY_STATUSES = frozenset({409, 429, 503})

DESCRIPTION = """\
notifkit's HTTP API. Authenticate with `Authorization: Bearer <key>`: a project key (role
`full`, or `send` for the three sending routes) or the admin key, which must name a project
(`x-project-id` header or `projectId` query) on project routes. Every error has the shape
`{"error": {"code", "message", "details": [{"field", "message"}]}}`. Lists take `limit`
(default 50, max 500) and an opaque `cursor` and answer `{"items", "nextCursor"}`."""


def document(operations: list[Operation]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op)
    tags = list(dict.fromkeys(op.tag for op in operations))
    return {
        "openapi": "3.1.0",
        "info": {"title": "notifkit", "version": __version__, "description": DESCRIPTION},
        "tags": [{"name": tag} for tag in tags],
        "paths": paths,
        "components": {
            "schemas": COMPONENTS,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                # An inbox route's other credential, for a user's browser or app.
                "inboxToken": {"type": "apiKey", "in": "query", "name": INBOX_TOKEN,
                               "description": "An inbox token (POST /v1/users/{userId}/"
                                              "inbox/token): that one user's inbox routes."},
            },
        },
    }


def _operation(op: Operation) -> dict[str, Any]:
    path_names = _PATH_PARAM.findall(op.path)
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": PATH_PARAMS[name]}
        for name in path_names
    ]
    query = list(op.query)
    headers = list(op.headers)
    if op.access in ("project", "ops"):
        headers.append(Param("x-project-id", "header", UUID,
                             "Admin key only: the project to act for."))
        if not any(p.name == "projectId" for p in query):
            query.append(Param("projectId", "query", UUID,
                               "Admin key only: the project to act for (or x-project-id)."))
    elif op.access == "admin" and (op.method != "POST" or "{projectId}" in op.path):
        # Creating a project names none: there either is a 400.
        meant = ("the project the caller means: it must be the path's" if "{projectId}" in
                 op.path else "the project the caller means: another project's key is a 404")
        headers.append(Param("x-project-id", "header", UUID, f"Optional: {meant}."))
        query.append(Param("projectId", "query", UUID, f"Optional: {meant} (or x-project-id)."))
    for p in [*query, *headers]:
        entry: dict[str, Any] = {"name": p.name, "in": p.where, "required": p.required,
                                 "schema": p.schema}
        if p.description:
            entry["description"] = p.description
        if p.where == "query" and not p.required and p.name != "projectId":
            # The server reads an empty filter or page parameter as one left out
            # (validation.query_value); projectId names who acts, and empty names no one.
            entry["allowEmptyValue"] = True
        params.append(entry)
    out: dict[str, Any] = {
        "operationId": op.operation_id,
        "summary": op.summary,
        "tags": [op.tag],
        "parameters": params,
        "responses": _responses(op, bool(path_names), bool(query)),
        "security": _security(op),
    }
    if op.description:
        out["description"] = op.description
    if op.body is not None:
        out["requestBody"] = {
            "required": op.body_required,
            "content": {media: {"schema": op.body} for media in op.body_types},
        }
    return out


def _security(op: Operation) -> list[dict[str, list[str]]]:
    """Who may call it: no one in particular, a key, or (an inbox route) a key or a token."""
    if op.access == "public":
        return []
    if any(p.name == INBOX_TOKEN for p in op.query):
        return [{"bearer": []}, {"inboxToken": []}]
    return [{"bearer": []}]


def _responses(op: Operation, has_path: bool, has_query: bool) -> dict[str, Any]:
    # Every route meets Expect before its handler runs (validation.expect_within_limit).
    statuses: set[int] = {413, 417, 503, *op.errors}
    if op.access != "public":
        statuses |= {401, 403}
        if op.access in ("project", "ops"):
            statuses |= {400, 404, 429}
    if op.body is not None:
        # 415 also answers a Content-Encoding the API does not decode, whatever the media type.
        statuses |= {400, 408, 413, 415}
    else:
        statuses.add(408)  # a body it does not take is still read, to refuse one with fields
    if has_path:
        statuses |= {400, 404}
    if has_query:
        statuses.add(400)
    out: dict[str, Any] = {}
    for status, reply in sorted(op.responses.items()):
        out[str(status)] = _reply(reply)
    for status in sorted(statuses):
        if str(status) in out:
            continue
        out[str(status)] = _reply(Reply(ref("Error"), _ERROR_TEXT[status], headers=(
            _RETRY_AFTER if status in _RETRY_STATUSES else {})))
    return out


def _reply(reply: Reply) -> dict[str, Any]:
    out: dict[str, Any] = {"description": reply.description or "OK"}
    if reply.schema is not None:
        out["content"] = {reply.content_type: {"schema": reply.schema}}
    if reply.headers:
        out["headers"] = {name: {"schema": schema} for name, schema in reply.headers.items()}
    return out
