"""A caller's idempotency key survives Redis losing its data (a restart without persistence, a
failover to an empty replica): for 24 h after the loss, a key Redis no longer knows is looked
up in PostgreSQL, and only then; the Redis claim still decides which request does the work."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from notifkit import codec
from notifkit.keys import Keys
from notifkit.services.api import idempotency
from notifkit.services.api.admission import Admission, KeyedSend
from notifkit.services.api.state import ADMISSION
from scenarios.harness import unlink_namespace
from tests.api.conftest import Api, Project

DAY_MS = 24 * 3600 * 1000


@pytest.fixture
async def template(api: Api, project: Project) -> str:
    reply = await api.call("PUT", "/v1/templates/invoice", key=project.full, json={
        "channels": {"sms": {"text": "t"}}})
    assert reply.status == 201
    return "invoice"


def admission(api: Api) -> Admission:
    assert api.client.app is not None
    return api.client.app[ADMISSION]


def count_lookups(api: Api, monkeypatch: pytest.MonkeyPatch,
                  before: Callable[[], Awaitable[None]] | None = None) -> list[str]:
    """Record every PostgreSQL lookup of a key (the key looked up), optionally holding each
    one until ``before`` returns."""
    target = admission(api)
    real = target.first_keyed_send
    seen: list[str] = []

    async def spy(project_id: str, key: str, before_ms: int) -> KeyedSend | None:
        seen.append(key)
        if before is not None:
            await before()
        return await real(project_id, key, before_ms)

    monkeypatch.setattr(target, "first_keyed_send", spy)
    return seen


async def send(api: Api, project: Project, key: str, **body: Any) -> Any:
    return await api.call("POST", "/v1/notifications", key=project.send,
                          json={"to": "u1", "template": "invoice", **body},
                          headers={"x-idempotency-key": key})


async def redis_loses_its_data(redis: Redis, api: Api) -> None:
    await unlink_namespace(redis, api.settings.namespace)


async def test_a_key_sent_before_redis_lost_its_data_replays_the_first_answer(
    api: Api, project: Project, template: str, redis: Redis, db: asyncpg.Pool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys = Keys(api.settings.namespace)
    first = await send(api, project, "order-42")
    assert first.status == 202
    # Given Redis restarted without its data
    await redis_loses_its_data(redis, api)
    lookups = count_lookups(api, monkeypatch)
    # When the caller retries with the same key (and a rebuilt body)
    again = await send(api, project, "order-42", data={"retry": True})
    # Then it gets the first answer, and nothing is enqueued or recorded again
    assert (again.status, again.body) == (202, first.body)
    assert again.headers["x-idempotent-replay"] == "true"
    assert await redis.xlen(keys.inbound("normal")) == 0
    assert await db.fetchval("SELECT count(*) FROM notifications") == 1
    assert lookups == ["order-42"]
    # The key is back in Redis, for the rest of the first request's 24 h
    name = keys.api_idempotency(project.id, "order-42")
    raw = await redis.get(name)
    assert raw is not None
    record = codec.loads(raw)
    assert (record["state"], record["status"], record["body"]) == ("done", 202, first.body)
    assert 0 < await redis.ttl(name) <= api.settings.caller_idempotency_ttl_s
    third = await send(api, project, "order-42")
    assert (third.status, third.body) == (202, first.body)
    assert lookups == ["order-42"]  # answered from Redis
    # A key PostgreSQL does not know is a new send
    other = await send(api, project, "order-43")
    assert other.status == 202
    assert other.body["id"] != first.body["id"]
    assert "x-idempotent-replay" not in other.headers
    assert await redis.xlen(keys.inbound("normal")) == 1
    assert lookups == ["order-42", "order-43"]


async def test_a_send_made_since_the_loss_without_a_record_is_no_earlier_send(
    api: Api, project: Project, template: str, redis: Redis, db: asyncpg.Pool,
) -> None:
    keys = Keys(api.settings.namespace)
    # Given a send made in this data set whose record Redis does not have: an enqueue left
    # unanswered (a 503 keeping the rows) whose pending claim then lapsed, never answered 202
    unsure = await send(api, project, "unsure")
    await redis.delete(keys.api_idempotency(project.id, "unsure"))
    # When the caller retries, within 24 h of the data set's start
    again = await send(api, project, "unsure")
    # Then it is a new send, as it is once Redis has kept its data for a day
    assert again.status == 202
    assert again.body["id"] != unsure.body["id"]
    assert "x-idempotent-replay" not in again.headers
    assert await db.fetchval("SELECT count(*) FROM notifications") == 2


async def test_a_template_deleted_since_does_not_stop_the_replay_after_the_loss(
    api: Api, project: Project, template: str, redis: Redis,
) -> None:
    first = await send(api, project, "before-delete")
    deleted = await api.call("DELETE", f"/v1/templates/{template}", key=project.full)
    assert deleted.status == 204
    await redis_loses_its_data(redis, api)
    again = await send(api, project, "before-delete")
    assert (again.status, again.body) == (202, first.body)
    # A new key still meets the missing template, and leaves the key free.
    missing = await send(api, project, "after-delete")
    assert (missing.status, missing.fields) == (400, ["template"])
    keys = Keys(api.settings.namespace)
    assert await redis.get(keys.api_idempotency(project.id, "after-delete")) is None


async def test_a_lookup_postgresql_cannot_answer_is_a_503_that_frees_the_key(
    api: Api, project: Project, template: str, redis: Redis, monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = await send(api, project, "down")
    await redis_loses_its_data(redis, api)

    async def unreachable(project_id: str, key: str, before_ms: int) -> KeyedSend | None:
        raise ConnectionRefusedError("PostgreSQL is down")

    with monkeypatch.context() as patch:
        patch.setattr(admission(api), "first_keyed_send", unreachable)
        refused = await send(api, project, "down")
    assert refused.status == 503
    keys = Keys(api.settings.namespace)
    assert await redis.xlen(keys.inbound("normal")) == 0
    assert await redis.get(keys.api_idempotency(project.id, "down")) is None
    again = await send(api, project, "down")
    assert (again.status, again.body) == (202, first.body)


async def test_without_a_loss_no_key_is_looked_up_in_postgresql(
    api: Api, project: Project, template: str, redis: Redis, monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys = Keys(api.settings.namespace)
    # Given a Redis that has kept its data for more than 24 h
    seconds, micros = await redis.time()
    await redis.set(keys.api_idempotency_since, seconds * 1000 + micros // 1000 - DAY_MS - 1)
    lookups = count_lookups(api, monkeypatch)
    first = await send(api, project, "fresh")
    again = await send(api, project, "fresh")
    assert first.status == again.status == 202
    assert again.body == first.body
    assert lookups == []
    assert await redis.xlen(keys.inbound("normal")) == 1


async def test_a_first_claim_marks_when_the_data_set_began(
    api: Api, project: Project, template: str, redis: Redis,
) -> None:
    keys = Keys(api.settings.namespace)
    await redis_loses_its_data(redis, api)
    assert await redis.get(keys.api_idempotency_since) is None
    await send(api, project, "k1")
    since = await redis.get(keys.api_idempotency_since)
    assert since is not None
    await send(api, project, "k2")
    assert await redis.get(keys.api_idempotency_since) == since
    assert await redis.ttl(keys.api_idempotency_since) == -1


async def test_a_new_data_set_beside_no_recent_keyed_send_skips_every_lookup(
    api: Api, project: Project, template: str, redis: Redis, db: asyncpg.Pool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At start, a Redis without the marker whose PostgreSQL holds no keyed send of the last
    24 h lost nothing a retry could need: marked old, no keyed send looks anything up."""
    keys = Keys(api.settings.namespace)
    seconds, micros = await redis.time()
    now_ms = seconds * 1000 + micros // 1000
    since = await redis.get(keys.api_idempotency_since)
    assert since is not None
    assert int(since) < now_ms - DAY_MS
    lookups = count_lookups(api, monkeypatch)
    assert (await send(api, project, "k1")).status == 202
    assert lookups == []
    # While with a keyed send of the last 24 h in PostgreSQL, the marker is left to the
    # first claim, which dates the data set from now (and looks keys up)
    await redis_loses_its_data(redis, api)
    marked = await idempotency.date_fresh_data_set(redis, keys.api_idempotency_since, db,
                                                   api.settings.caller_idempotency_ttl_s)
    assert (marked, await redis.get(keys.api_idempotency_since)) == (False, None)
    # And a store that cannot answer leaves it to the claims as well, with a warning
    closed = await asyncpg.create_pool(api.settings.database_url, min_size=0)
    await closed.close()
    assert not await idempotency.date_fresh_data_set(
        redis, keys.api_idempotency_since, closed, api.settings.caller_idempotency_ttl_s)
    assert await redis.get(keys.api_idempotency_since) is None


