"""/health, /metrics, /v1/streams and the DLQ routes."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from notifkit import metrics
from notifkit.config import Settings
from notifkit.ids import untasked_row_id, uuid7
from notifkit.keys import Keys
from notifkit.messages import InboundMessage
from notifkit.ratelimit import TokenBuckets
from notifkit.services.api.admission import Admission
from notifkit.services.api.errors import store_unavailable
from notifkit.services.api.routes import dlq as dlq_routes
from notifkit.services.api.validation import list_scope, scoped_cursor
from notifkit.services.events import outcome_row
from notifkit.streams import decode, encode, ensure_group, xadd
from notifkit.worker import remove_heartbeat, write_heartbeat
from tests.api.conftest import ADMIN, Api, Project, start_api
from tests.support.pg_proxy import PostgresProxy
from tests.support.streams import xrange


async def test_health_lists_heartbeats(api: Api, redis: Redis) -> None:
    keys = Keys(api.settings.namespace)
    beat = {"service": "delivery", "lastBeat": "2030-01-01T00:00:00.000Z", "inFlight": 3,
            "ts": time.time()}
    await write_heartbeat(redis, keys, "delivery-host-1", beat, 30)
    reply = await api.call("GET", "/health")
    assert reply.status == 200
    assert reply.body["status"] == "ok"
    assert (reply.body["redis"], reply.body["postgres"]) == ("ok", "ok")
    assert reply.body["services"]["delivery-host-1"] == {
        "service": "delivery", "lastBeat": "2030-01-01T00:00:00.000Z", "inFlight": 3,
        "stale": False}
    await write_heartbeat(redis, keys, "engine-host-2", {**beat, "ts": time.time() - 600}, 30)
    degraded = await api.call("GET", "/health")
    assert degraded.status == 200
    assert degraded.body["status"] == "degraded"


async def test_health_does_not_walk_the_keyspace(
    api: Api, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shared Redis holds millions of keys (dedup marks alone: one per task and stage for
    an hour); a SCAN for the heartbeats took longer than the health check's timeout, so a
    busy system reported Redis unreachable."""
    keys = Keys(api.settings.namespace)
    beat = {"service": "engine", "lastBeat": "2030-01-01T00:00:00.000Z", "inFlight": 0,
            "ts": time.time()}
    await write_heartbeat(redis, keys, "engine-host-1", beat, 30)
    await write_heartbeat(redis, keys, "engine-host-2", beat, 30)
    await redis.delete(keys.health("engine-host-2"))  # expired, another engine runs: not listed

    async def a_huge_keyspace(*args: Any, **kwargs: Any) -> AsyncIterator[bytes]:
        await asyncio.sleep(5)
        yield b""

    monkeypatch.setattr(Redis, "scan_iter", a_huge_keyspace)
    reply = await api.call("GET", "/health")
    assert reply.status == 200, reply.body
    assert (reply.body["status"], reply.body["redis"]) == ("ok", "ok")
    assert list(reply.body["services"]) == ["engine-host-1"]


async def test_health_keeps_a_service_whose_every_process_died(api: Api, redis: Redis) -> None:
    """A process killed without a clean stop leaves its index entry but its heartbeat key
    expires: /health used to drop it then and say "ok" with no delivery process left at all.
    The last process of a service that died stays listed, stale, and the status degraded,
    until another process of that service beats; a dead one with a live sibling goes."""
    keys = Keys(api.settings.namespace)
    beat = {"service": "engine", "lastBeat": "2030-01-01T00:00:00.000Z", "inFlight": 0,
            "ts": time.time()}
    await write_heartbeat(redis, keys, "engine-host-1", beat, 30)
    await write_heartbeat(redis, keys, "delivery-host-1", {**beat, "service": "delivery"}, 30)
    died_at = time.time() - 120
    await redis.zadd(keys.heartbeats, {"delivery-host-1": died_at})
    await redis.delete(keys.health("delivery-host-1"))  # SIGKILL, then its key expired
    reply = await api.call("GET", "/health")
    assert reply.status == 200
    assert reply.body["status"] == "degraded"
    gone = reply.body["services"]["delivery-host-1"]
    assert gone["service"] == "delivery"
    assert gone["stale"] is True
    assert gone["inFlight"] == 0
    # When it last beat, in the API's time format.
    assert gone["lastBeat"].startswith(time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(died_at)))
    assert gone["lastBeat"].endswith("Z")
    # Another delivery process takes over: the dead one is no longer news.
    await write_heartbeat(redis, keys, "delivery-host-2", {**beat, "service": "delivery"}, 30)
    healed = await api.call("GET", "/health")
    assert healed.body["status"] == "ok"
    assert sorted(healed.body["services"]) == ["delivery-host-2", "engine-host-1"]


async def test_health_forgets_a_dead_process_once_its_successor_stopped_cleanly(
    api: Api, redis: Redis
) -> None:
    """Seen on a fleet: an engine killed and replaced, the replacement stopped cleanly later
    (scaled to zero) -> /health listed the long-dead one, stale, and said degraded, although
    the service's last process had stopped cleanly."""
    keys = Keys(api.settings.namespace)
    beat = {"service": "engine", "lastBeat": "2030-01-01T00:00:00.000Z", "inFlight": 0,
            "ts": time.time()}
    await write_heartbeat(redis, keys, "engine-host-1", beat, 30)
    await redis.zadd(keys.heartbeats, {"engine-host-1": time.time() - 600})
    await redis.delete(keys.health("engine-host-1"))  # SIGKILL, then its key expired
    await write_heartbeat(redis, keys, "engine-host-2", beat, 30)
    await write_heartbeat(redis, keys, "delivery-host-3", {**beat, "service": "delivery"}, 30)
    await redis.zadd(keys.heartbeats, {"delivery-host-3": time.time() - 600})
    await redis.delete(keys.health("delivery-host-3"))  # another service's dead one stays

    await remove_heartbeat(redis, keys, "engine-host-2")  # the replacement's clean stop

    reply = await api.call("GET", "/health")
    assert list(reply.body["services"]) == ["delivery-host-3"]


