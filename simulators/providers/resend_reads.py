"""Resend reads: retrieve one sent email, list sent emails a page at a time.

GET /emails/{id}                        -> {"object": "email", ...}
GET /emails?limit=&after=|before=       -> {"object": "list", "has_more", "data": [...]}

Both answer from what the simulator recorded, `last_event` following the receipts the
simulator drew for each email. Any key reads any email: Resend scopes emails by team, which
the simulator has no notion of, and ids are random UUIDs. The list is newest first, `limit`
1-100 (default 20), paged by the id of an email as the `after` (older) or `before` (newer)
cursor, the cursor itself left out. Reads are not metered, faulted or counted in the stats,
which describe sends.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from simulators.kinds import ErrorCase, Provider
from simulators.providers.resend import Resend
from simulators.receipts import due_in_s
from simulators.records import MessageRecord
from simulators.replies import json_reply
from simulators.state import STATE

DEFAULT_LIMIT = 20
MAX_LIMIT = 100


async def get_email(request: web.Request) -> web.Response:
    provider = Resend()
    if provider.credentials(request) is None:
        return provider.render(ErrorCase.MISSING_CREDENTIALS).response()
    record = request.app[STATE].messages.find(Provider.RESEND, request.match_info["id"])
    if record is None:
        return provider.render(ErrorCase.NOT_FOUND, detail="Email not found").response()
    content = record.content
    email = {
        **_summary(record),
        "object": "email",
        "html": content.get("html"),
        "text": content.get("text"),
        "tags": content.get("tags"),
    }
    return json_reply(200, email).response()


async def list_emails(request: web.Request) -> web.Response:
    provider = Resend()
    if provider.credentials(request) is None:
        return provider.render(ErrorCase.MISSING_CREDENTIALS).response()
    query = request.query
    after, before = query.get("after"), query.get("before")
    limit = _limit(query.get("limit"))
    if limit is None:
        detail = f"The `limit` parameter must be an integer between 1 and {MAX_LIMIT}."
        return provider.render(ErrorCase.BAD_REQUEST, detail=detail).response()
    if after is not None and before is not None:
        detail = "You can only use one of `before` or `after` at a time."
        return provider.render(ErrorCase.BAD_REQUEST, detail=detail).response()
    store = request.app[STATE].messages
    emails = store.query(provider=Provider.RESEND, limit=len(store))
    start, end = 0, limit
    cursor = after if after is not None else before
    if cursor is not None:
        index = next((i for i, record in enumerate(emails) if record.id == cursor), None)
        if index is None:
            name = "after" if after is not None else "before"
            detail = f"The `{name}` cursor does not name a listed email."
            return provider.render(ErrorCase.BAD_REQUEST, detail=detail).response()
        if after is not None:
            start, end = index + 1, index + 1 + limit
        else:
            start, end = max(index - limit, 0), index
    has_more = end < len(emails) if before is None else start > 0
    page = {
        "object": "list",
        "has_more": has_more,
        "data": [_summary(record) for record in emails[start:end]],
    }
    return json_reply(200, page).response()


def _summary(record: MessageRecord) -> dict[str, Any]:
    content = record.content
    return {
        "id": record.id,
        "to": content.get("to", []),
        "from": content.get("from"),
        "created_at": record.received_at.isoformat(timespec="microseconds"),
        "subject": content.get("subject"),
        "bcc": content.get("bcc"),
        "cc": content.get("cc"),
        "reply_to": _as_list(content.get("reply_to")),
        # Until its time comes a scheduled email is only that, whatever fate it will meet.
        "last_event": "scheduled" if due_in_s(record) > 0 else record.last_event,
        "scheduled_at": content.get("scheduled_at"),
    }


def _limit(value: str | None) -> int | None:
    if value is None or value == "":
        return DEFAULT_LIMIT
    # int() also reads other scripts' digits ("\uff15") and digit separators ("1_0"),
    # which a web API's number parsing (JavaScript's Number(), say) refuses.
    if not value.isascii() or "_" in value:
        return None
    try:
        number = int(value)
    except ValueError:
        return None
    return number if 1 <= number <= MAX_LIMIT else None


def _as_list(value: object) -> list[Any] | None:
    if value is None:
        return None
    return value if isinstance(value, list) else [value]
