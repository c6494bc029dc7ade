"""Reconciliation: accepted notifications that never reached the pipeline.

The API commits a send's ``notifications`` row (with its ``accepted`` timeline row) before it
XADDs the send to ``inbound:{priority}``. A process that dies between the two, or that lost
the XADD's reply while Redis stayed unreachable, leaves a row that nothing will ever move on,
and whose caller never got a 202. The scheduler's poll lock holder (one process in the fleet)
runs :meth:`Reconciler.run_once` now and then:

    candidates   notifications created RECONCILE_GRACE_SECONDS ago or earlier, since the
                 cursor, with nothing on their timeline but ``accepted`` (a notification the
                 enricher took has rows from the engine on: queued, scheduled for its sendAt,
                 skipped, ...); workflow sends are left to their instance, which sends again
    the stream   each candidate's inbound stream, read from just before its id's time:
                   its entry is there      -> a backlog, not an orphan: left alone
                   absent, and the stream
                   kept every entry since  -> never enqueued: a ``failed`` timeline row says
                                              why, and it is never sent (its caller got no 202)
                   absent, but the stream
                   was trimmed past it     -> cannot be told: left alone and logged
                   absent, from before
                   ``notif:reconcile:since`` -> cannot be told either: Redis lost its data
                                              since (a restart without persistence), and the
                                              streams made afresh lost nothing only since then

``notif:reconcile:since`` is set (Redis's time) by the first pass that finds it missing, and
goes with the rest when Redis loses its data: a stream's own counters cannot show that, since
the workers' MKSTREAM makes a new empty stream that has "lost nothing".

Candidates are found by primary key: ids are UUIDv7, so a range of ids is a range of creation
times, and each pass reads one slice of ``SLICE_MS`` after another up to the grace horizon,
moving ``notif:reconcile:cursor`` on, so a row is looked at once and the hot path pays nothing
(no index, no key, no round trip). A holder without a cursor (the first one, or after Redis
lost its data) starts ``FIRST_LOOKBACK_MS`` before the horizon.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import asyncpg
from redis.asyncio import Redis

from notifkit.clock import now_ms
from notifkit.config import Settings
from notifkit.db.logs import Kind, LogRow, Status, insert_logs
from notifkit.db.pool import allow_lock_wait
from notifkit.keys import Keys
from notifkit.streams import find_notifications

log = logging.getLogger("notifkit.reconcile")

SLICE_MS = 60_000
SLICES_PER_PASS = 60
FIRST_LOOKBACK_MS = 3600_000
# Ids carry the API host's clock, stream ids Redis's: a stream is searched from this long
# before a notification's id, so clocks that far apart still find its entry.
CLOCK_SKEW_MS = 60_000
# The slice query's time limit, in place of the pool's (QUERY_TIMEOUT_S): a slice is a
# minute of traffic, so its cost grows with the send rate, not with a batch, and the cursor
# moves on only past a slice read whole; cut at 10 s, one heavy minute would stop
# reconciliation for good. The pass runs beside the scheduler's batches, on one connection,
# so waiting this long in a stall holds nothing but the pass.
SLICE_QUERY_TIMEOUT_S = 300.0
NEVER_ENQUEUED = ("never enqueued: the API stopped before its XADD to {stream} (or Redis lost "
                  "the entry), so it was never answered 202 and will not be sent")

# One slice of candidates, found by primary key (ids are UUIDv7: a range of ids is a range of
# times). A row counts only while its timeline holds nothing but the API's own accepted row:
# anything else (and a workflow's accepted row, which names its user) means something else
# owns it.
_CANDIDATES = """
SELECT n.id::text AS id, n.project_id::text AS project_id, n.priority
FROM notifications n
WHERE n.id >= $1::uuid AND n.id < $2::uuid
  AND n.created_at < now() - make_interval(secs => $3)
  AND NOT EXISTS (SELECT 1 FROM message_logs m
                  WHERE m.project_id = n.project_id AND m.event_id = n.id
                    AND (m.kind <> 'accepted' OR m.user_id IS NOT NULL))
