"""Provider callbacks: delivery receipts and engagement, signature-checked, to ``events:inbound``.

``POST /v1/webhooks/{provider}/{projectId}`` needs no API key; the signature is the
authentication, and a bad one is a 401 that changes nothing.

- resend, sendgrid, fcm, smtp: Svix-style headers ``svix-id``, ``svix-timestamp``,
  ``svix-signature: v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>`` (several
  space-separated signatures allowed; the same under ``webhook-id``, ... too), with that
  provider's secret from the settings (a ``whsec_`` secret is base64 of the key). Timestamps
  more than 5 minutes away are refused, so a captured callback cannot be replayed later.
- sendgrid, also: SendGrid's own Signed Event Webhook, ``X-Twilio-Email-Event-Webhook-Signature``
  (ECDSA P-256 over ``X-Twilio-Email-Event-Webhook-Timestamp`` + the body), verified with
  ``SENDGRID_WEBHOOK_PUBLIC_KEY``; a post carrying that header is checked this way only. The
  same 5-minute window applies.
- twilio: ``X-Twilio-Signature`` = base64 HMAC-SHA1(auth token, URL + the form parameters
  sorted by name, each as name + value), over ``NOTIFKIT_PUBLIC_URL`` + the request path, since
  that is the URL each SMS gives Twilio, or over the URL the callback was posted to (scheme,
  ``Host`` and path), as for a status callback URL set in Twilio's console.

Each event becomes one receipt on ``events:inbound``::

    {"type": "receipt", "projectId", "provider", "channel", "providerMessageId",
     "kind": "delivered" | "bounced" | "complained" | "opened" | "clicked" | "failed",
     "at", "webhookId", "taskId"?, "to"?, "raw": {...the provider's event...}}

``webhookId`` names the event as the provider tells its deliveries apart, so the provider
retrying a delivery gives the same id and a second open or click of one message another:

- Svix-signed bodies: ``{provider}:{svix-id}:{index in the body}``; Svix retries a delivery
  with the same ``svix-id`` and gives each new one its own.
- SendGrid's event lists: ``{provider}:sg_event_id:{sg_event_id}``, which SendGrid keeps for
  an event however it batches the events when it posts them again.
- twilio: ``twilio:{MessageSid}:{MessageStatus}``. Twilio reports each status of a message
  once, so a callback repeating one is a retry, whatever else its request carries.

Events that are not receipts (sent, queued, delivery delayed, ...) are acknowledged and
ignored, so the provider does not retry them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import web

from notifkit.clock import utc_now_iso
from notifkit.config import Settings, svix_keys
from notifkit.sendgrid_signature import SIGNATURE_HEADER, TIMESTAMP_HEADER, load_public_key, verify
from notifkit.services.api.auth import project_not_found, unauthorized
from notifkit.services.api.errors import ApiError, Detail, invalid, json_response
from notifkit.services.api.routing import Operations, Reply
from notifkit.services.api.schemas import ref
from notifkit.services.api.state import DB, KEYS, REDIS, SETTINGS
from notifkit.services.api.validation import (
    check_storable,
    invalid_json,
    iso,
    load_json,
    parse_json_object,
    parse_rfc3339,
    parse_uuid,
    read_body,
)
from notifkit.streams import queue_xadd

ops = Operations("webhooks")

PROVIDERS = ("resend", "sendgrid", "fcm", "smtp", "twilio")
CHANNEL_OF = {"resend": "email", "sendgrid": "email", "smtp": "email", "fcm": "push",
              "twilio": "sms"}
SVIX_TOLERANCE_S = 300

# "<channel>.<event>" suffixes (Resend and the simulators) and SendGrid's event names.
_KINDS = {
    "delivered": "delivered", "bounced": "bounced", "complained": "complained",
    "opened": "opened", "clicked": "clicked", "failed": "failed",
    "bounce": "bounced", "dropped": "failed", "spamreport": "complained", "open": "opened",
    "click": "clicked",
}
# "read" is the read receipt of channels that report one (WhatsApp, RCS): an open.
_TWILIO_KINDS = {"delivered": "delivered", "undelivered": "bounced", "failed": "failed",
                 "read": "opened"}
_TASK_TAGS = ("taskId", "task_id", "notifkit_task_id")


@ops.route("POST", "/v1/webhooks/{provider}/{projectId}", "Provider receipts and engagement",
           access="public", body={"type": "object"}, body_required=False,
           body_types=("application/json", "application/x-www-form-urlencoded"),
           responses={200: ref("WebhookResult"),
                      401: Reply(ref("Error"), "The signature is missing, wrong or too old; "
                                               "nothing was recorded.")},
           description="Signed like the provider signs (Svix headers; X-Twilio-Signature for "
                       "twilio; SendGrid's own ECDSA signature, "
                       "X-Twilio-Email-Event-Webhook-Signature, with "
                       "SENDGRID_WEBHOOK_PUBLIC_KEY). Each receipt goes to the events service.")
async def provider_webhook(request: web.Request) -> web.Response:
    provider = request.match_info["provider"]
    if provider not in PROVIDERS:
        raise ApiError(404, "provider_not_found",
                       f"Unknown provider; webhooks exist for {', '.join(PROVIDERS)}.")
    project = parse_uuid(request.match_info["projectId"])
    if project is None:
        raise project_not_found()
    app = request.app
    settings = app[SETTINGS]
    raw = await read_body(request)
    if provider == "twilio":
        params = _form(raw)
        _check_twilio(settings, request, params)
        _check_form_storable(params)
        events = _twilio_events(params)
    else:
        if provider == "sendgrid" and SIGNATURE_HEADER in request.headers:
            _check_sendgrid(settings, request, raw)
        else:
            _check_svix(settings, provider, request, raw)
        events = _json_events(provider, raw)
    if not await app[DB].fetchval("SELECT 1 FROM projects WHERE id = $1", project):
        raise project_not_found()
    # Names the delivery where an event carries no id of its own: Svix's, or for SendGrid's
    # own signature (whose events carry sg_event_id) the body's digest.
    svix_id = _svix_header(request, "id") or hashlib.sha256(raw).hexdigest()[:32]
    pipe = app[REDIS].pipeline(transaction=True)
    receipts = 0
    # Every event of the body, however many: the provider takes the 200 as "all delivered"
    # and never sends the rest again. MAX_BODY_BYTES bounds the count.
    for index, event in enumerate(events):
        if event is None:
            continue
        receipt = {"type": "receipt", "projectId": project, **event}
        receipt.setdefault("webhookId", f"{provider}:{svix_id}:{index}")
        queue_xadd(pipe, app[KEYS].events_inbound, receipt, settings.queue_max_len)
        receipts += 1
    if receipts:
        await pipe.execute()
    return json_response({"received": receipts, "ignored": len(events) - receipts})


# ---------------------------------------------------------------------------------------------
# Signatures


def _secret(settings: Settings, provider: str) -> str | None:
    secret: str | None = getattr(settings.webhooks, provider, None)
    return secret


def _svix_header(request: web.Request, name: str) -> str:
    """``svix-{name}``, else ``webhook-{name}``: Svix sends its unbranded (Standard Webhooks)
    names to some accounts, and its own verifiers take either."""
    return (request.headers.get(f"svix-{name}")
            or request.headers.get(f"webhook-{name}") or "")


def _check_svix(settings: Settings, provider: str, request: web.Request, body: bytes) -> None:
    secret = _secret(settings, provider)
    if not secret:
        raise unauthorized("webhook_not_configured",
                           f"No webhook secret is configured for {provider}; the callback "
                           "cannot be verified.")
    msg_id = _svix_header(request, "id")
    timestamp = _svix_header(request, "timestamp")
    signatures = _svix_header(request, "signature")
    if not (msg_id and signatures and timestamp.isascii() and timestamp.isdigit()) \
            or len(timestamp) > 12:
        raise _bad_signature()
    if abs(time.time() - int(timestamp)) > SVIX_TOLERANCE_S:
        raise unauthorized("invalid_signature",
                           "The webhook timestamp is more than 5 minutes away from now.")
    signed = f"{msg_id}.{timestamp}.".encode() + body
    expected = [base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest())
                for key in svix_keys(secret)]
    for candidate in signatures.split():
        version, _, value = candidate.partition(",")
        given = value.encode("utf-8", "replace")
        if version == "v1" and any(hmac.compare_digest(mine, given) for mine in expected):
            return
    raise _bad_signature()


def _check_sendgrid(settings: Settings, request: web.Request, body: bytes) -> None:
    """SendGrid's Signed Event Webhook (ECDSA), for accounts that post to notifkit directly."""
    key_text = settings.webhooks.sendgrid_public_key
    if not key_text:
        raise unauthorized("webhook_not_configured",
                           "This callback is signed with SendGrid's ECDSA key, and no "
                           "SENDGRID_WEBHOOK_PUBLIC_KEY is configured to verify it.")
    signature = request.headers.get(SIGNATURE_HEADER, "")
    timestamp = request.headers.get(TIMESTAMP_HEADER, "")
    if not (signature and timestamp.isascii() and timestamp.isdigit()) or len(timestamp) > 12:
        raise _bad_signature()
    if abs(time.time() - int(timestamp)) > SVIX_TOLERANCE_S:
        raise unauthorized("invalid_signature",
                           "The webhook timestamp is more than 5 minutes away from now.")
    if not verify(load_public_key(key_text), signature, timestamp, body):
        raise _bad_signature()


