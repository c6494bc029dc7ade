"""Caller idempotency keys (``x-idempotency-key``): the first response, replayed for 24 h.

    claim   SET key {"state": "pending", "fingerprint"} NX EX 60   -> this request does the work
    finish  SET key {"state": "done", "fingerprint", "status", "body"} EX 24 h, in the same
            script call as the enqueue (:class:`Remember`)
    release DEL key                                                -> the work failed; a retry may

Storing the response with the enqueue, not after it, matters when the process dies between
the two: a retry would find only the 'pending' claim (a 409 until it expires, 60 s later) and
then be accepted as a second notification.

A second request with the same key waits while the first is pending, then replays its
response, so two concurrent identical requests enqueue once. As API.md says, the same key
within 24 h gets the first response whatever the body (a retry that rebuilt its body, with a
new timestamp in ``data`` say, is still the same send); a different body is logged. The body
must still have the right shape: one that would be a 400 without the key (malformed JSON, a
missing, mistyped or unknown field) is that 400 with it too, while what depends on stored
state (a template or workflow that exists) is checked only after the replay. The same
key on another route is a 409: that response would answer a request the caller did not make.

Redis may lose every record at once (a restart without persistence, a failover to an empty
replica). ``notif:idempotency:since`` says since when (Redis's time) the data set has held
them: the claim that finds it missing sets it, in the same script call. While it is younger
than a key's lifetime (24 h), a claim won for a key Redis does not know may be a retry of a
request whose record went with the data, so a route that keeps its sends in PostgreSQL looks
the key up there (``recover`` in :func:`answer_once`; only sends made before the marker, as
one made since whose record is missing was never answered) before doing the work: found, the
first response is replayed and its record restored for the rest of its 24 h. Only the
claim's winner looks, holding the claim, so racing retries wait for its answer as they would
for any first request; once the marker is older than 24 h no request looks at all.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
from aiohttp import web
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from notifkit import codec
from notifkit.services.api.errors import ApiError, invalid_field, json_response
from notifkit.services.api.state import KEYS, REDIS, SETTINGS

log = logging.getLogger("notifkit.api")

HEADER = "x-idempotency-key"
REPLAY_HEADER = "x-idempotent-replay"
MAX_KEY_CHARS = 255
PENDING_TTL_S = 60
WAIT_STEP_S = 0.05
WAIT_TOTAL_S = 10.0


@dataclass(frozen=True, slots=True)
class Remember:
    """A key's finished record (the first response), for the enqueue to write in the same
    atomic call as its XADD (``notifkit.streams.XADD_AND_SET``)."""

    key: str
    record: bytes
    ttl_s: int


class MaybeDone(RedisConnectionError):
    """The work's outcome is unknown: its enqueue (and with it the key's record) may have run.
    The key is kept, so a retry replays the record if it was written, and otherwise waits for
    the pending claim to expire rather than making a second notification at once."""


@dataclass(frozen=True, slots=True)
class Replay:
    status: int
    body: Any


@dataclass(frozen=True, slots=True)
class Earlier:
    """A first response found in the system of record after Redis lost the key's record,
    with how long its key has left to live."""

    status: int
    body: Any
    ttl_s: int


# SET NX the pending record; the winner also learns when (Redis's time, ms) the data set holding
# the records began and what time it is now, marking the start if the mark is missing (a first
# start, or Redis lost its data). A loser gets the record that beat it, in the same round trip.
_CLAIM = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local since = tonumber(redis.call('GET', KEYS[2]))
    if not since then
        since = now
        redis.call('SET', KEYS[2], now)
    end
    return {1, since, now}
end
return {0, redis.call('GET', KEYS[1])}
"""


# How long the start-up check below may ask PostgreSQL before leaving the marker to the claims.
FRESH_CHECK_TIMEOUT_S = 2.0


