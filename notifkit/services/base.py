"""What every service is: something that starts, stops, and owns its own connections.

A :class:`WorkerService` is a service built around one :class:`~notifkit.worker.StreamWorker`:
it opens its own Redis client and (when it needs one) its own PostgreSQL pool, so any subset of
services can run in any process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Sequence
from typing import Any, ClassVar

from redis.asyncio import BlockingConnectionPool, Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from notifkit.config import Settings
from notifkit.db.availability import answers, lock_wait, unavailable
from notifkit.db.pool import POOL_CLOSE_TIMEOUT_S, QUERY_TIMEOUT_S, close_pool
from notifkit.db.priority_pool import PriorityPool
from notifkit.keys import Keys
from notifkit.tasks import cancel_all
from notifkit.worker import Dependency, Entry, StreamWorker, batch_stream, stream_worker

log = logging.getLogger("notifkit.services")


# How long a starting service waits for Redis's first answer.
REDIS_START_TIMEOUT_S = 10.0


def open_redis(settings: Settings, *, max_connections: int = 64) -> Redis:
    """A client whose pool makes a burst wait for a free connection (up to 10 s) instead of
    failing with "Too many connections"."""
    pool = BlockingConnectionPool.from_url(
        settings.redis_url, max_connections=max_connections, timeout=10,
        health_check_interval=30,
    )
    return Redis.from_pool(pool)  # the client owns the pool: aclose() closes it


class Service:
    """Base class: subclasses set ``name`` and override :meth:`start` / :meth:`stop`."""

    name: ClassVar[str] = ""
    needs_db: ClassVar[bool] = True
    # Seconds a query of this service, or opening a connection for one, may take. Without a
    # limit, a PostgreSQL that stalls (a partition, a frozen failover, a lock never released)
    # held a batch, and the stream slots it filled, for as long as the stall lasted; with it
    # the query fails with TimeoutError, which the worker handles as an outage. A wait for a
    # lock held by another session ends sooner (notifkit.db.pool.LOCK_WAIT_SHARE), as a
    # lock wait the worker holds the work for. Queries whose cost grows with the data (the
    # reconciler's slices, digest windows) pass a longer limit of their own; migrations use a
    # connection of their own, without one.
    query_timeout_s: ClassVar[float | None] = QUERY_TIMEOUT_S
    # Seconds a caller may wait for a free connection of the pool (None: as long as it takes).
    # A worker's batch waits its turn; the api service's requests do not (ApiService).
    acquire_timeout_s: ClassVar[float | None] = None
    # Whether the pool keeps generic plans for a short while (notifkit.db.pool): only for
    # services whose every statement is a key probe or a batch write.
    generic_plans: ClassVar[bool] = False

    def __init__(self, settings: Settings, **options: Any) -> None:
        self.settings = settings
        self.keys = Keys(settings.namespace)
        self.options = options
        self.redis: Redis = open_redis(settings)
        self.db: PriorityPool | None = None
        # When the process's shutdown grace ends (the event loop's clock), set by the server
        # before it stops its services one after another: they share one grace period.
        self.stop_deadline: float | None = None

    async def open(self) -> None:
        await self._check_redis()
        if self.needs_db and self.db is None:
            from notifkit.db.pool import create_pool

            self.db = await create_pool(self.settings, urgent=self._urgent_batch,
                                        command_timeout=self.query_timeout_s,
                                        acquire_timeout=self.acquire_timeout_s,
                                        generic_plans=self.generic_plans)

    def _urgent_batch(self) -> bool:
        """Whether the current task's queries go ahead of others waiting for a connection."""
        return False

    async def close(self) -> None:
        if self.db is not None:
            # Within what is left of the process's grace: past it, dropped at once.
            left = self.remaining_grace()
            await close_pool(self.db, POOL_CLOSE_TIMEOUT_S if left is None
                             else min(POOL_CLOSE_TIMEOUT_S, left))
            self.db = None
        await self.redis.aclose()

    async def _check_redis(self) -> None:
        """Fail the start, naming REDIS_URL, when Redis does not answer: a process that
        started without it would only fail later, request by request (README: Configuration)."""
        try:
            await asyncio.wait_for(self.redis.ping(), REDIS_START_TIMEOUT_S)
        except TimeoutError:
            raise RedisConnectionError(
                f"no answer within {REDIS_START_TIMEOUT_S:g} s") from None

    async def start(self) -> None:
        await self.open()

    async def stop(self) -> None:
        await self.close()

    def remaining_grace(self) -> float | None:
        """Seconds left of the process's shutdown grace (None: the whole grace, no deadline)."""
        if self.stop_deadline is None:
            return None
        return max(0.0, self.stop_deadline - asyncio.get_running_loop().time())

    async def last_redis_call(self, call: Awaitable[Any]) -> None:
        """A stopping service's goodbye to Redis (its heartbeat removed, a lock released),
        given what is left of the grace and at least what a worker's last calls get: a
        stalled Redis held each such call for the client's timeouts. Left undone, what it
        would have removed expires by itself."""
        left = self.remaining_grace()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(stream_worker.STOP_GOODBYE_MIN_S,
                                           self.settings.shutdown_grace_s if left is None
                                           else left)):
                await call

    async def run_until_idle(self) -> int:
        """Process whatever is available and return how much was done (0 = idle)."""
        return 0

    @property
    def pool(self) -> PriorityPool:
        if self.db is None:
            raise RuntimeError(f"the {self.name} service has not been started")
        return self.db