async def test_health_lists_only_the_last_dead_process_of_a_service(
    api: Api, redis: Redis
) -> None:
    """Processes of a service killed one after another (a crash loop, a redeploy by SIGKILL)
    each left an index entry: once none ran, /health listed every one of them for an hour,
    not the last one README promises, burying the one that says when the service stopped."""
    keys = Keys(api.settings.namespace)
    now = time.time()
    beat = {"service": "delivery", "lastBeat": "2030-01-01T00:00:00.000Z", "inFlight": 0}
    for n, died_at in ((1, now - 600), (2, now - 300), (3, now - 60)):
        await write_heartbeat(redis, keys, f"delivery-host-{n}", {**beat, "ts": died_at}, 30)
        await redis.zadd(keys.heartbeats, {f"delivery-host-{n}": died_at})
        await redis.delete(keys.health(f"delivery-host-{n}"))
    reply = await api.call("GET", "/health")
    assert reply.body["status"] == "degraded"
    assert list(reply.body["services"]) == ["delivery-host-3"]
    # The last one killed whose key has not expired yet is that one: the older ones go.
    await write_heartbeat(redis, keys, "delivery-host-4",
                          {**beat, "ts": now - 40}, 30)  # stale, its key still there
    reply = await api.call("GET", "/health")
    assert list(reply.body["services"]) == ["delivery-host-4"]
    assert reply.body["services"]["delivery-host-4"]["stale"] is True


async def test_health_is_degraded_by_a_worker_that_beats_but_cannot_read(
    api: Api, redis: Redis
) -> None:
    keys = Keys(api.settings.namespace)
    beat = {"service": "delivery", "lastBeat": "2030-01-01T00:00:00.000Z", "inFlight": 0,
            "ts": time.time()}
    await write_heartbeat(redis, keys, "delivery-host-1", beat, 30)
    assert (await api.call("GET", "/health")).body["status"] == "ok"
    failing = {**beat, "readError": "WRONGTYPE Operation against a key holding the wrong kind"}
    await write_heartbeat(redis, keys, "delivery-host-1", failing, 30)
    reply = await api.call("GET", "/health")
    assert reply.status == 200  # Redis and PostgreSQL answer; one worker is not well
    assert reply.body["status"] == "degraded"
    assert reply.body["services"]["delivery-host-1"]["readError"].startswith("WRONGTYPE")
    assert reply.body["services"]["delivery-host-1"]["stale"] is False


async def test_health_is_503_without_redis(settings: Settings) -> None:
    broken = settings.replace(redis_url="redis://127.0.0.1:1/0")
    _server, client = await _start_without_hub(broken)
    try:
        reply = await client.get("/health")
        assert reply.status == 503
        body = await reply.json()
        assert (body["status"], body["redis"], body["postgres"]) == ("degraded",
                                                                     "unreachable", "ok")
    finally:
        await client.close()


async def test_metrics_are_503_without_redis_never_this_process_alone(
    settings: Settings,
) -> None:
    # The counters are the whole system's totals, kept in Redis. Without Redis the scrape
    # showed this process's own counts instead: every counter went down (Prometheus takes
    # that for a reset and counts the whole total again when Redis is back) and the stream
    # gauges kept their last values. A failed scrape is what Prometheus can read right.
    metrics.PROCESSED.labels("engine", "s-metrics-outage", "").inc()
    broken = settings.replace(redis_url="redis://127.0.0.1:1/0")
    _server, client = await _start_without_hub(broken)
    try:
        reply = await client.get("/metrics")
        assert reply.status == 503
        assert reply.headers["Retry-After"] == "1"
        assert (await reply.json())["error"]["code"] == "service_unavailable"
    finally:
        await client.close()


async def test_health_is_503_without_postgres(settings: Settings) -> None:
    dead = await asyncpg.create_pool("postgresql://postgres@127.0.0.1:1/none", min_size=0)
    _server, client = await start_api(settings, db=dead)
    try:
        reply = await client.get("/health")
        assert reply.status == 503
        body = await reply.json()
        assert (body["redis"], body["postgres"]) == ("ok", "unreachable")
        # Every other route answers 503 in the error shape rather than failing.
        keyed = await client.get("/v1/messages",
                                 headers={"Authorization": "Bearer nk_whatever"})
        assert keyed.status == 503
        assert (await keyed.json())["error"]["code"] == "service_unavailable"
    finally:
        await client.close()
        await dead.close()


async def _start_without_hub(settings: Settings) -> tuple[Any, Any]:
    from aiohttp.test_utils import TestClient, TestServer

    from notifkit.services.api.app import create_app

    server = TestServer(create_app(settings))
    client = TestClient(server)
    await client.start_server()
    return server, client


async def test_streams_report_length_pending_and_age(
    api: Api, project: Project, redis: Redis
) -> None:
    keys = Keys(api.settings.namespace)
    stream = keys.outbound("normal")
    await ensure_group(redis, stream, keys.group("delivery"))
    # The oldest entry is given an id ten seconds old, so its age is known from the outside.
    old_ms = int(time.time() * 1000) - 10_000
    await redis.xadd(stream, encode({"n": 0}), id=f"{old_ms}-0")
    for i in range(1, 3):
        await xadd(redis, stream, {"n": i}, maxlen=1000)
    await redis.xreadgroup(keys.group("delivery"), "delivery-h-1", {stream: ">"}, count=2)
    reply = await api.call("GET", "/v1/streams", key=project.full)
    assert reply.status == 200
    assert set(reply.body) == {"items", "nextCursor"}  # the shape of every list
    assert reply.body["nextCursor"] is None
    # limit and cursor page it as they page every list.
    paged: list[str] = []
    params = {"limit": "5"}
    while True:
        page = await api.call("GET", "/v1/streams", key=project.full, params=params)
        assert page.status == 200, page.body
        assert len(page.body["items"]) <= 5
        paged += [s["stream"] for s in page.body["items"]]
        if page.body["nextCursor"] is None:
            break
        params = {"limit": "5", "cursor": page.body["nextCursor"]}
    assert paged == [s["stream"] for s in reply.body["items"]]
    bad = await api.call("GET", "/v1/streams", key=project.full, params={"cursor": "xyz"})
    assert bad.status == 400
    assert bad.fields == ["cursor"]
    info = next(s for s in reply.body["items"] if s["stream"] == stream)
    assert (info["length"], info["pending"], info["consumers"]) == (3, 2, 1)
    assert 10 <= info["oldestPendingAgeSeconds"] < 60
    assert info["groups"][0]["name"] == "notifkit:group:delivery"
    assert {s["stream"] for s in reply.body["items"]} == set(keys.all_streams())
    assert (await api.admin("GET", "/v1/streams")).status == 200
    assert (await api.call("GET", "/v1/streams", key=project.send)).status == 403

    metrics = await api.call("GET", "/metrics")
    assert metrics.status == 200
    # 0.0.4 is the text format every Prometheus and scraper reads (1.0.0 only newer ones).
    assert metrics.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert f'notifkit_stream_length{{stream="{stream}"}} 3.0' in metrics.body
    assert (f'notifkit_stream_pending{{group="notifkit:group:delivery",stream="{stream}"}} 2.0'
            in metrics.body)
    # The age of the oldest pending entry is the gauge a stuck consumer is alerted on: it is
    # there for the group, as old as the entry ten seconds in the past.
    age = f'notifkit_stream_oldest_pending_age_seconds{{group="notifkit:group:delivery",' \
          f'stream="{stream}"}} '
    [line] = [line for line in metrics.body.splitlines() if line.startswith(age)]
    assert 10 <= float(line.removeprefix(age)) < 60
    assert "notifkit_processed_total" in metrics.body


