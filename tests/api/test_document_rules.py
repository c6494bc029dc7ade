"""The OpenAPI document's rules for ids, names and contact addresses are the server's: a value
the document admits is accepted, and one it refuses is refused, so a client (or a fuzzer)
generating requests from the document gets no 400 it could not have foreseen.

Where JSON Schema cannot state the server's rule (a byte length, which hosts a webhook may
name), the document is the stricter side: those values are listed apart, and each is one the
server takes that the document does not promise."""

from __future__ import annotations

from functools import cache
from typing import Any
from urllib.parse import quote

import jsonschema_rs
import pytest

from notifkit.services.api.app import operations
from notifkit.services.api.openapi import document
from tests.api.conftest import ADMIN, Api, Project, Reply

IDS = [
    "u1", "a b", "ü", "\U0001f600", "...", "x" * 255, "a\u0301",  # a combining mark is printed
    "", "x" * 256, " a", "a ", ".", "..", "a\tb", "a\x85b",
    "a\u200bb", "\u200e", "a\u00adb", "\ufeffa", "\U000e0001",   # invisible formatting
    "\ue000", "\U000f0000",                                       # private use
    "\u0378", "\U0002fffd",                                       # unassigned
    "a\u00a0b", "\u2028", "\u3000",                               # separators but the space
]
NAMES = [
    "promo", "Black Friday — «Grüße» ✓", " padded ", "a\u200bb", "\ufeff", "x" * 100,
    "", " ", "\u3000", "\u2003 \u00a0", "a\tb", "a\nb", "a\x1b[31m", "a\x7f", "a\x85", "a\x9f",
    "x" * 101,
]
CONTACTS = [
    ("email", "ada@example.com"), ("email", "a.b+c@mail.example.co"), ("email", "ada@example"),
    ("email", "ada example.com"), ("email", "ada@-example.com"), ("email", "ä@example.com"),
    ("email", "ada@example.com\n"), ("email", f"{'a' * 65}@example.com"),
    ("sms", "+4915112345678"), ("sms", "4915112345678"), ("sms", "+0915112345678"),
    ("sms", "+49151"), ("sms", "+4915112345678\n"), ("sms", "+4\u0669\u0661\u0665\u0661\u0661"
                                                           "\u0662\u0663\u0664\u0665\u0666"),
    ("push", "fcm:APA91b-token_1"), ("push", "hex0123abcdef"), ("push", "tok en"),
    ("push", "tok\u200b"), ("push", "tok\x1b"), ("push", "x" * 1024), ("push", "x" * 1025),
    ("push", "ü" * 256),
    ("webhook", "https://example.com/hooks"), ("webhook", "https://hooks.example.com:8443/a?b=1#c"),
    ("webhook", "https://example.com"), ("webhook", "https://example.com./x"),
    ("webhook", "http://example.com/hooks"), ("webhook", "https://example.com/a b"),
    ("webhook", "https://example.com:0/"), ("webhook", "https://example.com:65536/"),
    ("webhook", "https://localhost/x"), ("webhook", "https://api.LocalHost.:8443/"),
    ("webhook", "https://10.0.0.5/x"), ("webhook", "https://127.1/x"),
    ("webhook", "https:///x"), ("webhook", "https://example.com/\u3000"),
]
# The server takes these; the document cannot say so without admitting values it refuses.
STRICTER = [
    ("push", "ü" * 300),                      # 600 bytes: under 1,024, but over 256 characters
    ("webhook", "https://8.8.8.8/hooks"),     # a public address (a private one is refused)
    ("webhook", "https://user@example.com/"),
    ("webhook", "https://bücher.example/"),
]


@cache
def _validator(name: str) -> Any:
    doc = document(operations())
    return jsonschema_rs.validator_for({"$ref": f"#/components/schemas/{name}",
                                        "components": doc["components"]})


def _admits(name: str, value: Any) -> bool:
    return bool(_validator(name).is_valid(value))


def _accepted(reply: Reply) -> bool:
    assert reply.status < 500, reply.body
    return reply.status < 300


@pytest.mark.parametrize("value", IDS, ids=ascii)
async def test_an_id_the_document_admits_is_one_the_server_takes(
    api: Api, project: Project, value: str
) -> None:
    admitted = _admits("Id", value)
    # In the body (as a recipient of an event) and in the path (a template's id).
    event = await api.call("POST", "/v1/events", key=project.send,
                           json={"name": "signed-up", "userId": value})
    assert admitted == _accepted(event), event.body
    if value not in ("", ".", ".."):  # which a URL resolves or drops before any server
        put = await api.call("PUT", f"/v1/templates/{quote(value, safe='')}",
                             key=project.full, json={"channels": {"sms": {"text": "hi"}}})
        assert admitted == _accepted(put), put.body
    # And as a workflow step's template, which the step's schema gives as an Id: refused for
    # the reason the template's own PUT gives, not as merely missing.
    workflow = await api.call("PUT", "/v1/workflows/w", key=project.full,
                              json={"steps": [{"type": "send", "template": value}]})
    assert admitted == _accepted(workflow), workflow.body
    if not admitted and value not in ("", ".", ".."):
        [problem] = put.error["details"]
        assert workflow.error["details"] == [
            {"field": "steps[0].template", "message": problem["message"]}]


