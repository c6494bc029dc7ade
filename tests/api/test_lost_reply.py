"""A lost enqueue reply: Redis ran the XADD (or not), but the API never heard.

The connection to Redis goes through a proxy that breaks the connection carrying the XADD,
either after Redis ran it (the reply is dropped) or before it reached Redis. Accepting must
follow what Redis really did: a send whose entry is on the stream is accepted, with its rows;
one that never got there is rolled back; one Redis cannot tell about keeps its rows for the
reconciliation and its caller gets the error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import asyncpg
import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from notifkit import codec
from notifkit.config import Settings
from notifkit.ids import uuid7
from notifkit.keys import Keys
from notifkit.messages import InboundMessage
from notifkit.ratelimit import TokenBuckets
from notifkit.services.api import admission as admission_module
from notifkit.services.api.admission import Admission
from notifkit.services.api.idempotency import Remember
from notifkit.streams import decode
from tests.api.conftest import Api, Project, start_api
from tests.support.redis_proxy import BreakingProxy, Mode
from tests.support.streams import xrange


def _message(project_id: str, key: str | None = None) -> InboundMessage:
    return {"eventId": uuid7(), "projectId": project_id, "template": "t",
            "to": {"userId": "u1"}, "data": {}, "channels": None, "priority": "normal",
            "sendAt": None, "campaignId": None, "idempotencyKey": key,
            "createdAt": "2026-12-01T00:00:00.000Z"}


class Broken:
    """An Admission whose Redis connection goes through a :class:`BreakingProxy`."""

    def __init__(self, settings: Settings, db: asyncpg.Pool, proxy: BreakingProxy) -> None:
        self.redis = Redis.from_url(proxy.url)
        self.admission = Admission(settings, Keys(settings.namespace), self.redis, db,
                                   TokenBuckets(self.redis))


@pytest.fixture
async def target(redis_url: str) -> tuple[str, int]:
    parts = urlsplit(redis_url)
    return parts.hostname or "127.0.0.1", parts.port or 6379


async def _broken(settings: Settings, db: asyncpg.Pool, target: tuple[str, int], mode: Mode,
                  *, refuse_after: bool = False) -> AsyncIterator[Broken]:
    async with BreakingProxy(*target, mode, refuse_after=refuse_after) as proxy:
        broken = Broken(settings, db, proxy)
        try:
            yield broken
        finally:
            await broken.redis.aclose()


@pytest.fixture
async def reply_lost(settings: Settings, db: asyncpg.Pool,
                     target: tuple[str, int]) -> AsyncIterator[Broken]:
    async for broken in _broken(settings, db, target, "reply"):
        yield broken


@pytest.fixture
async def never_sent(settings: Settings, db: asyncpg.Pool,
                     target: tuple[str, int]) -> AsyncIterator[Broken]:
    async for broken in _broken(settings, db, target, "request"):
        yield broken


@pytest.fixture
async def reply_lost_then_down(settings: Settings, db: asyncpg.Pool,
                               target: tuple[str, int]) -> AsyncIterator[Broken]:
    async for broken in _broken(settings, db, target, "reply", refuse_after=True):
        yield broken


async def _entries_of(redis: Redis, settings: Settings, event_id: str) -> int:
    entries = await xrange(redis, Keys(settings.namespace).inbound("normal"))
    return sum(1 for _id, fields in entries if decode(fields)["eventId"] == event_id)


async def _rows_of(db: asyncpg.Pool, event_id: str) -> tuple[int, int]:
    notifications = await db.fetchval("SELECT count(*) FROM notifications WHERE id = $1",
                                      event_id)
    logs = await db.fetchval("SELECT count(*) FROM message_logs WHERE event_id = $1", event_id)
    return notifications, logs


@pytest.mark.parametrize("idempotency_key", [None, "order-42"])
async def test_a_send_whose_xadd_ran_but_whose_reply_was_lost_is_accepted_with_its_rows(
    reply_lost: Broken, settings: Settings, project: Project, redis: Redis,
    db: asyncpg.Pool, idempotency_key: str | None,
) -> None:
    # A plain XADD, or (under a caller's key) the script that also stores the key's answer
    message = _message(project.id, key=idempotency_key)
    remember = None
    if idempotency_key is not None:
        key = Keys(settings.namespace).api_idempotency(project.id, idempotency_key)
        record = codec.dumps({"state": "done", "status": 202,
                              "body": {"id": message["eventId"]}})
        remember = Remember(key, record, 3600)

    await reply_lost.admission.accept(message, remember)  # no error: it is accepted

    assert await _entries_of(redis, settings, message["eventId"]) == 1
    assert await _rows_of(db, message["eventId"]) == (1, 1)
    if remember is not None:
        assert await redis.get(remember.key) == remember.record


async def test_a_send_whose_xadd_never_reached_redis_is_rolled_back(
    never_sent: Broken, settings: Settings, project: Project, redis: Redis,
    db: asyncpg.Pool,
) -> None:
    # Given a stream that already holds an entry, so the search has one to read past
    earlier = _message(project.id)
    plain = Admission(settings, Keys(settings.namespace), redis, db, TokenBuckets(redis))
    await plain.accept(earlier)
    message = _message(project.id)

    with pytest.raises(RedisConnectionError):
        await never_sent.admission.accept(message)

    assert await _entries_of(redis, settings, message["eventId"]) == 0
    assert await _rows_of(db, message["eventId"]) == (0, 0)
    assert await _rows_of(db, earlier["eventId"]) == (1, 1)


async def test_a_send_redis_cannot_tell_about_keeps_its_rows_and_its_caller_gets_the_error(
    reply_lost_then_down: Broken, settings: Settings, project: Project, redis: Redis,
    db: asyncpg.Pool,
) -> None:
    message = _message(project.id)

    with pytest.raises(RedisConnectionError):
        await reply_lost_then_down.admission.accept(message)

    # The rows stay for the reconciliation: the entry is on the stream after all
    assert await _rows_of(db, message["eventId"]) == (1, 1)
    assert await _entries_of(redis, settings, message["eventId"]) == 1


async def test_a_keyed_send_redis_cannot_tell_about_keeps_its_key_so_the_retry_gets_its_answer(
    api_settings: Settings, target: tuple[str, int], redis: Redis, db: asyncpg.Pool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with BreakingProxy(*target, "reply", every=True) as proxy:
        _server, client = await start_api(api_settings.replace(redis_url=proxy.url))
        try:
            api = Api(client, api_settings)
            project = await api.project()
            await api.call("PUT", "/v1/templates/t", key=project.full, json={
                "channels": {"email": {"subject": "s", "text": "t"}}})
            # Given a send whose XADD ran, whose reply was lost, and whose stream Redis
            # cannot search just then
            async def unreachable(*_args: object) -> None:
                raise RedisConnectionError("still unreachable")

            monkeypatch.setattr(admission_module, "find_notifications", unreachable)
            send = {"to": "u1", "template": "t"}
            headers = {"x-idempotency-key": "order-7"}
            first = await api.call("POST", "/v1/notifications", key=project.send, json=send,
                                   headers=headers)
            assert first.status == 503
            monkeypatch.undo()
            proxy.heal()

            # When the caller retries with the same key
            retry = await api.call("POST", "/v1/notifications", key=project.send, json=send,
                                   headers=headers)
        finally:
            await client.close()

    # Then it gets the first answer: the notification that is on the stream, with its rows
    # (twice on the stream if the lost reply's connection had served earlier calls: such a
    # call is sent once more on a new connection, and the enricher drops the copy)
    assert retry.status == 202
    assert retry.headers.get("x-idempotent-replay") == "true"
    event_id = retry.body["id"]
    assert await _entries_of(redis, api_settings, event_id) >= 1
    assert await _rows_of(db, event_id) == (1, 1)
