"""The scheduler: tasks wait here for their time (sendAt, quiet hours, a provider's 429) and
leave exactly once.

Ingest (the worker contract, on ``notifkit:stream:scheduled``), per read batch, in one
PostgreSQL transaction:

    lock the tasks' notifications rows FOR SHARE   canceled ones: refused, a 'canceled' row
    upsert scheduled_payloads (one statement)      the durable copy, written first
    MULTI: HSET payload shard + ZADD zset shard    task id -> "{stream}\\n{project}\\n{JSON}"
    commit; ack                                    (the worker acks after process() returns)

A crash between the steps replays the entry: the upsert and the ZADD of the same task are
idempotent.

Cancel (``POST /v1/notifications/{eventId}/cancel``): the API sets ``notifications.canceled_at``
holding the row FOR UPDATE, so a batch holding it FOR SHARE has its tasks in their shards
before the cancel commits, and every batch after sees it. Then :func:`cancel_waiting` takes
the notification's tasks out of their shards with a script that claims a task as the move
script does (and records it in the moved set, so its row is deleted as a moved one's): a task
is either moved or canceled, never both, whichever script runs first.
The tasks a cancel claims, and those ingest or a rebuild refuses for a canceled notification,
leave their users' throttle windows (:func:`release_throttle`) unless something of the
notification was handed to delivery for that user.

Polling: one scheduler at a time holds ``notif:lock:scheduler:poll`` (``SET NX PX`` with a
random token; renewed and released only by a script that checks the token). Each poll, per
shard, one Lua script takes up to ``batch_size`` due task ids and for each one XADDs its entry
to its target stream, removes it from the zset and the payload hash and records it in the
shard's *moved* set, all in one script: a task leaves once or not at all, whoever dies when.
The script also checks the lock token, so a poller that lost its lock while paused moves
nothing. Then the poller deletes the ``scheduled_payloads`` rows of the tasks in the moved
sets and takes them out of the sets; a poller that died before that leaves the ids to the next
one, so no row outlives its task for long.

Why a task id member plus a payload hash rather than the payload as the member: adding a task
again (an entry replayed, a task parked again) must replace it, not add a second copy; the
rebuild must ask "is this task present?"; and the moved set must name tasks, not payloads.

Rebuild: ``notif:scheduled:ready`` is set once the shards are built. An empty zset disappears
in Redis, so only this marker tells "nothing waits" from "Redis lost everything". When it is
missing (at start, or noticed by any later poll), the poll-lock holder re-adds every row of
``scheduled_payloads`` whose task is neither in its shard nor already moved at that due time
(the rows of canceled notifications' tasks it deletes instead), then sets the marker. A task
moved but not yet deleted from PostgreSQL when Redis lost its data is the one that can leave
twice; delivery's taskId dedup absorbs that.

Reconciliation: the poll lock holder also runs :class:`notifkit.reconcile.Reconciler` every
``reconcile_interval_s``, so exactly one process of the fleet settles accepted notifications
that were never enqueued; a pass stops between slices once the lock is lost.

Tests drive it without sleeping: :meth:`SchedulerService.run_until_idle` ingests everything
and polls once at ``clock()``; the clock (``clock=`` option, ms) is injectable.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
from redis.asyncio import Redis
from redis.exceptions import RedisError

from notifkit import codec, metrics, throttle
from notifkit.clock import now_ms
from notifkit.config import Settings
from notifkit.db import scheduled as scheduled_db
from notifkit.db.logs import LogRow, insert_logs, recipient_task_rows
from notifkit.errors import MalformedPayload
from notifkit.ids import is_uuid
from notifkit.keys import PRIORITIES, SCHEDULER_SHARDS, Keys, shard_of
from notifkit.messages import CHANNELS, ScheduledTask, parse_scheduled_task
from notifkit.reconcile import Reconciler
from notifkit.services.base import WorkerService
from notifkit.services.timeline import Recipient, canceled_row, went_out
from notifkit.streams import as_str
from notifkit.tasks import cancel_all
from notifkit.wording import counted
from notifkit.worker import Entry
from notifkit.worker.entry import describe_error

log = logging.getLogger("notifkit.scheduler")

Clock = Callable[[], int]

# How often the lock holder reconciles: a fraction of the grace period, so a never-enqueued
# notification is settled soon after it, within a minute at most.
RECONCILE_SHARE = 4
# A rebuild after Redis lost its data holds every waiting task back until it ends: one that
# reads many pages says how far it got at most this often.
REBUILD_PROGRESS_S = 10.0
MAX_RECONCILE_INTERVAL_S = 60.0

# KEYS: zset, payload hash, moved set, lock. ARGV: now_ms, limit, maxlen, token ('' = no check).
# Returns -1 when the lock is not ours, else {moved: {id, due, project, ...}, orphans: {id...},
# refused: {id, error, ...}}. Per task the XADD comes first: a script that stops half-way
# keeps what it did, so a task whose XADD failed must still be waiting.
_MOVE_DUE = """
if ARGV[4] ~= '' and redis.call('GET', KEYS[4]) ~= ARGV[4] then return -1 end
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES',
                       'LIMIT', 0, tonumber(ARGV[2]))