def _check_twilio(settings: Settings, request: web.Request,
                  params: list[tuple[str, str]]) -> None:
    token = settings.webhooks.twilio_auth_token or settings.sms.auth_token
    if not token:
        raise unauthorized("webhook_not_configured",
                           "No Twilio auth token is configured; the callback cannot be "
                           "verified.")
    signature = request.headers.get("X-Twilio-Signature", "").encode("utf-8", "replace")
    # The URL Twilio was given: NOTIFKIT_PUBLIC_URL's, which each SMS names as its
    # StatusCallback; or, for a callback URL configured by hand, the address it was posted to.
    urls = {settings.public_url.rstrip("/") + request.raw_path,
            f"{request.scheme}://{request.host}{request.raw_path}"}
    form = "".join(name + value for name, value in sorted(params))
    matched = False
    for url in sorted(urls):
        expected = base64.b64encode(
            hmac.new(token.encode(), (url + form).encode(), hashlib.sha1).digest())
        matched |= hmac.compare_digest(expected, signature)
    if not signature or not matched:
        raise _bad_signature()


def _bad_signature() -> ApiError:
    return unauthorized("invalid_signature",
                        "The webhook signature does not match; nothing was recorded.")


# ---------------------------------------------------------------------------------------------
# Events


def _form(raw: bytes) -> list[tuple[str, str]]:
    try:
        return parse_qsl(raw.decode("utf-8"), keep_blank_values=True, max_num_fields=200)
    except (UnicodeDecodeError, ValueError):
        # Twilio signs the decoded form, so a body that is none cannot carry a good signature.
        raise unauthorized("invalid_signature", "The callback body is not a form, so its "
                           "signature cannot match; nothing was recorded.") from None


