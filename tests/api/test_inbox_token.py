"""Inbox tokens: a user's browser reads that user's inbox with ``?token=``, never a project
key (a browser's EventSource cannot send an Authorization header)."""

from __future__ import annotations

import asyncio
import json
import time

import asyncpg
import pytest
from redis.asyncio import Redis

from notifkit.inbox_token import InvalidInboxToken, make_inbox_token, verify_inbox_token
from notifkit.keys import Keys
from notifkit.unsubscribe import make_token
from tests.api.conftest import Api, Project

from .test_inbox import add_message, read_message


async def token_for(api: Api, project: Project, user: str, **body: int) -> str:
    made = await api.call("POST", f"/v1/users/{user}/inbox/token", key=project.full,
                          json=body or None)
    assert made.status == 201, made.body
    assert made.body["userId"] == user
    token: str = made.body["token"]
    return token


async def test_a_token_reads_its_users_inbox_marks_read_and_streams(
    api: Api, project: Project, db: asyncpg.Pool, redis: Redis,
) -> None:
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    message = await add_message(db, project.id, "u1", "t1", "2030-01-01T00:00:01Z")
    token = await token_for(api, project, "u1")

    listed = await api.call("GET", "/v1/users/u1/inbox", params={"token": token})
    read = await api.call("POST", f"/v1/users/u1/inbox/{message}/read",
                          params={"token": token})
    unread = await api.call("GET", "/v1/users/u1/inbox",
                            params={"token": token, "unread": "true"})

    assert [m["id"] for m in listed.body["items"]] == [message]
    assert read.status == 204
    assert unread.body["items"] == []
    channel = Keys(api.settings.namespace).inbox_channel(project.id, "u1")
    async with api.client.get("/v1/users/u1/inbox/stream", params={"token": token}) as stream:
        assert stream.status == 200
        assert await stream.content.readuntil(b"\n\n") == b"retry: 3000\n: connected\n\n"
        await redis.publish(channel, json.dumps({"id": "m1", "text": "hello"}))
        assert (await read_message(stream))["data"] == {"id": "m1", "text": "hello"}


async def test_a_stream_opened_with_a_token_ends_when_the_token_expires(
    api: Api, project: Project, redis: Redis,
) -> None:
    """A token grants the inbox until its expiry, the stream too: one opened just before
    would otherwise go on forwarding the user's messages for as long as the connection
    lasts. It ends then, and the client's reconnect with the token is refused (401), so the
    page asks its backend for a new one."""
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    token = make_inbox_token(api.settings.secret, project.id, "u1", int(time.time()) + 2, None)
    channel = Keys(api.settings.namespace).inbox_channel(project.id, "u1")
    async with api.client.get("/v1/users/u1/inbox/stream", params={"token": token}) as stream:
        assert stream.status == 200
        await redis.publish(channel, json.dumps({"id": "m1", "text": "before"}))
        assert (await read_message(stream))["data"] == {"id": "m1", "text": "before"}
        rest = await asyncio.wait_for(stream.content.read(), 10)  # to the end of the stream
    assert b"event: message" not in rest
    again = await api.call("GET", "/v1/users/u1/inbox/stream", params={"token": token})
    assert (again.status, again.body["error"]["code"]) == (401, "invalid_token")


async def test_a_walk_goes_on_with_a_renewed_token(
    api: Api, project: Project, db: asyncpg.Pool,
) -> None:
    """A cursor belongs to its list, and the token only says who asks: a page that renewed its
    token mid-walk goes on where it was, with the key as much as with the new token."""
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    for n in range(3):
        await add_message(db, project.id, "u1", f"t{n}", f"2030-01-01T00:00:0{n}Z")
    first = await api.call("GET", "/v1/users/u1/inbox",
                           params={"token": await token_for(api, project, "u1"), "limit": "1"})
    renewed = await token_for(api, project, "u1")
    rest = await api.call("GET", "/v1/users/u1/inbox",
                          params={"token": renewed, "cursor": first.body["nextCursor"]})
    assert [m["taskId"] for m in first.body["items"] + rest.body["items"]] == ["t2", "t1", "t0"]
    keyed = await api.call("GET", "/v1/users/u1/inbox", key=project.full,
                           params={"cursor": first.body["nextCursor"]})
    assert [m["taskId"] for m in keyed.body["items"]] == ["t1", "t0"]


