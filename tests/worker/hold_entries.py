"""A worker process that takes entries and never finishes them, for the SIGKILL test.

    python hold_entries.py REDIS_URL NAMESPACE SERVICE CONCURRENCY

It consumes ``enriched:*`` as SERVICE; its processor prints one line per batch it holds
(``holding <consumer> <stream>/<id> ...``), flushes, and then waits forever, so the test knows
exactly which entries this process holds when it kills it.
"""

from __future__ import annotations

import asyncio
import sys

from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.keys import Keys
from notifkit.worker import Entry, StreamWorker


async def main(redis_url: str, namespace: str, service: str, concurrency: int) -> None:
    settings = Settings(
        redis_url=redis_url,
        namespace=namespace,
        worker_concurrency=concurrency,
        read_block_ms=50,
        reclaim_interval_s=3600.0,  # this process must never take entries back itself
        reclaim_min_idle_s=3600.0,
    )
    never = asyncio.Event()

    async def hold(batch: list[Entry]) -> None:
        print("holding", worker.consumer, *(f"{e.stream}/{e.id}" for e in batch), flush=True)
        await never.wait()

    redis = Redis.from_url(redis_url)
    worker = StreamWorker(
        redis=redis,
        settings=settings,
        service=service,
        streams=Keys(namespace).enriched_all(),
        process=hold,
    )
    await worker.start()
    print("ready", worker.consumer, flush=True)
    await never.wait()


if __name__ == "__main__":
    url, ns, name, count = sys.argv[1:5]
    asyncio.run(main(url, ns, name, int(count)))