def _check_form_storable(params: list[tuple[str, str]]) -> None:
    """The form goes onto a stream and into jsonb as the receipt's raw event, like a JSON
    body: a NUL (``%00``) there would fail the events service's batch on every attempt."""
    problems: list[Detail] = []
    for name, value in params:
        check_storable(name, "body", problems)
        check_storable(value, f"body.{name}", problems)
    if problems:
        raise invalid(problems)


def _twilio_events(params: list[tuple[str, str]]) -> list[dict[str, Any] | None]:
    form = dict(params)
    kind = _TWILIO_KINDS.get(form.get("MessageStatus", ""))
    sid = form.get("MessageSid") or form.get("SmsSid")
    if kind is None or not sid:
        return [None]
    receipt = {"provider": "twilio", "channel": "sms", "providerMessageId": sid, "kind": kind,
               "at": utc_now_iso(), "raw": form,
               "webhookId": f"twilio:{sid}:{form['MessageStatus']}"}
    if form.get("To"):
        receipt["to"] = form["To"]
    return [receipt]


def _json_events(provider: str, raw: bytes) -> list[dict[str, Any] | None]:
    stripped = raw.strip()
    if stripped.startswith(b"["):  # SendGrid's event webhook posts a list of events
        items = load_json(stripped)
        if not isinstance(items, list):
            raise invalid_json("The callback body must be a JSON array or object.")
        problems: list[Detail] = []
        check_storable(items, "body", problems)
        if problems:  # each event's raw form goes onto a stream and into jsonb
            raise invalid(problems)
        # Only SendGrid posts lists, whichever route took them (the simulators post every
        # provider's receipts to one URL): its messages are found under its name.
        return [_sendgrid_event("sendgrid", item) for item in items]
    return [_typed_event(provider, parse_json_object(raw))]


