"""Authentication, roles, the admin key's project rule, limits, and the one error shape."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import re
import time
import uuid
import zlib
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from multidict import CIMultiDict
from redis.asyncio import Redis

from notifkit.config import MAX_BODY_BYTES_LIMIT, Settings
from notifkit.keys import Keys
from notifkit.services.api import validation
from notifkit.services.api.app import create_app, operations
from notifkit.services.api.auth import PROJECT_CHECK_INTERVAL_S
from notifkit.services.api.state import HUB, KEY_CACHE
from tests.api.conftest import ADMIN, Api, Project, running_api, start_api


def nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


def assert_error_shape(body: object) -> None:
    assert isinstance(body, dict)
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"code", "message", "details"}
    assert isinstance(error["code"], str)
    assert error["code"] == error["code"].lower()
    assert isinstance(error["message"], str)
    assert error["message"]
    assert all(set(d) == {"field", "message"} for d in error["details"])


async def test_a_missing_or_unknown_key_is_401(api: Api, project: Project) -> None:
    missing = await api.call("GET", "/v1/users/u1")
    assert missing.status == 401
    assert missing.headers["WWW-Authenticate"] == "Bearer"
    assert_error_shape(missing.body)
    for header in ("Bearer nope", "Basic abc", "Bearer ", "bearer " + "x" * 5000):
        reply = await api.call("GET", "/v1/users/u1", headers={"Authorization": header})
        assert reply.status == 401, header
        assert_error_shape(reply.body)


async def test_who_is_calling_is_checked_before_the_project_they_name(
    api: Api, project: Project,
) -> None:
    # An unknown key is 401 and a key without the role is 403, whatever project id comes with
    # them; only a caller allowed to ask learns that the id it sent is malformed.
    header = {"x-project-id": "bad"}
    query = {"projectId": "bad"}
    for headers, params in ((header, None), (None, query)):
        unknown = await api.call("GET", "/v1/users/u1", key="nk_unknown", headers=headers,
                                 params=params)
        assert unknown.status == 401, (headers, params)
        send_only = await api.call("GET", "/v1/users/u1", key=project.send, headers=headers,
                                   params=params)
        assert send_only.status == 403, (headers, params)
        full = await api.call("GET", "/v1/users/u1", key=project.full, headers=headers,
                              params=params)
        assert (full.status, full.body["error"]["code"]) == (400, "validation_error")


async def test_headers_that_decide_who_acts_are_refused_when_sent_twice(
    api: Api, project: Project,
) -> None:
    """Given two keys (or two project ids, or two idempotency keys) in one request, the server
    cannot know which one the caller meant, and a proxy in front may have read the other: the
    request is a 400 naming the header, and nothing is sent for either project."""
    other = await api.project()
    await api.call("PUT", "/v1/users/u1", key=other.full, json={})
    await api.call("PUT", "/v1/templates/t", key=other.full,
                   json={"channels": {"inapp": {"text": "hi"}}})
    body = {"to": "u1", "template": "t"}
    cases: list[tuple[str, list[tuple[str, str]]]] = [
        ("Authorization", [("Authorization", f"Bearer {project.full}"),
                           ("Authorization", f"Bearer {other.full}")]),
        ("x-project-id", [("Authorization", f"Bearer {ADMIN}"),
                          ("x-project-id", project.id), ("x-project-id", other.id)]),
        ("x-idempotency-key", [("Authorization", f"Bearer {other.full}"),
                               ("x-idempotency-key", "a"), ("x-idempotency-key", "b")]),
    ]
    for name, headers in cases:
        async with api.client.post("/v1/notifications", json=body,
                                   headers=CIMultiDict(headers)) as reply:
            answer = await reply.json()
            assert reply.status == 400, (name, answer)
            assert [d["field"] for d in answer["error"]["details"]] == [name]
    messages = await api.call("GET", "/v1/messages", key=other.full)
    assert messages.body["items"] == []
    one = await api.call("POST", "/v1/notifications", key=other.full, json=body,
                         headers={"x-idempotency-key": "a"})
    assert one.status == 202, one.body


async def test_a_send_key_may_only_send(api: Api, project: Project) -> None:
    for method, path in (("GET", "/v1/users/u1"), ("PUT", "/v1/templates/t"),
                         ("GET", "/v1/messages"), ("GET", "/v1/streams"), ("GET", "/v1/dlq")):
        reply = await api.call(method, path, key=project.send, json={})
        assert reply.status == 403, (method, path)
        assert reply.error["code"] == "forbidden"
    # The three sending routes accept it (here: past auth, into validation).
    for path in ("/v1/notifications", "/v1/events", "/v1/workflows/w/trigger"):
        reply = await api.call("POST", path, key=project.send, json={})
        assert reply.status in (400, 404), (path, reply.body)


async def test_every_route_but_the_sending_ones_refuses_a_send_key(
    api: Api, project: Project
) -> None:
    """Walks the route table, so a management route added or edited later is held to it."""
    checked = 0
    for op in operations():
        if op.access not in ("project", "ops") or "send" in op.roles:
            continue
        path = re.sub(r"\{[^}]+\}", "x", op.path)
        reply = await api.call(op.method, path, key=project.send, json={})
        assert reply.status == 403, (op.method, op.path, reply.status)
        assert reply.error["code"] == "forbidden"
        checked += 1
    assert checked > 20
    assert {(op.method, op.path) for op in operations() if "send" in op.roles} == {
        ("POST", "/v1/notifications"), ("POST", "/v1/events"),
        ("POST", "/v1/workflows/{workflowId}/trigger")}


async def test_project_keys_cannot_call_admin_routes(api: Api, project: Project) -> None:
    reply = await api.call("POST", "/v1/projects", key=project.full, json={"name": "x"})
    assert reply.status == 403
    reply = await api.call("GET", f"/v1/projects/{project.id}", key=project.full)
    assert reply.status == 403


async def test_the_admin_key_must_name_an_existing_project(api: Api, project: Project) -> None:
    without = await api.admin("GET", "/v1/messages")
    assert without.status == 400
    assert without.error["code"] == "project_required"
    assert without.fields == ["x-project-id"]
    unknown = await api.admin("GET", "/v1/messages",
                              project="00000000-0000-4000-8000-000000000000")
    assert unknown.status == 404
    malformed = await api.admin("GET", "/v1/messages", project="not-a-uuid")
    assert malformed.status == 400
    assert malformed.fields == ["x-project-id"]
    # Only the admin key acts on it, but a project key naming garbage is told so too.
    named = await api.call("GET", "/v1/messages", key=project.full,
                           params={"projectId": "nope"})
    assert named.fields == ["projectId"]
    by_header = await api.admin("GET", "/v1/messages", project=project.id)
    assert by_header.status == 200
    by_query = await api.admin("GET", "/v1/messages", params={"projectId": project.id})
    assert by_query.status == 200
    both = await api.admin("GET", "/v1/messages", project=project.id,
                           params={"projectId": project.id.upper()})
    assert both.status == 200
    # Two different projects: acting for either one would be a guess.
    other = await api.project()
    clash = await api.admin("GET", "/v1/messages", project=project.id,
                            params={"projectId": other.id})
    assert (clash.status, clash.fields) == (400, ["projectId"])


async def test_a_project_key_naming_another_project_is_refused(
    api: Api, project: Project,
) -> None:
    # Given a key of one project, and a user of that project
    other = await api.project()
    assert (await api.call("PUT", "/v1/users/u-1", key=project.full, json={})).status == 201
    # Its own project named by header or query is fine
    own = await api.call("GET", "/v1/users/u-1", key=project.full, project=project.id.upper())
    assert own.status == 200
    own_query = await api.call("GET", "/v1/users/u-1", key=project.full,
                               params={"projectId": project.id})
    assert own_query.status == 200
    # Another project (or one that does not exist) named with it is a 403 naming the field,
    # not a call quietly made for the key's own project
    for named in (other.id, "00000000-0000-4000-8000-000000000000"):
        by_header = await api.call("PUT", "/v1/users/u-2", key=project.full, project=named,
                                   json={})
        assert (by_header.status, by_header.fields) == (403, ["x-project-id"])
        by_query = await api.call("GET", "/v1/dlq", key=project.full,
                                  params={"projectId": named})
        assert (by_query.status, by_query.fields) == (403, ["projectId"])
    sent = await api.call("POST", "/v1/notifications", key=project.send, project=other.id,
                          json={"to": "u-1", "template": "none"})
    assert (sent.status, sent.fields) == (403, ["x-project-id"])
    # And nothing was written anywhere
    assert (await api.call("GET", "/v1/users/u-2", key=project.full)).status == 404
    assert (await api.call("GET", "/v1/users/u-2", key=other.full)).status == 404


async def test_the_admin_routes_hold_to_the_project_the_admin_key_names(api: Api) -> None:
    """On the admin routes a named project (header or query, alike) says which project the
    caller means: the call is not quietly made for another one."""
    a, b = await api.project(), await api.project()
    made = await api.admin("POST", f"/v1/projects/{b.id}/keys", json={"role": "send"})
    b_key = made.body["id"]
    # Another project's path, key or none at all: 400 naming the field, or the key's 404.
    for where in ("header", "query"):
        named: dict[str, Any] = ({"project": a.id} if where == "header"
                                 else {"params": {"projectId": a.id}})
        field = "x-project-id" if where == "header" else "projectId"
        read = await api.admin("GET", f"/v1/projects/{b.id}", **named)
        assert (read.status, read.fields) == (400, [field])
        key = await api.admin("POST", f"/v1/projects/{b.id}/keys", json={"role": "full"},
                              **named)
        assert (key.status, key.fields) == (400, [field])
        created = await api.admin("POST", "/v1/projects", json={"name": "x"}, **named)
        assert (created.status, created.fields) == (400, [field])
        revoked = await api.admin("DELETE", f"/v1/keys/{b_key}", **named)
        assert (revoked.status, revoked.error["code"]) == (404, "key_not_found")
    # Nothing was done: B's send key still sends, and no key was made for B.
    sent = await api.call("POST", "/v1/notifications", key=made.body["key"],
                          json={"to": "u1", "template": "none"})
    assert sent.status != 401, sent.body
    # Naming the right project (or none) is the usual call.
    assert (await api.admin("GET", f"/v1/projects/{b.id}", project=b.id.upper())).status == 200
    assert (await api.admin("DELETE", f"/v1/keys/{b_key}", project=b.id)).status == 204
    gone = await api.call("POST", "/v1/notifications", key=made.body["key"],
                          json={"to": "u1", "template": "none"})
    assert gone.status == 401


async def test_unknown_projects_and_keys_are_404s_that_name_no_project(api: Api) -> None:
    """Projects and keys belong to no project: their 404s, for a well-formed id or not, say
    what is missing without claiming to have looked "in this project"."""
    for method, path, code in (
        ("GET", "/v1/projects/nope", "project_not_found"),
        ("GET", "/v1/projects/00000000-0000-4000-8000-000000000000", "project_not_found"),
        ("POST", "/v1/projects/nope/keys", "project_not_found"),
        ("DELETE", "/v1/keys/nope", "key_not_found"),
        ("DELETE", "/v1/keys/00000000-0000-4000-8000-000000000000", "key_not_found"),
    ):
        reply = await api.admin(method, path,
                                json={"role": "full"} if method == "POST" else None)
        assert reply.status == 404, (path, reply.body)
        assert reply.error["code"] == code
        assert "in this project" not in reply.error["message"], reply.error["message"]


async def test_bodies_must_be_json_objects_within_the_limit(api: Api, project: Project) -> None:
    not_json = await api.call("PUT", "/v1/users/u1", key=project.full, data="a=b",
                              headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert (not_json.status, not_json.fields) == (415, ["Content-Type"])
    assert_error_shape(not_json.body)
    broken = await api.call("PUT", "/v1/users/u1", key=project.full, data="{",
                            headers={"Content-Type": "application/json"})
    assert (broken.status, broken.fields) == (400, ["body"])
    assert broken.error["code"] == "invalid_json"
    for body in ("[1]", "null", '"text"'):
        wrong = await api.call("PUT", "/v1/users/u1", key=project.full, data=body,
                               headers={"Content-Type": "application/json"})
        assert (wrong.status, wrong.fields) == (400, ["body"])
    empty = await api.call("PUT", "/v1/users/u1", key=project.full, data="",
                           headers={"Content-Type": "application/json"})
    assert (empty.status, empty.fields) == (400, ["body"])
    huge = await api.call("PUT", "/v1/users/u1", key=project.full,
                          data='{"attributes": {"x": "' + "a" * (1024 * 1024) + '"}}',
                          headers={"Content-Type": "application/json"})
    assert (huge.status, huge.fields) == (413, ["body"])
    assert huge.error["code"] == "payload_too_large"


@pytest.mark.parametrize("charset", ["iso-8859-1", "latin-1", "UTF-16", "windows-1252"])
async def test_a_body_declared_in_another_charset_than_utf8_is_a_415(
    api: Api, project: Project, charset: str,
) -> None:
    """Given a JSON body whose Content-Type names a charset other than UTF-8 (JSON is UTF-8,
    RFC 8259), when it is sent, then the answer is a 415 naming Content-Type, not a 400 about
    bytes that do not decode, and not a body read in another encoding than the sender's."""
    for body in ('{"attributes": {"name": "Jos\u00e9"}}'.encode("latin-1"),
                 '{"attributes": {"name": "\u00c3\u00a9"}}'.encode("latin-1")):
        reply = await api.call("PUT", "/v1/users/u1", key=project.full, data=body,
                               headers={"Content-Type": f"application/json; charset={charset}"})
        assert (reply.status, reply.fields) == (415, ["Content-Type"]), reply.body
        assert_error_shape(reply.body)
        assert charset in reply.error["details"][0]["message"]
    stored = await api.call("GET", "/v1/users/u1", key=project.full)
    assert stored.status == 404, stored.body