async def test_metrics_report_each_streams_depth_not_its_length(
    api: Api, project: Project, redis: Redis
) -> None:
    """Acked entries stay in a stream until it is trimmed, so its length says nothing of the
    backlog: the depth counts what the group has not read plus what it has not acked."""
    keys = Keys(api.settings.namespace)
    stream = keys.outbound("low")
    group = keys.group("delivery")
    await ensure_group(redis, stream, group)
    ids = [await xadd(redis, stream, {"n": i}, maxlen=1000) for i in range(4)]
    await redis.xreadgroup(group, "delivery-h-1", {stream: ">"}, count=3)
    await redis.xack(stream, group, ids[0])  # 1 acked, 2 pending, 1 unread
    dlq = keys.dlq
    await xadd(redis, dlq, {"n": 0}, maxlen=1000)
    metrics = await api.call("GET", "/metrics")
    assert metrics.status == 200
    assert f'notifkit_stream_length{{stream="{stream}"}} 4.0' in metrics.body
    assert f'notifkit_stream_depth{{stream="{stream}"}} 3.0' in metrics.body
    assert f'notifkit_stream_depth{{stream="{dlq}"}} 1.0' in metrics.body


def dlq_record(keys: Keys, project: str, entry: str, n: int) -> dict[str, Any]:
    stream = keys.enriched("normal")
    return {"stream": stream, "group": "notifkit:group:engine", "entryId": entry,
            "service": "engine", "payload": {"projectId": project, "eventId": f"e{n}", "n": n},
            "error": "RuntimeError: boom", "attempts": 3, "failedAt": "2030-01-01T00:00:00Z",
            "projectId": project, "replayOf": f"{stream}/{entry}"}


async def test_a_replayed_task_starts_its_attempts_afresh(api: Api, redis: Redis) -> None:
    """A delivery task parked after 429s carries its attempts in its payload; replayed from
    the DLQ, it gets the full attempt limit again, as the replay promises."""
    keys = Keys(api.settings.namespace)
    a = await api.project("a")
    record = dlq_record(keys, a.id, "1-0", 0)
    record["stream"] = keys.outbound("normal")
    record["payload"] = {**record["payload"], "priorAttempts": 2, "parkCount": 2}
    entry_id = await xadd(redis, keys.dlq, record, 1000)
    assert (await api.call("POST", f"/v1/dlq/{entry_id}/replay", key=a.full)).status == 202
    [(_id, fields)] = await xrange(redis, keys.outbound("normal"))
    replayed = decode(fields)
    assert "priorAttempts" not in replayed
    assert "parkCount" not in replayed
    assert replayed["n"] == 0
    # The attempts made before stay known, for the timeline to number the new ones after them
    assert replayed["_replayedAttempts"] == 3


async def test_replays_of_a_replay_add_up_the_attempts_made_before(
    api: Api, redis: Redis
) -> None:
    keys = Keys(api.settings.namespace)
    a = await api.project("a")
    record = dlq_record(keys, a.id, "1-0", 0)
    record["payload"] = {**record["payload"], "_replayedAttempts": 3, "_replayOf": "x/1-0"}
    entry_id = await xadd(redis, keys.dlq, record, 1000)
    assert (await api.call("POST", f"/v1/dlq/{entry_id}/replay", key=a.full)).status == 202
    [(_id, fields)] = await xrange(redis, keys.enriched("normal"))
    assert decode(fields)["_replayedAttempts"] == 6


async def test_a_replay_goes_back_to_the_very_stream_it_came_from(
    api: Api, redis: Redis
) -> None:
    """Each priority lane and each single stream gets its own dead letters back: a critical
    entry replayed onto the normal lane would queue behind every normal backlog."""
    keys = Keys(api.settings.namespace)
    a = await api.project("a")
    origins = [s for s in keys.all_streams() if s != keys.dlq]
    for n, origin in enumerate(origins):
        record = dlq_record(keys, a.id, f"1-{n}", n)
        record["stream"] = origin
        entry_id = await xadd(redis, keys.dlq, record, 1000)
        reply = await api.call("POST", f"/v1/dlq/{entry_id}/replay", key=a.full)
        assert (reply.status, reply.body["stream"]) == (202, origin), reply.body
        # Then the entry is on its origin stream and on no other
        landed = {s: [decode(f)["n"] for _id, f in await xrange(redis, s)] for s in origins}
        assert {s: ns for s, ns in landed.items() if ns} == {origin: [n]}, origin
        await redis.delete(origin)


async def _project_with_a_send(api: Api, to: str | list[str] = "u1",
                               **fields: Any) -> tuple[Project, str]:
    """Project "a" with an e-mail template "t", and the id of a send of it to ``to``."""
    a = await api.project("a")
    made = await api.call("PUT", "/v1/templates/t", key=a.full,
                          json={"channels": {"email": {"subject": "s", "text": "t"}}})
    assert made.status == 201
    sent = await api.call("POST", "/v1/notifications", key=a.send,
                          json={"to": to, "template": "t", **fields})
    assert sent.status == 202, sent.body
    return a, str(sent.body["id"])


async def _u1_row(db: asyncpg.Pool, a: Project, event: str, task: str, channel: str,
                  attempt: int, kind: str, status: str) -> None:
    """A timeline row of ``event``'s recipient u1, as a stage would have written it."""
    await db.execute(
        "INSERT INTO message_logs (project_id, event_id, task_id, user_id, channel, attempt, "
        "kind, status) VALUES ($1, $2, $3, 'u1', $4, $5, $6, $7)",
        a.id, event, task, channel, attempt, kind, status)


