"""``create_app(settings)``: the aiohttp application of the HTTP API.

Resources are opened and closed in ``cleanup_ctx`` (Redis client, PostgreSQL pool, the pub/sub
hub's task) and published under typed ``web.AppKey``s (state.py). A caller that already owns a
Redis client or a pool (the ``ApiService``) passes them in, and they are left open at cleanup.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable, Iterable

import asyncpg
from aiohttp import web
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.db.pool import QUERY_TIMEOUT_S
from notifkit.keys import Keys
from notifkit.ratelimit import TokenBuckets
from notifkit.services.api.admission import Admission
from notifkit.services.api.auth import KeyCache
from notifkit.services.api.errors import Handler, error_middleware, quiet_malformed_requests
from notifkit.services.api.idempotency import date_fresh_data_set
from notifkit.services.api.middleware import auth_middleware, gives_inbox_token
from notifkit.services.api.pubsub import Hub
from notifkit.services.api.routing import Operation
from notifkit.services.api.state import (
    ADMISSION,
    DB,
    HUB,
    IN_FLIGHT,
    KEY_CACHE,
    KEYS,
    OPERATIONS,
    RATE,
    REDIS,
    SETTINGS,
    SSE_HEARTBEAT_S,
    SSE_LIVE_WAIT_S,
    InFlight,
)
from notifkit.services.api.validation import expect_within_limit
from notifkit.tasks import cancel_and_wait

SSE_HEARTBEAT_DEFAULT_S = 15.0
# Longer than the pub/sub loop's longest reconnect delay, so a stream asked for just after
# Redis came back waits for the subscription rather than failing.
SSE_LIVE_WAIT_DEFAULT_S = 10.0
# An API query caught in a PostgreSQL stall ends in a 503, not a request held open for as long
# as the stall lasts (QUERY_TIMEOUT_S: a request answers after about twice it).
MAX_LINE_BYTES = 64 * 1024
_PLACEHOLDER = re.compile(r"{([A-Za-z]+)}")


def operations() -> list[Operation]:
    """Every operation the API serves, in document order."""
    from notifkit.services.api.routes import (
        dlq,
        events,
        inbox,
        notifications,
        ops,
        projects,
        suppressions,
        templates,
        unsubscribe,
        usage,
        users,
        webhooks,
        workflows,
    )

    tables: Iterable[Iterable[Operation]] = (
        projects.ops, users.ops, templates.ops, notifications.ops, events.ops,
        workflows.ops, inbox.ops, suppressions.ops, usage.ops, ops.ops, dlq.ops, webhooks.ops,
        unsubscribe.ops,
    )
    return [op for table in tables for op in table]


def create_app(
    settings: Settings,
    *,
    redis: Redis | None = None,
    db: asyncpg.Pool | None = None,
    sse_heartbeat_s: float = SSE_HEARTBEAT_DEFAULT_S,
    sse_live_wait_s: float = SSE_LIVE_WAIT_DEFAULT_S,
) -> web.Application:
    app = web.Application(
        middlewares=[count_in_flight, error_middleware, auth_middleware],
        client_max_size=settings.max_body_bytes,
        # Room for every documented parameter at its longest, percent-encoded (aiohttp's own
        # 8 KiB limit answers a plain-text 400 before the app sees the request).
        # Bodies are decoded by validation.read_body, which answers an unsupported or broken
        # Content-Encoding in the error envelope.
        handler_args={"max_line_size": MAX_LINE_BYTES, "max_field_size": MAX_LINE_BYTES,
                      "auto_decompress": False},
    )
    app[SETTINGS] = settings
    app[IN_FLIGHT] = InFlight()
    quiet_malformed_requests()
    app[KEYS] = Keys(settings.namespace)
    app[SSE_HEARTBEAT_S] = sse_heartbeat_s
    app[SSE_LIVE_WAIT_S] = sse_live_wait_s
    table: dict[str, Operation] = {}
    for op in operations():
        path = route_path(op.path)
        app.router.add_route(op.method, path, op.handler, name=op.operation_id,
                             expect_handler=expect_within_limit)
        if op.method == "GET" and not _streams(op):
            # HTTP says a resource that answers GET answers HEAD: the same status and headers,
            # no body (aiohttp drops it). Same resource name, so the same auth applies.
            app.router.add_route("HEAD", path, op.handler, name=op.operation_id)
        table[op.operation_id] = op
    app[OPERATIONS] = table
    app.cleanup_ctx.append(_resources(settings, redis, db))
    app.on_shutdown.append(_close_streams)
    app.on_response_prepare.append(_open_to_inbox_pages)
    return app


async def _open_to_inbox_pages(request: web.Request, response: web.StreamResponse) -> None:
    """A user's page on any origin may read what it asked with an inbox token, errors
    included: the credential is in the URL the page was given, not one the browser adds by
    itself (no cookies here), so no other site can borrow it. A page on another origin than
    the API could not read the stream otherwise."""
    op = request.app[OPERATIONS].get(request.match_info.route.name or "")
    if op is not None and gives_inbox_token(request, op):
        response.headers["Access-Control-Allow-Origin"] = "*"


@web.middleware
async def count_in_flight(request: web.Request, handler: Handler) -> web.StreamResponse:
    counter = request.app[IN_FLIGHT]
    counter.count += 1
    try:
        return await handler(request)
    finally:
        counter.count -= 1


def _streams(op: Operation) -> bool:
    """Whether the operation answers an endless stream (server-sent events): a HEAD of it
    would hold the connection open for headers alone, so it gets no HEAD route."""
    return any(reply.content_type == "text/event-stream" for reply in op.responses.values())


def route_path(path: str) -> str:
    """aiohttp's default placeholder refuses ``{`` and ``}``, which caller-chosen ids may hold:
    every placeholder matches one whole path segment instead."""
    return _PLACEHOLDER.sub(r"{\1:[^/]+}", path)


async def _close_streams(app: web.Application) -> None:
    if HUB in app:
        app[HUB].close_streams()


def _resources(
    settings: Settings, redis: Redis | None, db: asyncpg.Pool | None
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        from notifkit.db.pool import close_pool, create_pool
        from notifkit.services.base import open_redis

        own_redis = redis is None
        own_db = db is None
        client = open_redis(settings) if redis is None else redis
        pool = (await create_pool(settings, command_timeout=QUERY_TIMEOUT_S,
                                        acquire_timeout=QUERY_TIMEOUT_S) if db is None
                else db)
        app[REDIS] = client
        app[DB] = pool
        app[KEY_CACHE] = KeyCache(pool)
        app[RATE] = TokenBuckets(client)
        app[ADMISSION] = Admission(settings, app[KEYS], client, pool, app[RATE])
        await date_fresh_data_set(client, app[KEYS].api_idempotency_since, pool,
                                  settings.caller_idempotency_ttl_s)
        hub = Hub(client, app[KEYS], app[KEY_CACHE], app[ADMISSION])
        app[HUB] = hub
        task = asyncio.create_task(hub.run(), name="notifkit-api-pubsub")
        try:
            yield
        finally:
            # The hub reads under a timeout, which can swallow a single cancellation: a plain
            # ``await task`` then hung the API's shutdown (and a failed start) for good.
            await cancel_and_wait(task)
            if own_db:
                await close_pool(pool)
            if own_redis:
                await client.aclose()

    return ctx
