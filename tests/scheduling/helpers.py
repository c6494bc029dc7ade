"""Helpers for the scheduling tests: an injectable clock, task builders, Redis wipes."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import Redis

from notifkit.keys import SCHEDULER_SHARDS, Keys
from notifkit.services.scheduler import SchedulerService

T0_MS = 1_780_000_000_000  # 2026-05-28T20:26:40Z


class FakeClock:
    """Milliseconds since the epoch, moved by the test."""

    def __init__(self, now_ms: int = T0_MS) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> int:
        self.now_ms += ms
        return self.now_ms


SchedulerFactory = Callable[..., SchedulerService]
Schedule = Callable[..., Awaitable[dict[str, Any]]]
Sent = Callable[..., Awaitable[list[dict[str, Any]]]]


def scheduled_task(
    keys: Keys,
    project_id: str,
    due_ms: int,
    *,
    task_id: str | None = None,
    priority: str = "normal",
    reason: str = "sendAt",
    stream: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    task_id = task_id or uuid.uuid4().hex
    return {
        "taskId": task_id,
        "projectId": project_id,
        "dueAt": due_ms,
        "stream": stream or keys.outbound(priority),
        "payload": {"taskId": task_id, "projectId": project_id, "priority": priority,
                    "dueAt": due_ms, **extra},
        "reason": reason,
    }


async def wipe_scheduler_state(redis: Redis, keys: Keys, *, keep_moved: bool = False) -> None:
    """What a Redis restart without persistence does to the scheduler's keys."""
    names = [keys.scheduled_ready]
    for shard in SCHEDULER_SHARDS:
        names += [keys.scheduled_shard(shard), keys.scheduled_payloads(shard)]
        if not keep_moved:
            names.append(keys.scheduled_moved(shard))
    await redis.delete(*names)
