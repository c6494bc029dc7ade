"""Operations: ``/health``, ``/metrics``, ``/v1/streams`` and the OpenAPI document.

``/health`` answers 503 (status ``degraded``) when Redis or PostgreSQL does not answer within
``HEALTH_TIMEOUT_S``, and lists every service's heartbeat (``notif:health:*``, found through the
``notif:heartbeats`` index rather than a SCAN, which a busy shared Redis could not finish
within the timeout). A heartbeat
older than three intervals (the service stalled but its key has not expired yet), or one that
says its worker's reads fail (``readError``), makes the status ``degraded``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from notifkit import codec, metrics, metrics_store
from notifkit.config import SERVICES
from notifkit.db.availability import answers
from notifkit.keys import Keys
from notifkit.services.api.errors import json_response
from notifkit.services.api.routing import CURSOR, LIMIT, Operations, Reply
from notifkit.services.api.schemas import ref
from notifkit.services.api.state import DB, KEYS, OPERATIONS, REDIS, SETTINGS
from notifkit.services.api.validation import encode_cursor, page_query
from notifkit.streams import as_str
from notifkit.worker.health import HEARTBEAT_INDEX_KEEP_S

ops = Operations("operations")

HEALTH_TIMEOUT_S = 1.0
STALE_BEATS = 3
# The text format's 0.0.4 label, which every Prometheus reads; prometheus_client's latest label
# (1.0.0) is refused by older scrapers, and what we render is the same text for our names.
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


@ops.route("GET", "/health", "Liveness of Redis, PostgreSQL and every service", access="public",
           responses={200: ref("Health"),
                      503: Reply(ref("Health"), "Redis or PostgreSQL is unreachable.")})
async def health(request: web.Request) -> web.Response:
    app = request.app
    # Both at once: one after the other, two stores that stopped answering took twice the
    # timeout, past the one second a probe commonly allows.
    (redis_ok, services), postgres_ok = await asyncio.gather(
        _redis_health(app[REDIS], app[KEYS], app[SETTINGS].heartbeat_interval_s),
        _postgres_health(app))
    # API.md knows two statuses; a 503 is the degraded one, and `redis` / `postgres` say why.
    if not (redis_ok and postgres_ok) or any(s["stale"] or "readError" in s
                                             for s in services.values()):
        status = "degraded"
    else:
        status = "ok"
    body = {
        "status": status,
        "redis": "ok" if redis_ok else "unreachable",
        "postgres": "ok" if postgres_ok else "unreachable",
        "services": services,
    }
    return json_response(body, 200 if redis_ok and postgres_ok else 503)


@ops.route("GET", "/metrics", "Prometheus metrics", access="public",
           responses={200: Reply({"type": "string"}, "Prometheus text exposition format.",
                                 content_type="text/plain")})
async def prometheus_metrics(request: web.Request) -> web.Response:
    app = request.app
    # Without Redis this raises, and the route answers 503 as any route does: the counters
    # are the whole system's totals, kept there, and this process's own counts in their
    # place would make every counter go down (a reset to Prometheus, which then counts the
    # whole total again once Redis is back). A failed scrape is recorded as one (`up` 0).
    streams = await asyncio.wait_for(stream_stats(app[REDIS], app[KEYS]), HEALTH_TIMEOUT_S)
    # This process's own counts first, so what it just did shows at once.
    await asyncio.wait_for(metrics_store.flush(app[REDIS], app[KEYS]), HEALTH_TIMEOUT_S)
    totals = await asyncio.wait_for(metrics_store.read_totals(app[REDIS], app[KEYS]),
                                    HEALTH_TIMEOUT_S)
    for info in streams:
        metrics.STREAM_LENGTH.labels(info["stream"]).set(info["length"])
        metrics.STREAM_DEPTH.labels(info["stream"]).set(stream_depth(info))
        for group in info["groups"]:
            metrics.STREAM_PENDING.labels(info["stream"], group["name"]).set(group["pending"])
            metrics.STREAM_OLDEST_PENDING_AGE.labels(info["stream"], group["name"]).set(
                group["oldestPendingAgeSeconds"] or 0)
    return web.Response(body=metrics_store.render(totals),
                        headers={"Content-Type": PROMETHEUS_TEXT})


@ops.route("GET", "/v1/streams", "Every stream's length, pending count, oldest pending age and "
           "consumers", access="ops", query=(LIMIT, CURSOR),
           responses={200: ref("StreamList")},
           description="The admin key or a full key. Streams are shared by every project. "
                       "A list like the others (limit, cursor), though every stream fits on "
                       "the default page.")
async def list_streams(request: web.Request) -> web.Response:
    app = request.app
    limit, cursor = page_query(request, 1, lambda parts: not isinstance(parts[0], bool)
                               and isinstance(parts[0], int) and parts[0] >= 0)
    start = 0 if cursor is None else cursor[0]
    streams = await stream_stats(app[REDIS], app[KEYS])
    end = start + limit
    return json_response({"items": streams[start:end],
                          "nextCursor": encode_cursor(request, end) if end < len(streams)
                          else None})


@ops.route("GET", "/openapi.json", "This document", access="public",
           responses={200: Reply({"type": "object"}, "An OpenAPI 3.1 document.")})
async def openapi_document(request: web.Request) -> web.Response:
    from notifkit.services.api.openapi import document

    return json_response(document(list(request.app[OPERATIONS].values())))


# ---------------------------------------------------------------------------------------------


async def _redis_health(
    redis: Redis, keys: Keys, interval_s: float
) -> tuple[bool, dict[str, dict[str, Any]]]:
    try:
        return True, await asyncio.wait_for(_heartbeats(redis, keys, interval_s),
                                            HEALTH_TIMEOUT_S)
    except (RedisError, OSError, TimeoutError):
        return False, {}


async def _heartbeats(
    redis: Redis, keys: Keys, interval_s: float
) -> dict[str, dict[str, Any]]:
    await redis.ping()
    now = time.time()
    # Consumers gone for long (their key expired an hour ago) leave the index for good.
    index = redis.pipeline(transaction=False)
    index.zremrangebyscore(keys.heartbeats, "-inf", now - HEARTBEAT_INDEX_KEEP_S)
    index.zrange(keys.heartbeats, 0, -1, withscores=True)
    replies = await index.execute()
    last_beats = {as_str(member): float(score) for member, score in replies[1]}
    if not last_beats:
        return {}
    consumers = list(last_beats)
    names = [keys.health(consumer) for consumer in consumers]
    prefix = keys.health_prefix()
    services: dict[str, dict[str, Any]] = {}
    died: list[str] = []
    for consumer, name, raw in zip(consumers, names, await redis.mget(names), strict=True):
        if raw is None:
            # Its key expired while it is still indexed: it stopped without a clean stop
            # (which leaves the index), killed or frozen.
            died.append(consumer)
            continue
        try:
            beat = codec.loads(raw)
        except ValueError:
            continue
        if not isinstance(beat, dict):
            continue
        ts = beat.get("ts")
        stale = isinstance(ts, int | float) and now - ts > STALE_BEATS * max(interval_s, 1.0)
        in_flight = beat.get("inFlight")
        entry: dict[str, Any] = {
            "service": str(beat.get("service", "")),
            "lastBeat": beat.get("lastBeat") if isinstance(beat.get("lastBeat"), str) else None,
            "inFlight": in_flight if isinstance(in_flight, int) else 0,
            "stale": bool(stale),
        }
        if isinstance(beat.get("readError"), str):
            entry["readError"] = beat["readError"]  # it beats, but every read fails
        services[name[len(prefix):]] = entry
    # A dead consumer whose service still runs elsewhere is no news: the others reclaim what
    # it held. The last one of its service stays listed, stale, so the status says that
    # nothing runs that service any more (until one beats again, or an hour passes). Only
    # the last: every process of a crash loop listed for an hour buried when it stopped.
    # One whose key has not expired yet (listed above) died after any whose key has.
    listed = {s["service"] for s in services.values()}
    last_died: dict[str, str] = {}
    for consumer in died:
        service = consumer.partition("-")[0]
        if service in SERVICES and service not in listed and (
                service not in last_died
                or last_beats[consumer] > last_beats[last_died[service]]):
            last_died[service] = consumer
    for service, consumer in last_died.items():
        services[consumer] = {"service": service, "lastBeat": _iso(last_beats[consumer]),
                              "inFlight": 0, "stale": True}
    return dict(sorted(services.items()))


def _iso(epoch_s: float) -> str:
    ms = int(epoch_s * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


async def _postgres_health(app: web.Application) -> bool:
    """Whether PostgreSQL answers within ``HEALTH_TIMEOUT_S``; a stalled server included."""
    return await answers(app[DB], HEALTH_TIMEOUT_S)


def stream_depth(info: dict[str, Any]) -> int:
    """A stream's backlog: what its busiest group has yet to read plus what it has read but
    not acked. Redis cannot always count the unread entries (``lag`` is null after a deletion
    inside the unread range); the stream's length bounds them then. A stream without a group
    (the DLQ) is all backlog."""
    groups = info["groups"]
    if not groups:
        return int(info["length"])
    return max(g["pending"] + g["lag"] if g["lag"] is not None else int(info["length"])
               for g in groups)


async def stream_stats(redis: Redis, keys: Keys) -> list[dict[str, Any]]:
    """Length, groups, pending counts and oldest pending age of every notifkit stream."""
    streams = keys.all_streams()
    pipe = redis.pipeline(transaction=False)
    for stream in streams:
        pipe.xlen(stream)
        pipe.xinfo_groups(stream)
    replies = await pipe.execute(raise_on_error=False)
    groups_of: dict[str, list[dict[str, Any]]] = {}
    pending_pipe = redis.pipeline(transaction=False)
    wanted: list[tuple[str, dict[str, Any]]] = []
    for index, stream in enumerate(streams):
        raw_groups = replies[index * 2 + 1]
        if isinstance(raw_groups, ResponseError | BaseException) or not raw_groups:
            groups_of[stream] = []
            continue
        groups: list[dict[str, Any]] = []
        for g in raw_groups:
            group: dict[str, Any] = {
                "name": as_str(g["name"]), "pending": int(g.get("pending") or 0),
                "consumers": int(g.get("consumers") or 0), "oldestPendingAgeSeconds": None,
                "lag": int(g["lag"]) if isinstance(g.get("lag"), int) else None,
            }
            groups.append(group)
            if group["pending"]:
                pending_pipe.xpending(stream, group["name"])
                wanted.append((stream, group))
        groups_of[stream] = groups
    if wanted:
        now_ms = time.time() * 1000
        for (_stream, group), summary in zip(wanted, await pending_pipe.execute(
                raise_on_error=False), strict=True):
            if isinstance(summary, dict) and summary.get("min"):
                oldest_ms = int(as_str(summary["min"]).split("-")[0])
                group["oldestPendingAgeSeconds"] = round(max(0.0, now_ms - oldest_ms) / 1000, 3)
    out: list[dict[str, Any]] = []
    for index, stream in enumerate(streams):
        length = replies[index * 2]
        groups = groups_of[stream]
        ages = [g["oldestPendingAgeSeconds"] for g in groups
                if g["oldestPendingAgeSeconds"] is not None]
        out.append({
            "stream": stream,
            "length": length if isinstance(length, int) else 0,
            "pending": sum(g["pending"] for g in groups),
            "oldestPendingAgeSeconds": max(ages) if ages else None,
            "consumers": sum(g["consumers"] for g in groups),
            "groups": groups,
        })
    return out
