"""Edge input, against the real API: values a JSON parser takes but the store cannot hold,
times and addresses that only look valid, forged cursors, odd key names. Each is a 400 naming
its field (or a 404 for an id), never a 500 or a 400 that names only the body."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import quote

import asyncpg
import pytest
from redis.asyncio import Redis

from notifkit.config import Settings, WebhookSecrets
from notifkit.keys import Keys
from notifkit.services.api.validation import list_scope
from simulators.signing import svix_headers
from tests.api.conftest import Api, Project, Reply, running_api

SECRET = "sendgrid-webhook-secret-0123456789"


async def send_raw(api: Api, project: Project, raw: str | bytes, method: str = "PUT",
                   path: str = "/v1/users/u1") -> Reply:
    """``raw`` as a JSON body, as written (a client's own serialiser may not write it)."""
    return await api.call(method, path, key=project.full, data=raw,
                          headers={"Content-Type": "application/json"})


@pytest.mark.parametrize("raw", [
    '{"attributes": {"x": 1e400}}',      # valid JSON, beyond a double
    '{"attributes": {"x": -1e400}}',
    '{"attributes": {"x": "\\ud800"}}',  # valid JSON escape, a lone surrogate
])
async def test_a_value_out_of_range_is_a_400_naming_its_field(
    api: Api, project: Project, raw: str
) -> None:
    reply = await send_raw(api, project, raw)
    assert reply.status == 400, reply.body
    assert reply.fields == ["attributes.x"]


async def test_a_key_with_a_lone_surrogate_is_a_400_naming_its_object(
    api: Api, project: Project
) -> None:
    reply = await api.call("PUT", "/v1/users/u1", key=project.full,
                           data='{"attributes": {"\\udc00": 1}}',
                           headers={"Content-Type": "application/json"})
    assert (reply.status, reply.fields) == (400, ["attributes"])


@pytest.mark.parametrize("raw", ['{"attributes": {"x": NaN}}', '{"a": Infinity}',
                                 b'{"attributes": {"x": "\xff"}}', b'\xff\xfe{\x00}\x00'])
async def test_what_is_not_json_stays_an_invalid_json_400(
    api: Api, project: Project, raw: str | bytes
) -> None:
    reply = await send_raw(api, project, raw)
    assert (reply.status, reply.fields) == (400, ["body"])
    assert reply.error["code"] == "invalid_json"


@pytest.mark.parametrize(("method", "path", "raw", "key"), [
    ("POST", "/v1/notifications", '{"to": "u1", "to": "u2", "template": "t"}', "to"),
    ("PUT", "/v1/users/u1", '{"timezone": "Europe/Berlin", "timezone" : "Asia/Tokyo"}',
     "timezone"),
    ("PUT", "/v1/users/u1", '{"attributes": {"plan": "pro", "a": [{"x": 1, "plan": 2}],'
                            ' "plan":\n"free"}}', "plan"),
    ("POST", "/v1/events", '{"name": "e", "userId": "u1", "": 1, "": 2}', ""),
])
async def test_a_key_given_twice_in_one_object_is_a_400_and_nothing_is_done(
    api: Api, project: Project, method: str, path: str, raw: str, key: str
) -> None:
    """Which of the two was meant is a guess: refused, as a header or query parameter sent
    twice is, rather than read as the last (a proxy or a log reader may show the first)."""
    reply = await send_raw(api, project, raw, method, path)
    assert (reply.status, reply.fields) == (400, ["body"]), reply.body
    assert reply.error["details"][0]["message"].startswith(f"gives the key {key!r} more than")
    assert (await api.call("GET", "/v1/users/u1", key=project.full)).status == 404
    listed = await api.call("GET", "/v1/messages", key=project.full)
    assert listed.body["items"] == []


@pytest.mark.parametrize("raw", [
    '{"attributes": {"note": "a \\": b", "plan": "x"}}',  # a key's end, inside a string
    '{"attributes": {"a": {"k": 1}, "b": {"k": 2}}}',     # one name in two objects
])
async def test_the_same_name_in_two_objects_or_inside_a_string_is_no_repeat(
    api: Api, project: Project, raw: str
) -> None:
    reply = await send_raw(api, project, raw)
    assert reply.status == 201, reply.body
    assert (await api.call("GET", "/v1/users/u1", key=project.full)).body["attributes"] == \
        json.loads(raw)["attributes"]


@pytest.mark.parametrize("send_at", [
    "2030-12-01T09:00:00+05:60",   # an offset's minutes run 00-59
    "2030-12-01T09:00:00-00:99",
    "2030-12-01T09:00:00+24:00",   # and its hours 00-23
    "2030-02-30T09:00:00Z",
    "2030-12-01T09:60:00Z",
    "2030-12-01",
])
async def test_a_send_at_outside_rfc_3339_is_a_400_naming_it(
    api: Api, project: Project, send_at: str
) -> None:
    reply = await send_at_reply(api, project, send_at)
    assert (reply.status, reply.fields) == (400, ["sendAt"])


async def send_at_reply(api: Api, project: Project, send_at: str) -> Reply:
    await api.call("PUT", "/v1/templates/t", key=project.full,
                   json={"channels": {"sms": {"text": "hi"}}})
    return await api.call("POST", "/v1/notifications", key=project.send,
                          json={"to": "u1", "template": "t", "sendAt": send_at})


async def test_an_offset_in_usage_bounds_is_checked_like_send_at(
    api: Api, project: Project
) -> None:
    reply = await api.call("GET", "/v1/usage/ai", key=project.full,
                           params={"since": "2030-12-01T09:00:00+05:60"})
    assert (reply.status, reply.fields) == (400, ["since"])
    fine = await api.call("GET", "/v1/usage/ai", key=project.full,
                          params={"since": "2030-12-01T09:00:00+23:59"})
    assert fine.status == 200, fine.body
    # Well-formed, but past the calendar's end once in UTC: said so, as for sendAt.
    beyond = await api.call("GET", "/v1/usage/ai", key=project.full,
                            params={"until": "9999-12-31T23:59:59-05:00"})
    assert (beyond.status, beyond.fields) == (400, ["until"])
    assert "9999-12-31T23:59:59.999Z" in beyond.error["details"][0]["message"]


@pytest.mark.parametrize("path", ["/v1/usage/ai", "/v1/messages"])
async def test_an_offset_whose_plus_arrived_as_a_space_is_told_so(
    api: Api, project: Project, path: str
) -> None:
    """Given a time bound written into the query with its offset's + as it is (which a query
    reads as a space), the 400 says the + needs writing as %2B rather than calling a correct
    RFC 3339 time no such thing; a space that stands for no + gets the usual answer."""
    for name in ("since", "until"):
        raw = f"{path}?{name}=2030-12-01T09:00:00+05:30"
        async with api.client.get(raw, headers={"Authorization": f"Bearer {project.full}"}
                                  ) as response:
            assert response.status == 400
            details = (await response.json())["error"]["details"]
        assert [d["field"] for d in details] == [name]
        assert "%2B" in details[0]["message"], details
    other = await api.call("GET", path, key=project.full,
                           params={"since": "2030-12-01T09:00:00 5"})
    assert (other.status, other.fields) == (400, ["since"])
    assert "%2B" not in other.error["details"][0]["message"]


@pytest.mark.parametrize(("path", "rows"), [
    ("/v1/messages", lambda body: len(body["items"])),
    ("/v1/usage/ai", lambda body: body["requests"]),
])
async def test_until_equal_to_since_is_an_empty_range_not_a_400(
    api: Api, project: Project, db: asyncpg.Pool, path: str,
    rows: Callable[[dict[str, Any]], int],
) -> None:
    """Given a row logged at the very instant both bounds name, [since, until) holds nothing:
    the answer is an empty 200 (a range can be empty), and only until before since, bounds
    swapped, is the 400 naming until."""
    at = "2030-01-01T00:00:00Z"
    await db.execute(
        "INSERT INTO message_logs (project_id, event_id, task_id, user_id, channel, attempt, "
        "kind, status, created_at) VALUES ($1, $2, 't1', 'u1', 'email', 0, 'sent', 'sent', "
        "$3::text::timestamptz)", project.id, str(uuid.uuid4()), at)
    await db.execute(
        "INSERT INTO ai_usage (task_id, project_id, model, prompt_tokens, completion_tokens, "
        "created_at) VALUES ('t1', $1, 'gpt-4o', 1, 1, $2::text::timestamptz)", project.id, at)
    found = await api.call("GET", path, key=project.full,
                           params={"since": at, "until": "2030-01-01T00:00:00.001Z"})
    empty = await api.call("GET", path, key=project.full, params={"since": at, "until": at})
    swapped = await api.call("GET", path, key=project.full,
                             params={"since": at, "until": "2029-12-31T23:59:59.999Z"})
    assert found.status == 200, found.body
    assert rows(found.body) == 1
    assert empty.status == 200, empty.body
    assert rows(empty.body) == 0
    assert (swapped.status, swapped.fields) == (400, ["until"])


@pytest.fixture
async def hooks(api_settings: Settings) -> AsyncIterator[Api]:
    settings = api_settings.replace(webhooks=WebhookSecrets(sendgrid=SECRET))
    async with running_api(settings) as api:
        yield api


@pytest.mark.parametrize(("raw", "field"), [
    ('[{"event": "delivered", "sg_message_id": "m1", "timestamp": 1e400}]',
     "body[0].timestamp"),
    ('[{"event": "delivered", "sg_message_id": "m1", "n": 123456789012345678901234567890}]',
     "body[0].n"),  # exact, not a rounded float, so it is refused like any body's
    ('[{"event": "delivered", "sg_message_id": "\\ud800"}]', "body[0].sg_message_id"),
])
async def test_a_signed_event_list_names_the_value_it_cannot_store(
    hooks: Api, redis: Redis, raw: str, field: str
) -> None:
    project = await hooks.project()
    reply = await hooks.call("POST", f"/v1/webhooks/sendgrid/{project.id}", data=raw,
                             headers={"Content-Type": "application/json",
                                      **svix_headers(SECRET, raw)})
    assert (reply.status, reply.fields) == (400, [field]), reply.body
    assert await redis.xlen(Keys(hooks.settings.namespace).events_inbound) == 0


def forged_cursor(path: str, *parts: object) -> str:
    """A cursor of ``path``'s list (no filters) holding ``parts``, made by hand."""
    return base64.urlsafe_b64encode(json.dumps([*parts, list_scope(path, {})]).encode()
                                    ).decode().rstrip("=")


@pytest.mark.parametrize("path", ["/v1/templates", "/v1/workflows"])
@pytest.mark.parametrize("after", ["a\u0000b", "a\u0001b", "", " a"])
async def test_a_cursor_naming_no_possible_id_is_a_400_not_a_500(
    api: Api, project: Project, path: str, after: str
) -> None:
    """A cursor of a list by id holds the last id of a page; one that holds what no id can
    be (a NUL, which PostgreSQL's text refuses, among them) is no cursor this API returned."""
    reply = await api.call("GET", path, key=project.full,
                           params={"cursor": forged_cursor(path, after)})
    assert (reply.status, reply.fields) == (400, ["cursor"]), reply.body


@pytest.mark.parametrize("path", ["/v1/templates", "/v1/workflows"])
async def test_a_page_of_a_list_by_id_still_leads_to_the_next(
    api: Api, project: Project, path: str
) -> None:
    for name in ("a b", "a/b", "\u00e9t\u00e9"):
        body = ({"channels": {"sms": {"text": "x"}}} if path == "/v1/templates"
                else {"steps": [{"type": "wait", "seconds": 1}]})
        made = await api.call("PUT", f"{path}/{quote(name, safe='')}", key=project.full,
                              json=body)
        assert made.status == 201, made.body
    seen: list[str] = []
    cursor: str | None = None
    while True:
        page = await api.call("GET", path, key=project.full,
                              params={"limit": "1", **({"cursor": cursor} if cursor else {})})
        assert page.status == 200, page.body
        seen += [item["id"] for item in page.body["items"]]
        cursor = page.body["nextCursor"]
        if cursor is None:
            break
    assert seen == sorted(["a b", "a/b", "\u00e9t\u00e9"])


@pytest.mark.parametrize(("body", "field"), [
    ({"": 1, "attributes": {}}, "''"),
    ({"contacts": [{"channel": "email", "target": "a@b.co", "": 1}]}, "contacts[0].''"),
    ({"attributes": {"": "nul\u0000"}}, "attributes.''"),
])
async def test_an_unknown_field_with_an_empty_name_is_named_visibly(
    api: Api, project: Project, body: dict[str, object], field: str
) -> None:
    """A detail's field is never the empty string, which reads as no field at all."""
    reply = await api.call("PUT", "/v1/users/u1", key=project.full, json=body)
    assert (reply.status, reply.fields) == (400, [field]), reply.body
    assert field in reply.error["message"]


IDEMPOTENCY_KEYS = ["order-42", "a b", "x" * 255, " lead", "trail ", " ", "\u00a0k", "k\u00ad",
                    "tab\there", "x" * 256, ""]


@pytest.mark.parametrize("value", IDEMPOTENCY_KEYS)
async def test_the_documented_idempotency_key_is_one_the_server_takes(
    api: Api, project: Project, value: str
) -> None:
    """Given the document's x-idempotency-key schema, a value it admits is accepted and one
    the server refuses is not admitted."""
    import jsonschema_rs

    from notifkit.services.api.app import operations
    from notifkit.services.api.openapi import document

    send = document(operations())["paths"]["/v1/notifications"]["post"]
    schema = next(p["schema"] for p in send["parameters"] if p["name"] == "x-idempotency-key")
    await api.call("PUT", "/v1/templates/t", key=project.full,
                   json={"channels": {"sms": {"text": "hi"}}})
    reply = await api.call("POST", "/v1/notifications", key=project.send,
                           json={"to": "u1", "template": "t"},
                           headers={"x-idempotency-key": value})
    assert jsonschema_rs.is_valid(schema, value) == (reply.status == 202), reply.body


@pytest.mark.parametrize(("channel", "target"), [
    ("email", "ada@example.com\n"), ("sms", "+4915112345678\n"),
    # Digits of another script are digits to \d, not to a phone network.
    ("sms", "+4\u0669\u0661\u0665\u0661\u0661\u0662\u0663\u0664\u0665\u0666"),
])
async def test_an_address_with_a_trailing_newline_or_another_script_s_digits_is_none(
    api: Api, project: Project, channel: str, target: str
) -> None:
    """A pattern's ``$`` also matches before a final newline, and ``\\d`` any script's digits:
    such an address is refused, not stored and handed to a provider."""
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    added = await api.call("POST", "/v1/users/u1/contacts", key=project.full,
                           json={"channel": channel, "target": target})
    assert (added.status, added.fields) == (400, ["target"]), added.body
    listed = await api.call("PUT", "/v1/users/u1", key=project.full,
                            json={"contacts": [{"channel": channel, "target": target}]})
    assert (listed.status, listed.fields) == (400, ["contacts[0].target"]), listed.body


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/v1/users/u1", {"locale": "de\n"}, "locale"),
    ("/v1/users/u1/preferences", {"quietHours": {"start": "22:00\n", "end": "07:00"}},
     "quietHours.start"),
])
async def test_a_trailing_newline_fails_the_field_pattern(
    api: Api, project: Project, path: str, body: dict[str, object], field: str
) -> None:
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    reply = await api.call("PUT", path, key=project.full, json=body)
    assert (reply.status, reply.fields) == (400, [field]), reply.body


