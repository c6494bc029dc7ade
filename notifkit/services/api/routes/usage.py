"""``GET /v1/usage/ai``: tokens the ai service spent for the caller's project.

Totals come from ``ai_usage`` (one row per AI-written task, written by the ai service), overall
and per model, optionally within ``[since, until)`` (RFC 3339).
"""

from __future__ import annotations

from aiohttp import web

from notifkit.db import ai_usage
from notifkit.services.api.errors import json_response
from notifkit.services.api.middleware import project_id
from notifkit.services.api.routing import Operations, Param
from notifkit.services.api.schemas import DATETIME, STRING, UUID, nullable, obj
from notifkit.services.api.state import DB
from notifkit.services.api.validation import (
    QueryChecks,
    iso,
    time_query,
    time_range_order,
)

ops = Operations("usage")

_COUNT = {"type": "integer", "minimum": 0}
_TOTALS = {"requests": _COUNT, "promptTokens": _COUNT, "completionTokens": _COUNT,
           "totalTokens": _COUNT}
AI_USAGE = obj({
    "projectId": UUID, "since": nullable(DATETIME), "until": nullable(DATETIME), **_TOTALS,
    "models": {"type": "array", "items": obj({"model": STRING, **_TOTALS},
                                             ("model", *_TOTALS))},
}, ("projectId", "since", "until", *_TOTALS, "models"))


@ops.route("GET", "/v1/usage/ai", "AI tokens used by the project",
           query=(Param("since", "query", DATETIME, "Count from this time (inclusive)."),
                  Param("until", "query", DATETIME, "Count up to this time (exclusive).")),
           responses={200: AI_USAGE})
async def get_ai_usage(request: web.Request) -> web.Response:
    project = project_id(request)
    checks = QueryChecks()
    since = checks(time_query, request, "since")
    until = checks(time_query, request, "until")
    checks.done()
    time_range_order(since, until)
    totals = await ai_usage.totals(request.app[DB], project, since, until)
    return json_response({"projectId": project, "since": iso(since), "until": iso(until),
                          **totals})
