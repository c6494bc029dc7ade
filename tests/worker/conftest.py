"""Fixtures for the stream-worker tests: a real Redis, one namespace per test, and a factory
for workers that are always stopped at the end of the test.

Every test gets its own namespace, so tests can run side by side against one Redis; all of
the namespace's keys are deleted afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.keys import Keys
from notifkit.streams import decode, xadd
from notifkit.worker import BatchProcessor, StreamWorker

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
def worker_redis_url() -> str:
    return os.environ.get("NOTIFKIT_TEST_REDIS_URL", DEFAULT_REDIS_URL)


@pytest.fixture
def worker_namespace() -> str:
    return f"test-worker-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def worker_redis(worker_redis_url: str, worker_namespace: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(worker_redis_url)
    try:
        await client.ping()
    except Exception as exc:  # pragma: no cover - environment problem, not a test failure
        await client.aclose()
        pytest.fail(f"Redis at {worker_redis_url} does not answer: {exc}")
    yield client
    stale = [key async for key in client.scan_iter(match=f"{worker_namespace}:*", count=500)]
    if stale:
        await client.delete(*stale)
    await client.aclose()


@pytest.fixture
def worker_settings(worker_redis_url: str, worker_namespace: str) -> Settings:
    """Settings for a worker under test: short intervals, entries reclaimable at once."""
    return Settings(
        redis_url=worker_redis_url,
        namespace=worker_namespace,
        worker_concurrency=10,
        reclaim_interval_s=0.05,
        reclaim_min_idle_s=0.0,
        read_block_ms=50,
        heartbeat_interval_s=0.1,
        heartbeat_ttl_s=5,
        shutdown_grace_s=5.0,
    )


@pytest.fixture
def keys(worker_namespace: str) -> Keys:
    return Keys(worker_namespace)


WorkerFactory = Callable[..., StreamWorker]


@pytest.fixture
async def make_worker(
    worker_redis: Redis, worker_settings: Settings
) -> AsyncIterator[WorkerFactory]:
    """Build a :class:`StreamWorker` on the test's Redis and namespace; any worker still
    running at the end of the test is stopped without grace."""
    made: list[StreamWorker] = []

    def factory(
        process: BatchProcessor,
        *,
        streams: list[str] | None = None,
        service: str = "engine",
        settings: Settings | None = None,
        **options: Any,
    ) -> StreamWorker:
        chosen = settings or worker_settings
        worker = StreamWorker(
            redis=worker_redis,
            settings=chosen,
            service=service,
            streams=streams or Keys(chosen.namespace).enriched_all(),
            process=process,
            **options,
        )
        made.append(worker)
        return worker

    yield factory
    for worker in made:
        await worker.stop(grace_s=0)


Add = Callable[..., Awaitable[str]]


@pytest.fixture
def add(worker_redis: Redis) -> Add:
    """XADD one well-formed entry (``{"data": <json>}``) and return its id."""

    async def _add(stream: str, payload: dict[str, Any]) -> str:
        return await xadd(worker_redis, stream, payload, maxlen=10_000)

    return _add


Pending = Callable[[str, str], Awaitable[int]]


@pytest.fixture
def pending(worker_redis: Redis) -> Pending:
    """How many entries of ``stream`` the group ``group`` holds unacknowledged (XPENDING)."""

    async def _pending(stream: str, group: str) -> int:
        summary: Any = await worker_redis.xpending(stream, group)
        return int(summary["pending"])

    return _pending


Payloads = Callable[[str], Awaitable[list[dict[str, Any]]]]


@pytest.fixture
def payloads(worker_redis: Redis) -> Payloads:
    """Every payload on a stream, oldest first."""

    async def _payloads(stream: str) -> list[dict[str, Any]]:
        return [decode(fields) for _id, fields in await worker_redis.xrange(stream)]

    return _payloads
