"""A stage's outputs (``Entry.emit``) are written only for entries that succeeded, in the same
MULTI/EXEC as their ack."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis

from notifkit.keys import Keys
from notifkit.worker import Entry

if TYPE_CHECKING:
    from .conftest import Add, Payloads, Pending, WorkerFactory


async def test_outputs_of_a_failed_attempt_are_discarded_and_the_retry_writes_its_own(
    make_worker: WorkerFactory, keys: Keys, add: Add, pending: Pending, payloads: Payloads,
) -> None:
    # Given a processor that emits for every entry but fails the odd ones on their first try
    source, out = keys.enriched("normal"), keys.outbound("normal")

    async def process(batch: list[Entry]) -> None:
        for entry in batch:
            entry.emit(out, {"n": entry.payload["n"], "attempt": entry.attempt})
            if entry.payload["n"] % 2 and entry.attempt == 1:
                entry.fail(RuntimeError("try again"))

    worker = make_worker(process)
    for n in range(6):
        await add(source, {"n": n})

    # When the first attempts have run (no reclaim yet)
    await worker.run_until_idle(reclaim=False)

    # Then only the even entries have written output, and the odd ones are still pending
    assert sorted(p["n"] for p in await payloads(out)) == [0, 2, 4]
    assert await pending(source, worker.group) == 3

    # And when the retries have run, each entry has exactly one output, from the attempt
    # that succeeded
    await worker.run_until_idle()
    outputs = sorted((p["n"], p["attempt"]) for p in await payloads(out))
    assert outputs == [(0, 1), (1, 2), (2, 1), (3, 2), (4, 1), (5, 2)]
    assert await pending(source, worker.group) == 0


async def test_a_processor_that_raises_after_emitting_writes_nothing(
    make_worker: WorkerFactory, redis: Redis, keys: Keys, add: Add, pending: Pending,
) -> None:
    source, out = keys.enriched("normal"), keys.outbound("normal")

    async def process(batch: list[Entry]) -> None:
        for entry in batch:
            entry.emit(out, {"n": entry.payload["n"]})
        raise ConnectionError("database went away")

    worker = make_worker(process)
    for n in range(3):
        await add(source, {"n": n})

    await worker.run_until_idle(reclaim=False)

    assert await redis.exists(out) == 0
    assert await pending(source, worker.group) == 3


async def test_outputs_appear_exactly_when_their_inputs_are_acked(
    make_worker: WorkerFactory, redis: Redis, keys: Keys, add: Add, pending: Pending,
) -> None:
    # Given a running worker that writes one output per input
    source, out = keys.enriched("normal"), keys.outbound("normal")
    total = 150

    async def process(batch: list[Entry]) -> None:
        await asyncio.sleep(0)
        for entry in batch:
            entry.emit(out, {"n": entry.payload["n"]})

    async def snapshot() -> tuple[int, int]:
        """(outputs written, inputs acked), read in one MULTI so both are of one instant."""
        pipe = redis.pipeline(transaction=True)
        pipe.xlen(out)
        pipe.xinfo_groups(source)
        length, groups = await pipe.execute()
        info: dict[Any, Any] = next(g for g in groups if g["name"] in (worker.group,
                                                                       worker.group.encode()))
        return int(length), int(info["entries-read"] or 0) - int(info["pending"])

    worker = make_worker(process, concurrency=5)
    await worker.ensure_groups()
    for n in range(total):
        await add(source, {"n": n})

    # When it works through them while an observer looks at Redis again and again
    await worker.start()
    seen: list[tuple[int, int]] = []
    for _ in range(4000):  # bounded wait for the condition
        seen.append(await snapshot())
        if seen[-1][1] >= total:
            break
    await worker.stop()

    # Then at every instant the observer saw, outputs and acks matched one for one
    assert seen[-1] == (total, total)
    assert all(written == acked for written, acked in seen), [s for s in seen if s[0] != s[1]]
    assert await pending(source, worker.group) == 0