async def test_a_dlq_id_with_a_trailing_newline_names_no_entry(
    api: Api, project: Project
) -> None:
    reply = await api.call("DELETE", "/v1/dlq/1-1%0A", key=project.full)
    assert reply.status == 404, reply.body


@pytest.mark.parametrize("send_at", [
    "9999-12-31T23:59:59-05:00",   # RFC 3339, but 9999-12-31 is already over in UTC
    "0001-01-01T00:00:00+01:00",   # and the calendar had not begun there yet
])
async def test_a_send_at_beyond_the_calendar_in_utc_says_so_not_that_it_is_no_rfc_3339(
    api: Api, project: Project, send_at: str
) -> None:
    reply = await send_at_reply(api, project, send_at)
    assert (reply.status, reply.fields) == (400, ["sendAt"])
    [problem] = reply.error["details"]
    assert "RFC 3339" not in problem["message"]
    assert "9999-12-31T23:59:59.999Z" in problem["message"]


async def test_a_nul_in_a_campaign_id_filter_is_refused_as_a_send_refuses_it(
    api: Api, project: Project
) -> None:
    reply = await api.call("GET", "/v1/messages", key=project.full,
                           params={"campaignId": "black\x00friday"})
    assert (reply.status, reply.fields) == (400, ["campaignId"])
    assert reply.error["details"][0]["message"] == "must not contain NUL characters"

