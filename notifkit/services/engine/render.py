"""Rendering one channel of one recipient's message.

Templates render in the sandboxed Jinja2 environment of :mod:`notifkit.templates` with the
context of API.md (``data``, ``user``, ``notification``, ``channel``, ``unsubscribeUrl`` for
email, ``items`` for a digest). A template without content for a channel (or whose content fails
to render, e.g. a variable the data lacks, or renders an SMS text or e-mail subject blank) falls
back to a generic message built from the template id and the data:

    email    subject "Invoice paid" (the id, humanised), text "amount: 12.00" one line per
             field, html the same lines as paragraphs
    sms      "Invoice paid: amount: 12.00, ..."
    push     title "Invoice paid", body "amount: 12.00, ..."
    inapp    text as for sms
    webhook  body = JSON {"template": id, "data": data}

Whatever wrote it (the template, the generic builder above, or a model in the ai service), a
channel's content goes through :func:`fit`: an sms text and a push title and body longer than
their providers take are cut to fit (ending in "…"), since sent whole they would be refused for
good.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from typing import Any, NamedTuple

from notifkit import templates
from notifkit.db.routing import Template
from notifkit.messages import EnrichedMessage

# The most text a channel's provider takes, in characters, or in bytes of the JSON text as
# UTF-8: Twilio refuses an SMS body over 1,600 characters (21617), FCM a message over 4 KB
# (notification and data together, hence half of it for the body, and half the rest for the
# title, leaving a kilobyte for the template's data and the message's own keys).
MAX_SMS_CHARS = 1600
MAX_PUSH_BODY_BYTES = 2048
MAX_PUSH_TITLE_BYTES = 1024
# Fields the providers refuse blank, for good (Twilio 21602 "Message body is required"; Resend
# and SendGrid an e-mail without a subject): one a template renders blank, from a null or empty
# value in the data say, is a failed render, so the recipient gets the generic content.
_NOT_BLANK: dict[str, tuple[str, ...]] = {"sms": ("text",), "email": ("subject",)}


def context_for(
    message: EnrichedMessage, channel: str, unsubscribe_url: str | None
) -> dict[str, Any]:
    return templates.build_context(
        data=message["data"],
        user=message["user"],
        notification={
            "id": message["eventId"],
            "template": message["template"],
            "priority": message["priority"],
            "campaignId": message.get("campaignId"),
        },
        channel=channel,
        unsubscribe_url=unsubscribe_url,
        items=message.get("digestItems"),
    )


class Rendered(NamedTuple):
    content: dict[str, Any]
    # The template error that made the content generic, if one did.
    error: str | None
    # What was cut to fit the provider (``sms text cut to 1,600 characters``), for the timeline.
    cuts: list[str]


def render(template: Template, channel: str, context: dict[str, Any]) -> Rendered:
    """The channel's content as it is sent: the template's, or the generic one.

    A template that fails to render (say, a variable the data does not carry) does not stop
    the send: the generic content goes out and the error is recorded on the timeline.
    """
    content, error = _content(template, channel, context)
    fitted, cuts = fit(channel, content)
    return Rendered(fitted, error, cuts)


def _content(
    template: Template, channel: str, context: dict[str, Any]
) -> tuple[dict[str, Any], str | None]:
    content = template.content.get(channel)
    if not isinstance(content, dict):
        return generic(template.id, channel, context), None
    try:
        rendered = templates.render_channel(content, channel, context)
    except templates.RenderError as exc:
        return generic(template.id, channel, context), str(exc)
    blank = blank_field(channel, rendered)
    if blank is not None:
        return generic(template.id, channel, context), f"{blank}: rendered empty"
    return rendered, None


def blank_field(channel: str, rendered: dict[str, Any]) -> str | None:
    """The field (``channels.sms.text``) of ``rendered`` that a provider refuses blank and
    that rendered blank, if one did."""
    for field in _NOT_BLANK.get(channel, ()):
        value = rendered.get(field)
        if isinstance(value, str) and not value.strip():
            return f"channels.{channel}.{field}"
    return None


def generic(template_id: str, channel: str, context: dict[str, Any]) -> dict[str, Any]:
    """The content built from the template id and the data, before :func:`fit`."""
    title = humanise(template_id)
    data = context.get("data") or {}
    lines = [f"{key}: {_text(value)}" for key, value in data.items()]
    summary = ", ".join(lines)
    line = f"{title}: {summary}" if summary else title
    if channel == "email":
        paragraphs = "".join(f"<p>{html.escape(x)}</p>" for x in lines) or ""
        return {"subject": title, "text": "\n".join(lines) or title,
                "html": f"<h1>{html.escape(title)}</h1>{paragraphs}"}
    if channel == "push":
        return {"title": title, "body": summary or title}
    if channel == "webhook":
        return {"body": json.dumps({"template": template_id, "data": data},
                                   ensure_ascii=False, default=str)}
    return {"text": line}


def json_text_bytes(text: str) -> int:
    return len(json.dumps(text, ensure_ascii=False).encode()) - 2


class _Limit(NamedTuple):
    most: int
    size: Callable[[str], int]
    unit: str


# Per channel, the fields its provider limits, measured as the provider measures them.
_LIMITS: dict[str, dict[str, _Limit]] = {
    "sms": {"text": _Limit(MAX_SMS_CHARS, len, "characters")},
    "push": {"title": _Limit(MAX_PUSH_TITLE_BYTES, json_text_bytes, "bytes"),
             "body": _Limit(MAX_PUSH_BODY_BYTES, json_text_bytes, "bytes")},
}


def fit(channel: str, content: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``content`` with each field its channel's provider limits cut to fit, and what was cut
    (``sms text cut to 1,600 characters``). The one place the limits apply, whoever wrote
    the content: the template, the generic builder or a model."""
    fitted = dict(content)
    cuts: list[str] = []
    for field, limit in _LIMITS.get(channel, {}).items():
        value = fitted.get(field)
        if isinstance(value, str) and limit.size(value) > limit.most:
            fitted[field] = cut(value, limit.most, limit.size)
            cuts.append(f"{channel} {field} cut to {limit.most:,} {limit.unit}")
    return fitted, cuts


def cut(text: str, limit: int, size: Callable[[str], int]) -> str:
    """``text`` if its ``size`` is within ``limit``, else its longest start that is, with
    "…" after it."""
    if size(text) <= limit:
        return text
    room = limit - size("…")
    used = 0
    for index, char in enumerate(text):
        used += size(char)
        if used > room:
            return text[:index].rstrip() + "…"
    return text  # pragma: no cover - the whole text fits


def humanise(template_id: str) -> str:
    words = template_id.replace("_", " ").replace("-", " ").replace(".", " ").split()
    text = " ".join(words)
    return text[:1].upper() + text[1:] if text else "Notification"


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)