async def test_a_token_opens_no_other_users_inbox_and_no_other_route(
    api: Api, project: Project,
) -> None:
    for user in ("u1", "u2"):
        await api.call("PUT", f"/v1/users/{user}", key=project.full, json={})
    token = await token_for(api, project, "u1")

    other = await api.call("GET", "/v1/users/u2/inbox", params={"token": token})
    profile = await api.call("GET", "/v1/users/u1", params={"token": token})
    mint = await api.call("POST", "/v1/users/u1/inbox/token", params={"token": token})

    assert other.status == 403
    # Elsewhere a token is no credential: no key was sent at all
    assert (profile.status, profile.body["error"]["code"]) == (401, "missing_api_key")
    assert mint.status == 401


async def test_another_projects_token_finds_nothing_of_this_one(
    api: Api, project: Project,
) -> None:
    other = await api.project("other")
    for owner in (project, other):
        await api.call("PUT", "/v1/users/u1", key=owner.full, json={})
    token = await token_for(api, other, "u1")

    listed = await api.call("GET", "/v1/users/u1/inbox", params={"token": token})

    assert listed.status == 200
    assert listed.body["items"] == []  # the other project's u1, whose inbox is empty


@pytest.mark.parametrize("forged", ["expired", "altered", "unsubscribe", "garbage"])
async def test_a_token_this_deployment_did_not_sign_or_that_expired_is_a_401(
    api: Api, project: Project, forged: str,
) -> None:
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    secret = api.settings.secret
    token = {
        "expired": make_inbox_token(secret, project.id, "u1", int(time.time()) - 1, None),
        "altered": make_inbox_token(secret, project.id, "u1", int(time.time()) + 60, None)[:-2]
        + "AA",
        # An unsubscribe link's token is signed by the same secret, for another purpose.
        "unsubscribe": make_token(secret, project.id, "u1", "email", None),
        "garbage": "not a token",
    }[forged]

    reply = await api.call("GET", "/v1/users/u1/inbox", params={"token": token})

    assert (reply.status, reply.body["error"]["code"]) == (401, "invalid_token")


async def test_a_token_with_a_key_or_given_twice_is_a_400(api: Api, project: Project) -> None:
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    token = await token_for(api, project, "u1")

    both = await api.call("GET", "/v1/users/u1/inbox", key=project.full,
                          params={"token": token})

    assert (both.status, both.fields) == (400, ["token"])
    twice = await api.call("GET", f"/v1/users/u1/inbox?token={token}&token={token}")
    assert (twice.status, twice.fields) == (400, ["token"])


async def test_minting_takes_a_life_and_needs_a_full_key_and_a_user(
    api: Api, project: Project,
) -> None:
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    before = time.time()
    made = await api.call("POST", "/v1/users/u1/inbox/token", key=project.full,
                          json={"ttlSeconds": 120})
    too_long = await api.call("POST", "/v1/users/u1/inbox/token", key=project.full,
                              json={"ttlSeconds": 8 * 86_400})
    unknown = await api.call("POST", "/v1/users/u1/inbox/token", key=project.full,
                             json={"ttl": 60})
    by_send_key = await api.call("POST", "/v1/users/u1/inbox/token", key=project.send)
    nobody = await api.call("POST", "/v1/users/ghost/inbox/token", key=project.full)

    assert made.status == 201
    expires = made.body["expiresAt"]
    assert before + 119 <= _epoch(expires) <= time.time() + 121
    assert (too_long.status, too_long.fields) == (400, ["ttlSeconds"])
    assert (unknown.status, unknown.fields) == (400, ["ttl"])
    assert by_send_key.status == 403
    assert nobody.status == 404


@pytest.mark.parametrize(("body", "life"), [
    (None, 3600),                  # none asked: an hour
    ({"ttlSeconds": 60}, 60),      # a minute at least
    ({"ttlSeconds": 604_800}, 604_800),  # and a week at most
    ({"ttlSeconds": 59}, None),
    ({"ttlSeconds": 604_801}, None),
])
async def test_a_token_lives_a_minute_to_a_week_and_an_hour_unless_asked(
    api: Api, project: Project, body: dict[str, int] | None, life: int | None,
) -> None:
    """The bounds and default README gives: a life outside them is a 400 naming ttlSeconds,
    and a token minted without one expires an hour on."""
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    before = int(time.time())
    made = await api.call("POST", "/v1/users/u1/inbox/token", key=project.full, json=body)
    if life is None:
        assert (made.status, made.fields) == (400, ["ttlSeconds"])
        return
    assert made.status == 201, made.body
    # expiresAt is whole seconds of the clock read while minting, between these two reads.
    assert before + life <= _epoch(made.body["expiresAt"]) <= time.time() + life


