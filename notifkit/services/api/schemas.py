"""JSON Schemas of every request and response body, as the OpenAPI document publishes them.

Route modules reference these by name (``ref("User")``); openapi.py puts :data:`COMPONENTS`
under ``components/schemas``. The handlers validate by hand (validation.py) so that each error
names its field; the schemathesis test checks both agree.
"""

from __future__ import annotations

from typing import Any

from notifkit.messages import CHANNELS, PRIORITIES
from notifkit.services.api.patterns import (
    E164_PATTERN,
    EMAIL_PATTERN,
    https_url_pattern,
    id_pattern,
    name_pattern,
    push_token_pattern,
)
from notifkit.templates import CHANNEL_FIELDS
from notifkit.workflow_defs import MAX_EVENT_NAME_CHARS, MAX_EXPRESSION_CHARS, MAX_TOTAL_STEPS

Schema = dict[str, Any]

CONTACT_CHANNELS = ("email", "sms", "push", "webhook")
RECIPIENT_STATUSES = (
    "accepted", "processing", "scheduled", "sent", "delivered", "failed", "skipped",
    "suppressed", "throttled", "dead_lettered",
)
RECEIPT_KINDS = ("delivered", "bounced", "complained", "opened", "clicked", "failed")
MAX_RECIPIENTS = 1000


def ref(name: str) -> Schema:
    if name not in COMPONENTS:
        raise KeyError(f"no schema component {name!r}")
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def obj(properties: dict[str, Schema], required: tuple[str, ...] = (),
        *, closed: bool = True) -> Schema:
    schema: Schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    if closed:
        schema["additionalProperties"] = False
    return schema


def page_of(item: str) -> Schema:
    return obj({"items": {"type": "array", "items": ref(item)},
                "nextCursor": nullable({"type": "string"})}, ("items", "nextCursor"))


STRING: Schema = {"type": "string"}
# A free-text field people read: some character other than white space.
NOT_BLANK = r"\S"
# Caller-chosen ids (users, templates, workflows): one component, as its pattern is long.
ID: Schema = {"$ref": "#/components/schemas/Id"}


def name_string(max_length: int) -> Schema:
    """A name (validation's Fields.name): not blank, no control character."""
    return {"type": "string", "minLength": 1, "maxLength": max_length,
            "pattern": name_pattern()}


# At most MAX_TARGET_BYTES (1,024) bytes in UTF-8, which JSON Schema cannot count: 256
# characters of any kind, or 1,024 of ASCII.
_TARGET_BYTES: Schema = {"anyOf": [{"maxLength": 256},
                                   {"maxLength": 1024, "pattern": r"^[\x00-\x7f]*$"}]}
_TARGETS: dict[str, Schema] = {
    "email": {"type": "string", "maxLength": 254, "pattern": EMAIL_PATTERN,
              "description": "An e-mail address such as ada@example.com. The server also "
                             "takes an international domain (ada@bücher.de), stored in its "
                             "ASCII form (ada@xn--bcher-kva.de)."},
    "sms": {"type": "string", "pattern": E164_PATTERN,
            "description": "An E.164 phone number such as +4915112345678."},
    "push": {"type": "string", "minLength": 1, "pattern": push_token_pattern(),
             **_TARGET_BYTES, "description": "A device token: printable, no spaces."},
    "webhook": {"type": "string", "pattern": https_url_pattern(), **_TARGET_BYTES,
                "description": "An https URL to a host named in DNS. The server also takes "
                               "a public address; a private one or localhost only with "
                               "WEBHOOK_ALLOW_PRIVATE_NETWORKS."},
}


def addressed(extra: dict[str, Schema] | None = None, description: str = "") -> Schema:
    """A ``channel`` and a ``target`` checked for that channel (plus ``extra`` fields)."""
    return {"oneOf": [obj({"channel": {"const": channel}, "target": target, **(extra or {})},
                          ("channel", "target")) for channel, target in _TARGETS.items()],
            "description": f"{description}target holds at most 1,024 bytes in UTF-8."}