async def date_fresh_data_set(redis: Redis, since_key: str, pool: asyncpg.Pool,
                              lifetime_s: int) -> bool:
    """At start, a data set without the marker (a new Redis, or one that lost its data) whose
    PostgreSQL holds no keyed send of the last ``lifetime_s`` lost no record a retry could
    need: it is marked as older than that, so keyed sends skip the lookup from the first.
    Otherwise the marker is left to the first claim, which dates the data set from now.
    Best effort: a store that cannot answer leaves it to the claims too. True if it marked."""
    try:
        async with asyncio.timeout(FRESH_CHECK_TIMEOUT_S):
            if await redis.exists(since_key):
                return False
            seconds, micros = await redis.time()
            now_ms = seconds * 1000 + micros // 1000
            oldest_ms = now_ms - lifetime_s * 1000
            # Event ids are UUIDv7, time-ordered: the primary key finds the window's sends.
            recent = await pool.fetchval(
                "SELECT EXISTS (SELECT 1 FROM notifications WHERE id >= $1 "
                "AND idempotency_key IS NOT NULL)", uuid.UUID(int=max(0, oldest_ms) << 80))
            if recent:
                return False
            return bool(await redis.set(since_key, oldest_ms - 1, nx=True))
    except (RedisError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError,
            TimeoutError) as exc:
        log.warning("Could not tell at start whether Redis lost idempotency records (%s): "
                    "keyed sends look up their key in PostgreSQL for up to 24 h.",
                    type(exc).__name__)
        return False


async def pause() -> None:
    """One step of the wait for a request in progress with the same key."""
    await asyncio.sleep(WAIT_STEP_S)


def header_key(request: web.Request) -> str | None:
    """The request's idempotency key, validated; None when it has none."""
    value = request.headers.get(HEADER)
    if value is None:
        return None
    if not 1 <= len(value) <= MAX_KEY_CHARS or not value.isprintable():
        raise invalid_field(HEADER, f"must be 1 to {MAX_KEY_CHARS} printable characters")
    return value