def test_a_token_is_good_until_its_expiry_and_not_at_it() -> None:
    """The boundary, on the clock the caller passes (the API passes the wall clock)."""
    secret = "inbox-token-test-secret-0123"
    token = make_inbox_token(secret, "p1", "u1", 1_000, None)

    assert verify_inbox_token(secret, token, 999.9).user_id == "u1"
    with pytest.raises(InvalidInboxToken, match="expired"):
        verify_inbox_token(secret, token, 1_000)
    with pytest.raises(InvalidInboxToken, match="bad signature"):
        verify_inbox_token("another-secret-0123456789", token, 999)


def _epoch(text: str) -> float:
    from datetime import datetime
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


async def test_a_page_on_another_origin_may_read_what_its_token_asked(
    api: Api, project: Project,
) -> None:
    """EventSource and fetch from the user's page, on another origin than the API: the
    browser shows the page the answer (and why a token was refused) only with CORS."""
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    token = await token_for(api, project, "u1")
    origin = {"Origin": "https://app.example.com"}

    listed = await api.call("GET", "/v1/users/u1/inbox", params={"token": token},
                            headers=origin)
    refused = await api.call("GET", "/v1/users/u1/inbox", params={"token": "x.y"},
                             headers=origin)
    keyed = await api.call("GET", "/v1/users/u1/inbox", key=project.full, headers=origin)
    async with api.client.get("/v1/users/u1/inbox/stream", params={"token": token},
                              headers=origin) as stream:
        streamed = stream.headers.get("Access-Control-Allow-Origin")

    assert listed.headers.get("Access-Control-Allow-Origin") == "*"
    assert refused.headers.get("Access-Control-Allow-Origin") == "*"
    assert streamed == "*"
    # A project key is for backends: its answers are not opened to pages
    assert "Access-Control-Allow-Origin" not in keyed.headers


async def test_a_token_opens_nothing_once_its_user_id_is_given_to_a_new_user(
    api: Api, project: Project, db: asyncpg.Pool,
) -> None:
    """User ids are the caller's, and may be given again: a token made for a user erased
    since must not read the inbox of the next user of the id (unsubscribe links guard the
    same way). The old token is a 401, as an expired one; a new token reads the new inbox."""
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    old = await token_for(api, project, "u1")
    assert (await api.call("DELETE", "/v1/users/u1", key=project.full)).status == 204
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    message = await add_message(db, project.id, "u1", "t1", "2030-01-01T00:00:01Z")

    for method, path in (("GET", "/v1/users/u1/inbox"),
                         ("POST", f"/v1/users/u1/inbox/{message}/read"),
                         ("GET", "/v1/users/u1/inbox/stream")):
        refused = await api.call(method, path, params={"token": old})
        assert (refused.status, refused.body["error"]["code"]) == (401, "invalid_token"), path
        assert "earlier user" in refused.body["error"]["message"]
    assert await db.fetchval("SELECT read_at FROM inapp_messages WHERE id = $1",
                             message) is None  # the refused mark-read changed nothing
    new = await token_for(api, project, "u1")
    listed = await api.call("GET", "/v1/users/u1/inbox", params={"token": new})
    assert [m["id"] for m in listed.body["items"]] == [message]


async def test_an_erased_users_open_streams_end(api: Api, project: Project) -> None:
    """A stream open when its user is erased ends (in every API process: the erasure is
    published on the user's channel), whether a token or a key opened it: else it would go
    on with the messages of a user created again under the id."""
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    token = await token_for(api, project, "u1")
    async with api.client.get("/v1/users/u1/inbox/stream", params={"token": token}) as by_token, \
            api.client.get("/v1/users/u1/inbox/stream",
                           headers={"Authorization": f"Bearer {project.full}"}) as by_key:
        for stream in (by_token, by_key):
            assert stream.status == 200
            assert await stream.content.readuntil(b"\n\n") == b"retry: 3000\n: connected\n\n"
        assert (await api.call("DELETE", "/v1/users/u1", key=project.full)).status == 204
        for stream in (by_token, by_key):
            rest = await asyncio.wait_for(stream.content.read(), 10)  # to the end
            assert b"event: message" not in rest