@pytest.mark.parametrize("charset", ["utf-8", "UTF-8", "utf8", "us-ascii"])
async def test_a_body_declared_in_utf8_or_ascii_is_read(
    api: Api, project: Project, charset: str,
) -> None:
    reply = await api.call("PUT", "/v1/users/u1", key=project.full,
                           data='{"attributes": {"name": "Jos\u00e9"}}'.encode(),
                           headers={"Content-Type": f"application/json; charset={charset}"})
    assert reply.status == 201, reply.body
    assert reply.body["attributes"] == {"name": "Jos\u00e9"}


@pytest.mark.parametrize("attributes", [
    {"x": "nul\u0000"}, {"deep": {"a": nested(40)}},
])
async def test_values_postgres_cannot_store_are_400_naming_the_field(
    api: Api, project: Project, attributes: dict[str, object]
) -> None:
    reply = await api.call("PUT", "/v1/users/u1", key=project.full,
                           json={"attributes": attributes})
    assert reply.status == 400
    assert reply.fields
    assert all(f.startswith("attributes.") for f in reply.fields)


async def test_integers_beyond_64_bits_are_refused_not_rounded(
    api: Api, project: Project,
) -> None:
    # A fast JSON parser would read the first as a float and store 1.2345678901234568e+29.
    huge = await api.call("PUT", "/v1/users/u1", key=project.full,
                          data='{"attributes": {"n": 123456789012345678901234567890}}',
                          headers={"Content-Type": "application/json"})
    assert (huge.status, huge.fields) == (400, ["attributes.n"])
    largest = await api.call("PUT", "/v1/users/u1", key=project.full,
                             data='{"attributes": {"n": 9223372036854775807, '
                                  '"id": "123456789012345678901234567890"}}',
                             headers={"Content-Type": "application/json"})
    assert largest.status in (200, 201)
    stored = await api.call("GET", "/v1/users/u1", key=project.full)
    assert stored.body["attributes"] == {"n": 9223372036854775807,
                                         "id": "123456789012345678901234567890"}


