"""Reclaim sweeps come every RECLAIM_INTERVAL_SECONDS (CONTRACT §3.4), on a worker of three
priority streams too.

A sweep waits for the read in progress to end (reads and sweeps count free slots one at a
time), and an idle worker's read blocks for ``read_block_ms``. The sweep used to take that
turn once per stream, and the pause to the next sweep began only after it: a worker of three
streams swept every interval plus two blocking reads (every ~7 s at RECLAIM_INTERVAL_SECONDS=5,
so a failed entry waited seconds longer for its retry than the settings say).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import TYPE_CHECKING, Any

import pytest
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.keys import Keys
from notifkit.worker import Entry

if TYPE_CHECKING:
    from .conftest import WorkerFactory


async def _nothing(batch: list[Entry]) -> None:
    return None


async def test_an_idle_worker_of_three_streams_sweeps_every_interval(
    make_worker: WorkerFactory, worker_settings: Settings, redis: Redis, keys: Keys,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a worker of the three enriched streams, idle, whose reads block for 0.4 s
    settings = worker_settings.replace(reclaim_interval_s=0.5, read_block_ms=400)
    sweeps: dict[str, list[float]] = {stream: [] for stream in keys.enriched_all()}
    claim = redis.xautoclaim

    async def spy(stream: Any, *args: Any, **kwargs: Any) -> Any:
        sweeps[stream].append(time.monotonic())
        return await claim(stream, *args, **kwargs)

    monkeypatch.setattr(redis, "xautoclaim", spy)
    worker = make_worker(_nothing, settings=settings)

    # When it runs for 4 s
    await worker.start()
    await asyncio.sleep(4.0)
    await worker.stop(grace_s=0)

    # Then it swept about every 0.5 s (the sweep before a start's first read aside), not every
    # 0.5 s plus two blocking reads of 0.4 s (two or three sweeps in 4 s)
    first = sweeps[keys.enriched("critical")]
    assert len(first) >= 5, [round(b - a, 2) for a, b in itertools.pairwise(first)]
    # And each sweep took every stream in one turn, not one blocking read apart
    for critical, low in zip(first, sweeps[keys.enriched("low")], strict=False):
        assert low - critical < 0.3