class WorkerService(Service):
    """A service that consumes streams through the worker contract."""

    # Batches in flight at once (see StreamWorker.max_batches); None = bounded by slots only.
    max_batches: ClassVar[int | None] = None
    # A batch takes at most 1/batch_share of the slots (None = every free slot).
    batch_share: ClassVar[int | None] = None
    # The worker claims the dedup mark that claim_key names while it counts the attempt.
    claims_on_read: ClassVar[bool] = False
    # The processor settles entries whose last attempt never finished (Entry.exhausted).
    settles_exhausted: ClassVar[bool] = False

    def streams(self) -> Sequence[str]:
        raise NotImplementedError

    async def process(self, batch: list[Entry]) -> None:
        raise NotImplementedError

    def claim_key(self, stream: str, payload: dict[str, Any]) -> tuple[str, int] | None:
        """The dedup mark (key, TTL in s) process() will claim for this payload, when
        ``claims_on_read``; None for a payload it will refuse."""
        return None

    def __init__(self, settings: Settings, **options: Any) -> None:
        super().__init__(settings, **options)
        self.worker = StreamWorker(
            redis=self.redis,
            settings=settings,
            service=self.name,
            streams=self.streams(),
            process=self.process,
            consumer=options.get("consumer"),
            max_batches=self.max_batches,
            max_batch_size=(max(1, settings.worker_concurrency // self.batch_share)
                            if self.batch_share else None),
            claim_key=self.claim_key if self.claims_on_read else None,
            settles_exhausted=self.settles_exhausted,
            dependency=(Dependency("PostgreSQL", "DATABASE_URL", unavailable,
                                   self._postgres_answers, lock_wait)
                        if self.needs_db else None),
        )
        self._background: list[asyncio.Task[None]] = []
        # Batches from the first (critical) stream of a worker of several priority streams go
        # ahead of the others waiting for a pooled connection: with a low backlog every
        # connection is busy with low batches, and a critical batch would queue behind all of
        # them (measured: 100-140 ms a stage with DB_MAX_CONNECTIONS=2).
        self._urgent_stream = self.worker.streams[0] if len(self.worker.streams) > 1 else None

    def _urgent_batch(self) -> bool:
        return self._urgent_stream is not None and batch_stream.get() == self._urgent_stream

    async def _postgres_answers(self, timeout_s: float) -> bool:
        return self.db is not None and await answers(self.db, timeout_s)

    async def start(self) -> None:
        await self.open()
        await self.worker.start()

    async def stop(self) -> None:
        await cancel_all(self._background)
        self._background = []
        await self.worker.stop(self.remaining_grace())
        await self.close()

    async def run_until_idle(self) -> int:
        await self.open()
        return await self.worker.run_until_idle()