UUID: Schema = {"type": "string", "format": "uuid"}
DATETIME: Schema = {"type": "string", "format": "date-time"}
ANY_OBJECT: Schema = {"type": "object"}
CHANNEL: Schema = {"type": "string", "enum": list(CHANNELS)}
CHANNEL_LIST: Schema = {"type": "array", "items": CHANNEL, "minItems": 1, "maxItems": 5,
                        "uniqueItems": True}
TEMPLATE_TEXT: Schema = {"type": "string", "maxLength": 100_000}
HHMM: Schema = {"type": "string", "pattern": r"^([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9])?$"}
SECONDS: Schema = {"type": "integer", "minimum": 1, "maximum": 31_536_000}
STEP_SECONDS: Schema = {"type": "number", "exclusiveMinimum": 0, "maximum": 366 * 24 * 3600}


def _content_says_something(channel: str) -> Schema:
    """TemplatePut's rule for one channel, as routes/templates.py checks it: unless the ai
    writes that channel, each field it requires says something. An e-mail's html and text are
    each optional, as API.md has them: one with neither goes out with an empty body."""
    required, _optional = CHANNEL_FIELDS[channel]
    says: Schema = {"required": list(required)}
    if channel != "webhook":  # a webhook's body may be any template, the empty one included
        says["properties"] = {key: {"minLength": 1} for key in required}
    ai_writes = {"properties": {"ai": {"type": "object", "properties": {
        "channels": {"contains": {"const": channel}}}, "required": ["channels"]}},
        "required": ["ai"]}
    return {"anyOf": [ai_writes, {"properties": {"channels": {"properties": {channel: says}}}}]}


_STEP_LIST: Schema = {"type": "array", "maxItems": 100,
                      "items": {"$ref": "#/components/schemas/WorkflowStep"}}
_SEND_STEP: dict[str, Schema] = {
    "template": ID,
    "channels": nullable(CHANNEL_LIST),
    "priority": nullable({"type": "string", "enum": list(PRIORITIES)}),
}
_rate: Schema = {"type": "number", "minimum": 0.001, "maximum": 100_000}

