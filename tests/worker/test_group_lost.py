"""A worker whose consumer group vanished (Redis restarted without its data, or the streams
were deleted while it ran) joins again with MKSTREAM and goes on (CONTRACT §3.1), instead of
failing every read with NOGROUP until someone restarts it."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from notifkit.keys import Keys
from notifkit.worker import Entry, is_nogroup

if TYPE_CHECKING:
    from .conftest import Add, Pending, WorkerFactory

WAIT_S = 10.0


class Seen:
    """A processor that records the payloads it was given and says when it got one."""

    def __init__(self) -> None:
        self.payloads: list[dict[str, object]] = []
        self.got = asyncio.Condition()

    async def __call__(self, batch: list[Entry]) -> None:
        async with self.got:
            self.payloads.extend(e.payload for e in batch)
            self.got.notify_all()

    async def until(self, count: int) -> None:
        async with self.got:
            await asyncio.wait_for(self.got.wait_for(lambda: len(self.payloads) >= count),
                                   WAIT_S)


async def test_a_running_worker_rejoins_a_stream_whose_group_is_gone(
    make_worker: WorkerFactory, redis: Redis, keys: Keys, add: Add, pending: Pending,
) -> None:
    # Given a running worker that has processed an entry
    seen = Seen()
    worker = make_worker(seen, service="delivery", streams=keys.outbound_all())
    await worker.start()
    await add(keys.outbound("normal"), {"n": 1})
    await seen.until(1)

    # When Redis loses every stream with its consumer groups, and new work arrives meanwhile
    await redis.delete(*keys.outbound_all())
    await add(keys.outbound("normal"), {"n": 2})
    await add(keys.outbound("critical"), {"n": 3})

    # Then the worker joins the groups again and processes the new entries, and acks them
    await seen.until(3)
    assert sorted(p["n"] for p in seen.payloads) == [1, 2, 3]  # type: ignore[type-var]
    await worker.stop()
    assert await pending(keys.outbound("normal"), worker.group) == 0
    assert await pending(keys.outbound("critical"), worker.group) == 0


async def test_a_reclaim_sweep_rejoins_a_stream_whose_group_is_gone(
    make_worker: WorkerFactory, redis: Redis, keys: Keys, add: Add,
) -> None:
    # Given a worker whose group is gone from its stream while it is not running
    seen = Seen()
    worker = make_worker(seen, service="engine", streams=[keys.enriched("normal")])
    await worker.ensure_groups()
    await redis.delete(keys.enriched("normal"))

    # When its reclaim sweep runs, then it finds nothing to take over, and fails on nothing
    assert await worker.reclaim_once() == 0
    # And the group is back, so work added afterwards is read
    await add(keys.enriched("normal"), {"n": 1})
    assert await worker.run_until_idle() == 1
    assert seen.payloads == [{"n": 1}]


def test_the_answers_that_mean_the_group_is_gone() -> None:
    assert is_nogroup(ResponseError(
        "NOGROUP No such key 's' or consumer group 'notifkit:group:engine'"))
    # A blocking read whose stream was deleted while it waited
    assert is_nogroup(ResponseError("UNBLOCKED the stream key no longer exists"))
    assert not is_nogroup(ResponseError("WRONGTYPE Operation against a key holding the wrong "
                                        "kind of value"))