async def test_unknown_routes_and_methods_use_the_error_shape(api: Api) -> None:
    missing = await api.call("GET", "/v2/nothing")
    assert missing.status == 404
    assert_error_shape(missing.body)
    wrong = await api.call("PATCH", "/v1/notifications")
    assert wrong.status == 405
    assert_error_shape(wrong.body)


async def test_head_answers_like_get_without_a_body(api: Api, project: Project) -> None:
    """Given routes that answer GET, when a client sends HEAD, then it gets GET's status and
    headers, with the same authentication, and no body; routes without GET stay 405."""
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    health = await api.call("HEAD", "/health")
    assert health.status == 200
    assert health.headers["Content-Type"] == "application/json"
    assert health.body is None
    user = await api.call("HEAD", "/v1/users/u1", key=project.full)
    assert user.status == 200
    assert user.body is None
    assert (await api.call("HEAD", "/v1/users/u1")).status == 401
    assert (await api.call("HEAD", "/v1/users/nobody", key=project.full)).status == 404
    assert (await api.call("HEAD", "/openapi.json")).status == 200
    not_get = await api.call("HEAD", "/v1/notifications", key=project.full)
    assert not_get.status == 405
    assert not_get.headers["Allow"] == "POST"


async def test_a_malformed_http_request_is_a_warning_not_a_logged_traceback(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    """Given bytes aiohttp cannot parse as a request (a NUL in a header), when they arrive,
    then the client gets a 400 and the log holds one warning, not an error with a traceback:
    a client's mistake is not the server's failure."""
    server = api.client.server
    caplog.set_level(logging.WARNING, logger="aiohttp.server")
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Probe: \x00\r\n\r\n")
    await writer.drain()
    answer = await reader.read()
    writer.close()
    assert answer.startswith(b"HTTP/1.0 400") or answer.startswith(b"HTTP/1.1 400"), answer
    records = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert records, "the refusal is logged"
    assert all(r.levelno == logging.WARNING and not r.exc_info for r in records), [
        (r.levelname, r.getMessage()) for r in records]
    assert "malformed HTTP request with 400" in records[0].getMessage()


@pytest.mark.parametrize("route", [("POST", "/v1/notifications"), ("PUT", "/v1/users/u1"),
                                   ("POST", "/v1/events")])
async def test_a_body_that_does_not_decode_is_a_400_not_a_500(
    api: Api, project: Project, caplog: pytest.LogCaptureFixture, route: tuple[str, str],
) -> None:
    """Given a body that claims a Content-Encoding it is not in, when it is sent, then the
    answer is a 400 naming Content-Encoding, and nothing is logged as a server error."""
    caplog.set_level(logging.WARNING)
    method, path = route
    reply = await api.call(method, path, key=project.full, data=b'{"not": "gzip"}',
                           headers={"Content-Type": "application/json",
                                    "Content-Encoding": "gzip"})
    assert (reply.status, reply.fields) == (400, ["Content-Encoding"]), reply.body
    assert_error_shape(reply.body)
    assert reply.error["code"] == "unreadable_body"
    await asyncio.sleep(0.05)  # aiohttp drains the rest of the body after the answer
    errors = [(r.name, r.getMessage()) for r in caplog.records
              if r.levelno >= logging.ERROR or r.exc_info]
    assert not errors, errors


@pytest.mark.parametrize("coding", ["br", "zstd", "compress", "snappy", "gzip, br"])
@pytest.mark.parametrize("route", [("POST", "/v1/events"), ("PUT", "/v1/users/u1"),
                                   ("POST", "/v1/webhooks/resend/{project}"),
                                   ("POST", "/v1/unsubscribe")])
async def test_a_content_encoding_the_api_does_not_decode_is_a_415_in_the_envelope(
    api: Api, project: Project, route: tuple[str, str], coding: str,
) -> None:
    """Given a body in a Content-Encoding other than gzip, deflate or identity (one aiohttp
    cannot decode, or one it does not know and used to read as identity), when it is sent,
    then the answer is the error envelope's 415 naming Content-Encoding, never a plain-text
    400 from the HTTP parser, and the body is not acted on."""
    method, path = route
    reply = await api.call(method, path.format(project=project.id), key=project.full,
                           data=b'{"name": "e", "userId": "u1"}',
                           headers={"Content-Type": "application/json",
                                    "Content-Encoding": coding})
    assert reply.status == 415, reply.body
    assert_error_shape(reply.body)
    assert reply.fields == ["Content-Encoding"]
    messages = await api.call("GET", "/v1/users/u1", key=project.full)
    assert messages.status == 404, "nothing was stored"


@pytest.mark.parametrize("coding", ["gzip", "x-gzip", "deflate", "raw-deflate", "identity"])
async def test_a_body_in_a_supported_content_encoding_is_read_decoded(
    api: Api, project: Project, coding: str,
) -> None:
    """Given a JSON body compressed with gzip or deflate (zlib-wrapped or raw, as clients
    send both), when it is sent, then the API reads the decoded JSON."""
    body = b'{"attributes": {"plan": "pro"}}'
    encoded = {"gzip": gzip.compress(body), "x-gzip": gzip.compress(body),
               "deflate": zlib.compress(body), "identity": body,
               "raw-deflate": zlib.compress(body)[2:-4]}[coding]
    reply = await api.call("PUT", "/v1/users/u1", key=project.full, data=encoded,
                           headers={"Content-Type": "application/json",
                                    "Content-Encoding": coding.replace("raw-", "")})
    assert reply.status == 201, reply.body
    assert reply.body["attributes"] == {"plan": "pro"}


async def test_a_compressed_body_is_read_under_the_largest_body_limit(
    api_settings: Settings,
) -> None:
    """Given the largest MAX_BODY_BYTES the settings take, when a gzip body is sent, then it
    is read (a limit past 2**63 failed every compressed request with a 500)."""
    async with running_api(api_settings.replace(max_body_bytes=MAX_BODY_BYTES_LIMIT)) as api:
        project = await api.project()
        reply = await api.call("PUT", "/v1/users/u1", key=project.full,
                               data=gzip.compress(b'{"attributes": {"plan": "pro"}}'),
                               headers={"Content-Type": "application/json",
                                        "Content-Encoding": "gzip"})
    assert reply.status == 201, reply.body
    assert reply.body["attributes"] == {"plan": "pro"}


async def test_a_gzip_body_of_several_members_is_read_whole(
    api: Api, project: Project,
) -> None:
    body = b'{"attributes": {"plan": "pro", "seats": 3}}'
    members = gzip.compress(body[:20]) + gzip.compress(body[20:])
    reply = await api.call("PUT", "/v1/users/u1", key=project.full, data=members,
                           headers={"Content-Type": "application/json",
                                    "Content-Encoding": "gzip"})
    assert reply.status == 201, reply.body
    assert reply.body["attributes"] == {"plan": "pro", "seats": 3}
    # Trailing bytes that are not another member are still refused.
    broken = await api.call("PUT", "/v1/users/u2", key=project.full,
                            data=gzip.compress(body) + b"junk",
                            headers={"Content-Type": "application/json",
                                     "Content-Encoding": "gzip"})
    assert (broken.status, broken.fields) == (400, ["Content-Encoding"]), broken.body


async def test_a_broken_deflate_body_is_a_400_in_the_envelope(
    api: Api, project: Project,
) -> None:
    """Given a body that claims deflate but is cut short, when it is sent, then the answer is
    the envelope's 400 naming Content-Encoding (aiohttp's parser used to answer a plain-text
    400 with the single word 'deflate')."""
    for data in (zlib.compress(b'{"name": "e", "userId": "u1"}')[:-6], b"\x78\x9c junk"):
        reply = await api.call("POST", "/v1/events", key=project.full, data=data,
                               headers={"Content-Type": "application/json",
                                        "Content-Encoding": "deflate"})
        assert (reply.status, reply.fields) == (400, ["Content-Encoding"]), reply.body
        assert reply.error["code"] == "unreadable_body"


async def test_a_compressed_body_that_inflates_past_the_limit_is_a_413(
    api: Api, project: Project,
) -> None:
    """Given a small gzip body that inflates beyond the body limit, when it is sent, then the
    answer is the envelope's 413: the limit holds for the decoded body too."""
    limit = api.settings.max_body_bytes
    body = b'{"name": "e", "userId": "u1", "data": {"x": "' + b"a" * limit + b'"}}'
    compressed = gzip.compress(body)
    assert len(compressed) < limit
    reply = await api.call("POST", "/v1/events", key=project.full, data=compressed,
                           headers={"Content-Type": "application/json",
                                    "Content-Encoding": "gzip"})
    assert reply.status == 413, reply.body
    assert_error_shape(reply.body)
    assert reply.error["code"] == "payload_too_large"


async def _head_only(api: Api, project: Project, extra: bytes) -> tuple[bytes, dict[str, str],
                                                                          object]:
    """The answer to a PUT whose headers end with ``extra`` and whose body is never sent: its
    status line, headers and JSON body. The client waits only for the answer, as one that
    asked ``Expect: 100-continue`` or announced a body it has not started sending would."""
    server = api.client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        writer.write(b"PUT /v1/users/u1 HTTP/1.1\r\nHost: x\r\n"
                     b"Authorization: Bearer " + project.full.encode() + b"\r\n"
                     b"Content-Type: application/json\r\n" + extra + b"\r\n")
        await writer.drain()
        status = await reader.readline()
        headers: dict[str, str] = {}
        if status.startswith(b"HTTP/1.1 1"):
            return status, headers, None  # an interim answer: the client would send its body
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        body = json.loads(await reader.readexactly(int(headers["content-length"])))
    finally:
        writer.close()
    return status, headers, body


@pytest.mark.parametrize("expect", [b"", b"Expect: 100-continue\r\n"])
async def test_a_body_announced_past_the_limit_is_a_413_before_it_is_sent(
    api: Api, project: Project, expect: bytes,
) -> None:
    """Given a request whose Content-Length is over the body limit, when only its headers have
    arrived, then the answer is already the envelope's 413 naming body: a client that asked
    Expect: 100-continue is not told to go on and send megabytes only to have them refused,
    and one that sends no body is not left waiting for the idle timeout."""
    too_long = str(api.settings.max_body_bytes + 1).encode()
    status, headers, body = await _head_only(
        api, project, expect + b"Content-Length: " + too_long + b"\r\n")
    assert status.startswith(b"HTTP/1.1 413"), (status, body)
    assert_error_shape(body)
    assert isinstance(body, dict)
    assert body["error"]["code"] == "payload_too_large"
    assert [d["field"] for d in body["error"]["details"]] == ["body"]
    assert headers.get("connection") == "close"


async def test_an_expectation_the_server_cannot_meet_is_a_417_in_the_envelope(
    api: Api, project: Project,
) -> None:
    """Given an Expect header other than 100-continue, when it arrives, then the answer is a
    417 in the error envelope naming Expect (aiohttp's own answer is plain text)."""
    status, headers, body = await _head_only(api, project,
                                             b"Expect: teapot\r\nContent-Length: 2\r\n")
    assert status.startswith(b"HTTP/1.1 417"), (status, body)
    assert headers["content-type"].startswith("application/json")
    assert headers.get("connection") == "close"
    assert_error_shape(body)
    assert isinstance(body, dict)
    assert [d["field"] for d in body["error"]["details"]] == ["Expect"]


async def test_a_body_within_the_limit_is_still_invited_with_100_continue(
    api: Api, project: Project,
) -> None:
    """Given Expect: 100-continue and a body within the limit, the client is told to send it,
    and the request is then served as any other."""
    server = api.client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        writer.write(b"PUT /v1/users/u1 HTTP/1.1\r\nHost: x\r\n"
                     b"Authorization: Bearer " + project.full.encode() + b"\r\n"
                     b"Content-Type: application/json\r\nExpect: 100-Continue\r\n"
                     b"Content-Length: 2\r\nConnection: close\r\n\r\n")
        await writer.drain()
        assert await reader.readline() == b"HTTP/1.1 100 Continue\r\n"
        assert await reader.readline() == b"\r\n"
        writer.write(b"{}")
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 201"), answer


async def test_a_client_that_hangs_up_mid_body_is_not_logged_as_a_store_outage(
    api: Api, project: Project, caplog: pytest.LogCaptureFixture,
) -> None:
    """Given a client that sends half its body and closes the connection, the log says the
    client went away, not that Redis or PostgreSQL is unreachable (an operator would go
    looking for an outage that is not there). Served as the service serves it: aiohttp's test
    server cancels the handler instead, which production does not."""
    caplog.set_level(logging.INFO)
    runner = web.AppRunner(create_app(api.settings), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/events HTTP/1.1\r\nHost: x\r\n"
                     b"Authorization: Bearer " + project.full.encode() + b"\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"na")
        await writer.drain()
        await asyncio.sleep(0.3)  # the handler is reading the body by now
        writer.close()
        await writer.wait_closed()
        for _ in range(100):
            if any("closed the connection" in r.getMessage() for r in caplog.records):
                break
            await asyncio.sleep(0.02)
    finally:
        await runner.cleanup()
    messages = [r.getMessage() for r in caplog.records if r.name == "notifkit.api"]
    assert any("closed the connection" in m for m in messages), messages
    assert not any("backing store" in m for m in messages), messages


async def test_a_project_over_its_api_rate_gets_429_with_retry_after(
    settings: Settings,
) -> None:
    slow = settings.replace(api_rate_per_second=0.5, api_rate_burst=3)
    _server, client = await start_api(slow)
    try:
        api = Api(client, slow)
        project = await api.project()  # the admin key is not rate limited
        statuses = [(await api.call("GET", "/v1/messages", key=project.full)).status
                    for _ in range(4)]
        assert statuses == [200, 200, 200, 429]
        limited = await api.call("GET", "/v1/messages", key=project.full)
        assert limited.status == 429
        assert limited.error["code"] == "rate_limited"
        assert int(limited.headers["Retry-After"]) >= 1
        # Another project has a bucket of its own.
        other = await api.project("other")
        assert (await api.call("GET", "/v1/messages", key=other.full)).status == 200
        assert (await api.admin("GET", "/v1/messages", project=project.id)).status == 200
    finally:
        await client.close()


async def test_keys_are_shown_once_and_stored_hashed(
    api: Api, project: Project, db: asyncpg.Pool
) -> None:
    made = await api.admin("POST", f"/v1/projects/{project.id}/keys", json={"role": "send"})
    assert made.status == 201
    assert set(made.body) == {"id", "key", "role", "name", "projectId", "createdAt"}
    import hashlib

    stored = await db.fetchval("SELECT key_hash FROM project_api_keys WHERE id = $1",
                               made.body["id"])
    assert stored == hashlib.sha256(made.body["key"].encode()).hexdigest()
    assert made.body["key"] not in str(await db.fetch("SELECT * FROM project_api_keys"))
    bad_role = await api.admin("POST", f"/v1/projects/{project.id}/keys", json={"role": "root"})
    assert bad_role.status == 400
    assert bad_role.fields == ["role"]
    gone = await api.admin("POST", "/v1/projects/00000000-0000-4000-8000-000000000000/keys",
                           json={"role": "full"})
    assert gone.status == 404
    # A key made without a name shows "name": null; sending that null makes the same key.
    assert made.body["name"] is None
    unnamed = await api.admin("POST", f"/v1/projects/{project.id}/keys",
                              json={"role": "full", "name": None})
    assert unnamed.status == 201, unnamed.body
    assert unnamed.body["name"] is None


async def test_a_revoked_key_is_rejected_at_once(api: Api, project: Project) -> None:
    made = await api.admin("POST", f"/v1/projects/{project.id}/keys", json={"role": "full"})
    key = made.body["key"]
    assert (await api.call("GET", "/v1/messages", key=key)).status == 200  # now cached
    assert (await api.admin("DELETE", f"/v1/keys/{made.body['id']}")).status == 204
    assert (await api.call("GET", "/v1/messages", key=key)).status == 401
    assert (await api.admin("DELETE", f"/v1/keys/{made.body['id']}")).status == 204
    assert (await api.admin("DELETE", "/v1/keys/00000000-0000-4000-8000-000000000000")
            ).status == 404


async def test_keys_of_a_deleted_project_are_401_not_500_in_every_process(
    api: Api, api_settings: Settings, db: asyncpg.Pool
) -> None:
    """Deleting a project deletes its keys, but a key another process cached still
    authenticates for up to a minute: its writes, which PostgreSQL refuses for naming no
    project, are a 401 saying so, and every process forgets the key at once."""
    _server, other_http = await start_api(api_settings)
    other = Api(other_http, api_settings)
    try:
        project = await api.project()
        await api.call("PUT", "/v1/templates/t1", key=project.full,
                       json={"channels": {"sms": {"text": "hi"}}})
        for client in (api, other):
            for key in (project.full, project.send):  # cached in both processes
                assert (await client.call("POST", "/v1/events", key=key, json={
                    "name": "e", "userId": "u1"})).status == 202
        # A send, so this process knows the template too.
        assert (await api.call("POST", "/v1/notifications", key=project.send, json={
            "to": "u1", "template": "t1"})).status == 202
        await db.execute("DELETE FROM projects WHERE id = $1", project.id)

        for method, path, key, body in (
            ("PUT", "/v1/users/u1", project.full, {}),
            ("POST", "/v1/notifications", project.send, {"to": "u1", "template": "t1"}),
        ):
            reply = await api.call(method, path, key=key, json=body)
            assert reply.status == 401, (path, reply.body)
            assert reply.error["code"] == "invalid_api_key"
            assert "project no longer exists" in reply.error["message"]
            assert reply.headers["WWW-Authenticate"] == "Bearer"
        assert (await api.call("GET", "/v1/users/u1", key=project.full)).status == 401
        # The other process got the word as after a revocation (bounded: 500 x 10 ms).
        for _ in range(500):
            if (await other.call("GET", "/v1/messages", key=project.full)).status == 401:
                break
            await asyncio.sleep(0.01)
        assert (await other.call("GET", "/v1/messages", key=project.full)).status == 401
        reply = await api.admin("PUT", "/v1/users/u1", project=project.id, json={})
        assert (reply.status, reply.error["code"]) == (404, "project_not_found")
    finally:
        await other_http.close()


async def test_a_key_of_a_deleted_project_finds_nothing_because_it_is_no_key(
    api: Api, db: asyncpg.Pool
) -> None:
    """What a cached key of a deleted project names went with the project: a 404 would say
    the thing is missing, when what is wrong is the key."""
    project = await api.project()
    for key in (project.full, project.send):  # cached
        assert (await api.call("POST", "/v1/events", key=key, json={
            "name": "e", "userId": "u1"})).status == 202
    await db.execute("DELETE FROM projects WHERE id = $1", project.id)

    for method, path, key, body in (
        ("GET", "/v1/templates/t1", project.full, None),
        ("POST", "/v1/workflows/w1/trigger", project.send, {"userId": "u1"}),
    ):
        reply = await api.call(method, path, key=key, json=body)
        assert (reply.status, reply.error["code"]) == (401, "invalid_api_key"), path
        assert "project no longer exists" in reply.error["message"]
    # A project that exists still gets its 404s.
    live = await api.project()
    reply = await api.call("GET", "/v1/templates/t1", key=live.full)
    assert (reply.status, reply.error["code"]) == (404, "template_not_found")


async def test_a_key_of_a_deleted_project_lists_nothing_once_a_second_has_passed(
    api: Api, db: asyncpg.Pool
) -> None:
    """A list finds nothing to fail on; the project is checked at most once a second."""
    clock = KeyCacheClock()
    api.client.app[KEY_CACHE].clock = clock
    project = await api.project()
    assert (await api.call("GET", "/v1/messages", key=project.full)).status == 200  # cached
    await db.execute("DELETE FROM projects WHERE id = $1", project.id)
    # PostgreSQL had the project less than a second ago (the key's lookup): on trust.
    assert (await api.call("GET", "/v1/messages", key=project.full)).status == 200

    clock.now += PROJECT_CHECK_INTERVAL_S
    reply = await api.call("GET", "/v1/messages", key=project.full)
    assert (reply.status, reply.error["code"]) == (401, "invalid_api_key")
    assert "project no longer exists" in reply.error["message"]


class KeyCacheClock:
    """A key cache's monotonic clock, moved only by the test."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


async def test_an_event_with_a_key_of_a_deleted_project_is_401_in_every_process(
    api: Api, api_settings: Settings, db: asyncpg.Pool, redis: Redis
) -> None:
    """POST /v1/events writes nothing to PostgreSQL, so no foreign key tells it that the
    key's project was deleted while the key sat in the cache: it asks whether the project
    exists, at most once a second (this process's clock is the test's here), and then refuses
    the key as a write does, in every process."""
    _server, other_http = await start_api(api_settings)
    other = Api(other_http, api_settings)
    # Both processes' clocks stand still unless moved: the other one can learn of the deletion
    # only from this one.
    clock, other_clock = KeyCacheClock(), KeyCacheClock()
    api.client.app[KEY_CACHE].clock = clock
    other_http.app[KEY_CACHE].clock = other_clock
    stream = Keys(api_settings.namespace).events_inbound
    event = {"name": "e", "userId": "u1"}
    try:
        project = await api.project()
        for client in (api, other):  # the key cached in both processes
            reply = await client.call("POST", "/v1/events", key=project.send, json=event)
            assert reply.status == 202, reply.body
        await db.execute("DELETE FROM projects WHERE id = $1", project.id)
        # PostgreSQL had the project less than a second ago (the key's lookup): on trust.
        assert (await api.call("POST", "/v1/events", key=project.send, json=event)).status \
            == 202
        queued = await redis.xlen(stream)

        clock.now += PROJECT_CHECK_INTERVAL_S
        reply = await api.call("POST", "/v1/events", key=project.send, json=event)
        assert reply.status == 401, reply.body
        assert reply.error["code"] == "invalid_api_key"
        assert "project no longer exists" in reply.error["message"]
        assert reply.headers["WWW-Authenticate"] == "Bearer"
        assert await redis.xlen(stream) == queued  # nothing enqueued for it
        # The other process got the word as after a revocation (bounded: 500 x 10 ms).
        for _ in range(500):
            if (await other.call("POST", "/v1/events", key=project.send,
                                 json=event)).status == 401:
                break
            await asyncio.sleep(0.01)
        reply = await other.call("POST", "/v1/events", key=project.send, json=event)
        assert (reply.status, reply.error["code"]) == (401, "invalid_api_key")
    finally:
        await other_http.close()


async def test_projects_validate_their_settings(api: Api) -> None:
    good = await api.admin("POST", "/v1/projects", json={
        "name": "p", "settings": {"throttle": {"limit": 5, "windowSeconds": 60},
                                  "rateLimits": {"email": 2, "sms": 1.5}}})
    assert good.status == 201
    assert good.body["settings"]["throttle"] == {"limit": 5, "windowSeconds": 60}
    fetched = await api.admin("GET", f"/v1/projects/{good.body['id']}")
    assert fetched.body == good.body
    bad = await api.admin("POST", "/v1/projects", json={
        "name": "", "settings": {"throttle": {"limit": -1},
                                 "rateLimits": {"fax": 1, "sms": -1, "push": 1e-300},
                                 "color": "red"}})
    assert bad.status == 400
    assert set(bad.fields) == {
        "name", "settings.throttle.limit", "settings.throttle.windowSeconds",
        "settings.rateLimits.fax", "settings.rateLimits.sms", "settings.rateLimits.push",
        "settings.color"}


async def test_a_throttle_window_is_at_most_a_year(api: Api) -> None:
    # A year (31,536,000 s) is the longest window a project may count sends over, as the
    # OpenAPI document says; one second more is a 400 naming the field.
    year = await api.admin("POST", "/v1/projects", json={
        "name": "p", "settings": {"throttle": {"limit": 5, "windowSeconds": 31_536_000}}})
    assert year.status == 201, year.body
    assert year.body["settings"]["throttle"] == {"limit": 5, "windowSeconds": 31_536_000}
    longer = await api.admin("POST", "/v1/projects", json={
        "name": "p", "settings": {"throttle": {"limit": 5, "windowSeconds": 31_536_001}}})
    assert (longer.status, longer.fields) == (400, ["settings.throttle.windowSeconds"])


async def test_a_whole_number_written_with_a_fraction_part_is_a_whole_number(api: Api) -> None:
    # JSON has one number type: 60.0 is the integer 60, as the OpenAPI document's "integer"
    # (JSON Schema) has it. A fraction is still refused.
    made = await api.admin("POST", "/v1/projects", json={
        "name": "p", "settings": {"throttle": {"limit": 5.0, "windowSeconds": 60.0}}})
    assert made.status == 201, made.body
    assert made.body["settings"]["throttle"] == {"limit": 5, "windowSeconds": 60}
    assert isinstance(made.body["settings"]["throttle"]["windowSeconds"], int)
    half = await api.admin("POST", "/v1/projects", json={
        "name": "p", "settings": {"throttle": {"limit": 5, "windowSeconds": 60.5}}})
    assert (half.status, half.fields) == (400, ["settings.throttle.windowSeconds"])


async def test_null_settings_are_no_settings(api: Api) -> None:
    # Every other optional field takes null for "not given"; settings does too.
    created = await api.admin("POST", "/v1/projects", json={"name": "p", "settings": None})
    assert (created.status, created.body["settings"]) == (201, {}), created.body
    wrong = await api.admin("POST", "/v1/projects", json={"name": "p", "settings": []})
    assert (wrong.status, wrong.fields) == (400, ["settings"])


async def test_a_project_may_turn_the_deployment_throttle_off(api: Api) -> None:
    # THROTTLE_LIMIT applies to every project that sets no throttle; limit 0 opts one out.
    off = await api.admin("POST", "/v1/projects", json={
        "name": "p", "settings": {"throttle": {"limit": 0, "windowSeconds": 60}}})
    assert off.status == 201, off.body
    assert off.body["settings"]["throttle"] == {"limit": 0, "windowSeconds": 60}


async def test_names_of_spaces_alone_are_refused(api: Api) -> None:
    """A project, key, event, topic or campaign named '   ' shows as nothing in every list:
    a 400 naming the field, as an empty name is."""
    blank = await api.admin("POST", "/v1/projects", json={"name": "   "})
    assert (blank.status, blank.fields) == (400, ["name"])
    assert blank.body["error"]["details"][0]["message"] == "must not be blank"
    project = await api.project("blanks")
    key = await api.admin("POST", f"/v1/projects/{project.id}/keys",
                          json={"role": "send", "name": " \t"})
    assert (key.status, key.fields) == (400, ["name"])
    event = await api.call("POST", "/v1/events", key=project.full,
                           json={"name": "  ", "userId": "u1"})
    assert (event.status, event.fields) == (400, ["name"])
    template = await api.call("PUT", "/v1/templates/t", key=project.full,
                              json={"topic": " ", "channels": {"sms": {"text": "x"}}})
    assert (template.status, template.fields) == (400, ["topic"])
    await api.call("PUT", "/v1/templates/t", key=project.full,
                   json={"channels": {"sms": {"text": "x"}}})
    send = await api.call("POST", "/v1/notifications", key=project.send,
                          json={"to": "u1", "template": "t", "campaignId": "  "})
    assert (send.status, send.fields) == (400, ["campaignId"])
    named = await api.admin("POST", "/v1/projects", json={"name": " Acme "})
    assert named.status == 201  # spaces around a name are the caller's to keep


async def test_admin_key_is_not_a_project_key(api: Api) -> None:
    assert (await api.call("GET", "/v1/users/u", key=ADMIN + "x")).status == 401


async def test_an_admin_key_longer_than_any_project_key_is_still_the_admin_key(
    api_settings: Settings,
) -> None:
    """The settings take an admin key of any length from 16 characters; the cap that spares
    the key lookup a hash of kilobytes applies to project keys (``nk_`` and 43 characters),
    not to the one key compared as it is."""
    admin = "a" * 600
    async with running_api(api_settings.replace(admin_key=admin)) as api:
        created = await api.call("POST", "/v1/projects", key=admin, json={"name": "long"})
        assert created.status == 201, created.body
        project = created.body["id"]
        got = await api.call("GET", "/v1/users/u", key=admin, project=project)
        assert got.status == 404, got.body
        # One character more or less is no admin key, and no project key either.
        for wrong in (admin + "a", admin[:-1]):
            refused = await api.call("POST", "/v1/projects", key=wrong, json={"name": "x"})
            assert (refused.status, refused.error["code"]) == (401, "invalid_api_key")


async def test_the_key_cache_is_cleared_when_the_revocation_subscription_drops(
    api_settings: Settings, redis: Redis, db: asyncpg.Pool
) -> None:
    """A revocation published while the subscription is down would be missed, so a process
    that loses it forgets every cached key and trusts its cache again only once resubscribed."""
    name = f"api-{api_settings.namespace}"
    client = Redis.from_url(api_settings.redis_url, client_name=name)
    _server, http = await start_api(api_settings, redis=client)
    hub = http.app[HUB]
    try:
        api = Api(http, api_settings)
        project = await api.project()
        assert (await api.call("GET", "/v1/messages", key=project.full)).status == 200
        await api.call("PUT", "/v1/users/u1", key=project.full, json={})
        stream = await http.get("/v1/users/u1/inbox/stream",
                                headers={"Authorization": f"Bearer {project.full}"})
        assert await stream.content.readuntil(b"\n\n") == b"retry: 3000\n: connected\n\n"
        # Revoked in PostgreSQL only: the cached key still works while the cache is trusted.
        await db.execute("UPDATE project_api_keys SET revoked_at = now() WHERE role = 'full'")
        assert (await api.call("GET", "/v1/messages", key=project.full)).status == 200

        clients = await redis.client_list()
        ids = [c["id"] for c in clients if c.get("name") == name and "P" in c.get("flags", "")]
        assert ids, "the hub's pub/sub connection was not found"
        for client_id in ids:
            await redis.client_kill_filter(_id=client_id)
        for _ in range(500):  # the hub notices the drop (bounded: 500 x 10 ms)
            if not hub.live.is_set():
                break
            await asyncio.sleep(0.01)
        assert (await api.call("GET", "/v1/messages", key=project.full)).status == 401
        # The stream opened with that key ends too: its revocation may have been missed.
        rest = await asyncio.wait_for(stream.content.read(), 5)
        assert b"event: message" not in rest
        stream.release()
        await asyncio.wait_for(hub.live.wait(), 10)  # and resubscribes
        assert (await api.call("GET", "/v1/messages", key=project.full)).status == 401
    finally:
        await http.close()
        await client.aclose()


async def test_a_route_that_takes_no_body_refuses_one_with_fields(
    api: Api, project: Project,
) -> None:
    # Whoever sent fields expected them to count: a 400 naming the body, and nothing done.
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    refused = await api.call("DELETE", "/v1/users/u1", key=project.full,
                             json={"keepContacts": True})
    assert (refused.status, refused.fields) == (400, ["body"])
    assert (await api.call("GET", "/v1/users/u1", key=project.full)).status == 200
    nothings: tuple[dict[str, object] | None, ...] = (None, {})  # no body at all, and {}
    for nothing in nothings:
        read = await api.call("POST", f"/v1/users/u1/inbox/{uuid.uuid4()}/read",
                              key=project.full, json=nothing)
        assert read.status == 404, nothing  # the route ran: no such message
    assert (await api.call("DELETE", "/v1/users/u1", key=project.full,
                           data=b" null ")).status == 204
    # A GET's too: filters sent in a body would otherwise quietly list everything.
    for path in ("/v1/messages", "/v1/users/u1"):
        listed = await api.call("GET", path, key=project.full, json={"userId": "u1"})
        assert (listed.status, listed.fields) == (400, ["body"]), path
        plain = await api.call("GET", path, key=project.full, json={})
        assert plain.status == (200 if path == "/v1/messages" else 404), path


async def test_a_body_that_stops_arriving_is_a_408_and_a_slow_one_is_read(
    api: Api, project: Project, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Given a chunked body whose sender stops before its end, the API answers 408 naming the
    body once nothing has come for the idle limit (the handler waited for ever, holding its
    connection); a body that keeps arriving, however slowly, is read to its end."""
    monkeypatch.setattr(validation, "BODY_IDLE_TIMEOUT_S", 0.3)
    runner = web.AppRunner(create_app(api.settings), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    head = (b"POST /v1/events HTTP/1.1\r\nHost: x\r\n"
            b"Authorization: Bearer " + project.full.encode() + b"\r\n"
            b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    body = b'{"name": "e", "userId": "u1"}'
    try:
        port = runner.addresses[0][1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head + b"4\r\n" + body[:4] + b"\r\n")
        await writer.drain()
        stalled = await asyncio.wait_for(reader.readuntil(b"}]}}"), 10)
        writer.close()

        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head)
        for i in range(0, len(body), 2):  # two bytes every 0.1 s: 1.5 s in all
            writer.write(b"2\r\n" + body[i:i + 2].ljust(2) + b"\r\n")
            await writer.drain()
            await asyncio.sleep(0.1)
        writer.write(b"0\r\n\r\n")
        slow = await asyncio.wait_for(reader.readuntil(b'"accepted"}'), 10)
        writer.close()
    finally:
        await runner.cleanup()
    status_line, _, rest = stalled.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 408 Request Timeout", stalled
    error = json.loads(rest.partition(b"\r\n\r\n")[2])["error"]
    assert (error["code"], [d["field"] for d in error["details"]]) == (
        "request_timeout", ["body"])
    assert slow.startswith(b"HTTP/1.1 202"), slow


async def test_the_408_comes_once_the_idle_limit_has_passed_not_a_second_one_later(
    api: Api, project: Project, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Given a body that stops right after its headers and a clock on which each check of the
    body finds another half of the idle limit gone, when the limit is reached, then the
    answer is the 408 (it came only after twice the limit, 60 s for a promised 30 s: the
    first window never counted, however little had arrived)."""
    ticks = iter(range(0, 1000))
    monkeypatch.setattr(validation, "_clock",
                        lambda: next(ticks) * validation.BODY_IDLE_TIMEOUT_S / 2)
    monkeypatch.setattr(validation, "BODY_POLL_S", 0.05)
    runner = web.AppRunner(create_app(api.settings), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", runner.addresses[0][1])
        writer.write(b"POST /v1/events HTTP/1.1\r\nHost: x\r\n"
                     b"Authorization: Bearer " + project.full.encode() + b"\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 40\r\n\r\n{\"na")
        await writer.drain()
        stalled = await asyncio.wait_for(reader.readuntil(b"}]}}"), 10)
        writer.close()
    finally:
        await runner.cleanup()
    assert stalled.startswith(b"HTTP/1.1 408 Request Timeout"), stalled
    assert b"nothing came for 30 s" in stalled, stalled