COMPONENTS: dict[str, Schema] = {
    "Error": obj({
        "error": obj({
            "code": STRING,
            "message": STRING,
            "details": {"type": "array", "items": obj(
                {"field": STRING, "message": STRING}, ("field", "message"))},
        }, ("code", "message", "details")),
    }, ("error",)),
    # -- projects and keys ---------------------------------------------------------------
    "ProjectSettings": obj({
        "throttle": obj({
            "limit": {"type": "integer", "minimum": 0, "maximum": 1_000_000},
            "windowSeconds": SECONDS,
        }, ("limit", "windowSeconds")),
        "rateLimits": obj({channel: _rate for channel in CONTACT_CHANNELS}),
    }),
    "Id": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": id_pattern(),
           "description": "1 to 255 printable characters (no control, formatting, private-use "
                          "or unassigned ones), no space at either end, not '.' or '..'."},
    "ProjectCreate": obj({
        "name": name_string(200),
        "settings": nullable({"$ref": "#/components/schemas/ProjectSettings"}),
    }, ("name",)),
    "Project": obj({
        "id": UUID, "name": STRING,
        "settings": {"$ref": "#/components/schemas/ProjectSettings"},
        "createdAt": DATETIME,
    }, ("id", "name", "settings", "createdAt")),
    "KeyCreate": obj({
        "role": {"type": "string", "enum": ["full", "send"]},
        "name": nullable(name_string(200)),
    }, ("role",)),
    "KeyCreated": obj({
        "id": UUID, "key": STRING, "role": {"type": "string", "enum": ["full", "send"]},
        "name": nullable(STRING), "projectId": UUID, "createdAt": DATETIME,
    }, ("id", "key", "role", "name", "projectId", "createdAt")),
    # -- users -----------------------------------------------------------------------------
    "ContactCreate": addressed(),
    "Contact": obj({
        "id": UUID, "channel": {"type": "string", "enum": list(CONTACT_CHANNELS)},
        "target": STRING, "enabled": {"type": "boolean"}, "createdAt": DATETIME,
    }, ("id", "channel", "target", "enabled", "createdAt")),
    "QuietHours": obj({"start": HHMM, "end": {**HHMM, "description": (
        "Differs from start (else 400); before it, the quiet hours span midnight.")}},
        ("start", "end")),
    "Preferences": obj({
        "channels": {"type": "object", "additionalProperties": {"type": "boolean"}},
        "topics": {"type": "object", "additionalProperties": {"type": "boolean"}},
        "quietHours": nullable({"$ref": "#/components/schemas/QuietHours"}),
    }, ("channels", "topics", "quietHours")),
    "PreferencesPut": obj({
        "channels": obj({channel: {"type": "boolean"} for channel in CHANNELS}),
        "topics": {"type": "object", "maxProperties": 200,
                   "propertyNames": name_string(100),
                   "additionalProperties": {"type": "boolean"}},
        "quietHours": nullable({"$ref": "#/components/schemas/QuietHours"}),
    }),
    "UserPut": obj({
        "attributes": ANY_OBJECT,
        "timezone": nullable({"type": "string", "minLength": 1, "maxLength": 64,
                              "description": "An IANA time zone such as Europe/Berlin."}),
        "locale": nullable({"type": "string", "pattern":
                            r"^(?=.{2,35}$)[A-Za-z]{2,3}([-_][A-Za-z0-9]{1,8}){0,7}$"}),
        "segments": {"type": "array", "maxItems": 100, "uniqueItems": True,
                     "items": name_string(100)},
        "contacts": {"type": "array", "maxItems": 100,
                     "items": {"$ref": "#/components/schemas/ContactCreate"}},
    }),
    "User": obj({
        "id": STRING, "attributes": ANY_OBJECT, "timezone": nullable(STRING),
        "locale": nullable(STRING), "segments": {"type": "array", "items": STRING},
        "contacts": {"type": "array", "items": {"$ref": "#/components/schemas/Contact"}},
        "preferences": {"$ref": "#/components/schemas/Preferences"},
        "createdAt": DATETIME, "updatedAt": DATETIME,
    }, ("id", "attributes", "timezone", "locale", "segments", "contacts", "preferences",
        "createdAt", "updatedAt")),
    # -- templates ---------------------------------------------------------------------------
    # The field the ai fills (AI_WRITTEN_FIELDS) may be left out of a channel it writes;
    # TemplatePut's allOf requires it of every other.
    "TemplateChannels": obj({
        "email": obj({"subject": TEMPLATE_TEXT, "html": TEMPLATE_TEXT, "text": TEMPLATE_TEXT},
                     ("subject",)),
        "sms": obj({"text": TEMPLATE_TEXT}),
        "push": obj({"title": TEMPLATE_TEXT, "body": TEMPLATE_TEXT, "data": ANY_OBJECT},
                    ("title",)),
        "inapp": obj({"text": TEMPLATE_TEXT, "url": TEMPLATE_TEXT}),
        "webhook": obj({"body": {"anyOf": [TEMPLATE_TEXT, ANY_OBJECT]}}),
    }),
    "TemplateAi": obj({
        "model": name_string(200),
        "prompt": {"type": "string", "minLength": 1, "maxLength": 100_000,
                   "pattern": NOT_BLANK},
        "channels": CHANNEL_LIST,
    }, ("model", "prompt", "channels")),
    "TemplatePut": {**obj({
        "topic": nullable(name_string(100)),
        "channels": {"$ref": "#/components/schemas/TemplateChannels"},
        "fallback": {**nullable(CHANNEL_LIST), "description": (
            "The order to try channels in when a provider fails. A channel without content "
            "under channels (or the ai writing it) gets generic content, as a send naming "
            "it does.")},
        "ai": nullable({"$ref": "#/components/schemas/TemplateAi"}),
    }, ("channels",)),
        # Something to send: content for a channel, or ai to write it.
        "anyOf": [{"properties": {"channels": {"minProperties": 1}}},
                  {"properties": {"ai": {"type": "object"}}, "required": ["ai"]}],
        "allOf": [_content_says_something(channel) for channel in CHANNEL_FIELDS]},
    "Template": obj({
        "id": STRING, "topic": nullable(STRING),
        "channels": {"type": "object"},
        "fallback": nullable({"type": "array", "items": CHANNEL}),
        "ai": nullable({"type": "object"}),
        "createdAt": DATETIME, "updatedAt": DATETIME,
    }, ("id", "topic", "channels", "fallback", "ai", "createdAt", "updatedAt")),
    "TemplateSummary": obj({
        "id": STRING, "topic": nullable(STRING),
        "channels": {"type": "array", "items": CHANNEL,
                     "description": "The channels the template has content for."},
        "fallback": nullable({"type": "array", "items": CHANNEL}),
        "ai": nullable(obj({"model": STRING, "channels": {"type": "array", "items": CHANNEL}},
                           ("model", "channels"))),
        "createdAt": DATETIME, "updatedAt": DATETIME,
    }, ("id", "topic", "channels", "fallback", "ai", "createdAt", "updatedAt")),
    "PreviewRequest": obj({"userId": ID, "data": nullable(ANY_OBJECT), "items": nullable({
        "type": "array", "maxItems": 1000,
        "items": obj({"data": nullable(ANY_OBJECT), "at": nullable(DATETIME)})})}),
    "Preview": obj({
        "template": STRING,
        "channels": {"type": "object", "additionalProperties": {"type": "object"}},
        "ai": nullable(obj({"model": STRING, "prompt": STRING, "prompts": {
            "type": "object", "additionalProperties": STRING}, "channels": {
            "type": "array", "items": CHANNEL}})),
    }, ("template", "channels", "ai")),
    # -- sending -------------------------------------------------------------------------------
    "NotificationCreate": obj({
        "to": {"anyOf": [
            ID,
            {"type": "array", "items": ID, "minItems": 1, "maxItems": MAX_RECIPIENTS},
            obj({"segment": name_string(100)}, ("segment",)),
        ]},
        "template": ID,
        "data": nullable(ANY_OBJECT),
        "channels": nullable(CHANNEL_LIST),
        "priority": nullable({"type": "string", "enum": list(PRIORITIES)}),
        "sendAt": nullable(DATETIME),
        "campaignId": nullable(name_string(255)),
    }, ("to", "template")),
    "Accepted": obj({"id": UUID, "status": {"type": "string", "enum": ["accepted"]}},
                    ("id", "status")),
    "TimelineEntry": obj({"kind": STRING, "at": DATETIME, "detail": nullable(STRING),
                          "status": {"type": "string", "enum": list(RECIPIENT_STATUSES)},
                          "attempt": {"type": "integer"}},
                         ("kind", "at", "detail")),
    "Recipient": obj({
        "userId": nullable(STRING), "channel": nullable(CHANNEL), "taskId": STRING,
        "status": {"type": "string", "enum": list(RECIPIENT_STATUSES)},
        "timeline": {"type": "array", "items": {"$ref": "#/components/schemas/TimelineEntry"}},
    }, ("userId", "channel", "taskId", "status", "timeline")),
    "Notification": obj({
        "id": UUID,
        "status": {"type": "string", "enum": list(RECIPIENT_STATUSES)},
        "template": STRING,
        "priority": {"type": "string", "enum": list(PRIORITIES)},
        "to": {},
        "channels": nullable({"type": "array", "items": CHANNEL}),
        "campaignId": nullable(STRING),
        "sendAt": nullable(DATETIME),
        "createdAt": DATETIME,
        "recipients": {"type": "array", "items": {"$ref": "#/components/schemas/Recipient"}},
        "timeline": {"type": "array", "items": {"$ref": "#/components/schemas/TimelineEntry"}},
        "nextCursor": {**nullable(STRING), "description": (
            "Fetches the recipients that follow (GET with cursor); null when every recipient "
            "is listed.")},
    }, ("id", "status", "template", "priority", "createdAt", "recipients", "nextCursor")),
    "MessageLog": obj({
        "id": STRING, "eventId": UUID, "taskId": STRING, "userId": nullable(STRING),
        "channel": nullable(CHANNEL), "attempt": {"type": "integer"}, "kind": STRING,
        "status": {"type": "string", "enum": list(RECIPIENT_STATUSES)},
        "detail": nullable(STRING), "provider": nullable(STRING),
        "providerMessageId": nullable(STRING), "campaignId": nullable(STRING),
        "metadata": ANY_OBJECT, "createdAt": DATETIME,
    }, ("id", "eventId", "taskId", "userId", "channel", "attempt", "kind", "status",
        "createdAt")),
    # -- events and workflows -------------------------------------------------------------------
    "EventCreate": obj({
        "name": name_string(MAX_EVENT_NAME_CHARS),
        "userId": ID,
        "data": nullable(ANY_OBJECT),
    }, ("name", "userId")),
    # One shape per step type (what workflow_defs.STEP_FIELDS allows and validate_steps
    # requires), so a generated or hand-written step is either valid or visibly not.
    "WorkflowStep": {
        "oneOf": [
            obj({"type": {"const": "send"}, **_SEND_STEP}, ("type", "template")),
            obj({"type": {"const": "wait"}, "seconds": STEP_SECONDS}, ("type", "seconds")),
            obj({"type": {"const": "waitForEvent"},
                 "event": name_string(MAX_EVENT_NAME_CHARS),
                 "timeoutSeconds": STEP_SECONDS,
                 "onTimeout": nullable({"type": "string", "enum": ["continue", "stop"]})},
                ("type", "event", "timeoutSeconds")),
            obj({"type": {"const": "branch"},
                 "if": {"type": "string", "minLength": 1,
                        "maxLength": MAX_EXPRESSION_CHARS,
                        "pattern": r"\S",
                        "description": "A Jinja2 expression over data, user and steps."},
                 "then": nullable(_STEP_LIST), "else": nullable(_STEP_LIST)},
                ("type", "if")),
            obj({"type": {"const": "digest"}, **_SEND_STEP, "windowSeconds": STEP_SECONDS},
                ("type", "template", "windowSeconds")),
        ],
        "description": "send {template, channels?, priority?} | wait {seconds} | waitForEvent "
                       "{event, timeoutSeconds, onTimeout?} | branch {if, then?, else?} | "
                       "digest {windowSeconds, template, channels?, priority?}",
    },
    "WorkflowPut": obj({
        "steps": {"type": "array", "minItems": 1, "maxItems": 100,
                  "items": {"$ref": "#/components/schemas/WorkflowStep"},
                  "description": f"At most {MAX_TOTAL_STEPS} steps in all, those inside "
                                 "branches included."},
    }, ("steps",)),
    "Workflow": obj({
        "id": STRING, "steps": {"type": "array", "items": {"type": "object"}},
        "createdAt": DATETIME, "updatedAt": DATETIME,
    }, ("id", "steps", "createdAt", "updatedAt")),
    "TriggerRequest": obj({"userId": ID, "data": nullable(ANY_OBJECT)}, ("userId",)),
    "TriggerAccepted": obj({"instanceId": UUID}, ("instanceId",)),
    "WorkflowInstance": obj({
        "id": UUID, "workflowId": STRING, "userId": STRING, "status": STRING,
        "currentStep": {"type": "integer"},
        "steps": {"type": "array", "items": obj({
            "index": {"type": "integer"}, "path": STRING, "type": STRING, "status": STRING,
            "output": {},
            "at": DATETIME}, ("index", "type", "status", "output", "at"))},
        "createdAt": DATETIME, "updatedAt": DATETIME,
        # Only on an instance failed because an entry of it was dead-lettered.
        "error": STRING,
    }, ("id", "workflowId", "status", "currentStep", "steps")),
    # -- inbox ---------------------------------------------------------------------------------
    "InboxMessage": obj({
        "id": UUID, "userId": STRING, "taskId": STRING, "eventId": UUID, "content": ANY_OBJECT,
        "read": {"type": "boolean"}, "readAt": nullable(DATETIME), "createdAt": DATETIME,
    }, ("id", "userId", "taskId", "eventId", "content", "read", "readAt", "createdAt")),
    # -- operations --------------------------------------------------------------------------
    "Health": obj({
        "status": {"type": "string", "enum": ["ok", "degraded"]},
        "redis": {"type": "string", "enum": ["ok", "unreachable"]},
        "postgres": {"type": "string", "enum": ["ok", "unreachable"]},
        "services": {"type": "object", "additionalProperties": obj({
            "lastBeat": nullable(DATETIME), "inFlight": {"type": "integer"},
            "service": STRING, "stale": {"type": "boolean"},
            "readError": STRING}, ("lastBeat", "inFlight"))},
    }, ("status", "redis", "postgres", "services")),
    "StreamGroup": obj({
        "name": STRING, "pending": {"type": "integer"}, "consumers": {"type": "integer"},
        "oldestPendingAgeSeconds": nullable({"type": "number"}),
        "lag": nullable({"type": "integer"}),
    }, ("name", "pending", "consumers", "oldestPendingAgeSeconds")),
    "StreamInfo": obj({
        "stream": STRING, "length": {"type": "integer"}, "pending": {"type": "integer"},
        "oldestPendingAgeSeconds": nullable({"type": "number"}),
        "consumers": {"type": "integer"},
        "groups": {"type": "array", "items": {"$ref": "#/components/schemas/StreamGroup"}},
    }, ("stream", "length", "pending", "oldestPendingAgeSeconds", "consumers", "groups")),
    "DlqEntry": obj({
        "id": STRING, "stream": STRING, "group": nullable(STRING), "payload": {},
        "error": nullable(STRING), "attempts": nullable({"type": "integer"}),
        "failedAt": nullable(STRING), "projectId": nullable(STRING),
        "service": nullable(STRING), "entryId": nullable(STRING),
    }, ("id", "stream", "group", "payload", "error", "attempts", "failedAt")),
    "Replayed": obj({"id": STRING, "stream": STRING, "replayOf": STRING},
                    ("id", "stream", "replayOf")),
    "WebhookResult": obj({"received": {"type": "integer"}, "ignored": {"type": "integer"}},
                         ("received", "ignored")),
    "Suppression": obj({
        "id": UUID, "channel": {"type": "string", "enum": list(CONTACT_CHANNELS)},
        "target": STRING,
        "reason": {"type": "string",
                   "description": "bounce, complaint, unsubscribe or manual."},
        "detail": nullable(STRING), "createdAt": DATETIME,
    }, ("id", "channel", "target", "reason", "detail", "createdAt")),
    "SuppressionCreate": addressed(
        {"detail": nullable({"type": "string", "minLength": 1, "maxLength": 1000})},
        "Checked and stored as a contact's address is (a webhook URL may name any host); "),
    "Unsubscribed": obj({
        "unsubscribed": {"type": "boolean"}, "channel": CHANNEL, "topic": nullable(STRING),
        "suppressed": {"type": "boolean"},
        "preview": {"type": "boolean", "description": "A template preview's link: nothing "
                                                      "was changed."},
    }, ("unsubscribed", "channel", "topic", "suppressed")),
}

COMPONENTS["MessageList"] = page_of("MessageLog")
COMPONENTS["InboxList"] = page_of("InboxMessage")
COMPONENTS["DlqList"] = page_of("DlqEntry")
COMPONENTS["WorkflowList"] = page_of("Workflow")
COMPONENTS["TemplateList"] = page_of("TemplateSummary")
COMPONENTS["SuppressionList"] = page_of("Suppression")
COMPONENTS["StreamList"] = page_of("StreamInfo")