async def test_a_replay_shows_on_the_timeline_and_reopens_the_task(
    api: Api, redis: Redis, db: asyncpg.Pool
) -> None:
    keys = Keys(api.settings.namespace)
    a, event = await _project_with_a_send(api)
    task = "01a00000-0000-7000-8000-000000000001"
    # Given its email task was dead-lettered after three attempts
    await _u1_row(db, a, event, task, "email", 3, "dead_lettered", "dead_lettered")
    record = dlq_record(keys, a.id, "1-0", 0)
    record["stream"] = keys.outbound("normal")
    record["payload"] = {"projectId": a.id, "eventId": event, "taskId": task, "userId": "u1",
                         "channel": "email", "campaignId": "c1"}
    entry_id = await xadd(redis, keys.dlq, record, 1000)

    async def shown() -> dict[str, Any]:
        reply = await api.call("GET", f"/v1/notifications/{event}", key=a.full)
        assert reply.status == 200
        body: dict[str, Any] = reply.body
        return body

    assert (await shown())["status"] == "dead_lettered"
    # When it is replayed, the timeline says so and the task is in progress again
    assert (await api.call("POST", f"/v1/dlq/{entry_id}/replay", key=a.full)).status == 202
    body = await shown()
    [recipient] = body["recipients"]
    assert [e["kind"] for e in recipient["timeline"]] == ["dead_lettered", "replayed"]
    assert recipient["timeline"][1]["detail"] == "replayed from the dead-letter queue"
    assert (recipient["status"], body["status"]) == ("processing", "processing")
    # And a failed attempt of the replay keeps it in progress, numbered after the first round
    await _u1_row(db, a, event, task, "email", 4, "failed", "processing")
    assert (await shown())["status"] == "processing"
    replay_row = await db.fetchrow("SELECT attempt, campaign_id FROM message_logs "
                                   "WHERE task_id = $1 AND kind = 'replayed'", task)
    assert tuple(replay_row) == (3, "c1")
    # A replay of an entry already gone leaves no row behind
    again = await xadd(redis, keys.dlq, record, 1000)
    await redis.xdel(keys.dlq, again)
    assert (await api.call("POST", f"/v1/dlq/{again}/replay", key=a.full)).status == 404
    assert await db.fetchval("SELECT count(*) FROM message_logs WHERE kind = 'replayed'") == 1


async def test_a_replayed_engine_entry_reopens_its_recipient(
    api: Api, redis: Redis, db: asyncpg.Pool
) -> None:
    keys = Keys(api.settings.namespace)
    a, event = await _project_with_a_send(api)
    # Given the recipient's engine entry (no task yet) was dead-lettered
    row_id = untasked_row_id(event, "u1")
    await _u1_row(db, a, event, row_id, "", 3, "dead_lettered", "dead_lettered")
    record = dlq_record(keys, a.id, "1-0", 0)
    record["payload"] = {"projectId": a.id, "eventId": event, "user": {"id": "u1"}}
    entry_id = await xadd(redis, keys.dlq, record, 1000)
    # When it is replayed, the replay lands on that recipient's timeline
    assert (await api.call("POST", f"/v1/dlq/{entry_id}/replay", key=a.full)).status == 202
    body = (await api.call("GET", f"/v1/notifications/{event}", key=a.full)).body
    [recipient] = body["recipients"]
    assert (recipient["userId"], recipient["channel"], recipient["taskId"]) == ("u1", None,
                                                                                 row_id)
    assert [e["kind"] for e in recipient["timeline"]] == ["dead_lettered", "replayed"]
    assert body["status"] == "processing"


@pytest.mark.parametrize("odd", [
    {"channel": "fax"},  # no channel of the timeline's
    {"channel": None},
    {"userId": "u\x001"},  # nothing a text column holds
    {"campaignId": "c\x00"},
    {"taskId": "t\x00"},
])
async def test_an_entry_whose_ids_the_timeline_cannot_hold_as_they_are_is_replayed(
    api: Api, redis: Redis, db: asyncpg.Pool, odd: dict[str, Any]
) -> None:
    """A poison's own data is what made it fail: the replay's row is written where the
    events service wrote its dead_lettered row, not refused by PostgreSQL as a 500."""
    keys = Keys(api.settings.namespace)
    a, event = await _project_with_a_send(api)
    task = "01a00000-0000-7000-8000-000000000001"
    record = dlq_record(keys, a.id, "1-0", 0)
    record["stream"] = keys.outbound("normal")
    record["payload"] = {"projectId": a.id, "eventId": event, "taskId": task, "userId": "u1",
                         "channel": "email", **odd}
    entry_id = await xadd(redis, keys.dlq, record, 1000)
    reply = await api.call("POST", f"/v1/dlq/{entry_id}/replay", key=a.full)
    assert reply.status == 202, reply.body
    dead = outcome_row({"type": "notification:failed", "stream": record["stream"],
                        "attempts": 3, **record["payload"]})
    assert dead is not None
    row = await db.fetchrow("SELECT task_id, channel FROM message_logs "
                            "WHERE kind = 'replayed'")
    assert row is not None
    assert (row["task_id"], row["channel"]) == (dead.task_id.replace("\x00", "\ufffd"),
                                                dead.channel)