def fingerprint(route: str, body: Any) -> str:
    canonical = json.dumps([route, body], sort_keys=True, separators=(",", ":"),
                           ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


async def replay_earlier(request: web.Request, project: str, key: str | None,
                         route: str) -> web.Response | None:
    """The first response to ``key`` on ``route`` if one is stored. Looked up once the body
    has the right shape (a key never makes malformed JSON or a missing, mistyped or unknown
    field acceptable) but before anything stored is consulted, so a retry still gets its
    answer when, say, the template it named was deleted since. A first request still in
    progress is waited for, as :meth:`IdempotencyKey.claim` waits: a retry that came before
    its answer gets that answer too, not a 400 from what changed meanwhile."""
    if key is None:
        return None
    redis = request.app[REDIS]
    name = request.app[KEYS].api_idempotency(project, key)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_TOTAL_S
    while True:
        raw = await redis.get(name)
        if raw is None:
            return None
        record = codec.loads(raw)
        if record.get("route") != route:
            return None  # claim() answers the 409
        if record.get("state") == "done":
            return json_response(record["body"], int(record["status"]), {REPLAY_HEADER: "true"})
        if loop.time() >= deadline:
            raise key_in_use()
        await pause()


def key_reused() -> ApiError:
    """The 409 for a key first used with another route."""
    return ApiError(
        409, "idempotency_key_reused",
        "This idempotency key was used with another route; use a new key.",
        [{"field": HEADER, "message": "was used with another route"}],
    )


def key_in_use() -> ApiError:
    """The 409 for a key whose first request is still in progress after the wait."""
    return ApiError(
        409, "idempotency_key_in_use",
        "A request with this idempotency key is still being processed; retry shortly.",
        [{"field": HEADER, "message": "is in use by a request in progress"}],
        headers={"Retry-After": "1"},
    )


class IdempotencyKey:
    def __init__(self, redis: Redis, key: str, route: str, body: Any, ttl_s: int,
                 since_key: str) -> None:
        self.redis = redis
        self.key = key
        self.route = route
        self.fingerprint = fingerprint(route, body)
        self.ttl_s = ttl_s
        self.since_key = since_key
        # Set by a won claim: when (Redis's time, ms) Redis last lost its data, if less than a
        # key's lifetime ago. A record written before then may have gone with the data; one
        # of a send made since then would still be here.
        self.lost_records_before_ms: int | None = None

    async def claim(self) -> Replay | None:
        """None: this request owns the key and must :meth:`finish` or :meth:`release` it.
        Otherwise the first request's response, to be replayed."""
        pending = codec.dumps({"state": "pending", "route": self.route,
                               "fingerprint": self.fingerprint})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_TOTAL_S
        while True:
            won, value, *now = await self.redis.eval(  # type: ignore[misc]
                _CLAIM, 2, self.key, self.since_key, pending, PENDING_TTL_S)
            if won:
                since_ms = int(value)
                if int(now[0]) - since_ms < self.ttl_s * 1000:
                    self.lost_records_before_ms = since_ms
                return None
            record = codec.loads(value)
            if record.get("route") != self.route:
                raise key_reused()
            if record.get("state") == "done":
                if record.get("fingerprint") != self.fingerprint:
                    log.info("Replayed the first response to an idempotency key reused with "
                             "a different body.", extra={"route": self.route})
                return Replay(int(record["status"]), record["body"])
            if loop.time() >= deadline:
                raise key_in_use()
            await pause()

    def remember(self, status: int, body: Any) -> Remember:
        record = {"state": "done", "route": self.route, "fingerprint": self.fingerprint,
                  "status": status, "body": body}
        return Remember(self.key, codec.dumps(record), self.ttl_s)

    async def finish(self, status: int, body: Any, ttl_s: int | None = None) -> None:
        done = self.remember(status, body)
        await self.redis.set(done.key, done.record,
                             ex=done.ttl_s if ttl_s is None else max(1, ttl_s))

    async def release(self) -> None:
        await self.redis.delete(self.key)


async def answer_once(
    request: web.Request, project: str, key: str | None, route: str, body: Any, status: int,
    response: Any, enqueue: Callable[[Remember | None], Awaitable[None]],
    recover: Callable[[int], Awaitable[Earlier | None]] | None = None,
) -> web.Response:
    """Run ``enqueue`` and answer ``response`` with ``status``; under an idempotency key, only
    the first request with that key runs it and the others replay its answer. ``enqueue``
    gets the key's finished record (None without a key) and writes it atomically with its
    XADD, so no instant exists at which the work is queued but the key is not answered.
    ``recover(before_ms)`` finds the key's first response in the system of record, from a
    request made before ``before_ms`` (Redis's time of its last loss of data: a later one left
    its record in Redis); it is asked only by the claim's winner, and only within a key's
    lifetime of that loss."""
    if key is None:
        await enqueue(None)
        return json_response(response, status)
    app = request.app
    keys = app[KEYS]
    idem = IdempotencyKey(app[REDIS], keys.api_idempotency(project, key), route, body,
                          app[SETTINGS].caller_idempotency_ttl_s, keys.api_idempotency_since)
    replay = await idem.claim()
    if replay is not None:
        return json_response(replay.body, replay.status, {REPLAY_HEADER: "true"})
    try:
        if recover is not None and idem.lost_records_before_ms is not None:
            earlier = await recover(idem.lost_records_before_ms)
            if earlier is not None:
                await idem.finish(earlier.status, earlier.body, earlier.ttl_s)
                log.info("Replayed the first response to an idempotency key from PostgreSQL: "
                         "Redis lost its record with the rest of its data.",
                         extra={"route": route, "project_id": project})
                return json_response(earlier.body, earlier.status, {REPLAY_HEADER: "true"})
        await enqueue(idem.remember(status, response))
    except MaybeDone:
        raise
    except BaseException:
        await idem.release()
        raise
    return json_response(response, status)
