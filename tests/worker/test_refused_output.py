"""An output Redis refuses leaves its input pending: never acked without its outputs.

A key of the wrong type where an output stream belongs (an operator's mistake, a namespace
clash) makes XADD fail. Inside MULTI/EXEC the XACK queued after it would still run and the
entry would be gone; the worker's settle script stops at the refusal instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from redis.asyncio import Redis

from notifkit.keys import Keys
from notifkit.worker import Entry

if TYPE_CHECKING:
    from .conftest import Add, Payloads, Pending, WorkerFactory


async def test_a_refused_output_leaves_the_entry_pending_and_its_counter_kept(
    make_worker: WorkerFactory, redis: Redis, keys: Keys, add: Add, pending: Pending,
    payloads: Payloads,
) -> None:
    source, good, bad = keys.enriched("normal"), keys.outbound("normal"), keys.outbound("low")
    await redis.set(bad, "not a stream")

    async def process(batch: list[Entry]) -> None:
        for entry in batch:
            entry.emit(good, {"n": entry.payload["n"]})
            entry.emit(bad, {"n": entry.payload["n"]})

    worker = make_worker(process, streams=[source])
    entry_id = await add(source, {"n": 1})
    await worker.run_until_idle(reclaim=False)

    assert await pending(source, worker.group) == 1
    assert await redis.get(keys.attempts(worker.group, entry_id, source)) == b"1"
    # The output before the refused one was written; the retry will write it again.
    assert [p["n"] for p in await payloads(good)] == [1]

    # Once the key is fixed, the retry settles the entry.
    await redis.delete(bad)
    await worker.run_until_idle()
    assert await pending(source, worker.group) == 0
    assert [p["n"] for p in await payloads(bad)] == [1]
    assert await redis.get(keys.attempts(worker.group, entry_id, source)) is None


@pytest.mark.parametrize("size", [1, 1500])
async def test_a_batch_settles_every_entry_and_forgets_every_counter(
    make_worker: WorkerFactory, redis: Redis, keys: Keys, add: Add, pending: Pending,
    payloads: Payloads, size: int,
) -> None:
    # Past 1,000 ids, the settle script acks in chunks (Lua's unpack has a stack limit).
    source, out = keys.enriched("normal"), keys.outbound("normal")

    async def process(batch: list[Entry]) -> None:
        for entry in batch:
            entry.emit(out, {"n": entry.payload["n"]})

    worker = make_worker(process, streams=[source], concurrency=size)
    ids = [await add(source, {"n": n}) for n in range(size)]
    await worker.run_until_idle(reclaim=False)

    assert await pending(source, worker.group) == 0
    assert sorted(p["n"] for p in await payloads(out)) == list(range(size))
    counters = [keys.attempts(worker.group, entry_id, source) for entry_id in ids]
    left = [await redis.exists(*counters[i:i + 500]) for i in range(0, size, 500)]
    assert sum(left) == 0
