"""A workflow service in its own process, for the crash and concurrency tests.

    python workflow_process.py REDIS_URL DATABASE_URL NAMESPACE SCHEMA MODE

MODE ``pause-after-send``: every step's InboundMessage is written, then the process prints
``sent <idempotencyKey>`` and stops forever right there, *before* recording the step as done:
the worst instant to be killed. Its lock lives 500 ms, so after a SIGKILL it expires quickly.

MODE ``record-runs``: a normal service that appends ``{"instance", "pid", "start", "end"}`` to
the Redis list ``{NAMESPACE}:test:runs`` for every run it makes while holding an instance's
lock (each run lingers 20 ms, to widen any window in which two runs could overlap).

Both print ``ready`` once consuming.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

from notifkit.config import Settings
from notifkit.db import workflows as db
from notifkit.services.workflow import WorkflowService
from notifkit.services.workflow.lock import HeldLock
from notifkit.services.workflow.runner import Runner


class PausingRunner(Runner):
    async def publish(self, instance: db.Instance, step: dict[str, Any], row: db.StepRow,
                      event_id: str, digest_items: list[dict[str, Any]] | None) -> None:
        await super().publish(instance, step, row, event_id, digest_items)
        print("sent", f"wf:{instance.id}:{row.path}", flush=True)
        await asyncio.Event().wait()


class PausingService(WorkflowService):
    def make_runner(self) -> Runner:
        return PausingRunner(pool=self.pool, redis=self.redis, settings=self.settings,
                             timers=self.timers, clock=self.clock)


class RecordingService(WorkflowService):
    async def run_locked(self, instance_id: str, project_id: str | None, lock: HeldLock) -> None:
        start = time.time()
        await super().run_locked(instance_id, project_id, lock)
        await asyncio.sleep(0.02)
        record = {"instance": instance_id, "pid": os.getpid(), "start": start,
                  "end": time.time()}
        await self.redis.rpush(f"{self.settings.namespace}:test:runs", json.dumps(record))


async def main(redis_url: str, database_url: str, namespace: str, schema: str,
               mode: str) -> None:
    settings = Settings(
        redis_url=redis_url, database_url=database_url, namespace=namespace, db_schema=schema,
        worker_concurrency=8, read_block_ms=50, reclaim_interval_s=3600.0,
        reclaim_min_idle_s=3600.0, heartbeat_interval_s=1.0, log_format="text",
        log_level="WARNING",
    )
    service: WorkflowService
    if mode == "pause-after-send":
        service = PausingService(settings, lock_ttl_ms=500, timer_poll_interval_s=0.05)
    else:
        service = RecordingService(settings, lock_retry_s=0.01, timer_poll_interval_s=0.01)
    await service.start()
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