async def test_a_dlq_page_that_runs_out_of_scan_budget_goes_on_from_where_it_stopped(
    api: Api, redis: Redis, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A page reads a bounded number of entries; one that finds nothing of the caller's within
    it is empty with a cursor, and the cursor leads on to the caller's entries."""
    monkeypatch.setattr(dlq_routes, "SCAN_CHUNK", 2)
    monkeypatch.setattr(dlq_routes, "SCAN_BUDGET", 3)
    keys = Keys(api.settings.namespace)
    a, b = await api.project("a"), await api.project("b")
    for n in range(5):
        await xadd(redis, keys.dlq, dlq_record(keys, b.id, f"1-{n}", n), 1000)
    mine = await xadd(redis, keys.dlq, dlq_record(keys, a.id, "1-5", 5), 1000)

    first = await api.call("GET", "/v1/dlq", key=a.full)
    assert (first.status, first.body["items"]) == (200, [])
    assert first.body["nextCursor"] is not None
    second = await api.call("GET", "/v1/dlq", key=a.full,
                            params={"cursor": first.body["nextCursor"]})
    assert [i["id"] for i in second.body["items"]] == [mine]
    assert second.body["nextCursor"] is None


async def test_an_entry_of_a_canceled_notification_is_not_replayed(
    api: Api, redis: Redis, db: asyncpg.Pool
) -> None:
    """A cancel promises that nothing more of the notification is sent: a replay (say, of
    everything dead-lettered during a provider outage) must not send part of it after all."""
    keys = Keys(api.settings.namespace)
    a, event = await _project_with_a_send(api, to=["u1", "u2"], sendAt="2099-01-01T00:00:00Z")
    # Given one of its tasks was dead-lettered, and the notification was canceled since
    record = dlq_record(keys, a.id, "1-0", 0)
    record["stream"] = keys.outbound("normal")
    record["payload"] = {"projectId": a.id, "eventId": event, "userId": "u1",
                         "taskId": "01a00000-0000-7000-8000-000000000001", "channel": "email"}
    entry_id = await xadd(redis, keys.dlq, record, 1000)
    assert (await api.call("POST", f"/v1/notifications/{event}/cancel", key=a.full)).status \
        == 200
    # When it is replayed, the replay is refused and nothing goes back to the stream
    reply = await api.call("POST", f"/v1/dlq/{entry_id}/replay", key=a.full)
    assert reply.status == 409, reply.body
    assert reply.body["error"]["code"] == "notification_canceled"
    assert await redis.xlen(keys.outbound("normal")) == 0
    assert await db.fetchval("SELECT count(*) FROM message_logs WHERE kind = 'replayed'") == 0
    # And the entry stays in the DLQ, to be deleted
    assert [e["id"] for e in (await api.call("GET", "/v1/dlq", key=a.full)).body["items"]] \
        == [entry_id]
    assert (await api.call("DELETE", f"/v1/dlq/{entry_id}", key=a.full)).status == 204
    # While an entry of the events service (an outcome of work done before the cancel) is
    # still replayed: it only records what happened
    record["stream"] = keys.events_inbound
    record["payload"] = {"type": "notification:failed", "projectId": a.id, "eventId": event}
    entry_id = await xadd(redis, keys.dlq, record, 1000)
    assert (await api.call("POST", f"/v1/dlq/{entry_id}/replay", key=a.full)).status == 202


async def test_an_entry_with_nowhere_or_nothing_to_replay_is_a_409_and_stays(
    api: Api, redis: Redis
) -> None:
    keys = Keys(api.settings.namespace)
    a = await api.project("a")
    for change in ({"stream": "elsewhere:stream"}, {"stream": keys.dlq}, {"payload": [1]}):
        entry_id = await xadd(redis, keys.dlq, {**dlq_record(keys, a.id, "1-0", 0), **change},
                              1000)
        reply = await api.call("POST", f"/v1/dlq/{entry_id}/replay", key=a.full)
        assert (reply.status, reply.body["error"]["code"]) == (409, "not_replayable"), change
        assert (await api.call("GET", f"/v1/dlq/{entry_id}", key=a.full)).status == 200
    described = (await api.call("GET", "/openapi.json")).body["paths"][
        "/v1/dlq/{entryId}/replay"]["post"]["responses"]["409"]["description"]
    assert "not_replayable" in described
    assert "notification_canceled" in described


async def test_a_replay_racing_a_cancel_waits_for_it_and_is_refused(
    api: Api, redis: Redis, db: asyncpg.Pool
) -> None:
    """A cancel holds its notification FOR UPDATE until it commits: a replay checked while it
    was under way must wait for the outcome, not read the row as it was and send the task."""
    keys = Keys(api.settings.namespace)
    a, event = await _project_with_a_send(api, sendAt="2099-01-01T00:00:00Z")
    record = dlq_record(keys, a.id, "1-0", 0)
    record["stream"] = keys.outbound("normal")
    record["payload"] = {"projectId": a.id, "eventId": event, "userId": "u1",
                         "taskId": "01a00000-0000-7000-8000-000000000001", "channel": "email"}
    entry_id = await xadd(redis, keys.dlq, record, 1000)
    async with db.acquire() as conn:
        cancel = conn.transaction()
        await cancel.start()
        await conn.execute("SELECT 1 FROM notifications WHERE id = $1 FOR UPDATE", event)
        await conn.execute("UPDATE notifications SET canceled_at = now() WHERE id = $1", event)
        replay = asyncio.create_task(
            api.call("POST", f"/v1/dlq/{entry_id}/replay", key=a.full))
        # The race proper: the replay's check is waiting on the cancel's row lock.
        await until_blocked_by(db, conn.get_server_pid(), replay)
        await cancel.commit()
    reply = await replay
    assert reply.status == 409, reply.body
    assert await redis.xlen(keys.outbound("normal")) == 0


async def until_blocked_by(db: asyncpg.Pool, holder: int, request: asyncio.Task[Any]) -> None:
    """Returns once some session waits on a lock ``holder`` (a backend's pid) holds; fails if
    ``request`` ends first (it did not wait for the lock)."""
    while not await db.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))", holder
    ):
        assert not request.done(), "the request did not wait for the lock"
        await asyncio.sleep(0.01)


async def test_a_scheduler_entry_of_a_canceled_notification_is_not_replayed(
    api: Api, redis: Redis, db: asyncpg.Pool
) -> None:
    """The scheduler's entries carry the task they hold as their own payload: the cancel
    check looks at that task's notification, so the replay is refused as for any other
    stage's entry rather than moved out of the DLQ for the scheduler to drop."""
    keys = Keys(api.settings.namespace)
    a, event = await _project_with_a_send(api, sendAt="2099-01-01T00:00:00Z")
    task = {"projectId": a.id, "eventId": event, "userId": "u1",
            "taskId": "01a00000-0000-7000-8000-000000000001", "channel": "email"}
    record = dlq_record(keys, a.id, "1-0", 0)
    record.update(stream=keys.scheduled, group="notifkit:group:scheduler", service="scheduler",
                  payload={"taskId": task["taskId"], "projectId": a.id, "dueAt": 1,
                           "stream": keys.outbound("normal"), "payload": task,
                           "reason": "rateLimited"}, replayOf=f"{keys.scheduled}/1-0")
    entry_id = await xadd(redis, keys.dlq, record, 1000)
    assert (await api.call("POST", f"/v1/notifications/{event}/cancel", key=a.full)).status \
        == 200
    reply = await api.call("POST", f"/v1/dlq/{entry_id}/replay", key=a.full)
    assert reply.status == 409, reply.body
    assert reply.body["error"]["code"] == "notification_canceled"
    assert await redis.xlen(keys.scheduled) == 0
    assert [e["id"] for e in (await api.call("GET", "/v1/dlq", key=a.full)).body["items"]] \
        == [entry_id]


