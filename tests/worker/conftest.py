"""Fixtures for the stream-worker tests, on top of the root conftest's ``redis_url``,
``namespace`` (one per test, its keys deleted afterwards) and ``redis``: worker settings
that need no PostgreSQL, and a factory for workers that are always stopped at the end.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.keys import Keys
from notifkit.streams import decode, xadd
from notifkit.worker import BatchProcessor, StreamWorker
from tests.support.streams import xrange


@pytest.fixture
def worker_settings(redis_url: str, namespace: str) -> Settings:
    """Settings for a worker under test: short intervals, entries reclaimable at once."""
    return Settings(
        redis_url=redis_url,
        namespace=namespace,
        worker_concurrency=10,
        reclaim_interval_s=0.05,
        reclaim_min_idle_s=0.0,
        read_block_ms=50,
        heartbeat_interval_s=0.1,
        heartbeat_ttl_s=5,
        shutdown_grace_s=5.0,
    )


@pytest.fixture
def keys(namespace: str) -> Keys:
    return Keys(namespace)


WorkerFactory = Callable[..., StreamWorker]


@pytest.fixture
async def make_worker(
    redis: Redis, worker_settings: Settings
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
            redis=redis,
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
def add(redis: Redis) -> Add:
    """XADD one well-formed entry (``{"data": <json>}``) and return its id."""

    async def _add(stream: str, payload: dict[str, Any]) -> str:
        return await xadd(redis, stream, payload, maxlen=10_000)

    return _add


Pending = Callable[[str, str], Awaitable[int]]


@pytest.fixture
def pending(redis: Redis) -> Pending:
    """How many entries of ``stream`` the group ``group`` holds unacknowledged (XPENDING)."""

    async def _pending(stream: str, group: str) -> int:
        summary: Any = await redis.xpending(stream, group)
        return int(summary["pending"])

    return _pending


Payloads = Callable[[str], Awaitable[list[dict[str, Any]]]]


@pytest.fixture
def payloads(redis: Redis) -> Payloads:
    """Every payload on a stream, oldest first."""

    async def _payloads(stream: str) -> list[dict[str, Any]]:
        return [decode(fields) for _id, fields in await xrange(redis, stream)]

    return _payloads