async def test_requests_racing_after_the_loss_enqueue_nothing_and_share_one_lookup(
    api: Api, project: Project, template: str, redis: Redis, db: asyncpg.Pool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys = Keys(api.settings.namespace)
    first = await send(api, project, "race")
    await redis_loses_its_data(redis, api)
    # The lookup is held until every other request waits on the claim it holds.
    racers = 6
    waiting: set[asyncio.Task[Any]] = set()
    all_waiting = asyncio.Event()
    real_pause = idempotency.pause

    async def pause() -> None:
        task = asyncio.current_task()
        assert task is not None
        waiting.add(task)
        if len(waiting) == racers - 1:
            all_waiting.set()
        await real_pause()

    async def hold() -> None:
        await all_waiting.wait()

    monkeypatch.setattr(idempotency, "pause", pause)
    lookups = count_lookups(api, monkeypatch, before=hold)
    replies = await asyncio.gather(*(send(api, project, "race") for _ in range(racers)))
    assert {(r.status, r.body["id"]) for r in replies} == {(202, first.body["id"])}
    assert lookups == ["race"]
    assert await redis.xlen(keys.inbound("normal")) == 0
    assert await db.fetchval("SELECT count(*) FROM notifications") == 1
    # And a new key raced the same way is sent once.
    all_waiting.clear()
    waiting.clear()
    fresh = await asyncio.gather(*(send(api, project, "race-new") for _ in range(racers)))
    assert len({r.body["id"] for r in fresh}) == 1
    assert await redis.xlen(keys.inbound("normal")) == 1
    assert await db.fetchval("SELECT count(*) FROM notifications") == 2


async def test_a_key_older_than_24_hours_or_from_a_workflow_is_no_earlier_send(
    api: Api, project: Project, template: str, redis: Redis, db: asyncpg.Pool,
) -> None:
    old = await send(api, project, "old")
    wf = await send(api, project, "wf:instance:0")
    await db.execute("UPDATE notifications SET created_at = now() - interval '25 hours' "
                     "WHERE id = $1", old.body["id"])
    # A workflow's send carries its own key; its accepted row names the user.
    await db.execute("UPDATE message_logs SET user_id = 'u1' WHERE event_id = $1",
                     wf.body["id"])
    await redis_loses_its_data(redis, api)
    for key, earlier in (("old", old), ("wf:instance:0", wf)):
        again = await send(api, project, key)
        assert again.status == 202
        assert again.body["id"] != earlier.body["id"]
        assert "x-idempotent-replay" not in again.headers


async def test_a_send_settled_as_never_enqueued_is_no_earlier_send(
    api: Api, project: Project, template: str, redis: Redis, db: asyncpg.Pool,
) -> None:
    first = await send(api, project, "orphan")
    await db.execute(
        "INSERT INTO message_logs (project_id, event_id, task_id, channel, kind, status, "
        "detail, metadata) VALUES ($1, $2, $3, '', 'failed', 'failed', 'never enqueued', "
        "'{\"reason\": \"never_enqueued\"}')", project.id, first.body["id"], first.body["id"])
    await redis_loses_its_data(redis, api)
    again = await send(api, project, "orphan")
    assert again.status == 202
    assert again.body["id"] != first.body["id"]


async def test_the_lookup_is_served_by_an_index(db: asyncpg.Pool) -> None:
    from notifkit.services.api.admission import _KEYED_SENDS
    async with db.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")
        plan = "\n".join(r[0] for r in await conn.fetch(
            "EXPLAIN " + _KEYED_SENDS,
            ["00000000-0000-0000-0000-000000000001"], ["k"], [0], 86400))
    assert "notifications_idempotency_idx" in plan, plan


async def test_a_send_made_since_a_recent_loss_is_looked_up_and_not_taken_for_earlier(
    api: Api, project: Project, template: str, redis: Redis, db: asyncpg.Pool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Within 24 h of a loss every claimed key is looked up, but only sends made before the
    loss count: one made since whose record Redis lacks was never answered 202, so a retry
    is a new send, not a replay of it."""
    keys = Keys(api.settings.namespace)
    # Given Redis lost its data an hour ago
    seconds, micros = await redis.time()
    await redis.set(keys.api_idempotency_since, seconds * 1000 + micros // 1000 - 3600_000)
    # And a send made since then left no record (its enqueue went unanswered, its claim lapsed)
    unsure = await send(api, project, "since-the-loss")
    assert unsure.status == 202
    await redis.delete(keys.api_idempotency(project.id, "since-the-loss"))
    lookups = count_lookups(api, monkeypatch)
    # When the caller retries
    again = await send(api, project, "since-the-loss")
    # Then PostgreSQL was asked, found no earlier send, and the retry is a new send
    assert lookups == ["since-the-loss"]
    assert again.status == 202
    assert again.body["id"] != unsure.body["id"]
    assert "x-idempotent-replay" not in again.headers
    assert await db.fetchval("SELECT count(*) FROM notifications") == 2