async def test_a_replayed_scheduler_entry_reopens_the_task_it_holds(
    api: Api, redis: Redis, db: asyncpg.Pool
) -> None:
    """A scheduler entry carries its task under ``payload``, where the events service finds
    it for the dead_lettered row; the replay looked for the notification at the top level,
    found none and wrote no 'replayed' row, so the notification read dead_lettered until the
    task was sent (a sendAt days away: for days)."""
    keys = Keys(api.settings.namespace)
    a, event = await _project_with_a_send(api, sendAt="2099-01-01T00:00:00Z")
    task_id = "01a00000-0000-7000-8000-000000000001"
    task = {"projectId": a.id, "eventId": event, "userId": "u1", "taskId": task_id,
            "channel": "email", "campaignId": "c1"}
    # Given the scheduler dead-lettered the entry holding the task, after three attempts
    await _u1_row(db, a, event, task_id, "email", 3, "dead_lettered", "dead_lettered")
    record = dlq_record(keys, a.id, "1-0", 0)
    record.update(stream=keys.scheduled, group="notifkit:group:scheduler", service="scheduler",
                  payload={"taskId": task_id, "projectId": a.id, "dueAt": 4070908800000,
                           "stream": keys.outbound("normal"), "payload": task,
                           "reason": "sendAt"}, replayOf=f"{keys.scheduled}/1-0")
    entry_id = await xadd(redis, keys.dlq, record, 1000)

    # When it is replayed
    assert (await api.call("POST", f"/v1/dlq/{entry_id}/replay", key=a.full)).status == 202

    # Then the task's own timeline says so, and it is in progress again
    body = (await api.call("GET", f"/v1/notifications/{event}", key=a.full)).body
    [recipient] = body["recipients"]
    assert (recipient["taskId"], recipient["channel"]) == (task_id, "email")
    assert [e["kind"] for e in recipient["timeline"]] == ["dead_lettered", "replayed"]
    assert (recipient["status"], body["status"]) == ("processing", "processing")
    row = await db.fetchrow("SELECT user_id, attempt, campaign_id FROM message_logs "
                            "WHERE kind = 'replayed'")
    assert tuple(row) == ("u1", 3, "c1")


async def test_a_replayed_record_of_the_events_or_workflow_service_reopens_no_task(
    api: Api, redis: Redis, db: asyncpg.Pool
) -> None:
    """The events service's entries record what happened to a task (and the workflow
    service's are triggers, wakes and custom events): replaying one records it again and
    redoes no work of the task. A 'replayed' row put the sent task back to 'processing',
    and nothing came after it (the record's row was there already), so the notification
    read 'processing' for ever."""
    keys = Keys(api.settings.namespace)
    a, event = await _project_with_a_send(api)
    task = "01a00000-0000-7000-8000-000000000001"
    # Given a task delivery sent, whose notification:sent the events service dead-lettered
    await _u1_row(db, a, event, task, "email", 1, "sent", "sent")
    sent = {"type": "notification:sent", "projectId": a.id, "eventId": event, "taskId": task,
            "userId": "u1", "channel": "email", "provider": "resend", "attempt": 1}
    custom = {"type": "event", "projectId": a.id, "name": "opened", "userId": "u1",
              "data": {}, "eventId": str(uuid7())}
    for stream, group, payload in (
            (keys.events_inbound, "notifkit:group:events", sent),
            (keys.workflow_inbound, "notifkit:group:workflow", custom)):
        record = dlq_record(keys, a.id, "1-0", 0)
        record.update(stream=stream, group=group, payload=payload,
                      service=group.rpartition(":")[2], replayOf=f"{stream}/1-0")
        entry_id = await xadd(redis, keys.dlq, record, 1000)

        # When it is replayed
        reply = await api.call("POST", f"/v1/dlq/{entry_id}/replay", key=a.full)
        assert (reply.status, reply.body["stream"]) == (202, stream), reply.body

    # Then it is back on its stream, and no timeline has a 'replayed' row: the task is sent
    body = (await api.call("GET", f"/v1/notifications/{event}", key=a.full)).body
    assert (body["status"], body["recipients"][0]["status"]) == ("sent", "sent")
    assert await db.fetchval("SELECT count(*) FROM message_logs WHERE kind = 'replayed'") == 0


async def test_one_dlq_entry_reads_as_the_list_shows_it_and_only_in_its_project(
    api: Api, redis: Redis
) -> None:
    keys = Keys(api.settings.namespace)
    a, b = await api.project("a"), await api.project("b")
    mine = await xadd(redis, keys.dlq, dlq_record(keys, a.id, "1-0", 0), 1000)
    theirs = await xadd(redis, keys.dlq, dlq_record(keys, b.id, "1-1", 1), 1000)
    listed = await api.call("GET", "/v1/dlq", key=a.full)
    one = await api.call("GET", f"/v1/dlq/{mine}", key=a.full)
    assert (one.status, one.body) == (200, listed.body["items"][0])
    assert (await api.admin("GET", f"/v1/dlq/{theirs}", project=b.id)).body["id"] == theirs
    for path in (f"/v1/dlq/{theirs}", "/v1/dlq/99999999999999999999-1", "/v1/dlq/garbage"):
        missing = await api.call("GET", path, key=a.full)
        assert (missing.status, missing.body["error"]["code"]) == (404, "dlq_entry_not_found")
    assert (await api.call("GET", f"/v1/dlq/{mine}", key=a.send)).status == 403


