"""A stage whose dedup key comes from the payload alone lets the worker claim the mark in the
round trip that counts the attempt; the stage's own claim then reuses that answer."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, cast

from redis.asyncio import Redis

from notifkit.dedup import Dedup
from notifkit.keys import Keys
from notifkit.worker import Entry

if TYPE_CHECKING:
    from .conftest import Add, Payloads, WorkerFactory


def _claim_key(keys: Keys) -> Any:
    def claim_key(stream: str, payload: dict[str, Any]) -> tuple[str, int] | None:
        if payload.get("bad"):
            raise ValueError("the stage refuses this payload")
        key = payload.get("k")
        return None if key is None else (keys.processed("delivery", key), 60)

    return claim_key


async def test_the_mark_is_claimed_with_the_count_and_reused_by_the_stage(
    make_worker: WorkerFactory, redis: Redis, keys: Keys, add: Add,
) -> None:
    stream = keys.outbound("normal")
    mark = keys.processed("delivery", "task-1")
    dedup = Dedup(redis, keys, "delivery", 60)
    seen: dict[str, Entry] = {}
    reused: dict[str, bool] = {}

    async def process(batch: list[Entry]) -> None:
        for entry in batch:
            seen[entry.id] = entry
        claimable = [e for e in batch if e.payload.get("k")]
        # With the mark gone, a fresh claim would let every entry through: the answers
        # below can only come from the claims made while the attempts were counted.
        await redis.delete(mark)
        allowed = await dedup.claim_many([(e, e.payload["k"], None) for e in claimable])
        reused.update({e.id: ok for e, ok in zip(claimable, allowed, strict=True)})

    first = await add(stream, {"k": "task-1"})
    again = await add(stream, {"k": "task-1"})
    plain = await add(stream, {"n": 1})
    refused = await add(stream, {"bad": True})
    worker = make_worker(process, service="delivery", streams=[stream],
                         claim_key=_claim_key(keys))
    assert await worker.run_until_idle(reclaim=False) == 4

    assert seen[first].claimed == (mark, True)
    assert seen[again].claimed == (mark, False)
    assert seen[plain].claimed is None
    assert seen[refused].claimed is None
    assert reused == {first: True, again: False}
    assert await redis.exists(mark) == 0  # the stage asked Redis nothing more


async def test_an_entry_over_its_attempt_limit_gives_back_the_mark_it_claimed(
    make_worker: WorkerFactory, redis: Redis, keys: Keys, add: Add, payloads: Payloads,
) -> None:
    stream = keys.outbound("normal")
    mark = keys.processed("delivery", "task-2")
    processed: list[str] = []

    async def process(batch: list[Entry]) -> None:
        processed.extend(e.id for e in batch)

    entry_id = await add(stream, {"k": "task-2"})
    worker = make_worker(process, service="delivery", streams=[stream],
                         claim_key=_claim_key(keys), max_attempts=3)
    await worker.ensure_groups()
    # Three attempts already counted (each died before it finished): this read is the fourth.
    await redis.set(keys.attempts(worker.group, entry_id, stream), 3)
    await worker.run_until_idle(reclaim=False)

    assert processed == []
    assert [p["entryId"] for p in await payloads(keys.dlq)] == [entry_id]
    # Dead-lettered, it must not keep a retry by another entry with the same key out.
    assert await redis.exists(mark) == 0


async def test_a_reclaimed_entry_finds_the_mark_its_crashed_attempt_claimed_its_own(
    make_worker: WorkerFactory, redis: Redis, keys: Keys, add: Add,
) -> None:
    stream = keys.outbound("normal")
    mark = keys.processed("delivery", "task-3")
    answers: list[tuple[int, bool | None]] = []  # (attempt, the claim's answer)
    hanging = asyncio.Event()

    async def process(batch: list[Entry]) -> None:
        for entry in batch:
            answers.append((entry.attempt, None if entry.claimed is None else entry.claimed[1]))
            if entry.attempt == 1:
                hanging.set()
                await asyncio.Event().wait()

    # Given a worker that claimed the mark with the count and died before finishing (stopped
    # without grace: nothing is released or acked)
    entry_id = await add(stream, {"k": "task-3"})
    crashed = make_worker(process, service="delivery", streams=[stream],
                          claim_key=_claim_key(keys), consumer="delivery-host-a-1")
    await crashed.start()
    await asyncio.wait_for(hanging.wait(), 10)
    await crashed.stop(grace_s=0)
    assert cast(bytes, await redis.get(mark)).decode() == f"{stream}/{entry_id}"

    # When another worker reclaims the entry
    survivor = make_worker(process, service="delivery", streams=[stream],
                           claim_key=_claim_key(keys), consumer="delivery-host-b-1")
    await survivor.run_until_idle()

    # Then the retry's claim finds its own mark and proceeds: it is not its own duplicate
    assert answers == [(1, True), (2, True)]
