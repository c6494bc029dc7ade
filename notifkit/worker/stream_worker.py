"""The loop itself: read, count attempts, process, settle or dead-letter; reclaim, keep alive,
beat (see the package docstring)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from notifkit import metrics
from notifkit.clock import utc_now_iso
from notifkit.config import KEEP_ALIVE_MIN_RECLAIM_IDLE_S, Settings
from notifkit.db import availability
from notifkit.errors import MalformedPayload, NotifkitError, PermanentFailure
from notifkit.keys import Keys
from notifkit.redis_pipe import pipe
from notifkit.streams import DATA_FIELD, as_str, decode, dlq_fields, encode, ensure_group
from notifkit.tasks import cancel_all
from notifkit.wording import counted
from notifkit.worker import scripts
from notifkit.worker.entry import (
    BatchProcessor,
    ClaimKey,
    Entry,
    attempts_made,
    batch_fields,
    batch_stream,
    channel_label,
    describe_error,
    dlq_record,
    failed_event,
    log_fields,
)
from notifkit.worker.health import (
    consumer_name,
    heartbeat_failure,
    next_beat_in,
    remove_heartbeat,
    write_heartbeat,
)
from notifkit.worker.outage import PROBE_FIRST_S, Dependency, Outage
from notifkit.worker.reading import entries_of, is_nogroup

log = logging.getLogger("notifkit.worker")

# A worker of several priority streams keeps 1/20 of its slots (none below 20) for the first
# one: with every slot busy on low work, a critical entry would wait for a whole batch.
PRIORITY_RESERVE_DIVISOR = 20
# How long a read waits on the first stream alone while only its reserved slots are free.
RESERVED_POLL_MS = 50
# While some priority stream has its `max_batches` in flight, the others are polled this often
# (and at once when a batch ends): a blocking read on them could not be woken for the stream
# whose batch ended.
LANE_POLL_S = 0.005
# A stopping worker's last Redis calls (its heartbeat removed, its consumer forgotten) get what
# is left of the shutdown grace, and at least this.
STOP_GOODBYE_MIN_S = 1.0
# How soon a reclaim sweep that ran out of free slots sweeps again.
RECLAIM_AGAIN_S = 0.1
# A worker keeps its entries from the reclaim sweep while it works on them, for at most this
# many times RECLAIM_MIN_IDLE_SECONDS: then a batch stuck in a live process (an await that
# never returns) is taken over like a dead process's.
KEEP_ALIVE_LIMIT = 10
# Below this RECLAIM_MIN_IDLE_SECONDS nothing is kept alive (0 means "reclaim at once").
KEEP_ALIVE_MIN_IDLE_S = KEEP_ALIVE_MIN_RECLAIM_IDLE_S
# Beyond two reclaim cycles, how long an entry held for a lock wait may stay away before the
# wait stops counting it (see Outage.forget_after_s).
LOCK_WAIT_FORGET_S = 60.0


# How long a bug's traceback, once written, stands for the same bug met again (a poison
# entry's attempts, the reclaim sweep's default minute apart, fall within it), and how many
# distinct bugs are remembered meanwhile.
TRACE_WINDOW_S = 600.0
MAX_TRACED = 256


def is_bug(exc: BaseException) -> bool:
    """Whether ``exc`` is none of the failures a stage expects (a provider's answer, a
    refusal of notifkit's own, a store that cannot serve): a bug, whose traceback is the only
    way to find the line at fault."""
    expected = (NotifkitError, RedisError, OSError, TimeoutError, asyncpg.PostgresError,
                asyncpg.InterfaceError)
    return not isinstance(exc, expected)


def may_be_one_entrys(exc: BaseException) -> bool:
    """Whether a failure of a whole batch may come from one entry's data, rather than from a
    store that cannot serve (tried entry by entry, that would only fail once per entry)."""
    if isinstance(exc, PermanentFailure | RedisConnectionError | RedisTimeoutError):
        return False
    return not (availability.unavailable(exc) or availability.lock_wait(exc)
                or availability.rolled_back_for_another(exc))


@dataclass
class WorkerStats:
    processed: int = 0
    failed: int = 0
    dead_lettered: int = 0
    malformed: int = 0
    reclaimed: int = 0
    held: int = 0  # failed tries given back: they met an outage of the stage's dependency
    max_in_flight: int = 0


class StreamWorker:
    """Consumes ``streams`` (highest priority first) through ``notifkit:group:{service}``."""

    def __init__(
        self,
        *,
        redis: Redis,
        settings: Settings,
        service: str,
        streams: Sequence[str],
        process: BatchProcessor,
        consumer: str | None = None,
        max_attempts: int | None = None,
        concurrency: int | None = None,
        max_batches: int | None = None,
        max_batch_size: int | None = None,
        claim_key: ClaimKey | None = None,
        settles_exhausted: bool = False,
        dependency: Dependency | None = None,
    ) -> None:
        if not streams:
            raise ValueError("a worker needs at least one stream")
        self.redis = redis
        self.settings = settings
        self.keys = Keys(settings.namespace)
        self.service = service
        self.streams = list(streams)
        self.group = self.keys.group(service)
        self.consumer = consumer or consumer_name(service)
        self.process = process
        self.max_attempts = max_attempts or settings.max_attempts_for(service)
        self.concurrency = concurrency or settings.worker_concurrency
        # A stage whose batches only talk to Redis and PostgreSQL does better with few,
        # large batches: while they run, new entries gather and the next read takes them all,
        # so the per-batch round trips are shared by more entries. None = only `concurrency`
        # bounds it (stages that wait on providers, whose batches may be slow). The limit is
        # per stream: a critical entry never waits for a batch of low ones to end.
        self.max_batches = max_batches
        # The most entries one read takes (None = all the free slots).
        self.max_batch_size = max_batch_size
        self.claim_key = claim_key
        # An entry over the attempt limit because its last attempt never finished goes to
        # the processor marked ``exhausted`` (it may have recorded an outcome before the
        # crash, e.g. delivery's outbox) instead of straight to the DLQ.
        self.settles_exhausted = settles_exhausted
        # What the stage cannot work without: while it is away the worker holds its work
        # instead of spending attempts on it (notifkit/worker/outage.py).
        self.outage = (None if dependency is None else Outage(
            dependency, service=service,
            first_probe_s=min(PROBE_FIRST_S, settings.reclaim_interval_s),
            # An entry held for a lock wait comes back within a sweep of its idle time: not
            # back after a few of those, another process has taken it over.
            forget_after_s=(LOCK_WAIT_FORGET_S + 2 * (settings.reclaim_min_idle_s
                                                      + settings.reclaim_interval_s))))
        self._batches: dict[str, int] = {}  # stream -> batches in flight
        self.stats = WorkerStats()
        self._in_flight: dict[tuple[str, str], Entry] = {}
        # bug (type, text, line raising it) -> when its traceback was last written
        self._traced: dict[tuple[Any, ...], float] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._capacity = asyncio.Event()
        self._capacity.set()
        # Reads and reclaim sweeps take entries one at a time: each counts the free slots and
        # fills them before the other may count, so together they never exceed `concurrency`.
        self._taking = asyncio.Lock()
        self._stopping = asyncio.Event()
        self._loops: list[asyncio.Task[None]] = []
        self._keep_alive_task: asyncio.Task[None] | None = None
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._groups_ready = False
        # The last blocking read left every stream empty (see _read_new).
        self._drained = False
        self._emptied_at = -LANE_POLL_S  # time.monotonic() of the last read that left them so
        # Why reads fail, while they do: the heartbeat carries it, so /health says a worker
        # that beats but cannot read is not well.
        self._read_error: str | None = None
        # Set when the heartbeat should not wait for its interval: reads began or ceased to
        # fail, which /health should show now rather than at the next beat.
        self._beat_now = asyncio.Event()
        self.sweep_cut_short = False  # the last reclaim sweep stopped for want of free slots
        self._release = redis.register_script(scripts.RELEASE_MARKS)
        self._give_back = redis.register_script(scripts.GIVE_BACK_ATTEMPTS)
        self._forget = redis.register_script(scripts.FORGET_CONSUMER)

    # -- lifecycle ----------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    async def ensure_groups(self) -> None:
        if not self._groups_ready:
            for stream in self.streams:
                await ensure_group(self.redis, stream, self.group)
            self._groups_ready = True

    async def _rejoin(self, exc: ResponseError) -> None:
        """Create the group again on every stream (MKSTREAM, from the start, as at start-up)
        after Redis answered NOGROUP: it lost its data, or the stream was deleted, while this
        worker ran. Without this every read would fail the same way until the process
        restarted, while the api goes on adding entries nobody reads. Reading the new stream
        from its start takes what was added since the loss."""
        log.warning("The %s consumer group is gone (%s); joining the streams again.",
                    self.group, exc, extra={"service": self.service})
        self._groups_ready = False
        await self.ensure_groups()

    async def start(self) -> None:
        await self.ensure_groups()
        # Join each group as a consumer now, not at the first entry read, so a running but idle
        # worker is one of its group's consumers (GET /v1/streams).
        for stream in self.streams:
            with contextlib.suppress(ResponseError):
                await self.redis.xgroup_createconsumer(stream, self.group, self.consumer)
        self._stopping.clear()
        await self.beat()  # so /health sees this consumer as soon as start() returns
        self._loops = [
            asyncio.create_task(self._read_loop(), name=f"{self.consumer}:read"),
            asyncio.create_task(self._reclaim_loop(), name=f"{self.consumer}:reclaim"),
        ]
        self._heartbeat_task = asyncio.create_task(self._heartbeat_loop(),
                                                   name=f"{self.consumer}:heartbeat")
        if self.settings.reclaim_min_idle_s >= KEEP_ALIVE_MIN_IDLE_S:
            self._keep_alive_task = asyncio.create_task(self._keep_alive_loop(),
                                                        name=f"{self.consumer}:keep-alive")
        log.info("Worker started; reading %s.", ", ".join(self.streams),
                 extra={"service": self.service, "consumer": self.consumer})

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop reading, let in-flight work finish for ``grace_s``, then cancel the rest.

        Cancelled work is not acked: it stays pending and another process reclaims it.
        """
        grace = self.settings.shutdown_grace_s if grace_s is None else grace_s
        deadline = asyncio.get_running_loop().time() + grace
        self._stopping.set()
        # The keep-alive runs on through the grace: a batch still finishing would otherwise go
        # idle and be reclaimed, and done a second time, by another process while this one
        # completes it (a grace longer than two thirds of RECLAIM_MIN_IDLE_SECONDS). So does
        # the heartbeat: with a grace longer than its key's life, /health lost the process
        # while it still finished its batches.
        await cancel_all(self._loops)
        self._loops = []
        if self.outage is not None:
            await self.outage.close()
        if self._tasks:
            _done, pending = await asyncio.wait(self._tasks, timeout=grace)
            if pending:
                stuck = [f"{e.stream}/{e.id}" for e in self._in_flight.values()]
                log.warning(
                    "Shutdown grace period over; cancelling %d batches. Their entries stay "
                    "pending and will be reclaimed: %s", len(pending), ", ".join(stuck[:20]),
                    extra={"service": self.service},
                )
                # Cancelled again until they end (a cancellation can be swallowed by a call
                # completing as it lands: asyncio.wait_for on Python 3.11), within a bound.
                await cancel_all(list(pending))
        await cancel_all([t for t in (self._keep_alive_task, self._heartbeat_task)
                          if t is not None])
        self._keep_alive_task = self._heartbeat_task = None
        try:
            # What is left of the grace, and at least STOP_GOODBYE_MIN_S: a stalled Redis held
            # each of these calls for the client's timeouts, one after another.
            async with asyncio.timeout(max(STOP_GOODBYE_MIN_S,
                                           deadline - asyncio.get_running_loop().time())):
                await remove_heartbeat(self.redis, self.keys, self.consumer)
                for stream in self.streams:  # one call per stream: each may live in its own slot
                    with contextlib.suppress(RedisError, OSError):
                        await self._forget(keys=[stream], args=[self.group, self.consumer])
        except TimeoutError:
            log.warning("Redis did not answer the stopping worker in time: its heartbeat expires "
                        "by itself, and its consumer stays in the group until one takes over "
                        "what it holds.", extra={"service": self.service})
        log.info("Worker stopped.", extra={"service": self.service, "consumer": self.consumer})

    async def run_until_idle(self, *, reclaim: bool = True, max_rounds: int = 10_000) -> int:
        """Process everything available (new entries, and reclaimable ones when ``reclaim``)
        until a round finds nothing; returns how many entries were handled. For tests."""
        await self.ensure_groups()
        handled = 0
        for _ in range(max_rounds):
            found = 0
            if reclaim:
                found += await self.reclaim_once()
            while self.concurrency - self.in_flight > 0:
                taken = await self._read_new(block_ms=None)
                if not taken:
                    break
                found += taken
            if self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)
            handled += found
            if not found:
                return handled
        return handled

    # -- reading ------------------------------------------------------------------
    async def _read_loop(self) -> None:
        failing_since: float | None = None  # when reads began to fail, while they do
        while not self._stopping.is_set():
            try:
                if self.outage is not None and self.outage.holding:
                    # /health says the worker waits now, and that it works again once it
                    # does, rather than an interval later.
                    self._beat_now.set()
                    await self.outage.ok.wait()
                    self._beat_now.set()
                    continue
                free = self.concurrency - self.in_flight
                if free <= 0:
                    self._capacity.clear()
                    await self._capacity.wait()
                    continue
                open_streams = self._open_streams()
                if not open_streams:
                    self._capacity.clear()
                    await self._capacity.wait()
                    continue
                if len(open_streams) < len(self.streams):
                    # Some stream has its batches in flight: take what the others hold, else
                    # wait for a batch to end, or a moment for the others to get work.
                    self._capacity.clear()
                    since = time.monotonic() - self._emptied_at
                    if since < LANE_POLL_S:
                        # A read a moment ago left the streams empty (at low load, the read
                        # that started this batch): asking them again at once was one more
                        # round trip per batch that found nothing.
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._capacity.wait(), LANE_POLL_S - since)
                        continue
                    taken = await self._read_new(block_ms=None, only=open_streams)
                else:
                    taken = await self._read_new(block_ms=self.settings.read_block_ms)
                self._set_read_error(None)
                if failing_since is not None:
                    self._read_again(failing_since)
                    failing_since = None
                if not taken and len(open_streams) < len(self.streams):
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._capacity.wait(), LANE_POLL_S)
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                log.warning("Reading %s failed (%s); retrying in 1 s.", self.service, exc,
                            extra={"service": self.service})
                failing_since = failing_since or time.monotonic()
                self._set_read_error(str(exc) or type(exc).__name__)
                await asyncio.sleep(1.0)
            except Exception as exc:
                log.exception("Unexpected error in the read loop; retrying in 1 s.",
                              extra={"service": self.service})
                self._set_read_error(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(1.0)

    def _set_read_error(self, error: str | None) -> None:
        """Record why reads fail (None: they work), beating at once when that changes: after
        an outage the last beat said the reads failed, and /health stayed degraded until the
        next interval's beat."""
        if (error is None) != (self._read_error is None):
            self._beat_now.set()
        self._read_error = error

    def _read_again(self, failing_since: float) -> None:
        """After failed reads, say that reading works again: the warnings just stop, and an
        operator watching an outage wants to know it is over."""
        log.info("Reading %s works again after %.1f s of failed reads.", self.service,
                     time.monotonic() - failing_since, extra={"service": self.service})

    async def _read_new(self, *, block_ms: int | None, only: list[str] | None = None) -> int:
        """Fill the free slots from the streams in priority order (of ``only`` when given),
        then dispatch; returns how many entries were taken off the streams (malformed and
        dead-lettered ones included, so a read that yields only those still counts as
        progress)."""
        if self._held():
            return 0
        async with self._taking:
            free = self.concurrency - self.in_flight
            if free <= 0:
                return 0
            if self.max_batch_size is not None:
                free = min(free, self.max_batch_size)
            if self.settings.injects("unbounded_reads"):  # test-only fault: no backpressure
                free = max(free, 100 * self.concurrency)
            raw: list[tuple[str, str, Mapping[bytes, bytes] | None]] = []
            streams, reserve = self._read_order()
            first = streams[0]
            if only is not None:
                streams = [s for s in streams if s in only]
            per_stream = (free - reserve) // len(streams)
            blocking_count = None  # the per-stream count of a blocking read over every stream
            if self.max_batches is not None and len(streams) > 1 and per_stream >= 1:
                # A stage of few batches per stream reads every stream in one round trip.
                # Reading stream by stream cost a round trip per empty stream, several times
                # per batch: at 500/s offered, six reads per notification where two do.
                if not (self._drained and block_ms is not None):
                    # Critical first, then normal, then low, each taking what the earlier
                    # left (a read of equal shares gave a low backlog two thirds of the slots
                    # while critical entries waited).
                    raw, emptied = await self._read_in_order(streams, first, free, reserve)
                    if emptied:
                        blocking_count = free + 1  # every stream is known to be empty
                if not raw and block_ms is not None:
                    # Nothing anywhere: block on every stream at once, an equal share each
                    # (it returns as soon as any stream gets work).
                    raw = await self._xread({s: ">" for s in streams}, per_stream, block_ms)
                    blocking_count = per_stream
            else:
                if not (self._drained and block_ms is not None):
                    for stream in streams:
                        # Lower streams leave `reserve` slots free, so work arriving on the
                        # first stream never waits for a batch of lower-priority work to end.
                        want = free - len(raw) - (reserve if stream != first else 0)
                        if want <= 0:
                            break
                        raw.extend(await self._xread({stream: ">"}, want, None))
                if not raw and block_ms is not None:
                    # Nothing anywhere: block on every stream at once. ``count`` per stream
                    # keeps the total within the free capacity.
                    if per_stream >= 1:
                        raw = await self._xread({s: ">" for s in streams}, per_stream,
                                                block_ms)
                        blocking_count = per_stream
                    else:
                        # Only the slots kept for the first stream are free: wait on it
                        # alone, briefly, so freed slots are soon offered to the others again.
                        raw = await self._xread({streams[0]: ">"}, free,
                                                min(block_ms, RESERVED_POLL_MS))
            by_stream: dict[str, list[tuple[str, str, Mapping[bytes, bytes] | None]]] = {}
            for item in raw:
                by_stream.setdefault(item[0], []).append(item)
            # A blocking read that got fewer than `count` from every stream left each of them
            # empty, so the next read can block at once instead of first polling each stream
            # in priority order (three round trips per batch at low load): a blocking read
            # returns whatever any stream holds, so nothing waits.
            self._drained = blocking_count is not None and all(
                len(entries) < blocking_count for entries in by_stream.values())
            if self._drained:
                self._emptied_at = time.monotonic()
            if self._held():
                # A read already waiting when an outage began: its entries stay pending,
                # untried and uncounted, for the sweep that follows the outage.
                return len(raw)
            # One batch per stream: a critical entry read together with lower-priority ones
            # must not wait for their batch to finish (measured: a critical entry in a batch
            # of 45 low ones spent 740 ms in the enricher under a low backlog).
            for entries in by_stream.values():
                await self._dispatch(entries, reclaimed=False)
            return len(raw)

    def _open_streams(self) -> list[str]:
        """The streams with fewer than ``max_batches`` batches in flight."""
        if self.max_batches is None:
            return self.streams
        return [s for s in self.streams if self._batches.get(s, 0) < self.max_batches]

    def _read_order(self) -> tuple[list[str], int]:
        """The streams in the order to fill slots from, and how many slots only the first
        (highest-priority) stream may fill."""
        if self.settings.injects("ignore_priority"):  # test-only fault: lowest first
            return self.streams[::-1], 0
        reserve = self.concurrency // PRIORITY_RESERVE_DIVISOR if len(self.streams) > 1 else 0
        return self.streams, reserve

    async def _xread(
        self, streams: dict[str, str], count: int, block_ms: int | None
    ) -> list[tuple[str, str, Mapping[bytes, bytes] | None]]:
        args: list[Any] = ["XREADGROUP", "GROUP", self.group, self.consumer, "COUNT", count]
        if block_ms is not None:
            args += ["BLOCK", block_ms]
        args += ["STREAMS", *streams, *streams.values()]
        return entries_of(await self._call_rejoining(args))

    async def _read_in_order(
        self, streams: list[str], first: str, free: int, reserve: int
    ) -> tuple[list[tuple[str, str, Mapping[bytes, bytes] | None]], bool]:
        """Up to ``free`` new entries, filled from ``streams`` in order (those after ``first``
        leaving ``reserve`` slots), and whether every stream was read and left empty."""
        args: list[Any] = ["EVAL", scripts.READ_IN_ORDER, len(streams), *streams,
                           self.group, self.consumer, free,
                           *[0 if stream == first else reserve for stream in streams]]
        emptied, reply = await self._call_rejoining(args)
        return entries_of(reply), int(emptied) == 1

    async def _call_rejoining(self, args: list[Any]) -> Any:
        """One read command; after a NOGROUP, the group is created again and the read
        repeated once."""
        try:
            (reply,) = await pipe(self.redis).command(*args).execute()
        except ResponseError as exc:
            if not is_nogroup(exc):
                raise
            await self._rejoin(exc)
            (reply,) = await pipe(self.redis).command(*args).execute()
        return reply

    def _held(self) -> bool:
        """Whether an outage holds this worker: nothing is read or reclaimed."""
        return self.outage is not None and self.outage.holding

    # -- reclaiming ---------------------------------------------------------------
    async def _reclaim_loop(self) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        while not self._stopping.is_set():
            # Intervals run from one sweep's start to the next: a sweep first waits for the
            # read in progress (a blocking one, on an idle worker), and counting the interval
            # from its end made every period that much longer than RECLAIM_INTERVAL_SECONDS.
            await self._pause_between_sweeps(loop.time() - started)
            started = loop.time()
            try:
                await self.reclaim_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a chore: log and carry on
                log.warning("Reclaim sweep failed (%s); next sweep in %.1f s.", exc,
                            self.settings.reclaim_interval_s, extra={"service": self.service})

    async def _pause_between_sweeps(self, elapsed_s: float = 0.0) -> None:
        """Wait for the next sweep: an interval after the last began (``elapsed_s`` ago),
        and no sweep during an outage. The end of one sweeps at once: what the outage held
        has been idle since it began."""
        delay = max(0.0, self.next_reclaim_delay_s() - elapsed_s)
        outage = self.outage
        if outage is None:
            await asyncio.sleep(delay)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(outage.recovered.wait(), delay)
        await outage.ok.wait()
        outage.recovered.clear()

    def next_reclaim_delay_s(self) -> float:
        """A sweep that ran out of free slots left idle entries behind (after an outage there
        can be thousands): the next one comes as soon as slots may have freed, not a whole
        interval later. Each entry still waits ``reclaim_min_idle_s`` between its tries."""
        if self.sweep_cut_short:
            return min(self.settings.reclaim_interval_s, RECLAIM_AGAIN_S)
        return self.settings.reclaim_interval_s

    async def reclaim_once(self) -> int:
        """XAUTOCLAIM entries idle past ``reclaim_min_idle_s`` (up to free capacity) and
        dispatch them; returns how many were taken over."""
        self.sweep_cut_short = False
        if self.settings.injects("skip_reclaim"):  # test-only fault (config.FAULT_INJECTIONS)
            return 0
        if self._held():
            return 0
        total = 0
        swept: list[str] = []
        # One turn for every stream: the read in progress ends first (reads and sweeps count
        # the free slots one at a time), and an idle worker's read blocks for read_block_ms,
        # so a turn per stream put that wait between the streams, twice more per sweep.
        async with self._taking:
            for stream in self.streams:
                total += await self._reclaim_stream(stream)
                if self.sweep_cut_short:
                    break
                swept.append(stream)
        for stream in swept:
            await self._forget_departed(stream)
        return total

    async def _reclaim_stream(self, stream: str) -> int:
        """One stream's part of a sweep, under ``_taking``; sets ``sweep_cut_short`` when the
        free slots ran out."""
        min_idle_ms = int(self.settings.reclaim_min_idle_s * 1000)
        total = 0
        cursor = "0-0"
        while True:
            free = self.concurrency - self.in_flight
            if free <= 0:
                self.sweep_cut_short = True
                return total
            # Entries in flight when the claim is sent are this worker's own, even if their
            # batch settles before the reply is read: an entry acked meanwhile must not be
            # taken for a stray and processed again. (None is dispatched meanwhile:
            # dispatching takes `_taking`, which this sweep holds.)
            ours = set(self._in_flight)
            try:
                reply: Any = await self.redis.xautoclaim(
                    stream, self.group, self.consumer, min_idle_ms, cursor, count=free)
            except ResponseError as exc:
                if not is_nogroup(exc):
                    raise
                await self._rejoin(exc)
                return total  # a group made just now has nothing pending to take over
            cursor = as_str(reply[0])
            # An entry of this worker's own that is trimmed is still done: it is in memory.
            trimmed = [as_str(i) for i in (reply[2] if len(reply) > 2 else ())
                       if (stream, as_str(i)) not in ours]
            if trimmed:
                await self._trimmed_away(stream, trimmed)
            claimed = [
                (stream, as_str(entry_id), fields)
                for entry_id, fields in reply[1]
                if (stream, as_str(entry_id)) not in ours
            ]
            if claimed:
                total += len(claimed)
                self.stats.reclaimed += len(claimed)
                metrics.RECLAIMED.labels(self.service, stream).inc(len(claimed))
                # The ids (the first 20), so an entry can be followed through the logs.
                # The text is parsed by the scenarios ("Reclaimed N idle entries"): kept.
                log.info("Reclaimed %d idle entries from %s.", len(claimed), stream,
                         extra={"service": self.service, "stream": stream,
                                "entry_ids": [entry_id for _, entry_id, _ in claimed[:20]]})
                await self._dispatch(claimed, reclaimed=True)
            if cursor == "0-0":
                return total

    async def _trimmed_away(self, stream: str, entry_ids: list[str]) -> None:
        """Pending entries the stream no longer holds (trimmed by ``MAXLEN ~ QUEUE_MAX_LEN``
        before they were done): XAUTOCLAIM took them off the pending list, and they can never
        be processed, so say so and drop their attempt counters."""
        await self.redis.delete(*[key for i in entry_ids
                                  for key in self.keys.attempt_counters(self.group, i, stream)])
        log.warning("Pending entries of %s were trimmed from the stream before being "
                    "processed (QUEUE_MAX_LEN is below the backlog) and are lost: %d (%s).",
                    stream, len(entry_ids), ", ".join(entry_ids[:20]),
                    extra={"service": self.service})

    async def _forget_departed(self, stream: str) -> None:
        """Take off ``stream``'s group the consumers of processes that died (a clean stop
        leaves by itself) once others reclaimed what they held. Gone means no heartbeat: a
        live worker may not read one of its streams for a while (its reads favour the first),
        so idle time alone does not tell. One holding entries stays, so they can be reclaimed
        from it (the script checks that atomically); one taken off by mistake rejoins at its
        next read."""
        try:
            consumers: Any = await self.redis.xinfo_consumers(stream, self.group)
        except ResponseError:
            return  # no group (yet): nothing to take off
        idle_ms = 1000 * self.settings.reclaim_min_idle_s
        idle = [as_str(c["name"]) for c in consumers
                if not int(c.get("pending") or 0) and int(c.get("idle") or 0) > idle_ms
                and as_str(c["name"]) != self.consumer]
        if not idle:
            return
        checks = self.redis.pipeline(transaction=False)
        for name in idle:
            checks.exists(self.keys.health(name))
        for name, beats in zip(idle, await checks.execute(), strict=True):
            if not beats:
                await self._forget(keys=[stream], args=[self.group, name])

    # -- keeping entries in progress -------------------------------------------------
    async def _keep_alive_loop(self) -> None:
        interval = self.settings.reclaim_min_idle_s / 3
        while True:  # until stop() cancels it, once nothing is in flight
            await asyncio.sleep(interval)
            try:
                await self.keep_alive()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a chore: log and carry on
                log.warning("Could not mark entries in progress as alive (%s); another "
                            "process may reclaim and repeat them.", exc,
                            extra={"service": self.service})

    async def keep_alive(self) -> int:
        """Reset the idle time of the entries this worker is working on (taken less than
        ``KEEP_ALIVE_LIMIT`` x ``reclaim_min_idle_s`` ago); returns how many it touched.

        Without it an entry whose processing outlasts ``reclaim_min_idle_s`` (a slow provider
        within its timeout, a stalled event loop) is taken over by another process and done a
        second time while the first still works on it.
        """
        oldest = time.monotonic() - KEEP_ALIVE_LIMIT * self.settings.reclaim_min_idle_s
        by_stream: dict[str, list[str]] = {}
        for entry in list(self._in_flight.values()):
            if entry.taken_at > oldest:
                by_stream.setdefault(entry.stream, []).append(entry.id)
        if not by_stream:
            return 0
        args: list[Any] = [self.group, self.consumer]
        for ids in by_stream.values():
            args += [len(ids), *ids]
        (kept,) = await pipe(self.redis).eval(scripts.KEEP_ALIVE, len(by_stream), *by_stream,
                                              *args).execute()
        return int(kept)

    # -- dispatching ----------------------------------------------------------------
    async def _dispatch(
        self, raw: list[tuple[str, str, Mapping[bytes, bytes] | None]], *, reclaimed: bool
    ) -> list[Entry]:
        parsed: list[tuple[str, str, dict[str, Any]]] = []
        malformed: list[tuple[str, str, str]] = []
        for stream, entry_id, fields in raw:
            try:
                parsed.append((stream, entry_id, decode(fields)))
            except MalformedPayload as exc:
                malformed.append((stream, entry_id, str(exc)))

        entries = [Entry(stream, entry_id, payload, 0, reclaimed)
                   for stream, entry_id, payload in parsed]
        batch_pipe = pipe(self.redis)
        counters = [self.keys.attempt_counters(self.group, entry_id, stream)
                    for stream, entry_id, _p in parsed]
        if parsed:
            counter_keys = [key for keys in counters for key in keys]
            batch_pipe.eval(scripts.COUNT_ATTEMPTS, len(counter_keys), *counter_keys,
                            self.settings.attempts_ttl_s)
        for stream, entry_id, _reason in malformed:
            if self.settings.injects("retry_malformed"):  # test-only fault
                continue
            batch_pipe.xack(stream, self.group, entry_id)
            batch_pipe.delete(*self.keys.attempt_counters(self.group, entry_id, stream))
        if self.settings.injects("ack_before_process"):  # test-only fault: breaks at-least-once
            for stream, entry_id, _payload in parsed:
                batch_pipe.xack(stream, self.group, entry_id)
        # The stage's dedup claims ride in the same round trip (one fewer per batch).
        claims = self._claims(entries)
        for entry, mark, ttl_s in claims:
            batch_pipe.set(mark, entry.owner, ex=ttl_s, nx=True, get=True)
        results = await batch_pipe.execute()
        for (entry, mark, _ttl), before in zip(claims, results[len(results) - len(claims):],
                                               strict=True):
            mine = before is None or as_str(before) == entry.owner
            entry.claimed = (mark, mine)
            if mine:
                entry.marks.append(mark)

        for stream, entry_id, reason in malformed:
            self.stats.malformed += 1
            metrics.MALFORMED.labels(self.service, stream).inc()
            log.error("Acked a malformed entry without processing it: %s.", reason,
                      extra={"service": self.service, "stream": stream, "entry_id": entry_id})

        # An entry's count is its deciding counter's, the first of its counters.
        replies = results[0] if parsed else []
        deciding: list[int] = []
        at = 0
        for keys in counters:
            deciding.append(int(replies[at]))
            at += len(keys)
        batch: list[Entry] = []
        over_limit: list[Entry] = []
        for index, entry in enumerate(entries):
            attempt = deciding[index]
            entry.attempt = attempt
            # Counting the attempts of the entries a parked task came from (priorAttempts):
            # a task whose last attempt was in flight on a process that died is given up
            # on, not sent once more.
            if attempts_made(entry) > self.max_attempts:
                entry.attempt = attempt - 1  # the attempts actually made
                if self.settles_exhausted:
                    entry.exhausted = True
                    batch.append(entry)
                    continue
                entry.error = RuntimeError(
                    f"gave up after {counted(attempts_made(entry), 'attempt')} "
                    "(last one never finished)"
                )
                over_limit.append(entry)
            else:
                batch.append(entry)
        for entry in over_limit:
            if entry.marks:  # claimed with the count, but never processed: let it go
                await self._release(keys=entry.marks, args=[entry.owner])
                entry.marks.clear()
        if over_limit:
            await self._dead_letter(over_limit)
        if batch:
            for entry in batch:
                self._in_flight[(entry.stream, entry.id)] = entry
            self.stats.max_in_flight = max(self.stats.max_in_flight, self.in_flight)
            stream = batch[0].stream
            self._batches[stream] = self._batches.get(stream, 0) + 1
            task = asyncio.create_task(self._run(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return batch

    def _claims(self, entries: list[Entry]) -> list[tuple[Entry, str, int]]:
        if self.claim_key is None:
            return []
        claims = []
        for entry in entries:
            try:
                found = self.claim_key(entry.stream, entry.payload)
            except Exception:  # the stage refuses the payload and says why
                continue
            if found is not None:
                claims.append((entry, found[0], max(1, found[1])))
        return claims

    async def _run(self, batch: list[Entry]) -> None:
        # Every batch holds entries of one stream; whatever the batch awaits can tell which.
        batch_stream.set(batch[0].stream)
        try:
            try:
                await self.process(batch)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                for entry in batch:
                    if entry.error is None:
                        entry.error = exc
                if len(batch) > 1 and may_be_one_entrys(exc):
                    await self._try_each_alone(batch, exc)
            done = [e for e in batch if e.error is None]
            failed = [e for e in batch if e.error is not None]
            if done:
                await asyncio.shield(self._commit(done))
            if failed:
                await asyncio.shield(self._handle_failures(failed))
        except asyncio.CancelledError:
            pass  # left pending: another process (or this one) reclaims it
        except Exception as exc:
            if isinstance(exc, RedisConnectionError | RedisTimeoutError | OSError) \
                    or availability.unavailable(exc):
                # A store that cannot serve, not a bug: the reclaim after it is the retry.
                log.warning("Could not record the outcome of a batch (%s); its entries stay "
                            "pending and will be reclaimed.", str(exc) or describe_error(exc),
                            extra=batch_fields(self.service, batch))
            else:
                log.exception("Could not record the outcome of a batch; its entries stay "
                              "pending and will be reclaimed.",
                              extra=batch_fields(self.service, batch))
        finally:
            for entry in batch:
                self._in_flight.pop((entry.stream, entry.id), None)
            self._batches[batch[0].stream] -= 1
            self._capacity.set()

    async def _try_each_alone(self, batch: list[Entry], exc: Exception) -> None:
        """The whole batch raised ``exc``, which may be one entry's doing (a batch-wide
        INSERT refusing one row's value): try again, within this attempt, each entry that
        did nothing irreversible, so that only the one at fault fails. Without this, its
        neighbours, reclaimed with it batch after batch, were dead-lettered beside it."""
        again = [e for e in batch if e.error is exc and not e.irreversible]
        if len(again) < 2:
            return
        log.warning("A batch of %d failed as a whole (%s); trying each of %d entries alone.",
                    len(batch), describe_error(exc) if is_bug(exc) else
                    str(exc) or describe_error(exc), len(again),
                    extra=batch_fields(self.service, batch))
        for entry in again:
            entry.error = None
            entry.emits.clear()  # the failed run's outputs never leave
            try:
                await self.process([entry])
            except asyncio.CancelledError:
                entry.error = exc  # stopped: it stays pending, as the batch would have
                raise
            except Exception as alone:
                if entry.error is None:
                    entry.error = alone

    async def _commit(self, done: list[Entry]) -> None:
        await self._settle([out for entry in done for out in entry.emits], done)
        self.stats.processed += len(done)
        if self.outage is not None and self.outage.lock_cause is not None:
            self.outage.settled([(e.stream, e.id) for e in done])
        counts: dict[tuple[str, str], int] = {}
        for entry in done:
            labels = (entry.stream, channel_label(entry))
            counts[labels] = counts.get(labels, 0) + 1
        for (stream, channel), count in counts.items():
            metrics.PROCESSED.labels(self.service, stream, channel).inc(count)

    async def _handle_failures(self, failed: list[Entry]) -> None:
        held = await self._hold_for_outage(failed)
        last: list[Entry] = []
        for entry in failed:
            if id(entry) in held:
                if entry.marks:
                    await self._release(keys=entry.marks, args=[entry.owner])
                    entry.marks.clear()
                continue
            self.stats.failed += 1
            metrics.FAILED.labels(self.service, entry.stream, channel_label(entry)).inc()
            permanent = isinstance(entry.error, PermanentFailure)
            final = permanent or attempts_made(entry) >= self.max_attempts
            error = entry.error
            bug = error is not None and is_bug(error)
            trace = error if error is not None and bug and self._first_trace(error) else None
            log.warning(
                "Attempt %d of %d failed: %s. %s", attempts_made(entry), self.max_attempts,
                # A query timeout's TimeoutError has no text, and a bug's (a KeyError's
                # 'userId') says little without its type: name the type too.
                describe_error(entry.error) if bug else
                str(entry.error) or describe_error(entry.error),
                "Dead-lettering it." if final else "It stays pending for the reclaim sweep.",
                extra=log_fields(self.service, entry),
                exc_info=trace,
            )
            if entry.marks:
                await self._release(keys=entry.marks, args=[entry.owner])
                entry.marks.clear()
            if final:
                last.append(entry)
        if self.outage is not None and self.outage.lock_cause is not None:
            self.outage.settled([(e.stream, e.id) for e in failed if id(e) not in held])
        if last:
            await self._dead_letter(last)

    def _first_trace(self, error: BaseException) -> bool:
        """Whether ``error``'s traceback is to be written: not when the same bug (type, text
        and the line raising it) was traced in the last ``TRACE_WINDOW_S``. A bug that fails
        all the traffic met it in every batch, a poison entry in every attempt: the first
        traceback says where it is, and the records after it name it by type and text."""
        frames = traceback.extract_tb(error.__traceback__)
        where = (frames[-1].filename, frames[-1].lineno) if frames else None
        key = (type(error), str(error), where)
        now = time.monotonic()
        last = self._traced.get(key)
        if last is not None and now - last < TRACE_WINDOW_S:
            return False
        if len(self._traced) >= MAX_TRACED:
            self._traced = {k: t for k, t in self._traced.items() if now - t < TRACE_WINDOW_S}
        self._traced[key] = now
        return True

    async def _hold_for_outage(self, failed: list[Entry]) -> set[int]:
        """The failed entries (their ``id()``s) that met an outage of the stage's dependency,
        or waited on a lock another session holds there, and did nothing irreversible: they
        stay pending, and the attempt just counted for them is given back, so neither uses
        up their attempts."""
        outage = self.outage
        if outage is None or self.settings.injects("ignore_outages"):  # test-only fault
            return set()
        spare = [e for e in failed if e.error is not None
                 and not isinstance(e.error, PermanentFailure)]
        waited = [e for e in spare if e.error and outage.dependency.lock_wait(e.error)]
        waiting = {id(e) for e in waited}
        met = [e for e in spare if id(e) not in waiting and e.error
               and outage.dependency.unavailable(e.error)]
        if met and not await outage.confirms(met[0].error or RuntimeError()):
            met = []
        # A try that called a provider happened, outage or not: it counts.
        spared = [e for e in waited + met if not e.irreversible]
        if spared:
            await self._give_back(keys=[key for e in spared for key in
                                        self.keys.attempt_counters(self.group, e.id, e.stream)])
            self.stats.held += len(spared)
        if waited:
            # Said once, when the wait begins: each try that meets the lock again is silent.
            outage.lock_waited(waited[0].error or RuntimeError(),
                               [(e.stream, e.id) for e in waited if not e.irreversible])
        held_met = [e for e in met if not e.irreversible]
        if held_met:
            log.info("%d of a batch's entries met the %s outage; they stay pending, and this "
                     "attempt does not count against them.", len(held_met),
                     outage.dependency.name,
                     extra=batch_fields(self.service, held_met))
        return {id(e) for e in spared}

    async def _dead_letter(self, entries: list[Entry]) -> None:
        """DLQ entry + ``notification:failed`` + XACK + DEL counter, atomically per batch."""
        now = utc_now_iso()
        outputs: list[tuple[str, dict[str, Any]]] = []
        for entry in entries:
            record = dlq_record(entry, self.service, self.group, now)
            outputs.append((self.keys.dlq, record))
            if (entry.stream != self.keys.events_inbound
                    and not self.settings.injects("skip_failed_event")):  # test-only fault
                outputs.append((self.keys.events_inbound, failed_event(entry, record)))
        added = await self._settle(outputs, entries)
        dlq_ids = [added_id for (stream, _), added_id in zip(outputs, added, strict=True)
                   if stream == self.keys.dlq]
        for entry, dlq_id in zip(entries, dlq_ids, strict=True):
            self.stats.dead_lettered += 1
            metrics.DEAD_LETTERED.labels(self.service, entry.stream, channel_label(entry)).inc()
            made = attempts_made(entry)
            log.error("Moved to the dead-letter queue as %s after %d attempt%s (%s); replay it "
                      "with POST /v1/dlq/%s/replay once the cause is fixed.", dlq_id, made,
                      "" if made == 1 else "s", describe_error(entry.error), dlq_id,
                      extra={**log_fields(self.service, entry), "dlq_id": dlq_id})

    async def _settle(self, outputs: Sequence[tuple[str, Mapping[str, Any]]],
                      entries: Sequence[Entry]) -> list[str]:
        """Write ``outputs``, then ack ``entries`` and delete their attempt counters: one
        script call, which stops before acking anything if Redis refuses an output. Returns
        the outputs' new entry ids, in order."""
        by_stream: dict[str, list[str]] = {}
        for entry in entries:
            by_stream.setdefault(entry.stream, []).append(entry.id)
        keys = [stream for stream, _payload in outputs]
        keys += by_stream
        keys += [key for e in entries
                 for key in self.keys.attempt_counters(self.group, e.id, e.stream)]
        args: list[Any] = [len(outputs), len(by_stream), self.settings.queue_max_len,
                           self.group]
        for stream, payload in outputs:
            fields = (dlq_fields(payload) if stream == self.keys.dlq
                      else [DATA_FIELD, encode(payload)[DATA_FIELD]])
            args.append(len(fields))
            args += fields
        for ids in by_stream.values():
            args.append(len(ids))
            args += ids
        [added] = await pipe(self.redis).eval(scripts.SETTLE, len(keys), *keys, *args).execute()
        return [i.decode() if isinstance(i, bytes) else str(i) for i in added or []]

    # -- heartbeat -----------------------------------------------------------------
    async def _heartbeat_loop(self) -> None:
        while True:  # until stop() has let the last batch finish
            # Cleared before the beat, so a change of read state during it beats again.
            self._beat_now.clear()
            failed = False
            try:
                await self.beat()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failed = True
                log.warning("Heartbeat failed (%s); trying again.", heartbeat_failure(exc),
                            extra={"service": self.service})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._beat_now.wait(), next_beat_in(
                    self.settings.heartbeat_interval_s, failed))

    async def beat(self) -> None:
        beat = {
            "service": self.service,
            "consumer": self.consumer,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "lastBeat": utc_now_iso(),
            "inFlight": self.in_flight,
            "processed": self.stats.processed,
            "ts": time.time(),
        }
        # Reads that fail, or an outage that stopped them: either way the worker beats but
        # does no work, and /health says why.
        problem = self._read_error or (self.outage.waiting_for() if self.outage else None)
        if problem is not None:
            beat["readError"] = problem[:500]
        await write_heartbeat(self.redis, self.keys, self.consumer, beat,
                              self.settings.heartbeat_ttl_s)