async def test_dlq_is_scoped_replayable_and_deletable(
    api: Api, redis: Redis, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="notifkit.api")
    keys = Keys(api.settings.namespace)
    a, b = await api.project("a"), await api.project("b")
    ids = []
    for n, owner in enumerate([a, b, a]):
        ids.append(await xadd(redis, keys.dlq, dlq_record(keys, owner.id, f"1-{n}", n), 1000))

    mine = await api.call("GET", "/v1/dlq", key=a.full)
    assert mine.status == 200
    assert [item["id"] for item in mine.body["items"]] == [ids[0], ids[2]]
    item = mine.body["items"][0]
    assert (item["stream"], item["group"], item["error"], item["attempts"], item["failedAt"]) \
        == (keys.enriched("normal"), "notifkit:group:engine", "RuntimeError: boom", 3,
            "2030-01-01T00:00:00Z")
    assert item["payload"]["n"] == 0
    page = await api.call("GET", "/v1/dlq", key=a.full, params={"limit": "1"})
    rest = await api.call("GET", "/v1/dlq", key=a.full,
                          params={"limit": "1", "cursor": page.body["nextCursor"]})
    assert [i["id"] for i in rest.body["items"]] == [ids[2]]
    # Only another project's entries follow: no next page to offer.
    assert rest.body["nextCursor"] is None
    assert mine.body["nextCursor"] is None
    only_b_page = await api.call("GET", "/v1/dlq", key=b.full, params={"limit": "1"})
    assert ([i["id"] for i in only_b_page.body["items"]], only_b_page.body["nextCursor"]) \
        == ([ids[1]], None)
    for forged in ("99999999999999999999-0", "18446744073709551616-0"):
        bad = await api.call("GET", "/v1/dlq", key=a.full,
                             params={"cursor": scoped_cursor(list_scope("/v1/dlq", {}),
                                                             forged)})
        assert (bad.status, bad.fields) == (400, ["cursor"])
    everything = await api.admin("GET", "/v1/dlq")
    assert len(everything.body["items"]) == 3
    only_b = await api.admin("GET", "/v1/dlq", project=b.id)
    assert [i["id"] for i in only_b.body["items"]] == [ids[1]]

    # Another project's entry does not exist for this key.
    for method, path in (("POST", f"/v1/dlq/{ids[1]}/replay"), ("DELETE", f"/v1/dlq/{ids[1]}"),
                         ("DELETE", "/v1/dlq/99999999999999999999-1"),
                         ("POST", "/v1/dlq/garbage/replay")):
        assert (await api.call(method, path, key=a.full)).status == 404

    replayed = await api.call("POST", f"/v1/dlq/{ids[0]}/replay", key=a.full)
    assert replayed.status == 202
    entries = await xrange(redis, keys.enriched("normal"))
    [(new_id, fields)] = entries
    assert replayed.body == {"id": new_id.decode(), "stream": keys.enriched("normal"),
                             "replayOf": f"{keys.enriched('normal')}/1-0"}
    assert decode(fields) == {"projectId": a.id, "eventId": "e0", "n": 0,
                              "_replayOf": f"{keys.enriched('normal')}/1-0",
                              "_replayedAttempts": 3}
    assert (await api.call("POST", f"/v1/dlq/{ids[0]}/replay", key=a.full)).status == 404

    assert (await api.call("DELETE", f"/v1/dlq/{ids[2]}", key=a.full)).status == 204
    assert (await api.call("GET", "/v1/dlq", key=a.full)).body["items"] == []
    assert await redis.xlen(keys.dlq) == 1  # b's entry is untouched
    # An operator's replay and discard are both on the record, with the notification's ids
    said = [(r.getMessage(), getattr(r, "event_id", None), getattr(r, "project_id", None))
            for r in caplog.records if "dead-lettered entry" in r.getMessage()]
    assert said == [
        (f"Replayed dead-lettered entry {ids[0]} to {keys.enriched('normal')} as "
         f"{new_id.decode()}.", "e0", a.id),
        (f"Discarded dead-lettered entry {ids[2]}; its work is never retried.", "e2", a.id)]


async def test_the_dlq_lists_one_stream_or_one_notification(api: Api, redis: Redis) -> None:
    keys = Keys(api.settings.namespace)
    a = await api.project("a")
    event = "01a00000-0000-7000-8000-0000000000e1"
    engine = dlq_record(keys, a.id, "1-0", 0)
    delivery = {**dlq_record(keys, a.id, "1-1", 1), "stream": keys.outbound("normal")}
    delivery["payload"] = {"projectId": a.id, "eventId": event, "taskId": "t1"}
    scheduler = {**dlq_record(keys, a.id, "1-2", 2), "stream": keys.scheduled,
                 "payload": {"taskId": "t2", "projectId": a.id, "dueAt": 1,
                             "stream": keys.outbound("normal"),
                             "payload": {"projectId": a.id, "eventId": event, "taskId": "t2"}}}
    ids = [await xadd(redis, keys.dlq, record, 1000)
           for record in (engine, delivery, scheduler)]

    async def listed(**params: str) -> list[str]:
        reply = await api.call("GET", "/v1/dlq", key=a.full, params=params)
        assert reply.status == 200, reply.body
        return [item["id"] for item in reply.body["items"]]

    assert await listed(stream=keys.outbound("normal")) == [ids[1]]
    # A scheduler entry is about the task it holds
    assert await listed(eventId=event) == [ids[1], ids[2]]
    assert await listed(eventId=event, stream=keys.scheduled) == [ids[2]]
    assert await listed(eventId=event.upper(), limit="1") == [ids[1]]
    bad = await api.call("GET", "/v1/dlq", key=a.full,
                         params={"stream": "outbound:nowhere", "eventId": "e0", "limit": "0"})
    assert (bad.status, sorted(bad.fields)) == (400, ["eventId", "limit", "stream"])


async def test_concurrent_replays_enqueue_once(api: Api, project: Project, redis: Redis) -> None:
    keys = Keys(api.settings.namespace)
    entry = await xadd(redis, keys.dlq, dlq_record(keys, project.id, "1-0", 0), 1000)
    replies = await asyncio.gather(*(api.call("POST", f"/v1/dlq/{entry}/replay", key=ADMIN)
                                     for _ in range(5)))
    assert sorted(r.status for r in replies) == [202, 404, 404, 404, 404]
    assert await redis.xlen(keys.enriched("normal")) == 1


async def test_a_redis_refusal_on_accept_answers_503_and_keeps_nothing(
    api: Api, project: Project, redis: Redis, db: asyncpg.Pool,
) -> None:
    created = await api.call("PUT", "/v1/templates/any", key=project.full,
                             json={"channels": {"sms": {"text": "t"}}})
    assert created.status == 201
    # A key of the wrong type where the inbound stream belongs: Redis refuses the XADD.
    await redis.set(Keys(api.settings.namespace).inbound("normal"), "not a stream")
    reply = await api.call("POST", "/v1/notifications", key=project.send,
                           json={"to": "u1", "template": "any"})
    assert reply.status == 503, reply.body
    assert reply.body["error"]["code"] == "service_unavailable"
    assert reply.headers["Retry-After"] == "1"
    assert await db.fetchval("SELECT count(*) FROM notifications") == 0