local moved, orphans, refused = {}, {}, {}
for i = 1, #due, 2 do
  local id, score = due[i], due[i + 1]
  local value = redis.call('HGET', KEYS[2], id)
  local a = value and string.find(value, '\\n', 1, true)
  local b = a and string.find(value, '\\n', a + 1, true)
  if not b then
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
    orphans[#orphans + 1] = id
  else
    local stream = string.sub(value, 1, a - 1)
    local project = string.sub(value, a + 1, b - 1)
    local added = redis.pcall('XADD', stream, 'MAXLEN', '~', ARGV[3], '*', 'data',
                              string.sub(value, b + 1))
    if type(added) == 'table' and added.err then
      refused[#refused + 1] = id
      refused[#refused + 1] = added.err
    else
      redis.call('ZREM', KEYS[1], id)
      redis.call('HDEL', KEYS[2], id)
      redis.call('ZADD', KEYS[3], score, project .. ' ' .. id)
      moved[#moved + 1] = id
      moved[#moved + 1] = score
      moved[#moved + 1] = project
    end
  end
end
return {moved, orphans, refused}
"""

# KEYS: zset, payload hash, moved set. ARGV: project id, then task ids. Claims the waiting
# tasks of that project as _MOVE_DUE would, but adds them to no stream: the cancel's half of
# "a task leaves once". Recorded in the moved set, so the poller deletes their rows and a
# rebuild does not bring them back. Returns the ids claimed.
_CANCEL_WAITING = """
local claimed = {}
for i = 2, #ARGV do
  local id = ARGV[i]
  local score = redis.call('ZSCORE', KEYS[1], id)
  local value = score and redis.call('HGET', KEYS[2], id)
  local a = value and string.find(value, '\\n', 1, true)
  local b = a and string.find(value, '\\n', a + 1, true)
  if score and (not b or string.sub(value, a + 1, b - 1) == ARGV[1]) then
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
    redis.call('ZADD', KEYS[3], score, ARGV[1] .. ' ' .. id)
    claimed[#claimed + 1] = id
  end
end
return claimed
"""

# KEYS: zset, payload hash, moved set. ARGV: task id, due ms, value, moved-set member.
# Adds the task unless it is in its shard already or was moved at this due time.
_ADD_IF_ABSENT = """
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
local moved = redis.call('ZSCORE', KEYS[3], ARGV[4])
if moved and tonumber(moved) == tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
return 1
"""

# KEYS: moved set. ARGV: member, due ms. Forget a moved task once its row is deleted, unless
# it was moved again (at another due time) in between.
_FORGET_MOVED = """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) == tonumber(ARGV[2]) then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
"""

_RENEW_LOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

_RELEASE_LOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass(frozen=True, slots=True)
class MovedTask:
    task_id: str
    due_ms: int
    project_id: str


def encode_entry(stream: str, project_id: str, payload: dict[str, Any]) -> bytes:
    """The payload-hash value the move script splits: target stream, project, entry JSON."""
    return b"\n".join((stream.encode(), project_id.encode(), codec.dumps(payload)))


def moved_member(project_id: str, task_id: str) -> str:
    return f"{project_id} {task_id}"


def _by_shard(task_ids: Iterable[str]) -> dict[str, list[str]]:
    shards: dict[str, list[str]] = {}
    for task_id in dict.fromkeys(task_ids):
        shards.setdefault(shard_of(task_id), []).append(task_id)
    return shards


async def waiting_tasks(redis: Redis, keys: Keys, task_ids: Iterable[str]) -> set[str]:
    """Which of these tasks wait in their shards right now."""
    ids = list(dict.fromkeys(task_ids))
    if not ids:
        return set()
    pipe = redis.pipeline(transaction=False)
    for task_id in ids:
        pipe.zscore(keys.scheduled_shard(shard_of(task_id)), task_id)
    scores = await pipe.execute()
    return {task_id for task_id, score in zip(ids, scores, strict=True) if score is not None}


async def cancel_waiting(redis: Redis, keys: Keys, project_id: str,
                         task_ids: Iterable[str]) -> set[str]:
    """Take a project's tasks out of their shards before the poller moves them; returns the
    ids taken (a task already moved, or not in the scheduler yet, is not)."""
    shards = _by_shard(task_ids)
    if not shards:
        return set()
    script = redis.register_script(_CANCEL_WAITING)
    pipe = redis.pipeline(transaction=False)
    for shard, ids in shards.items():
        await script(keys=[keys.scheduled_shard(shard), keys.scheduled_payloads(shard),
                           keys.scheduled_moved(shard)], args=[project_id, *ids], client=pipe)
    return {as_str(task_id) for reply in await pipe.execute() for task_id in reply}


async def release_throttle(db: asyncpg.Pool | asyncpg.Connection, redis: Redis, keys: Keys,
                           canceled: Iterable[Recipient], *,
                           unsent: Collection[str] = ()) -> None:
    """Take canceled sends, each ``(project_id, event_id, user_id)``, out of their users'
    throttle windows, unless something of the notification went out to that user (or may
    still). Called once the 'canceled' rows are committed: when a cancel and the scheduler
    drop tasks of one user at the same time, each reads after it wrote, so the later reader
    sees both. ``unsent`` names tasks that were handed to delivery but reached no one
    (skipped there): their own rows do not count as having gone out."""
    recipients = list(dict.fromkeys(canceled))
    if not recipients:
        return
    rows = await recipient_task_rows(db, recipients)
    kept = went_out(r for r in rows if str(r["task_id"]) not in unsent)
    # PostgreSQL spells a uuid in lower case; the keys and members as the pipeline did.
    await throttle.release(redis, keys, [(p, u, e) for p, e, u in recipients
                                         if (p.lower(), e.lower(), u) not in kept])


class SchedulerService(WorkerService):
    name = "scheduler"

    def __init__(self, settings: Settings, **options: Any) -> None:
        super().__init__(settings, **options)
        self.clock: Clock = options.get("clock") or now_ms
        self.batch_size: int = int(options.get("batch_size", 500))
        self.lock_ttl_ms = int(settings.scheduler_lock_ttl_s * 1000)
        self.token: str | None = None  # set while this scheduler holds the poll lock
        self._move = self.redis.register_script(_MOVE_DUE)
        self._add_if_absent = self.redis.register_script(_ADD_IF_ABSENT)
        self._forget = self.redis.register_script(_FORGET_MOVED)
        self._renew = self.redis.register_script(_RENEW_LOCK)
        self._release = self.redis.register_script(_RELEASE_LOCK)
        self.reconciler = Reconciler(settings, self.keys, self.redis, lambda: self.pool,
                                     clock=self.clock)
        self.reconcile_interval_s = min(MAX_RECONCILE_INTERVAL_S,
                                        settings.reconcile_grace_s / RECONCILE_SHARE)
        self._targets = frozenset(
            [*self.keys.outbound_all(), *self.keys.enriched_all(), *self.keys.inbound_all(),
             self.keys.ai_pending]
        )

    def streams(self) -> Sequence[str]:
        return [self.keys.scheduled]

    @property
    def holds_lock(self) -> bool:
        return self.token is not None

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        await super().start()
        self._background.append(
            asyncio.create_task(self._poll_loop(), name=f"{self.worker.consumer}:poll")
        )
        self._background.append(asyncio.create_task(
            self._reconcile_loop(), name=f"{self.worker.consumer}:reconcile"))

    async def stop(self) -> None:
        # The poll loop's redis-py calls can swallow a cancel (Python 3.11's wait_for): a
        # lone cancel() and gather once held a server's stop forever.
        await cancel_all(self._background)
        self._background = []
        await self.last_redis_call(self.release_lock())
        await super().stop()

    async def run_until_idle(self) -> int:
        """Ingest everything on the stream, then poll once at ``clock()``."""
        handled = await self.ingest_until_idle()
        return handled + await self.poll_once()

    async def ingest_until_idle(self, *, reclaim: bool = True) -> int:
        """Only the stream half of :meth:`run_until_idle`: schedule what is waiting."""
        await self.open()
        return await self.worker.run_until_idle(reclaim=reclaim)

    # -- ingest ------------------------------------------------------------------------
    async def process(self, batch: list[Entry]) -> None:
        latest: dict[str, ScheduledTask] = {}  # a task named twice in a batch: the last wins
        for entry in batch:
            try:
                task = self._parse(entry.payload)
            except MalformedPayload as exc:
                metrics.MALFORMED.labels(self.name, entry.stream).inc()
                log.error("Acked a scheduled task that can never be scheduled: %s.", exc,
                          extra={"service": self.name, "stream": entry.stream,
                                 "entry_id": entry.id,
                                 "task_id": entry.payload.get("taskId")})
                continue
            latest[task["taskId"]] = task
        if not latest:
            return
        events = {(t["projectId"], e) for t in latest.values() if (e := _event_id(t["payload"]))}
        # The notifications stay locked until the tasks are in their shards: a cancel waits
        # for this transaction and then finds them there, or this batch sees the cancel.
        async with self.pool.acquire() as conn, conn.transaction():
            canceled = await scheduled_db.lock_canceled(conn, events)
            refused = [t for t in latest.values() if _event_id(t["payload"]) in canceled]
            for task in refused:
                del latest[task["taskId"]]
            rows = [
                scheduled_db.ScheduledRow(
                    task_id=t["taskId"], project_id=t["projectId"], due_ms=t["dueAt"],
                    priority=_priority(t), stream=t["stream"], payload=t["payload"],
                )
                for t in latest.values()
            ]
            written = await scheduled_db.upsert(conn, rows)
            superseded = await scheduled_db.waiting_later(conn, latest.keys() - written)
            pipe = self.redis.pipeline(transaction=True)
            for task in latest.values():
                task_id = task["taskId"]
                if task_id in superseded:
                    log.info("Left a scheduled task waiting for its later time; this older "
                             "copy of it was read again.",
                             extra={"task_id": task_id, "project_id": task["projectId"],
                                    "event_id": _event_id(task["payload"]),
                                    "entry_due_ms": task["dueAt"]})
                    continue
                if task_id not in written:
                    log.warning("Dropped a scheduled task: its project no longer exists.",
                                extra={"task_id": task_id, "project_id": task["projectId"],
                                       "event_id": _event_id(task["payload"])})
                    continue
                shard = shard_of(task_id)
                value = encode_entry(task["stream"], task["projectId"], task["payload"])
                pipe.hset(self.keys.scheduled_payloads(shard), task_id, value)
                pipe.zadd(self.keys.scheduled_shard(shard), {task_id: task["dueAt"]})
            if written:
                await pipe.execute()
            await insert_logs(conn, [
                logged for t in refused
                if (logged := _refused_row(t["projectId"], t["taskId"], t["payload"],
                                           " before it reached the scheduler"))
            ])
        await release_throttle(self.pool, self.redis, self.keys, _recipients(
            (t["projectId"], t["payload"]) for t in refused))
        for task in refused:
            log.info("Refused a scheduled task: its notification was canceled.",
                     extra={"task_id": task["taskId"], "project_id": task["projectId"],
                            "event_id": _event_id(task["payload"])})
        for task in latest.values():
            if task["taskId"] in written:
                log.debug("Scheduled a task; it leaves for %s at %d ms (%s).", task["stream"],
                          task["dueAt"], task.get("reason"),
                          extra={"task_id": task["taskId"], "project_id": task["projectId"],
                                 "event_id": _event_id(task["payload"])})

    def _parse(self, payload: dict[str, Any]) -> ScheduledTask:
        task = parse_scheduled_task(payload)
        if not is_uuid(task["projectId"]):
            raise MalformedPayload("field 'projectId' is not a UUID")
        if task["stream"] not in self._targets:
            raise MalformedPayload(f"stream {task['stream']!r} is not a stream tasks return to")
        return task

    # -- polling -----------------------------------------------------------------------
    async def _poll_loop(self) -> None:
        interval_s = self.settings.scheduler_poll_interval_s
        while True:
            try:
                await self.poll_once()  # moves everything due, a batch per shard at a time
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a chore: log and carry on
                log.warning("A scheduler poll failed (%s); polling again in %.2f s.",
                            str(exc) or describe_error(exc),
                            interval_s, extra={"service": self.name})
            await asyncio.sleep(interval_s)

    async def _reconcile_loop(self) -> None:
        while True:
            await asyncio.sleep(self.reconcile_interval_s)
            if not self.holds_lock:
                continue
            try:
                await self.reconciler.run_once(still_leader=lambda: self.holds_lock)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a chore: log and carry on
                log.warning("A reconciliation pass failed (%s); trying again in %.0f s.",
                            str(exc) or describe_error(exc),
                            self.reconcile_interval_s, extra={"service": self.name})

    async def poll_once(self, now_ms: int | None = None) -> int:
        """One poll: hold the lock, rebuild if Redis lost the shards, move what is due at
        ``now_ms`` (default ``clock()``), delete moved rows. Returns how many tasks moved;
        0 without doing anything when another scheduler holds the lock."""
        if not await self.acquire_lock():
            return 0
        if not await self.redis.exists(self.keys.scheduled_ready):
            await self.rebuild()
        moved = await self.move_due(self.clock() if now_ms is None else now_ms)
        try:
            await self.forget_moved()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # moving never waits for PostgreSQL; the rows can lag
            log.warning("Could not delete moved tasks from PostgreSQL (%s); the next poll "
                        "tries again.", str(exc) or describe_error(exc),
                        extra={"service": self.name})
        return len(moved)

    async def move_due(self, now_ms: int, *, token: str | None = None) -> list[MovedTask]:
        """Move every task due at ``now_ms``, shard by shard, ``batch_size`` per script call;
        returns what moved. ``token`` defaults to this scheduler's lock token; ``""`` skips
        the lock check."""
        fence = self.token if token is None else token
        if fence is None:
            return []
        total: list[MovedTask] = []
        shards = list(SCHEDULER_SHARDS)
        while shards:
            pipe = self.redis.pipeline(transaction=False)
            for shard in shards:
                await self._move(
                    keys=[self.keys.scheduled_shard(shard), self.keys.scheduled_payloads(shard),
                          self.keys.scheduled_moved(shard), self.keys.scheduler_lock],
                    args=[now_ms, self.batch_size, self.settings.queue_max_len, fence],
                    client=pipe,
                )
            replies = await pipe.execute()
            again: list[str] = []
            orphans: list[str] = []
            for shard, reply in zip(shards, replies, strict=True):
                if reply == -1:
                    log.warning("Lost the scheduler poll lock; another scheduler polls now.",
                                extra={"service": self.name})
                    self.token = None
                    return total
                moved, missing, refused = reply
                for i in range(0, len(refused), 2):
                    log.error("Could not add a due task to its stream (%s); it stays scheduled "
                              "and the next poll tries again.", as_str(refused[i + 1]),
                              extra={"service": self.name, "task_id": as_str(refused[i])})
                count = len(moved) // 3
                total.extend(
                    MovedTask(as_str(moved[i]), int(float(moved[i + 1])), as_str(moved[i + 2]))
                    for i in range(0, len(moved), 3)
                )
                orphans.extend(as_str(m) for m in missing)
                if count + len(missing) >= self.batch_size:
                    again.append(shard)
            if orphans:
                await self._restore(orphans)
            shards = again
            if shards and fence and not await self.acquire_lock():
                break
        if total:
            log.info("Moved %d due tasks to their streams.", len(total),
                     extra={"service": self.name})
        return total

    async def forget_moved(self) -> int:
        """Delete the PostgreSQL rows of moved tasks, then take them out of the moved sets:
        ``batch_size`` per shard at a time, until the sets are empty (a poll moves everything
        due, so it forgets everything moved, however many landed in one shard). Returns how
        many were forgotten."""
        forgotten = 0
        while True:
            removed, more = await self._forget_page()
            forgotten += removed
            # Nothing removed: whatever is left changed under us (a task moved again with a
            # new due time); the next poll takes it.
            if not more or not removed:
                return forgotten

    async def _forget_page(self) -> tuple[int, bool]:
        """One page per shard: (members removed, whether some shard may hold more)."""
        pipe = self.redis.pipeline(transaction=False)
        for shard in SCHEDULER_SHARDS:
            pipe.zrange(self.keys.scheduled_moved(shard), 0, self.batch_size - 1, withscores=True)
        replies = await pipe.execute()
        moved: list[tuple[str, str, str, int]] = []  # shard, member, task, due
        for shard, members in zip(SCHEDULER_SHARDS, replies, strict=True):
            for raw_member, score in members:
                member = as_str(raw_member)
                moved.append((shard, member, member.partition(" ")[2], int(score)))
        if not moved:
            return 0, False
        await scheduled_db.delete_moved(
            self.pool, [(m[1].partition(" ")[0], m[2], m[3]) for m in moved]
        )
        pipe = self.redis.pipeline(transaction=False)
        for shard, member, _task, due in moved:
            await self._forget(keys=[self.keys.scheduled_moved(shard)], args=[member, due],
                               client=pipe)
        removed = sum(int(r) for r in await pipe.execute())
        return removed, any(len(members) >= self.batch_size for members in replies)

    async def rebuild(self) -> int:
        """Re-add every waiting task from PostgreSQL that Redis does not hold; set the marker."""
        log.info("The scheduler's shards are not marked as built in Redis (a first start, or "
                 "Redis lost its data); rebuilding them from scheduled_payloads before polling.",
                 extra={"service": self.name})
        added = read = 0
        reported = time.monotonic()
        async for page in scheduled_db.pages(self.pool, self.batch_size):
            added += await self.add_rows(page)
            read += len(page)
            if not await self.acquire_lock():
                log.warning("Lost the scheduler poll lock during a rebuild; the holder "
                            "finishes it.", extra={"service": self.name})
                return added
            if time.monotonic() - reported >= REBUILD_PROGRESS_S:
                reported = time.monotonic()
                log.info("Rebuilding the scheduler's shards: %d waiting tasks read from "
                         "PostgreSQL so far, %d re-added.", read, added,
                         extra={"service": self.name})
        await self.redis.set(self.keys.scheduled_ready, str(self.clock()))
        log.log(logging.WARNING if added else logging.INFO,
                "Rebuilt the scheduler's shards: %d waiting tasks re-added from PostgreSQL.",
                added, extra={"service": self.name})
        return added

    async def add_rows(self, rows: Sequence[scheduled_db.ScheduledRow]) -> int:
        """Put tasks read from PostgreSQL into their shards unless already there (or already
        moved at that due time); returns how many were added. Tasks of canceled notifications
        are not added but deleted: a cancel while Redis had lost them found none to take out.
        Their notifications stay locked until the others are added, as at ingest."""
        events = {(r.project_id, e) for r in rows if (e := _event_id(r.payload))}
        if not events:
            return await self._add_if_absent_all(rows)
        async with self.pool.acquire() as conn, conn.transaction():
            canceled = await scheduled_db.lock_canceled(conn, events)
            refused = [r for r in rows if _event_id(r.payload) in canceled]
            if refused:
                await scheduled_db.delete_moved(
                    conn, [(r.project_id, r.task_id, r.due_ms) for r in refused])
                await insert_logs(conn, [
                    logged for r in refused
                    if (logged := _refused_row(r.project_id, r.task_id, r.payload,
                                               " before it was due"))
                ])
                log.info("Deleted %s of canceled notifications instead of re-adding them.",
                         counted(len(refused), "waiting task"), extra={"service": self.name})
            dropped = {r.task_id for r in refused}
            added = await self._add_if_absent_all([r for r in rows if r.task_id not in dropped])
        await release_throttle(self.pool, self.redis, self.keys, _recipients(
            (r.project_id, r.payload) for r in refused))
        return added

    async def _add_if_absent_all(self, rows: Sequence[scheduled_db.ScheduledRow]) -> int:
        pipe = self.redis.pipeline(transaction=False)
        for row in rows:
            shard = shard_of(row.task_id)
            await self._add_if_absent(
                keys=[self.keys.scheduled_shard(shard), self.keys.scheduled_payloads(shard),
                      self.keys.scheduled_moved(shard)],
                args=[row.task_id, row.due_ms, encode_entry(row.stream, row.project_id,
                                                            row.payload),
                      moved_member(row.project_id, row.task_id)],
                client=pipe,
            )
        return sum(int(r) for r in await pipe.execute())

    async def _restore(self, task_ids: list[str]) -> None:
        """Shard entries without a payload (the hash lost them): re-add from PostgreSQL."""
        rows = await scheduled_db.by_task_ids(self.pool, task_ids)
        restored = await self.add_rows(rows)
        log.error("Found %d due tasks without a payload in Redis; re-added %d from "
                  "PostgreSQL (the rest were already gone).", len(task_ids), restored,
                  extra={"service": self.name})

    # -- the poll lock -----------------------------------------------------------------
    async def acquire_lock(self) -> bool:
        """Hold the poll lock: renew it if this scheduler holds it, else try to take it."""
        if self.settings.injects("scheduler_lock_forever"):  # test-only fault: no expiry
            mine = self.token or f"{self.worker.consumer}:{uuid.uuid4().hex}"
            if await self.redis.set(self.keys.scheduler_lock, mine, nx=True):
                self.token = mine
                return True
            current = await self.redis.get(self.keys.scheduler_lock)
            return current is not None and as_str(current) == self.token
        if self.token is not None:
            renewed = await self._renew(keys=[self.keys.scheduler_lock],
                                        args=[self.token, self.lock_ttl_ms])
            if int(renewed):
                return True
            log.warning("The scheduler poll lock expired before it was renewed; trying to "
                        "take it again.", extra={"service": self.name})
            self.token = None
        token = f"{self.worker.consumer}:{uuid.uuid4().hex}"
        if await self.redis.set(self.keys.scheduler_lock, token, nx=True, px=self.lock_ttl_ms):
            self.token = token
            log.info("Took the scheduler poll lock; this scheduler polls now.",
                     extra={"service": self.name, "consumer": self.worker.consumer})
            return True
        return False

    async def release_lock(self) -> None:
        if self.token is None:
            return
        token, self.token = self.token, None
        try:
            await self._release(keys=[self.keys.scheduler_lock], args=[token])
        except (RedisError, OSError) as exc:
            log.warning("Could not release the scheduler poll lock (%s); it expires within "
                        "%d s and another scheduler takes over.", exc,
                        self.settings.scheduler_lock_ttl_s, extra={"service": self.name})


def _event_id(payload: dict[str, Any]) -> str | None:
    """The notification a task belongs to (every payload a task carries names its event)."""
    event_id = payload.get("eventId")
    return event_id if isinstance(event_id, str) and is_uuid(event_id) else None


def _recipients(tasks: Iterable[tuple[str, dict[str, Any]]]) -> list[Recipient]:
    """Whose sends of which notification these tasks (project id, payload) were."""
    return [(project_id, event_id, user_id) for project_id, payload in tasks
            if (event_id := _event_id(payload))
            and isinstance(user_id := payload.get("userId"), str)]


def _refused_row(project_id: str, task_id: str, payload: dict[str, Any],
                 when: str) -> LogRow | None:
    """The timeline row of a task refused for a canceled notification: one per recipient and
    channel, as the engine's 'scheduled' row before it (a task without both has none)."""
    event_id = _event_id(payload)
    user_id, channel = payload.get("userId"), payload.get("channel")
    if event_id is None or not isinstance(user_id, str) or channel not in CHANNELS:
        return None
    campaign = payload.get("campaignId")
    return canceled_row(project_id, event_id, task_id, user_id, channel,
                        campaign if isinstance(campaign, str) else None, when)


def _priority(task: ScheduledTask) -> str:
    priority = task["payload"].get("priority")
    if priority in PRIORITIES:
        return str(priority)
    suffix = task["stream"].rsplit(":", 1)[-1]
    return suffix if suffix in PRIORITIES else "normal"

