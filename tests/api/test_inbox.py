"""The in-app inbox: listing, marking read, and the server-sent-event stream."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.keys import Keys
from notifkit.services.api import pubsub
from notifkit.services.api.routes import inbox
from notifkit.services.api.state import HUB
from notifkit.streams import decode
from tests.api.conftest import Api, Project, running_api
from tests.support.streams import xrange


async def add_message(db: asyncpg.Pool, project: str, user: str, task: str, at: str,
                      read: bool = False) -> str:
    return str(await db.fetchval(
        "INSERT INTO inapp_messages (project_id, user_id, task_id, event_id, content, "
        "created_at, read_at) VALUES ($1, $2, $3, gen_random_uuid(), $4, "
        "$5::text::timestamptz, CASE WHEN $6 THEN now() END) RETURNING id",
        project, user, task, {"text": f"message {task}"}, at, read))


async def test_listing_unread_and_marking_read(
    api: Api, project: Project, db: asyncpg.Pool
) -> None:
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    ids = [await add_message(db, project.id, "u1", f"t{i}", f"2030-01-01T00:00:0{i}Z",
                             read=i == 0) for i in range(4)]
    everything = await api.call("GET", "/v1/users/u1/inbox", key=project.full)
    assert everything.status == 200
    assert [m["taskId"] for m in everything.body["items"]] == ["t3", "t2", "t1", "t0"]
    assert everything.body["items"][0]["content"] == {"text": "message t3"}
    # The same fields as the live stream's events, whose items name the user too.
    assert {m["userId"] for m in everything.body["items"]} == {"u1"}
    unread = await api.call("GET", "/v1/users/u1/inbox", key=project.full,
                            params={"unread": "true"})
    assert [m["taskId"] for m in unread.body["items"]] == ["t3", "t2", "t1"]
    paged = await api.call("GET", "/v1/users/u1/inbox", key=project.full,
                           params={"limit": "2"})
    rest = await api.call("GET", "/v1/users/u1/inbox", key=project.full,
                          params={"limit": "2", "cursor": paged.body["nextCursor"]})
    assert [m["taskId"] for m in rest.body["items"]] == ["t1", "t0"]
    assert rest.body["nextCursor"] is None

    read = await api.call("POST", f"/v1/users/u1/inbox/{ids[3]}/read", key=project.full)
    assert read.status == 204
    unread = await api.call("GET", "/v1/users/u1/inbox", key=project.full,
                            params={"unread": "true"})
    assert [m["taskId"] for m in unread.body["items"]] == ["t2", "t1"]
    elsewhere = await api.call("POST", f"/v1/users/u2/inbox/{ids[2]}/read", key=project.full)
    assert elsewhere.status == 404
    # Another user's message: unknown for this user, not said to be missing from the project.
    assert elsewhere.error["message"] == f"No in-app message {ids[2]!r} exists for user 'u2'."
    assert (await api.call("GET", "/v1/users/ghost/inbox", key=project.full)).status == 404
    bad = await api.call("GET", "/v1/users/u1/inbox", key=project.full,
                         params={"unread": "maybe"})
    assert bad.fields == ["unread"]


async def test_marking_read_queues_the_messages_open_for_the_events_service(
    api: Api, project: Project, db: asyncpg.Pool, redis: Redis
) -> None:
    """A read is the in-app channel's ``opened`` receipt, named by the message as a provider
    names its own: the first read's time, and the same ``webhookId`` on every call, so a
    repeat (or a retry after Redis failed) is the same receipt."""
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    message = await add_message(db, project.id, "u1", "t1", "2030-01-01T00:00:01Z")
    for _ in range(2):
        reply = await api.call("POST", f"/v1/users/u1/inbox/{message}/read", key=project.full)
        assert reply.status == 204
    receipts = [decode(fields) for _id, fields in
                await xrange(redis, Keys(api.settings.namespace).events_inbound)]
    read_at = await db.fetchval("SELECT read_at FROM inapp_messages WHERE id = $1", message)
    assert receipts[0] == {
        "type": "receipt", "projectId": project.id, "provider": "inapp", "channel": "inapp",
        "providerMessageId": message, "taskId": "t1", "kind": "opened",
        "at": read_at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "webhookId": f"inapp:read:{message}",
    }
    assert receipts == [receipts[0]] * 2
    missing = await api.call("POST", f"/v1/users/u2/inbox/{message}/read", key=project.full)
    assert missing.status == 404
    assert len(await xrange(redis, Keys(api.settings.namespace).events_inbound)) == 2


async def test_an_unread_filter_left_empty_lists_every_message(
    api: Api, project: Project, db: asyncpg.Pool
) -> None:
    """``?unread=`` (a form's unticked box, a URL template left unfilled) is no filter: read
    and unread messages alike, as without the parameter, not a 400."""
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    await add_message(db, project.id, "u1", "t1", "2030-01-01T00:00:01Z", read=True)
    await add_message(db, project.id, "u1", "t2", "2030-01-01T00:00:02Z")
    reply = await api.call("GET", "/v1/users/u1/inbox?unread=&limit=", key=project.full)
    assert reply.status == 200, reply.body
    assert [m["taskId"] for m in reply.body["items"]] == ["t2", "t1"]


async def test_every_bad_inbox_query_parameter_is_named_in_one_400(
    api: Api, project: Project
) -> None:
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    reply = await api.call("GET", "/v1/users/u1/inbox", key=project.full,
                           params={"unread": "maybe", "limit": "0", "cursor": "garbage"})
    assert reply.status == 400
    assert sorted(reply.fields) == ["cursor", "limit", "unread"]


async def test_the_stream_forwards_published_messages_and_heartbeats(
    api: Api, project: Project, redis: Redis
) -> None:
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    channel = Keys(api.settings.namespace).inbox_channel(project.id, "u1")
    other = Keys(api.settings.namespace).inbox_channel(project.id, "u2")
    async with api.client.get("/v1/users/u1/inbox/stream",
                              headers={"Authorization": f"Bearer {project.full}"}) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/event-stream"
        assert await response.content.readuntil(b"\n\n") == b"retry: 3000\n: connected\n\n"
        await redis.publish(other, json.dumps({"id": "not-mine"}))
        await redis.publish(channel, json.dumps({"id": "m1", "text": "hello"}))
        frames: list[bytes] = []
        while not any(b"event: message" in f for f in frames):
            frames.append(await asyncio.wait_for(response.content.readuntil(b"\n\n"), 10))
        message = next(f for f in frames if b"event: message" in f)
        # its id is not a message id an SSE client could resume from: no id line
        assert message == b'event: message\ndata: {"id": "m1", "text": "hello"}\n\n'
        # The fixture's heartbeat is 0.2 s: a comment frame arrives on an idle stream.
        heartbeat = await asyncio.wait_for(response.content.readuntil(b"\n\n"), 10)
        assert heartbeat == b": heartbeat\n\n"


async def test_revoking_a_key_ends_the_streams_it_opened(
    api: Api, project: Project, redis: Redis
) -> None:
    """A stream opened before its key was revoked must not go on delivering the user's
    messages: the revocation ends it (the client's reconnect then gets a 401), while a
    stream opened with another key of the project carries on."""
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    made = await api.admin("POST", f"/v1/projects/{project.id}/keys", json={"role": "full"})
    channel = Keys(api.settings.namespace).inbox_channel(project.id, "u1")

    def stream(key: str) -> Any:
        return api.client.get("/v1/users/u1/inbox/stream",
                              headers={"Authorization": f"Bearer {key}"})

    async with stream(made.body["key"]) as doomed, stream(project.full) as kept:
        for response in (doomed, kept):
            assert await response.content.readuntil(b"\n\n") == b"retry: 3000\n: connected\n\n"
        revoked = await api.admin("DELETE", f"/v1/keys/{made.body['id']}")
        assert revoked.status == 204
        rest = await asyncio.wait_for(doomed.content.read(), 2)  # to the end of the stream
        assert b"event: message" not in rest
        await redis.publish(channel, json.dumps({"id": "m1"}))
        frames: list[bytes] = []
        while not any(b"event: message" in f for f in frames):
            frames.append(await asyncio.wait_for(kept.content.readuntil(b"\n\n"), 10))
    again = await api.call("GET", "/v1/users/u1/inbox/stream", key=made.body["key"])
    assert again.status == 401


async def read_message(response: Any) -> dict[str, Any]:
    """The next ``message`` event: its id line and data, heartbeats skipped."""
    async with asyncio.timeout(10):
        frame = b""
        while b"event: message" not in frame:
            frame = await response.content.readuntil(b"\n\n")
    fields = dict(line.split(": ", 1) for line in frame.decode().strip().split("\n"))
    return {"id": fields.get("id"), "data": json.loads(fields["data"])}


async def test_a_reconnecting_stream_first_sends_what_it_missed_then_live_messages(
    api: Api, project: Project, redis: Redis, db: asyncpg.Pool
) -> None:
    """An inbox client that lost its connection for a few seconds must not lose the messages
    stored meanwhile: EventSource reconnects with the last id it saw."""
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    await api.call("PUT", "/v1/users/u2", key=project.full, json={})
    # Given a client that saw message t0, then three more stored while it was away (and one
    # for another user)
    seen = await add_message(db, project.id, "u1", "t0", "2030-01-01T00:00:00Z")
    missed = [await add_message(db, project.id, "u1", f"t{i}", f"2030-01-01T00:00:0{i}Z")
              for i in (1, 2, 3)]
    await add_message(db, project.id, "u2", "other", "2030-01-01T00:00:02Z")
    channel = Keys(api.settings.namespace).inbox_channel(project.id, "u1")
    headers = {"Authorization": f"Bearer {project.full}", "Last-Event-ID": seen}
    # When it reconnects with the last event id it saw
    async with api.client.get("/v1/users/u1/inbox/stream", headers=headers) as response:
        assert response.status == 200
        assert await response.content.readuntil(b"\n\n") == b"retry: 3000\n: connected\n\n"
        # Then it gets the three it missed, oldest first, each with its id as the event id
        replayed = [await read_message(response) for _ in missed]
        assert [m["id"] for m in replayed] == missed
        assert [m["data"]["taskId"] for m in replayed] == ["t1", "t2", "t3"]
        assert replayed[0]["data"]["userId"] == "u1"
        assert replayed[0]["data"]["content"] == {"text": "message t1"}
        # and a message announced again after the backlog was read comes once, not twice,
        # while a new one comes live with its id
        fresh = await add_message(db, project.id, "u1", "t4", "2030-01-01T00:00:04Z")
        await redis.publish(channel, json.dumps({"id": missed[2], "taskId": "t3"}))
        await redis.publish(channel, json.dumps({"id": fresh, "taskId": "t4"}))
        live = await read_message(response)
        assert (live["id"], live["data"]["taskId"]) == (fresh, "t4")


async def test_a_last_event_id_that_is_no_message_id_is_a_400_naming_it(
    api: Api, project: Project, db: asyncpg.Pool
) -> None:
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    reply = await api.call("GET", "/v1/users/u1/inbox/stream", key=project.full,
                           headers={"Last-Event-ID": "garbage"})
    assert reply.status == 400
    assert reply.fields == ["Last-Event-ID"]


async def test_a_stream_asked_for_while_the_subscription_is_down_is_a_503_not_a_deaf_stream(
    api_settings: Settings,
) -> None:
    """While the process's pub/sub subscription is down (Redis just came back, the hub has
    not resubscribed yet) a stream would be opened that hears nothing published until the
    hub is back, and nothing ever ends it for its client to resume: it is a 503 to retry."""
    async with running_api(api_settings, sse_live_wait_s=0.2) as api:
        project = await api.project()
        await api.call("PUT", "/v1/users/u1", key=project.full, json={})
        api.client.app[HUB].live.clear()  # as the hub's loop does when its connection drops

        async with api.client.get("/v1/users/u1/inbox/stream", headers={
                "Authorization": f"Bearer {project.full}"}) as response:
            assert response.status == 503
            assert (await response.json())["error"]["code"] == "service_unavailable"
            assert response.headers["Retry-After"] == "1"


async def test_a_stream_waits_for_the_subscription_then_resumes_what_was_stored_meanwhile(
    api: Api, project: Project, db: asyncpg.Pool
) -> None:
    """A reconnect that arrives before the subscription is back waits for it, and then
    replays from its Last-Event-ID everything stored until then."""
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    seen = await add_message(db, project.id, "u1", "t0", "2030-01-01T00:00:00Z")
    hub = api.client.app[HUB]
    hub.live.clear()
    headers = {"Authorization": f"Bearer {project.full}", "Last-Event-ID": seen}
    async with asyncio.TaskGroup() as tasks:
        opening = tasks.create_task(api.client.get("/v1/users/u1/inbox/stream",
                                                   headers=headers))
        stored = await add_message(db, project.id, "u1", "t1", "2030-01-01T00:00:01Z")
        hub.live.set()
    async with opening.result() as response:
        assert response.status == 200
        assert await response.content.readuntil(b"\n\n") == b"retry: 3000\n: connected\n\n"
        assert (await read_message(response))["id"] == stored


async def test_a_stream_that_falls_behind_ends_for_its_client_to_resume_without_a_gap(
    api: Api, project: Project, db: asyncpg.Pool
) -> None:
    """A client reading more slowly than its messages come in fills its stream's queue: the
    oldest queued messages were dropped, so the client went on reading with a gap it could
    not see. The stream ends instead, and the client's reconnect with the last id it saw
    replays the rest, each message once."""
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    count = pubsub.QUEUE_SIZE + 50
    ids = [str(i) for i in await db.fetchval(
        "WITH made AS (INSERT INTO inapp_messages (project_id, user_id, task_id, event_id, "
        "content, created_at) SELECT $1, 'u1', 'fast-' || n, gen_random_uuid(), '{}', "
        "'2030-01-01T00:00:00Z'::timestamptz + n * interval '1 ms' "
        "FROM generate_series(1, $2) AS n RETURNING id, created_at) "
        "SELECT array_agg(id ORDER BY created_at) FROM made", project.id, count)]
    hub = api.client.app[HUB]
    channel = Keys(api.settings.namespace).inbox_channel(project.id, "u1")
    headers = {"Authorization": f"Bearer {project.full}"}
    async with api.client.get("/v1/users/u1/inbox/stream", headers=headers) as response:
        assert await response.content.readuntil(b"\n\n") == b"retry: 3000\n: connected\n\n"
        # All announced before the stream's handler gets to run again: more than its queue holds
        for message_id in ids:
            hub._handle({"type": "pmessage", "channel": channel,
                         "data": json.dumps({"id": message_id}).encode()})
        # The stream ends (its client reconnects), rather than skipping what it dropped
        rest_of_stream = await asyncio.wait_for(response.content.read(), 10)
    received = [frame.split(b"\n")[0].removeprefix(b"id: ").decode()
                for frame in rest_of_stream.split(b"\n\n") if b"event: message" in frame]
    # the oldest, as many as the queue holds, in order: no gap
    assert received == ids[:pubsub.QUEUE_SIZE]
    resumed = {**headers, "Last-Event-ID": received[-1]}
    async with api.client.get("/v1/users/u1/inbox/stream", headers=resumed) as response:
        assert await response.content.readuntil(b"\n\n") == b"retry: 3000\n: connected\n\n"
        rest = [(await read_message(response))["id"] for _ in ids[pubsub.QUEUE_SIZE:]]
    assert rest == ids[pubsub.QUEUE_SIZE:]


async def test_a_resume_longer_than_one_replay_ends_and_continues_without_a_gap(
    api: Api, project: Project, db: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that missed more than one replay holds got the oldest ones and then the live
    messages, skipping those in between for good (its next Last-Event-ID was a live one).
    The stream ends after a full replay instead, and the reconnect continues from there."""
    monkeypatch.setattr(inbox, "RESUME_LIMIT", 3)
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    seen = await add_message(db, project.id, "u1", "t0", "2030-01-01T00:00:00Z")
    missed = [await add_message(db, project.id, "u1", f"t{i}", f"2030-01-01T00:00:0{i}Z")
              for i in range(1, 6)]
    headers = {"Authorization": f"Bearer {project.full}", "Last-Event-ID": seen}
    async with api.client.get("/v1/users/u1/inbox/stream", headers=headers) as response:
        first = await asyncio.wait_for(response.content.read(), 10)  # the stream ends
    replayed = [frame.split(b"\n")[0].removeprefix(b"id: ").decode()
                for frame in first.split(b"\n\n") if b"event: message" in frame]
    assert replayed == missed[:3]
    headers["Last-Event-ID"] = replayed[-1]
    async with api.client.get("/v1/users/u1/inbox/stream", headers=headers) as response:
        assert [(await read_message(response))["id"] for _ in missed[3:]] == missed[3:]
