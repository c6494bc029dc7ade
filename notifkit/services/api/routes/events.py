"""``POST /v1/events``: a custom event for a user, handed to the events service.

The events service records it and wakes workflow instances waiting for it (``waitForEvent``).
Like a send, it takes an ``x-idempotency-key``: a retried event must not wake a workflow twice.
"""

from __future__ import annotations

import logging

from aiohttp import web

from notifkit.clock import utc_now_iso
from notifkit.ids import uuid7
from notifkit.services.api.idempotency import (
    Remember,
    answer_once,
    header_key,
    replay_earlier,
)
from notifkit.services.api.middleware import project_id
from notifkit.services.api.routes.notifications import IDEMPOTENCY_PARAM, REPLAY_REPLY_HEADERS
from notifkit.services.api.routing import SEND, Operations, Reply
from notifkit.services.api.schemas import ref
from notifkit.services.api.state import KEYS, REDIS, SETTINGS
from notifkit.services.api.validation import Fields, read_json
from notifkit.streams import xadd, xadd_and_set
from notifkit.workflow_defs import MAX_EVENT_NAME_CHARS

log = logging.getLogger("notifkit.api")

ops = Operations("events")
_ROUTE = "POST /v1/events"


@ops.route("POST", "/v1/events", "Record a custom event (wakes waiting workflows)",
           roles=SEND, body=ref("EventCreate"), headers=(IDEMPOTENCY_PARAM,),
           responses={202: Reply(ref("Accepted"), "Accepted and queued for the events "
                                                  "service.", headers=REPLAY_REPLY_HEADERS)},
           errors=(409,))
async def post_event(request: web.Request) -> web.Response:
    project = project_id(request)
    key = header_key(request)
    body = await read_json(request)
    fields = Fields(body)
    fields.only(("name", "userId", "data"))
    name = fields.name("name", required=True, max_len=MAX_EVENT_NAME_CHARS)
    user_id = fields.identifier("userId", required=True)
    data = fields.obj("data", nullable=True)
    fields.raise_if_invalid()
    if (earlier := await replay_earlier(request, project, key, _ROUTE)) is not None:
        return earlier
    event_id = uuid7()
    payload = {
        "type": "custom", "projectId": project, "name": name, "userId": user_id,
        "data": data or {}, "eventId": event_id, "at": utc_now_iso(),
    }

    async def enqueue(remember: Remember | None) -> None:
        app = request.app
        stream, maxlen = app[KEYS].events_inbound, app[SETTINGS].queue_max_len
        if remember is None:
            await xadd(app[REDIS], stream, payload, maxlen)
        else:
            await xadd_and_set(app[REDIS], stream, payload, maxlen, remember.key,
                               remember.record, remember.ttl_s)
        log.info("Accepted custom event %r and queued it for the events service.", name,
                 extra={"event_id": event_id, "project_id": project})

    return await answer_once(request, project, key, _ROUTE, body, 202,
                             {"id": event_id, "status": "accepted"}, enqueue)