"""


@dataclass
class Pass:
    """What one pass found: notifications whose entries are still on their streams, those
    settled as failed, and those the streams can no longer tell about."""

    in_stream: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    undecided: list[str] = field(default_factory=list)


def id_floor(ms: int) -> str:
    """The lowest UUID whose UUIDv7 time is ``ms``."""
    return str(uuid.UUID(int=(ms & ((1 << 48) - 1)) << 80))


def id_ms(event_id: str) -> int:
    return uuid.UUID(event_id).int >> 80


class Reconciler:
    def __init__(self, settings: Settings, keys: Keys, redis: Redis,
                 pool: asyncpg.Pool | Callable[[], asyncpg.Pool],
                 clock: Callable[[], int] = now_ms) -> None:
        self.settings = settings
        self.keys = keys
        self.redis = redis
        self._pool = pool
        self.clock = clock

    @property
    def pool(self) -> asyncpg.Pool:
        return self._pool() if callable(self._pool) else self._pool

    async def run_once(self, now_ms: int | None = None,
                       still_leader: Callable[[], bool] = lambda: True) -> Pass:
        """Check up to ``SLICES_PER_PASS`` slices past the cursor, up to the grace horizon
        (``now_ms``, default ``clock()``, less ``RECONCILE_GRACE_SECONDS``); stops early when
        ``still_leader()`` turns false."""
        now = self.clock() if now_ms is None else now_ms
        horizon = now - int(self.settings.reconcile_grace_s * 1000)
        raw = await self.redis.get(self.keys.reconcile_cursor)
        cursor = int(raw) if raw is not None else horizon - FIRST_LOOKBACK_MS
        outcome = Pass()
        since = await self._history_since()
        for _ in range(SLICES_PER_PASS):
            if cursor >= horizon or not still_leader():
                break
            end = min(cursor + SLICE_MS, horizon)
            async with self.pool.acquire() as conn, conn.transaction():
                # Behind a migration's lock the slice waits as long as it may take.
                await allow_lock_wait(conn, SLICE_QUERY_TIMEOUT_S)
                rows = await conn.fetch(_CANDIDATES, id_floor(cursor), id_floor(end),
                                        self.settings.reconcile_grace_s,
                                        timeout=SLICE_QUERY_TIMEOUT_S)
            if rows:
                await self._settle(rows, outcome, since)
            cursor = end
            await self.redis.set(self.keys.reconcile_cursor, cursor)
        return outcome

    async def _history_since(self) -> int:
        """Since when (Redis's clock, ms) Redis has kept its data."""
        seconds, micros = await self.redis.time()
        await self.redis.set(self.keys.reconcile_since, seconds * 1000 + micros // 1000, nx=True)
        raw = await self.redis.get(self.keys.reconcile_since)
        return int(raw) if raw is not None else seconds * 1000 + micros // 1000

    async def _settle(self, rows: list[asyncpg.Record], outcome: Pass, since: int) -> None:
        by_stream: dict[str, list[asyncpg.Record]] = {}
        for row in rows:
            by_stream.setdefault(self.keys.inbound(row["priority"]), []).append(row)
        failed: list[LogRow] = []
        for stream, group in by_stream.items():
            since_ms = min(id_ms(r["id"]) for r in group) - CLOCK_SKEW_MS
            search = await find_notifications(self.redis, stream, max(since_ms, 0),
                                              {r["id"]: r["project_id"] for r in group})
            for row in group:
                ids = {"event_id": row["id"], "project_id": row["project_id"]}
                if row["id"] in search.found:
                    outcome.in_stream.append(row["id"])
                elif search.complete and since_ms >= since:
                    outcome.failed.append(row["id"])
                    failed.append(LogRow(
                        project_id=row["project_id"], event_id=row["id"], task_id=row["id"],
                        user_id=None, channel="", kind=Kind.FAILED, status=Status.FAILED,
                        detail=NEVER_ENQUEUED.format(stream=stream),
                        metadata={"reason": "never_enqueued"}))
                    log.warning("Settled an accepted notification as failed: it was never "
                                "enqueued on %s, and will not be sent.", stream, extra=ids)
                elif since_ms < since:
                    outcome.undecided.append(row["id"])
                    log.warning("An accepted notification has nothing on its timeline and no "
                                "entry on %s, which holds only what was added since Redis "
                                "last lost its data, after its time: it cannot be told whether "
                                "it was ever enqueued, so it is left as it is.",
                                stream, extra=ids)
                else:
                    outcome.undecided.append(row["id"])
                    log.warning("An accepted notification has nothing on its timeline and no "
                                "entry on %s, which was trimmed past its time: it cannot be "
                                "told whether it was ever enqueued, so it is left as it is.",
                                stream, extra=ids)
        await insert_logs(self.pool, failed)
