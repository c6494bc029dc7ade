"""Typed application state: every resource a handler may use, under a ``web.AppKey``.

``create_app`` (app.py) fills these in its ``cleanup_ctx``; handlers read them with
``request.app[DB]`` and so on, and mypy knows each one's type.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import asyncpg
from aiohttp import web
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.keys import Keys

if TYPE_CHECKING:
    from notifkit.ratelimit import TokenBuckets
    from notifkit.services.api.admission import Admission
    from notifkit.services.api.auth import KeyCache, Principal
    from notifkit.services.api.pubsub import Hub
    from notifkit.services.api.routing import Operation

SETTINGS = web.AppKey("settings", Settings)
KEYS = web.AppKey("keys", Keys)
REDIS = web.AppKey("redis", Redis)
DB = web.AppKey("db", asyncpg.Pool)
KEY_CACHE: web.AppKey[KeyCache] = web.AppKey("key_cache")
HUB: web.AppKey[Hub] = web.AppKey("hub")
RATE: web.AppKey[TokenBuckets] = web.AppKey("rate")
ADMISSION: web.AppKey[Admission] = web.AppKey("admission")
OPERATIONS: web.AppKey[dict[str, Operation]] = web.AppKey("operations")
SSE_HEARTBEAT_S = web.AppKey("sse_heartbeat_s", float)
# How long an inbox stream request waits for the pub/sub subscription to be up (503 after).
SSE_LIVE_WAIT_S = web.AppKey("sse_live_wait_s", float)


class InFlight:
    """Requests being answered right now (server-sent event streams included), for the api's
    heartbeat."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


IN_FLIGHT = web.AppKey("in_flight", InFlight)

PRINCIPAL: web.RequestKey[Principal] = web.RequestKey("principal")
