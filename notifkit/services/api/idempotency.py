"""Caller idempotency keys (``x-idempotency-key``): the first response, replayed for 24 h.

    claim   SET key {"state": "pending", "fingerprint"} NX EX 60   -> this request does the work
    finish  SET key {"state": "done", "fingerprint", "status", "body"} EX 24 h
    release DEL key                                                -> the work failed; a retry may

A second request with the same key waits while the first is pending, then replays its
response, so two concurrent identical requests enqueue once. The fingerprint is the route and
the request body: the same key with a different request is a 409, not a silent replay of
something the caller did not ask for.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from redis.asyncio import Redis

from notifkit import codec
from notifkit.services.api.errors import ApiError, invalid_field

HEADER = "x-idempotency-key"
REPLAY_HEADER = "x-idempotent-replay"
MAX_KEY_CHARS = 255
PENDING_TTL_S = 60
WAIT_STEP_S = 0.05
WAIT_TOTAL_S = 10.0


@dataclass(frozen=True, slots=True)
class Replay:
    status: int
    body: Any


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


class IdempotencyKey:
    def __init__(self, redis: Redis, key: str, fingerprint: str, ttl_s: int) -> None:
        self.redis = redis
        self.key = key
        self.fingerprint = fingerprint
        self.ttl_s = ttl_s

    async def claim(self) -> Replay | None:
        """None: this request owns the key and must :meth:`finish` or :meth:`release` it.
        Otherwise the first request's response, to be replayed."""
        pending = codec.dumps({"state": "pending", "fingerprint": self.fingerprint})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_TOTAL_S
        while True:
            if await self.redis.set(self.key, pending, nx=True, ex=PENDING_TTL_S):
                return None
            raw = await self.redis.get(self.key)
            if raw is None:
                continue  # released or expired between the two calls: try to claim again
            record = codec.loads(raw)
            if record.get("fingerprint") != self.fingerprint:
                raise ApiError(
                    409, "idempotency_key_reused",
                    "This idempotency key was used with a different request; use a new key.",
                    [{"field": HEADER, "message": "was used with a different request"}],
                )
            if record.get("state") == "done":
                return Replay(int(record["status"]), record["body"])
            if loop.time() >= deadline:
                raise ApiError(
                    409, "idempotency_key_in_use",
                    "A request with this idempotency key is still being processed; retry "
                    "shortly.",
                    [{"field": HEADER, "message": "is in use by a request in progress"}],
                    headers={"Retry-After": "1"},
                )
            await asyncio.sleep(WAIT_STEP_S)

    async def finish(self, status: int, body: Any) -> None:
        record = {"state": "done", "fingerprint": self.fingerprint, "status": status,
                  "body": body}
        await self.redis.set(self.key, codec.dumps(record), ex=self.ttl_s)

    async def release(self) -> None:
        await self.redis.delete(self.key)