async def test_a_failed_enqueue_of_several_sends_names_every_event(
    settings: Settings, project: Project, redis: Redis, db: asyncpg.Pool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Sends accepted together fail together; the record named the first one's event only.
    keys = Keys(settings.namespace)
    await redis.set(keys.inbound("normal"), "not a stream")
    admission = Admission(settings, keys, redis, db, TokenBuckets(redis))
    messages: list[InboundMessage] = [
        {"eventId": uuid7(), "projectId": project.id, "template": "t",
         "to": {"userId": "u1"}, "data": {}, "channels": None, "priority": "normal",
         "sendAt": None, "campaignId": None, "idempotencyKey": None,
         "createdAt": "2026-12-01T00:00:00.000Z"} for _ in range(3)]
    caplog.set_level(logging.WARNING, logger="notifkit.api")
    outcomes = await asyncio.gather(*(admission.accept(m) for m in messages),
                                    return_exceptions=True)
    assert all(isinstance(o, ResponseError) for o in outcomes), outcomes
    named: set[str] = set()
    for record in caplog.records:
        if "Enqueueing" in record.getMessage():
            fields = vars(record)
            assert fields["project_id"] == project.id
            named |= {fields["event_id"], *fields.get("event_ids", ())}
    assert named == {m["eventId"] for m in messages}


async def test_a_send_answered_503_is_logged_with_its_project_and_event(
    api: Api, project: Project, redis: Redis, caplog: pytest.LogCaptureFixture,
) -> None:
    # The 503's record named only the path: an operator could not tell whose send failed,
    # nor find the notification the send had minted (whose rows, when Redis cannot tell
    # whether the entry was enqueued, stay for the reconciliation and may still be sent).
    created = await api.call("PUT", "/v1/templates/any", key=project.full,
                             json={"channels": {"sms": {"text": "t"}}})
    assert created.status == 201
    await redis.set(Keys(api.settings.namespace).inbound("normal"), "not a stream")
    caplog.set_level(logging.WARNING, logger="notifkit.api")
    reply = await api.call("POST", "/v1/notifications", key=project.send,
                           json={"to": "u1", "template": "any"})
    assert reply.status == 503, reply.body
    [record] = [r for r in caplog.records if "the client is told to retry" in r.getMessage()]
    fields = vars(record)
    assert (fields["path"], fields["method"]) == ("/v1/notifications", "POST")
    assert fields["project_id"] == project.id
    [enqueue] = [r for r in caplog.records if "Enqueueing" in r.getMessage()]
    assert fields["event_id"] == vars(enqueue)["event_id"]
    assert vars(enqueue)["project_id"] == project.id


@pytest.mark.parametrize(("error", "unavailable"), [
    (asyncpg.TooManyConnectionsError("too many clients"), True),
    (asyncpg.CannotConnectNowError("starting up"), True),
    (asyncpg.AdminShutdownError("terminating"), True),
    (asyncpg.ConnectionFailureError("gone"), True),
    (asyncpg.UniqueViolationError("duplicate"), False),
    (asyncpg.UndefinedColumnError("no such column"), False),
    (ResponseError("OOM command not allowed when used memory > 'maxmemory'."), True),
    (ConnectionRefusedError(), True),
    (KeyError("bug"), False),
])
def test_only_a_store_that_cannot_serve_answers_503(error: Exception,
                                                    unavailable: bool) -> None:
    assert store_unavailable(error) is unavailable


@pytest.mark.parametrize("path", ["/v1/dlq", "/v1/streams", "/v1/workflows"])
async def test_a_bad_limit_and_a_bad_cursor_are_named_in_one_answer(
        api: Api, project: Project, path: str) -> None:
    both = await api.call("GET", path, key=project.full, params={"limit": "0", "cursor": "zz"})
    assert (both.status, sorted(both.fields)) == (400, ["cursor", "limit"])
    # A cursor that decodes but names nothing this list made is still refused.
    forged = await api.call("GET", path, key=project.full, params={"cursor": scoped_cursor(
        list_scope(path, {}), -1 if path != "/v1/streams" else "x")})
    assert (forged.status, forged.fields) == (400, ["cursor"])


async def test_health_answers_while_postgres_stalls(settings: Settings) -> None:
    """A PostgreSQL that accepts connections but stops answering (a partition, a frozen
    failover) held /health for as long as the stall lasted: timing out its probe cancelled the
    query, and the cancelled query then waited for its connection to be given back to the
    pool, which waited for the server. A health check must answer within its own timeout."""
    from notifkit.db.pool import create_pool

    proxy = PostgresProxy(settings)
    await proxy.start()
    pool = await create_pool(proxy.settings)
    _server, client = await start_api(settings, db=pool)
    try:
        assert (await client.get("/health")).status == 200
        proxy.stall()
        # Bounded only so a regression fails instead of hanging; the check answers in ~1 s.
        reply = await asyncio.wait_for(client.get("/health"), 30)
        assert reply.status == 503
        body = await reply.json()
        assert (body["status"], body["redis"], body["postgres"]) == ("degraded", "ok",
                                                                     "unreachable")
        again = await asyncio.wait_for(client.get("/health"), 30)  # the pool's other connection
        assert (await again.json())["postgres"] == "unreachable"
    finally:
        await client.close()
        pool.terminate()
        await proxy.stop()


async def test_health_asks_both_stores_at_once(settings: Settings) -> None:
    """With Redis and PostgreSQL both stalled, /health waited a second for one, then a second
    for the other: two seconds, past the one-second timeout most probes use (a Kubernetes
    probe's default). Both are asked at once, so it answers within about one."""
    from notifkit.db.pool import create_pool
    from tests.support.pg_proxy import StallingRedisProxy

    async with PostgresProxy(settings) as pg, StallingRedisProxy(settings) as rd:
        pool = await create_pool(pg.settings)
        _server, client = await start_api(rd.settings, db=pool)
        try:
            assert (await client.get("/health")).status == 200
            pg.stall()
            rd.stall()
            started = time.monotonic()
            reply = await asyncio.wait_for(client.get("/health"), 30)
            took = time.monotonic() - started
            assert reply.status == 503
            body = await reply.json()
            assert (body["redis"], body["postgres"]) == ("unreachable", "unreachable")
            assert took < 1.6, took
        finally:
            pg.restore()
            rd.restore()
            await client.close()
            pool.terminate()


async def test_every_route_answers_503_while_postgres_stalls(settings: Settings) -> None:
    """Every API query waited for a PostgreSQL that had stopped answering for as long as it
    did: requests hung (over 40 s seen) where a 503 that asks to retry was due. The api
    service's pool now limits each query, and the opening of a connection for one
    (QUERY_TIMEOUT_S; 1 s here), and the request answers 503."""
    from notifkit.db.pool import create_pool

    proxy = PostgresProxy(settings)
    await proxy.start()
    # as the api service makes it
    pool = await create_pool(proxy.settings, command_timeout=1.0)
    _server, client = await start_api(settings, db=pool)
    admin = {"Authorization": f"Bearer {ADMIN}"}
    try:
        created = await client.post("/v1/projects", json={"name": "p"}, headers=admin)
        assert created.status == 201
        project = (await created.json())["id"]
        proxy.stall()
        for _ in range(2):  # the second needs a new connection, whose opening stalls too
            # Bounded only so a regression fails instead of hanging.
            reply = await asyncio.wait_for(
                client.get(f"/v1/projects/{project}", headers=admin), 30)
            assert reply.status == 503
            assert reply.headers["Retry-After"] == "1"
            assert (await reply.json())["error"]["code"] == "service_unavailable"
    finally:
        await client.close()
        pool.terminate()
        await proxy.stop()
