"""Payloads that can never parse are acked at once and counted (CONTRACT §3.6)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, cast

import pytest
from redis.asyncio import Redis
from redis.typing import EncodableT, FieldT

from notifkit.keys import Keys
from notifkit.worker import Entry

if TYPE_CHECKING:
    from .conftest import Add, Payloads, Pending, WorkerFactory

GARBAGE: list[dict[FieldT, EncodableT]] = [
    {"payload": '{"eventId": "e1"}'},  # no "data" field
    {"data": "{not json"},  # not JSON
    {"data": '[1, 2, 3]'},  # JSON, but not an object
    {"data": '"just a string"'},
    {"data": b"\xff\xfe"},  # not even UTF-8
]


@pytest.mark.parametrize("concurrency", [1, 2, 10])
async def test_garbage_is_acked_at_once_and_counted_and_never_processed(
    make_worker: WorkerFactory, redis: Redis, keys: Keys, add: Add, pending: Pending,
    payloads: Payloads, concurrency: int,
) -> None:
    # Given garbage entries ahead of a valid one (more of them than the worker takes at once)
    stream = keys.enriched("normal")
    seen: list[Entry] = []

    async def process(batch: list[Entry]) -> None:
        seen.extend(batch)

    worker = make_worker(process, concurrency=concurrency)
    garbage_ids = [await redis.xadd(stream, fields) for fields in GARBAGE]
    valid_id = await add(stream, {"eventId": "ok"})

    # When the worker drains the stream
    await worker.run_until_idle()

    # Then only the valid entry reached process(), once, and everything is acked
    assert [(e.id, e.payload) for e in seen] == [(valid_id, {"eventId": "ok"})]
    assert worker.stats.malformed == len(GARBAGE)
    assert worker.stats.processed == 1
    assert await pending(stream, worker.group) == 0
    for garbage_id in garbage_ids:
        key = keys.attempts(worker.group, cast(bytes, garbage_id).decode(), stream)
        assert await redis.exists(key) == 0
    # Garbage is not a failure: nothing is dead-lettered for it
    assert await payloads(keys.dlq) == []
    assert worker.stats.failed == 0


async def test_a_running_worker_keeps_going_after_garbage(
    make_worker: WorkerFactory, redis: Redis, keys: Keys, add: Add, pending: Pending,
) -> None:
    stream = keys.enriched("low")
    done = asyncio.Event()
    seen: list[str] = []

    async def process(batch: list[Entry]) -> None:
        seen.extend(e.payload["n"] for e in batch)
        if len(seen) == 2:
            done.set()

    worker = make_worker(process)
    await worker.start()
    await add(stream, {"n": "before"})
    for fields in GARBAGE:
        await redis.xadd(stream, fields)
    await add(stream, {"n": "after"})

    await asyncio.wait_for(done.wait(), timeout=10)
    await worker.stop()

    assert seen == ["before", "after"]
    assert worker.stats.malformed == len(GARBAGE)
    assert await pending(stream, worker.group) == 0