@pytest.mark.parametrize("value", NAMES, ids=ascii)
async def test_a_name_the_document_admits_is_one_the_server_takes(
    api: Api, project: Project, value: str
) -> None:
    await api.call("PUT", "/v1/templates/t", key=project.full,
                   json={"channels": {"sms": {"text": "hi"}}})
    await api.call("PUT", "/v1/users/u0", key=project.full, json={})
    steps = [{"type": "waitForEvent", "event": value, "timeoutSeconds": 60}]
    cases: list[tuple[str, str, str, str | None, dict[str, Any]]] = [
        ("TemplatePut", "PUT", "/v1/templates/t2", project.full,
         {"topic": value, "channels": {"sms": {"text": "hi"}}}),
        ("UserPut", "PUT", "/v1/users/u1", project.full, {"segments": [value]}),
        ("PreferencesPut", "PUT", "/v1/users/u0/preferences", project.full,
         {"topics": {value: False}}),
        ("NotificationCreate", "POST", "/v1/notifications", project.send,
         {"to": "u1", "template": "t", "campaignId": value}),
        ("NotificationCreate", "POST", "/v1/notifications", project.send,
         {"to": {"segment": value}, "template": "t"}),
        ("EventCreate", "POST", "/v1/events", project.send, {"name": value, "userId": "u1"}),
        ("WorkflowPut", "PUT", "/v1/workflows/w", project.full, {"steps": steps}),
        ("ProjectCreate", "POST", "/v1/projects", ADMIN, {"name": value}),
        ("KeyCreate", "POST", f"/v1/projects/{project.id}/keys", ADMIN,
         {"role": "send", "name": value}),
    ]
    for schema, method, path, key, body in cases:
        reply = await api.call(method, path, key=key, json=body)
        assert _admits(schema, body) == _accepted(reply), (schema, body, reply.body)


@pytest.mark.parametrize(("channel", "target", "stricter"),
                         [(*c, False) for c in CONTACTS] + [(*c, True) for c in STRICTER],
                         ids=ascii)
async def test_a_contact_the_document_admits_is_one_the_server_takes(
    api: Api, project: Project, channel: str, target: str, stricter: bool
) -> None:
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    body = {"channel": channel, "target": target}
    reply = await api.call("POST", "/v1/users/u1/contacts", key=project.full, json=body)
    if stricter:  # refused by the document, taken by the server
        assert (_admits("ContactCreate", body), _accepted(reply)) == (False, True), reply.body
    else:
        assert _admits("ContactCreate", body) == _accepted(reply), reply.body


@pytest.mark.parametrize("detail", [None, "bounced at the gateway", " ", "x" * 1000, "",
                                    "x" * 1001], ids=ascii)
async def test_a_suppression_detail_the_document_admits_is_one_the_server_takes(
    api: Api, project: Project, detail: str | None
) -> None:
    body = {"channel": "email", "target": "ada@example.com", "detail": detail}
    reply = await api.call("POST", "/v1/suppressions", key=project.full, json=body)
    assert _admits("SuppressionCreate", body) == _accepted(reply), reply.body


AI = {"model": "gpt-4o-mini", "prompt": "Write it.", "channels": ["sms"]}


@pytest.mark.parametrize("body", [
    {"channels": {"sms": {"text": "hi"}}},
    {"channels": {"email": {"subject": "Hi", "text": "body"}}},
    {"channels": {"email": {"subject": "Hi", "html": "<p>body</p>"}}},
    {"channels": {}, "ai": AI},
    {"channels": {"email": {"subject": "Hi"}}},
    {"channels": {}},
    {"channels": {}, "ai": None},
    # A field a channel requires must say something, unless the ai writes that channel.
    {"channels": {"email": {"subject": "", "text": "body"}}},
    {"channels": {"email": {"subject": "Hi", "text": "", "html": ""}}},
    {"channels": {"sms": {"text": ""}}},
    {"channels": {"push": {"title": "Hi", "body": ""}}},
    {"channels": {"inapp": {"text": ""}}},
    {"channels": {"sms": {"text": ""}}, "ai": AI},
    {"channels": {"email": {"subject": "", "text": ""}}, "ai": AI},
    {"channels": {"email": {"subject": ""}}, "ai": {**AI, "channels": ["email"]}},
    # The field the model fills may be left out of a channel it writes, and only there.
    {"channels": {"sms": {}}, "ai": AI},
    {"channels": {"sms": {}}},
    {"channels": {"push": {"title": "T"}}, "ai": {**AI, "channels": ["push"]}},
    {"channels": {"push": {"title": "T"}}},
    {"channels": {"push": {"body": "b"}}, "ai": {**AI, "channels": ["push"]}},
    {"channels": {"inapp": {"url": "https://x.example"}}, "ai": {**AI, "channels": ["inapp"]}},
    {"channels": {"webhook": {}}, "ai": {**AI, "channels": ["webhook"]}},
    {"channels": {"webhook": {}}},
    {"channels": {"webhook": {"body": ""}}},
], ids=ascii)
async def test_a_template_the_document_admits_is_one_the_server_takes(
    api: Api, project: Project, body: dict[str, Any]
) -> None:
    """Content for no channel (without ai), an e-mail with a subject and no body, or a
    required field left empty in a channel the ai does not write, is what the server refuses;
    the document says so too."""
    reply = await api.call("PUT", "/v1/templates/t", key=project.full, json=body)
    assert _admits("TemplatePut", body) == _accepted(reply), reply.body
