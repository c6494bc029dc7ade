"""Writes that race on one row: whichever comes second sees the first one's result, and no
interleaving of two requests is answered with a 500 or leaves a mix of both.

A second PostgreSQL session stands in for the other request: it takes the row's lock, the
request under test is left waiting on it, and the session then does its write and commits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.db import logs
from notifkit.ids import uuid7
from notifkit.keys import Keys
from notifkit.services.api import idempotency
from notifkit.services.api.routes import dlq as dlq_routes
from notifkit.services.api.routes import inbox as inbox_routes
from notifkit.services.api.state import HUB
from notifkit.streams import xadd
from notifkit.unsubscribe import make_token
from tests.api.conftest import Api, Project
from tests.support.services import skip_unless_ci
from tests.support.sessions import schema_session
from tests.support.waiting import until, until_async


@pytest.fixture
async def other(api_settings: Settings) -> AsyncIterator[asyncpg.Connection]:
    """Another session on the test's schema."""
    async with schema_session(api_settings) as conn:
        yield conn


async def waiting_on_a_lock(conn: asyncpg.Connection) -> bool:
    """Whether some other session of the database is waiting for a lock."""
    return bool(await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND datname = current_database() AND pid <> pg_backend_pid()"))


async def test_a_user_put_that_finds_the_user_erased_under_it_creates_the_user_again(
    api: Api, project: Project, other: asyncpg.Connection,
) -> None:
    # Given a user
    made = await api.call("PUT", "/v1/users/u1", key=project.full, json={"segments": ["a"]})
    assert made.status == 201, made.body

    # And an erasure of that user that holds its row
    erasing = other.transaction()
    await erasing.start()
    await other.execute("SELECT 1 FROM users WHERE project_id = $1 AND id = 'u1' FOR UPDATE",
                        project.id)

    # When a PUT of the user comes in meanwhile, and the erasure then commits
    put = asyncio.create_task(api.call(
        "PUT", "/v1/users/u1", key=project.full,
        json={"segments": ["b"], "contacts": [{"channel": "email", "target": "b@example.com"}]}))
    await until_async(lambda: waiting_on_a_lock(other))
    await other.execute("DELETE FROM users WHERE project_id = $1 AND id = 'u1'", project.id)
    await erasing.commit()
    reply = await put

    # Then the PUT, coming second, created the user anew with what it sent
    assert reply.status == 201, reply.body
    assert reply.body["segments"] == ["b"]
    assert [c["target"] for c in reply.body["contacts"]] == ["b@example.com"]
    got = await api.call("GET", "/v1/users/u1", key=project.full)
    assert got.status == 200, got.body
    assert got.body["segments"] == ["b"]
    assert got.body["attributes"] == {}


async def test_two_replays_of_one_dlq_entry_leave_one_replayed_row(
    api: Api, project: Project, redis: Redis, db: asyncpg.Pool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys = Keys(api.settings.namespace)
    # Given a dead-lettered task of a notification
    event_id = uuid7()
    stream = keys.outbound("normal")
    entry = await xadd(redis, keys.dlq, {
        "stream": stream, "group": "notifkit:group:delivery", "entryId": "1-0",
        "service": "delivery", "error": "RuntimeError: boom", "attempts": 3,
        "failedAt": "2030-01-01T00:00:00Z", "projectId": project.id,
        "replayOf": f"{stream}/1-0",
        "payload": {"projectId": project.id, "eventId": event_id, "taskId": "t1",
                    "channel": "email", "userId": "u1"}}, 1000)

    # And a first replay held up once it has written the timeline's row
    written = asyncio.Event()
    go_on = asyncio.Event()
    real_insert = logs.insert_one
    calls = 0

    async def held_insert(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        first = calls == 1
        row_id = await real_insert(*args)
        if first:
            written.set()
            await go_on.wait()
        return row_id

    monkeypatch.setattr(dlq_routes, "insert_one", held_insert)
    first = asyncio.create_task(api.call("POST", f"/v1/dlq/{entry}/replay", key=project.full))
    await written.wait()

    # When a second replay of the entry runs to its end (or waits for the first), and the
    # first then goes on
    second = asyncio.create_task(api.call("POST", f"/v1/dlq/{entry}/replay", key=project.full))
    watcher = await asyncpg.connect(api.settings.database_url)
    try:
        await until_async(lambda: _done_or_waiting(second, watcher))
    finally:
        await watcher.close()
    go_on.set()
    replies = [await first, await second]

    # Then the entry went back once, and its timeline says so once
    assert sorted(r.status for r in replies) == [202, 404], [r.body for r in replies]
    assert await redis.xlen(stream) == 1
    assert await db.fetchval(
        "SELECT count(*) FROM message_logs WHERE event_id = $1 AND kind = 'replayed'",
        event_id) == 1


async def _done_or_waiting(task: asyncio.Task[Any], conn: asyncpg.Connection) -> bool:
    return task.done() or await waiting_on_a_lock(conn)


async def test_an_unsubscribe_that_finds_the_user_erased_under_it_still_suppresses(
    api: Api, project: Project, other: asyncpg.Connection, db: asyncpg.Pool,
) -> None:
    # Given a user
    made = await api.call("PUT", "/v1/users/u1", key=project.full, json={
        "contacts": [{"channel": "email", "target": "ada@example.com"}]})
    assert made.status == 201, made.body
    token = make_token(api.settings.secret or "", project.id, "u1", "email", "marketing",
                       "ada@example.com")

    # And an erasure of the user, not yet committed
    erasing = other.transaction()
    await erasing.start()
    await other.execute("DELETE FROM users WHERE project_id = $1 AND id = 'u1'", project.id)

    # When the user's unsubscribe link is followed meanwhile, and the erasure then commits
    clicked = asyncio.create_task(api.call("GET", "/v1/unsubscribe", params={"token": token}))
    await until_async(lambda: _done_or_waiting(clicked, other))
    await erasing.commit()
    reply = await clicked

    # Then the address is suppressed, and the erased user has no preferences left behind
    assert reply.status == 200, reply.body
    assert reply.body["suppressed"] is True
    assert await db.fetchval("SELECT count(*) FROM suppressions WHERE target = "
                             "'ada@example.com'") == 1
    assert await db.fetchval("SELECT count(*) FROM user_topic_preferences") == 0


async def test_a_retry_while_the_first_send_is_in_progress_gets_its_answer_though_the_template_went(
    api: Api, project: Project, other: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch,
    redis: Redis,
) -> None:
    made = await api.call("PUT", "/v1/templates/hello", key=project.full, json={
        "channels": {"email": {"subject": "s", "text": "t"}}})
    assert made.status == 201, made.body
    body = {"to": "u1", "template": "hello"}
    headers = {"x-idempotency-key": "k1"}
    # A Redis that has kept its data for over a day: no key is looked up in notifications
    # (which the lock below holds), so the send waits where it writes.
    seconds, _micros = await redis.time()
    await redis.set(Keys(api.settings.namespace).api_idempotency_since,
                    (seconds - 2 * 24 * 3600) * 1000)

    # Given a send with a key, held up in its acceptance by a lock on the table it writes
    held = other.transaction()
    await held.start()
    await other.execute("LOCK TABLE notifications IN ACCESS EXCLUSIVE MODE")
    first = asyncio.create_task(api.call("POST", "/v1/notifications", key=project.send,
                                         json=body, headers=headers))
    await until_async(lambda: waiting_on_a_lock(other))

    # And its template deleted meanwhile
    assert (await api.call("DELETE", "/v1/templates/hello", key=project.full)).status == 204

    # When the caller retries with the key before the first answer came, and the first then
    # goes through
    waited = asyncio.Event()
    real_pause = idempotency.pause

    async def pause() -> None:
        waited.set()
        await real_pause()

    monkeypatch.setattr(idempotency, "pause", pause)
    retry = asyncio.create_task(api.call("POST", "/v1/notifications", key=project.send,
                                         json=body, headers=headers))
    await until(lambda: retry.done() or waited.is_set())
    await held.rollback()
    accepted, again = await first, await retry

    # Then both got the one answer
    assert accepted.status == 202, accepted.body
    assert again.status == 202, again.body
    assert again.body["id"] == accepted.body["id"]
    assert again.headers["x-idempotent-replay"] == "true"


async def test_a_request_chosen_to_break_a_deadlock_is_told_to_retry(
    api: Api, project: Project, other: asyncpg.Connection,
) -> None:
    # Given a user with two addresses
    made = await api.call("PUT", "/v1/users/u1", key=project.full, json={"contacts": [
        {"channel": "email", "target": "a@example.com"},
        {"channel": "email", "target": "b@example.com"}]})
    assert made.status == 201, made.body
    ids = await other.fetch("SELECT id FROM user_contacts ORDER BY target")
    first, second = ids[0]["id"], ids[1]["id"]

    # And another session that holds the second address's row, and that PostgreSQL never
    # picks to break a deadlock (it checks for one only after a minute of waiting)
    try:
        await other.execute("SET deadlock_timeout = '60s'")
    except asyncpg.InsufficientPrivilegeError:
        skip_unless_ci("setting deadlock_timeout needs a superuser")
    held = other.transaction()
    await held.start()
    await other.execute("UPDATE user_contacts SET enabled = false WHERE id = $1", second)

    # When a PUT that removes both addresses waits for it, and the session then asks for the
    # first address's row, which the PUT holds by then
    put = asyncio.create_task(api.call("PUT", "/v1/users/u1", key=project.full,
                                       json={"contacts": []}))
    await until_async(lambda: waiting_on_a_lock(other))
    await other.execute("UPDATE user_contacts SET enabled = false WHERE id = $1", first)
    reply = await put
    await held.rollback()

    # Then the PUT, chosen to break the deadlock, is refused as one to retry, not as a bug
    assert reply.status == 503, reply.body
    assert reply.headers["Retry-After"] == "1"
    assert reply.error["code"] == "service_unavailable"
    retried = await api.call("PUT", "/v1/users/u1", key=project.full, json={"contacts": []})
    assert retried.status == 200, retried.body
    assert retried.body["contacts"] == []


async def test_an_inbox_stream_opening_as_its_key_is_revoked_is_not_left_open(
    api: Api, project: Project, monkeypatch: pytest.MonkeyPatch,
) -> None:
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    made = await api.admin("POST", f"/v1/projects/{project.id}/keys", json={"role": "full"})
    hub = api.client.app[HUB]

    # Given a stream authenticated with a key, held before it starts listening
    checked = asyncio.Event()
    go_on = asyncio.Event()
    real_require_user = inbox_routes._require_user

    async def held_require_user(*args: Any) -> None:
        await real_require_user(*args)
        checked.set()
        await go_on.wait()

    monkeypatch.setattr(inbox_routes, "_require_user", held_require_user)
    opening = asyncio.create_task(api.call("GET", "/v1/users/u1/inbox/stream",
                                           key=made.body["key"]))
    await checked.wait()

    # When the key is revoked, and the process has heard the revocation, before the stream
    # listens
    heard = asyncio.Event()
    real_revoke = hub._revoke

    def revoke(raw: bytes) -> None:
        real_revoke(raw)
        heard.set()

    monkeypatch.setattr(hub, "_revoke", revoke)
    assert (await api.admin("DELETE", f"/v1/keys/{made.body['id']}")).status == 204
    await heard.wait()
    go_on.set()

    # Then the stream is refused as any request with the key is now, not left open for good
    reply = await opening
    assert reply.status == 401, reply.body


async def test_an_inbox_stream_opening_as_its_user_is_erased_is_not_left_open(
    api: Api, project: Project, monkeypatch: pytest.MonkeyPatch,
) -> None:
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    minted = await api.call("POST", "/v1/users/u1/inbox/token", key=project.full)
    assert minted.status == 201, minted.body
    hub = api.client.app[HUB]

    # Given a stream opened with the user's token, held after the user was found and before
    # it starts listening
    checked = asyncio.Event()
    go_on = asyncio.Event()
    real_require_user = inbox_routes._require_user

    async def held_require_user(*args: Any) -> int:
        created: int = await real_require_user(*args)
        if not checked.is_set():
            checked.set()
            await go_on.wait()
        return created

    monkeypatch.setattr(inbox_routes, "_require_user", held_require_user)
    opening = asyncio.create_task(api.client.get("/v1/users/u1/inbox/stream",
                                                 params={"token": minted.body["token"]}))
    await checked.wait()

    # When the user is erased, and the process has heard the erasure end the user's streams,
    # before the stream listens
    heard = asyncio.Event()
    real_handle = hub._handle

    def handle(message: dict[str, Any]) -> None:
        real_handle(message)
        if message.get("type") == "pmessage" and message.get("data") in (b"", ""):
            heard.set()

    monkeypatch.setattr(hub, "_handle", handle)
    assert (await api.call("DELETE", "/v1/users/u1", key=project.full)).status == 204
    await heard.wait()
    go_on.set()

    # Then the stream is refused as one for an unknown user, not left open for good (it would
    # go on with the messages of a user created again under the id)
    response = await opening
    try:
        assert response.status == 404
    finally:
        response.close()


async def test_a_contact_added_as_the_same_address_is_removed_is_added(
    api: Api, project: Project, other: asyncpg.Connection,
) -> None:
    # Given a user with an address
    made = await api.call("PUT", "/v1/users/u1", key=project.full, json={
        "contacts": [{"channel": "email", "target": "ada@example.com"}]})
    assert made.status == 201, made.body

    # And a PUT of the user's contacts under way, holding the user's row
    removing = other.transaction()
    await removing.start()
    await other.execute("SELECT 1 FROM users WHERE project_id = $1 AND id = 'u1' "
                        "FOR NO KEY UPDATE", project.id)

    # When the address is added again meanwhile, and the PUT then removes it and commits
    adding = asyncio.create_task(api.call(
        "POST", "/v1/users/u1/contacts", key=project.full,
        json={"channel": "email", "target": "ada@example.com"}))
    await until_async(lambda: waiting_on_a_lock(other))
    await other.execute("DELETE FROM user_contacts WHERE project_id = $1 AND user_id = 'u1'",
                        project.id)
    await removing.commit()
    added = await adding

    # Then the addition, coming second, added it (no 200 naming a contact that is gone)
    assert added.status == 201, added.body
    got = await api.call("GET", "/v1/users/u1", key=project.full)
    assert [c["id"] for c in got.body["contacts"]] == [added.body["id"]]
