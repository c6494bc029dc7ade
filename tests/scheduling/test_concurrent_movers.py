"""Concurrent movers over random due times: no task moved twice, none lost, none early."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.db.scheduled import ScheduledRow
from notifkit.keys import Keys
from notifkit.services.scheduler import SchedulerService
from notifkit.streams import decode
from tests.support.streams import xrange

from .helpers import T0_MS


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(
    due_offsets=st.lists(st.integers(0, 1_000), min_size=1, max_size=150),
    sweeps=st.lists(st.lists(st.integers(0, 1_100), min_size=1, max_size=6), min_size=2,
                    max_size=6),
    batch_size=st.integers(1, 12),
)
async def test_concurrent_movers_move_every_task_once_and_never_early(
    settings: Settings, redis: Redis, due_offsets: list[int], sweeps: list[list[int]],
    batch_size: int,
) -> None:
    """The move script is the only thing between a due task and its stream. Several movers
    (each with its own connection, as separate processes would have) run it at once with
    their own clocks and without the poll lock's protection: atomicity alone must make
    every task leave exactly once and never before its due time."""
    scoped = settings.replace(namespace=f"{settings.namespace}:{uuid.uuid4().hex[:8]}")
    keys = Keys(scoped.namespace)
    movers = [
        SchedulerService(scoped, consumer=f"scheduler-m{i}", batch_size=batch_size)
        for i in range(len(sweeps))
    ]
    try:
        project = str(uuid.uuid4())
        tasks = {uuid.uuid4().hex: T0_MS + offset for offset in due_offsets}
        rows = [
            ScheduledRow(task_id, project, due, "normal", keys.outbound("normal"),
                         {"taskId": task_id, "dueAt": due})
            for task_id, due in tasks.items()
        ]
        assert await movers[0].add_rows(rows) == len(rows)
        moves: list[tuple[str, int, int]] = []  # task, due, the mover's clock

        async def run(mover: SchedulerService, clock_offsets: list[int]) -> None:
            for offset in sorted(clock_offsets):
                now = T0_MS + offset
                moves.extend((m.task_id, m.due_ms, now) for m in await mover.move_due(
                    now, token=""))
                await asyncio.sleep(0)

        await asyncio.gather(*(run(m, s) for m, s in zip(movers, sweeps, strict=True)))
        late = T0_MS + 10_000
        moves.extend((m.task_id, m.due_ms, late) for m in await movers[0].move_due(late, token=""))

        assert Counter(task for task, _due, _now in moves) == dict.fromkeys(tasks, 1)
        assert all(due <= now for _task, due, now in moves)
        assert all(tasks[task] == due for task, due, _now in moves)
        entries = [decode(f) for _id, f in await xrange(redis, keys.outbound("normal"))]
        assert Counter(e["taskId"] for e in entries) == dict.fromkeys(tasks, 1)
        for shard in "0123456789abcdef":
            assert await redis.exists(keys.scheduled_shard(shard),
                                      keys.scheduled_payloads(shard)) == 0
    finally:
        for mover in movers:
            await mover.close()
