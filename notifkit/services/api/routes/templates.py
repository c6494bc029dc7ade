"""Templates: per-channel Jinja2 content, checked at PUT, rendered by the preview route.

A template's channels are the channels it has content for plus those its ``ai`` block writes.
A ``fallback`` channel may be any of the five: one without content gets the engine's generic
content, as a send naming that channel does.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg
from aiohttp import web
from redis.exceptions import RedisError

from notifkit.messages import CHANNELS
from notifkit.services.api.admission import KNOWN_TEMPLATE_TTL_S
from notifkit.services.api.errors import ApiError, detail, invalid, json_response, not_found
from notifkit.services.api.middleware import project_id
from notifkit.services.api.routing import CURSOR, LIMIT, Operations, Reply
from notifkit.services.api.schemas import ref
from notifkit.services.api.state import DB, HUB, SETTINGS
from notifkit.services.api.validation import (
    Fields,
    id_page,
    id_page_query,
    iso,
    lookup_id,
    path_id,
    read_json,
)
from notifkit.services.engine.render import blank_field, fit
from notifkit.templates import (
    AI_WRITTEN_FIELDS,
    CHANNEL_FIELDS,
    RenderError,
    build_context,
    render_channel,
    render_string,
    syntax_error,
    template_errors,
    template_strings,
    uncompiled,
    warm_beside_loop,
)
from notifkit.transports.fcm import reserved_data_key
from notifkit.transports.inapp import unsafe_url
from notifkit.unsubscribe import unsubscribe_url

log = logging.getLogger("notifkit.api")

ops = Operations("templates")

MAX_TEMPLATE_CHARS = 100_000
PREVIEW_EVENT_ID = "00000000-0000-7000-8000-000000000000"
PREVIEW_USER_ID = "preview-user"


@ops.route("PUT", "/v1/templates/{templateId}", "Create or replace a template",
           body=ref("TemplatePut"), responses={200: ref("Template"), 201: ref("Template")},
           description="A Jinja2 syntax error is a 400 whose details name the field "
                       "(e.g. channels.email.subject) and the line.")
async def put_template(request: web.Request) -> web.Response:
    project = project_id(request)
    template_id = path_id(request, "templateId")
    fields = Fields(await read_json(request))
    fields.only(("topic", "channels", "fallback", "ai"))
    topic = fields.name("topic", nullable=True, max_len=100)
    raw_ai = fields.body.get("ai")
    written_by_ai = raw_ai.get("channels") if isinstance(raw_ai, dict) else None
    channels = _channels(fields, written_by_ai if isinstance(written_by_ai, list) else [])
    ai = _ai(fields)
    fallback = fields.channel_list("fallback", CHANNELS, nullable=True)
    fields.raise_if_invalid()
    assert channels is not None
    available = set(channels) | set(ai["channels"] if ai else ())
    if not available:
        fields.fail("channels", "must hold content for at least one channel (or use ai)")
    # Compiling takes up to a few seconds for the largest fields: in a thread, the event loop
    # goes on answering other requests meanwhile.
    errors, prompt_problem = await asyncio.to_thread(
        lambda: (template_errors(channels),
                 syntax_error(ai["prompt"]) if ai is not None else None))
    fields.errors.extend(detail(e["field"], e["message"]) for e in errors)
    if prompt_problem:
        fields.fail("ai.prompt", prompt_problem)
    if fields.errors:
        raise invalid(fields.errors)
    row = await request.app[DB].fetchrow(
        "INSERT INTO templates (project_id, id, topic, content, fallback, ai) "
        "VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (project_id, id) DO UPDATE SET "
        "topic = EXCLUDED.topic, content = EXCLUDED.content, fallback = EXCLUDED.fallback, "
        "ai = EXCLUDED.ai, updated_at = now() "
        "RETURNING (xmax = 0) AS created, id, topic, content, fallback, ai, created_at, "
        "updated_at",
        project, template_id, topic, channels, fallback, ai,
    )
    return json_response(template_json(row), 201 if row["created"] else 200)


@ops.route("GET", "/v1/templates/{templateId}", "Get a template",
           responses={200: ref("Template")})
async def get_template(request: web.Request) -> web.Response:
    row = await load_template(request, lookup_id(request, "templateId", "template"))
    return json_response(template_json(row))


@ops.route("GET", "/v1/templates", "The project's templates, by id",
           query=(LIMIT, CURSOR), responses={200: ref("TemplateList")},
           description="Each template's summary: the channels it has content for, not the "
                       "content (GET /v1/templates/{templateId} has it).")
async def list_templates(request: web.Request) -> web.Response:
    limit, after = id_page_query(request)
    # Content stays in PostgreSQL, only its channel names come (as "content", so the summary
    # is template_json's): a page of 500 templates with fields of up to 100,000 characters
    # each would be a response of hundreds of megabytes.
    rows = await request.app[DB].fetch(
        "SELECT id, topic, ARRAY(SELECT jsonb_object_keys(content) ORDER BY 1) AS content, "
        "fallback, ai - 'prompt' AS ai, created_at, updated_at FROM templates "
        "WHERE project_id = $1 AND ($2::text IS NULL OR id > $2) ORDER BY id LIMIT $3",
        project_id(request), after, limit + 1,
    )
    return json_response(id_page(request, rows, limit, template_json))


@ops.route("DELETE", "/v1/templates/{templateId}", "Delete a template",
           responses={204: Reply(None, "New sends naming the template are refused (400); "
                                       "those accepted before fail with the reason "
                                       "'template not found' on their timeline.")})
async def delete_template(request: web.Request) -> web.Response:
    project = project_id(request)
    template_id = lookup_id(request, "templateId", "template")
    deleted = await request.app[DB].fetchval(
        "DELETE FROM templates WHERE project_id = $1 AND id = $2 RETURNING true",
        project, template_id,
    )
    if not deleted:
        raise not_found("template", template_id)
    # Every API process stops accepting sends of it as the deletion reaches it. The template
    # is gone whatever happens to the message: a process that misses it still looks the
    # template up again within KNOWN_TEMPLATE_TTL_S, so a Redis error is no reason for a 503.
    try:
        await request.app[HUB].publish_template_deletion(project, template_id)
    except (RedisError, OSError) as exc:
        log.warning("Publishing a template deletion failed (%s); other API processes may "
                    "accept sends of it for up to %.0f s.", exc, KNOWN_TEMPLATE_TTL_S)
    return web.Response(status=204)


def digest_items(fields: Fields) -> list[dict[str, Any]] | None:
    """The preview's ``items``: what a digest step hands its template, each ``{"data", "at"}``
    (the trigger's data and time), so a digest template can be tried before a window closes."""
    given = fields.array("items", nullable=True)
    if given is None:
        return None
    items: list[dict[str, Any]] = []
    for index, value in enumerate(given):
        if not isinstance(value, dict):
            fields.fail(f"items[{index}]", "must be an object with data and at")
            continue
        item = fields.child(f"items[{index}]", value)
        item.only(("data", "at"))
        data = item.obj("data", nullable=True)
        at = item.timestamp("at", nullable=True)
        # As a digest step hands it over: in UTC to the millisecond, however it was written.
        items.append({"data": data if data is not None else {}, "at": iso(at)})
    return items


@ops.route("POST", "/v1/templates/{templateId}/preview", "Render a template without sending",
           body=ref("PreviewRequest"), responses={200: ref("Preview")},
           description="Renders every channel with data, user (the named user, or a "
                       "placeholder), notification (placeholders), channel and, for e-mail, "
                       "unsubscribeUrl; items (each {data, at}) for a digest template, "
                       "as a send carries it (an SMS text over 1,600 characters, a push "
                       "title over 1 KB or body over 2 KB of UTF-8 cut to fit). An AI "
                       "template's prompt is rendered for each channel the model writes "
                       "(ai.prompts; ai.prompt is the first channel's). A render error is a "
                       "400 naming the field.")
async def preview_template(request: web.Request) -> web.Response:
    project = project_id(request)
    template_id = lookup_id(request, "templateId", "template")
    fields = Fields(await read_json(request))
    fields.only(("userId", "data", "items"))
    user_id = fields.identifier("userId")
    data = fields.obj("data", nullable=True) or {}
    items = digest_items(fields)
    fields.raise_if_invalid()
    row = await load_template(request, template_id)
    user: dict[str, Any] = {"id": PREVIEW_USER_ID, "attributes": {}, "timezone": None,
                            "locale": None}
    if user_id is not None:
        found = await request.app[DB].fetchrow(
            "SELECT id, attributes, timezone, locale FROM users "
            "WHERE project_id = $1 AND id = $2",
            project, user_id,
        )
        if found is None:
            raise invalid([detail("userId", "no user with this id exists in this project")])
        user = dict(found)
    notification = {"id": PREVIEW_EVENT_ID, "template": template_id, "priority": "normal",
                    "campaignId": None}
    settings = request.app[SETTINGS]
    rendered: dict[str, Any] = {}
    problems = []
    written_by_ai: list[str] = list(row["ai"]["channels"]) if row["ai"] else []
    prompt_source = row["ai"]["prompt"] if row["ai"] else None
    await warm_beside_loop(
        [field for channel, content in row["content"].items() if isinstance(content, dict)
         for field in uncompiled(content, channel)]
        + (uncompiled({"prompt": prompt_source}, "") if isinstance(prompt_source, str) else []))
    def context_for(channel: str) -> dict[str, Any]:
        return build_context(
            data=data, user=user, notification=notification, channel=channel,
            # Marked a preview's: whoever follows it (the template's author, trying the
            # link) turns nothing off for the user it was rendered for.
            unsubscribe_url=unsubscribe_url(settings, project, user["id"], channel,
                                            row["topic"], preview=True),
            items=items,
        )

    for channel, content in row["content"].items():
        try:
            rendered[channel] = render_channel(content, channel, context_for(channel))
        except RenderError as exc:
            problems.append(detail(exc.field, exc.message))
            continue
        if channel not in written_by_ai and (
                blank := blank_field(channel, rendered[channel])) is not None:
            # A send would not go out with it: it gets the generic content instead. Not so
            # for a channel the model writes: its body is the answer, and a blank e-mail
            # subject (or push title) is the answer's first sentence.
            problems.append(detail(blank, "renders empty with this data, so a send gets the "
                                          "generic content instead"))
            continue
        if channel == "inapp" and unsafe_url(rendered[channel].get("url")):
            # What the recipient gets: the in-app transport sends the message without it.
            rendered[channel]["url"] = None
        # What a send carries: a text longer than the channel's provider takes is cut to fit.
        rendered[channel] = fit(channel, rendered[channel])[0]
    ai_out = None
    if row["ai"]:
        # As the ai service renders it: once per channel it writes, with that channel, the
        # e-mail's unsubscribeUrl and a digest's items.
        prompts: dict[str, str] = {}
        for channel in row["ai"]["channels"]:
            try:
                prompts[channel] = render_string(row["ai"]["prompt"], context_for(channel),
                                                 field="ai.prompt")
            except RenderError as exc:
                problems.append(detail(exc.field, f"for {channel}: {exc.message}"))
        if prompts:
            ai_out = {"model": row["ai"]["model"],
                      "prompt": prompts.get(row["ai"]["channels"][0], ""),
                      "prompts": prompts, "channels": row["ai"]["channels"]}
    if problems:
        raise ApiError(400, "template_render_error",
                       "The template does not render with this data.", problems)
    return json_response({"template": template_id, "channels": rendered, "ai": ai_out})


# ---------------------------------------------------------------------------------------------


async def load_template(request: web.Request, template_id: str) -> asyncpg.Record:
    row = await request.app[DB].fetchrow(
        "SELECT id, topic, content, fallback, ai, created_at, updated_at FROM templates "
        "WHERE project_id = $1 AND id = $2",
        project_id(request), template_id,
    )
    if row is None:
        raise not_found("template", template_id)
    return row


def template_json(row: asyncpg.Record) -> dict[str, Any]:
    return {
        "id": row["id"], "topic": row["topic"], "channels": row["content"],
        "fallback": row["fallback"], "ai": row["ai"], "createdAt": iso(row["created_at"]),
        "updatedAt": iso(row["updated_at"]),
    }


def _channels(fields: Fields, written_by_ai: list[Any]) -> dict[str, Any] | None:
    """Each channel's content. A required field must say something, unless the AI writes
    that channel (then the fields may be empty placeholders): a message no provider takes is
    refused here, not dead-lettered at send time. An email's html and text are each optional
    (API.md): every email transport sends one with neither with an empty body."""
    raw = fields.obj("channels", required=True)
    if raw is None:
        return None
    outer = fields.child("channels", raw)
    outer.only(CHANNELS)
    out: dict[str, Any] = {}
    for channel, content in raw.items():
        if channel not in CHANNEL_FIELDS:
            continue
        if not isinstance(content, dict):
            outer.fail(channel, "must be an object")
            continue
        inner = outer.child(channel, content)
        required, optional = CHANNEL_FIELDS[channel]
        inner.only((*required, *optional))
        for key in (*required, *optional):
            if channel == "push" and key == "data":
                data = inner.obj("data") or {}
                _refuse_long(data, f"channels.{channel}.data", fields)
                for name in data:
                    if reserved_data_key(name):
                        inner.child("data", data).fail(
                            name, "is a key FCM reserves (from, message_type, google..., "
                                  "gcm...): it refuses every message that uses it")
            elif channel == "webhook" and key == "body":
                body = content.get("body")
                if "body" not in content:
                    if channel not in written_by_ai:
                        inner.fail("body", "is required")
                elif not isinstance(body, str | dict):
                    inner.fail("body", "must be a template string or an object")
                elif isinstance(body, str) and len(body) > MAX_TEMPLATE_CHARS:
                    inner.fail("body", f"must be at most {MAX_TEMPLATE_CHARS} characters")
                else:
                    _refuse_long(body, f"channels.{channel}.body", fields)
            else:
                by_ai = channel in written_by_ai
                must_say = key in required and not by_ai
                # The field the model fills may be left out; the others may be empty.
                inner.string(key, required=key in required and not (
                                 by_ai and AI_WRITTEN_FIELDS[channel] == key),
                             min_len=1 if must_say else 0, max_len=MAX_TEMPLATE_CHARS)
        if channel == "inapp" and unsafe_url(content.get("url")):
            inner.fail("url", "must not be a javascript:, vbscript: or data: link")
        out[channel] = content
    return out


def _refuse_long(value: Any, path: str, fields: Fields) -> None:
    """Each string of an object's fields (push data, a webhook body) is a template, held to
    the length of any other field."""
    for where, source in template_strings(value, path):
        if len(source) > MAX_TEMPLATE_CHARS:
            fields.errors.append(detail(where, f"must be at most {MAX_TEMPLATE_CHARS} characters"))


def _ai(fields: Fields) -> dict[str, Any] | None:
    raw = fields.obj("ai", nullable=True)
    if raw is None:
        return None
    inner = fields.child("ai", raw)
    inner.only(("model", "prompt", "channels"))
    # White space alone names no model, and asks the model nothing. The model name goes out
    # as it is in every provider call: one with a control character would fail each send.
    model = inner.name("model", required=True, max_len=200)
    prompt = inner.string("prompt", required=True, max_len=MAX_TEMPLATE_CHARS,
                          allow_blank=False)
    channels = inner.channel_list("channels", CHANNELS, required=True)
    if model is None or prompt is None or channels is None:
        return None
    return {"model": model, "prompt": prompt, "channels": channels}