def _typed_event(provider: str, event: dict[str, Any]) -> dict[str, Any] | None:
    """Resend's ``{"type": "email.delivered", "created_at", "data": {"email_id", ...}}`` and
    the simulators' ``{"type": "push.delivered", "data": {"provider", "message_id", ...}}``."""
    kind_name = event.get("type")
    data = event.get("data")
    if not isinstance(kind_name, str) or not isinstance(data, dict):
        return None
    prefix, _, suffix = kind_name.partition(".")
    kind = _KINDS.get(suffix)
    message_id = data.get("email_id") or data.get("message_id") or data.get("id")
    if kind is None or not isinstance(message_id, str) or not message_id:
        return None
    source = data.get("provider")
    actual = source if isinstance(source, str) and source in PROVIDERS else provider
    receipt: dict[str, Any] = {
        "provider": actual, "channel": prefix if prefix in ("email", "sms", "push")
        else CHANNEL_OF[actual], "providerMessageId": message_id, "kind": kind,
        "at": _when(event.get("created_at")), "raw": event,
    }
    task_id = data.get("task_id") or _tag(data.get("tags"))
    if isinstance(task_id, str) and task_id:
        receipt["taskId"] = task_id
    to = data.get("to")
    if isinstance(to, list) and to and isinstance(to[0], str):
        receipt["to"] = to[0]
    elif isinstance(to, str):
        receipt["to"] = to
    return receipt


def _sendgrid_event(provider: str, item: Any) -> dict[str, Any] | None:
    if not isinstance(item, dict):
        return None
    kind = _KINDS.get(str(item.get("event", "")))
    message_id = item.get("sg_message_id")
    if kind is None or not isinstance(message_id, str) or not message_id:
        return None
    at = item.get("timestamp")
    receipt: dict[str, Any] = {
        "provider": provider, "channel": "email",
        # sg_message_id is the X-Message-Id of the send plus a filter suffix after a dot.
        "providerMessageId": message_id.split(".", 1)[0], "kind": kind,
        # true and false are ints to Python, yet no time: they read as now, as a string does.
        "at": iso(_epoch(at)) if isinstance(at, int) and not isinstance(at, bool)
        else utc_now_iso(), "raw": item,
    }
    if isinstance(item.get("email"), str):
        receipt["to"] = item["email"]
    event_id = item.get("sg_event_id")
    if isinstance(event_id, str) and event_id:
        receipt["webhookId"] = f"{provider}:sg_event_id:{event_id}"
    # SendGrid echoes a send's custom_args as top-level fields of each of its events.
    task_id = next((item[name] for name in _TASK_TAGS if isinstance(item.get(name), str)
                    and item[name]), None)
    if task_id is not None:
        receipt["taskId"] = task_id
    return receipt


def _tag(tags: Any) -> str | None:
    if isinstance(tags, dict):
        for name in _TASK_TAGS:
            if isinstance(tags.get(name), str):
                return str(tags[name])
    if isinstance(tags, list):
        for tag in tags:
            if isinstance(tag, dict) and tag.get("name") in _TASK_TAGS \
                    and isinstance(tag.get("value"), str):
                return str(tag["value"])
    return None


def _when(value: Any) -> str:
    parsed = parse_rfc3339(value) if isinstance(value, str) else None
    return iso(parsed) or utc_now_iso()


def _epoch(seconds: int) -> Any:
    from datetime import UTC, datetime

    try:
        return datetime.fromtimestamp(seconds, UTC)
    except (OverflowError, OSError, ValueError):
        return datetime.now(UTC)
