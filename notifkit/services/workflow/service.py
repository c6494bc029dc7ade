"""The workflow service: consumes ``workflow:inbound`` and polls the workflow timers.

Entries on ``workflow:inbound``:

    {"type": "trigger", "projectId", "workflowId", "instanceId", "userId", "data"}   (api)
    {"type": "event", "projectId", "name", "userId", "data", "at", "eventId"?}      (events)
    {"type": "wake", "timer": "{instanceId}:{path}"}                                (timers)
    {"type": "wake", "instanceId", "projectId", "reason": "event"}                  (this service)

A trigger or wake runs its instance under ``lock:workflow:{instanceId}``. When another process
holds the lock, the entry is acked and a wake is scheduled a moment later (``{id}:retry``):
the holder may be about to sleep, and the instance must be looked at again after it lets go.
An event resolves the user's open waiters for that name in PostgreSQL and emits one wake per
instance, written atomically with the event's ack.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, ClassVar

import asyncpg

from notifkit import metrics
from notifkit.clock import iso
from notifkit.config import Settings
from notifkit.db import workflows as db
from notifkit.services.base import WorkerService
from notifkit.services.workflow.lock import HeldLock, InstanceLocks
from notifkit.services.workflow.runner import LockLost, Runner, as_datetime, ms
from notifkit.services.workflow.timers import Timers, instance_of, timer_member
from notifkit.worker import Entry
from notifkit.worker.entry import describe_error

log = logging.getLogger("notifkit.workflow")

LOCK_RETRY_S = 0.25  # a busy instance is first looked at again this much later
BUSY_REMEMBERED = 10_000  # instances whose retry delay is remembered; more start afresh
TIMER_BATCH = 500
REBUILD_PAGE = 1000  # sleeping instances read per query when rebuilding the timers
# A rebuild after Redis lost its data leaves sleepers unwoken until it ends: one that reads
# many pages says how far it got at most this often.
REBUILD_PROGRESS_S = 10.0


class WorkflowService(WorkerService):
    name: ClassVar[str] = "workflow"

    def __init__(self, settings: Settings, **options: Any) -> None:
        super().__init__(settings, **options)
        self.clock: Callable[[], float] = options.get("clock") or time.time
        self.timer_poll_interval_s: float = options.get(
            "timer_poll_interval_s", settings.scheduler_poll_interval_s
        )
        self.lock_retry_s: float = options.get("lock_retry_s", LOCK_RETRY_S)
        # Busy instances and the delay of their last retry: a holder that died keeps its
        # lock for the whole TTL, so each retry waits twice as long (never past the lock's
        # expiry) rather than looking four times a second for a minute.
        self._busy: dict[str, float] = {}
        self.locks = InstanceLocks(
            self.redis, int(options.get("lock_ttl_ms", settings.workflow_lock_ttl_s * 1000)),
            exclusive=not settings.injects("ignore_workflow_locks"),  # test-only fault
        )
        self.timers = Timers(self.redis, self.keys.workflow_timers, self.keys.workflow_inbound,
                             settings.queue_max_len)
        self.rebuild_page_size: int = options.get("rebuild_page_size", REBUILD_PAGE)
        self._runner: Runner | None = None

    def streams(self) -> Sequence[str]:
        return [self.keys.workflow_inbound]

    @property
    def runner(self) -> Runner:
        if self._runner is None:
            self._runner = self.make_runner()
        return self._runner

    def make_runner(self) -> Runner:
        return Runner(pool=self.pool, redis=self.redis, settings=self.settings,
                      timers=self.timers, clock=self.clock)

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        await super().start()
        await self.rebuild_timers()
        self._background.append(
            asyncio.create_task(self._timer_loop(), name="workflow:timers")
        )

    async def run_until_idle(self) -> int:
        """Move due timers and drain the stream until neither finds anything. For tests."""
        await self.open()
        total = 0
        while True:
            moved = await self.poll_timers()
            done = await self.worker.run_until_idle()
            total += moved + done
            if not moved and not done:
                return total

    async def poll_timers(self) -> int:
        await self.rebuild_timers_if_lost()
        moved = 0
        while True:
            batch = await self.timers.move_due(int(self.clock() * 1000), TIMER_BATCH)
            moved += batch
            if batch < TIMER_BATCH:
                return moved

    async def rebuild_timers(self) -> int:
        """Re-add the timer of every sleeping instance (ZADD NX), then mark the set built: the
        set can be lost with Redis, PostgreSQL still knows who sleeps until when. A timer
        re-added for an instance that has moved on only wakes it for nothing."""
        added = 0
        after: tuple[datetime, str] | None = None
        reported = time.monotonic()
        while True:
            page = await db.sleeping_instances(self.pool, self.rebuild_page_size, after)
            if page:
                await self.redis.zadd(
                    self.keys.workflow_timers,
                    {timer_member(iid, path): ms(wake_at) for iid, path, wake_at in page}, nx=True,
                )
                added += len(page)
                if time.monotonic() - reported >= REBUILD_PROGRESS_S:
                    reported = time.monotonic()
                    log.info("Rebuilding the workflow timers: %d sleeping instances re-added "
                             "so far.", added, extra={"service": self.name})
            if len(page) < self.rebuild_page_size:
                break
            after = (page[-1][2], page[-1][0])
        await self.redis.set(self.keys.workflow_timers_ready, iso(as_datetime(self.clock())))
        return added

    async def rebuild_timers_if_lost(self) -> int:
        """Rebuild the timers when their marker is gone (Redis lost its data while this
        process ran): without it no sleeping instance would ever wake."""
        if await self.redis.exists(self.keys.workflow_timers_ready):
            return 0
        log.warning("The workflow timers are not marked as built in Redis (Redis lost its "
                    "data); rebuilding them from PostgreSQL.")
        added = await self.rebuild_timers()
        log.info("Rebuilt the workflow timers: %d sleeping instances re-added from PostgreSQL.",
                 added, extra={"service": self.name})
        return added

    async def _timer_loop(self) -> None:
        while True:
            try:
                await self.poll_timers()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a chore: log and carry on
                log.warning("Moving due workflow timers failed (%s); trying again in %.2f s.",
                            str(exc) or describe_error(exc), self.timer_poll_interval_s)
            await asyncio.sleep(self.timer_poll_interval_s)

    # -- processing ---------------------------------------------------------------------------

    async def process(self, batch: list[Entry]) -> None:
        by_instance: dict[str, list[Entry]] = {}
        events: list[Entry] = []
        for entry in batch:
            kind = entry.payload.get("type")
            if kind == "event":
                events.append(entry)
                continue
            instance_id = _instance_id(entry.payload)
            if kind in ("trigger", "wake") and instance_id:
                by_instance.setdefault(instance_id, []).append(entry)
            else:
                metrics.MALFORMED.labels(self.name, entry.stream).inc()
                log.error("Acked a workflow entry it cannot use (type %r, no instance).", kind,
                          extra={"stream": entry.stream, "entry_id": entry.id})
        # Entries of one instance run together (one run serves them all); instances in
        # parallel, each under its own lock.
        await asyncio.gather(
            *(self._event(entry) for entry in events),
            *(self._instance(iid, entries) for iid, entries in by_instance.items()),
        )

    async def _instance(self, instance_id: str, entries: list[Entry]) -> None:
        try:
            await self.handle_instance(instance_id, entries)
        except Exception as exc:
            for entry in entries:
                entry.fail(exc)

    async def handle_instance(self, instance_id: str, entries: list[Entry]) -> None:
        trigger = next((e.payload for e in entries if e.payload.get("type") == "trigger"), None)
        project_id = _project_id(entries)
        try:
            instance = await db.get_instance(self.pool, instance_id, project_id)
            if instance is None and trigger is not None:
                instance = await db.create_instance(
                    self.pool, instance_id=instance_id, project_id=trigger["projectId"],
                    workflow_id=str(trigger.get("workflowId")),
                    user_id=str(trigger.get("userId")), data=trigger.get("data") or {},
                    now=as_datetime(self.clock()),
                    idempotency_key=trigger.get("idempotencyKey"),
                )
        except (asyncpg.DataError, KeyError) as exc:
            log.error("Acked a workflow entry naming no valid instance (%s).", exc,
                      extra={"instance_id": instance_id})
            return
        if instance is None:
            self._busy.pop(instance_id, None)
            log.warning("Workflow instance %s does not exist (or its workflow was deleted); "
                        "nothing to run.", instance_id, extra={"instance_id": instance_id})
            return
        for entry in entries:
            # A timer's wake names no project: named here, a DLQ record of the entry is the
            # project's own to see and replay, not only an operator's.
            entry.payload.setdefault("projectId", instance.project_id)
        replayed = any("_replayOf" in e.payload for e in entries)
        # A DLQ replay of the entry that failed it: back to where it was, and on.
        if instance.status == "failed" and replayed and await db.reopen_dead_lettered(
                self.pool, instance_id, as_datetime(self.clock())):
            log.info("Workflow instance failed by a dead-lettered entry carries on, as the "
                     "entry is replayed.", extra={"instance_id": instance_id})
            instance = await db.get_instance(self.pool, instance_id, project_id) or instance
        if instance.finished:
            self._busy.pop(instance_id, None)
            return
        lock = await self.locks.acquire(self.keys.workflow_lock(instance_id))
        if lock is None:
            await self._retry_soon(instance_id)
            return
        self._busy.pop(instance_id, None)
        try:
            await self.run_locked(instance_id, project_id, lock)
        except LockLost:
            await self._retry_soon(instance_id)
        finally:
            await lock.release()

    async def _retry_soon(self, instance_id: str) -> None:
        """Someone else runs the instance: look at it again once they are likely done. The
        first look is soon (a live holder is usually about to let go), each next one twice as
        late, but never after the lock would expire: the TTL is how long a holder that died
        keeps it. Said once per wait."""
        previous = self._busy.get(instance_id)
        delay_s = self.lock_retry_s
        if previous is not None:
            left_ms = await self.redis.pttl(self.keys.workflow_lock(instance_id))
            delay_s = previous * 2
            if left_ms >= 0:
                delay_s = min(delay_s, left_ms / 1000 + self.lock_retry_s)
            delay_s = max(self.lock_retry_s, delay_s)
        elif len(self._busy) >= BUSY_REMEMBERED:
            self._busy.clear()
        self._busy[instance_id] = delay_s
        await self.timers.schedule(instance_id, "retry", int((self.clock() + delay_s) * 1000))
        if previous is None:
            log.info("Workflow instance is running elsewhere; looking at it again once its "
                     "lock is free.", extra={"instance_id": instance_id})

    async def run_locked(self, instance_id: str, project_id: str | None, lock: HeldLock) -> None:
        """Run the instance while holding ``lock``; re-reads the instance under it."""
        instance = await db.get_instance(self.pool, instance_id, project_id)
        if instance is None or instance.finished:
            return
        await self.runner.run(instance, lock)

    async def _event(self, entry: Entry) -> None:
        p = entry.payload
        name, user_id, project_id = p.get("name"), p.get("userId"), p.get("projectId")
        if not (isinstance(name, str) and isinstance(user_id, str)
                and isinstance(project_id, str)):
            log.error("Acked a workflow event without name, userId and projectId.",
                      extra={"stream": entry.stream, "entry_id": entry.id})
            return
        now = as_datetime(self.clock())
        event_id = p.get("eventId")
        event: dict[str, Any] = {"name": name, "data": p.get("data") or {},
                                 "at": p.get("at") or iso(now)}
        if isinstance(event_id, str):
            event["id"] = event_id
        # Keyed by the event's id when it has one, so a copy of the same event (a retried
        # forward) finds the waiters it resolved and wakes them again, resolving no others.
        resolved_by = f"event:{event_id}" if isinstance(event_id, str) else entry.owner
        if self.settings.injects("ignore_workflow_events"):  # test-only fault
            return
        try:
            woken = await db.resolve_waiters(
                self.pool, project_id=project_id, user_id=user_id, event_name=name,
                event=event, resolved_by=resolved_by, now=now,
                occurred_at=occurred_at(event["at"], now),
            )
        except asyncpg.DataError as exc:
            log.error("Acked a workflow event with an invalid project id (%s).", exc,
                      extra={"stream": entry.stream, "entry_id": entry.id})
            return
        except Exception as exc:
            entry.fail(exc)
            return
        for instance_id in woken:
            entry.emit(self.keys.workflow_inbound, {
                "type": "wake", "instanceId": instance_id, "projectId": project_id,
                "reason": "event",
            })
        if woken:
            log.info("Event %r resolved %d waiting workflow instance(s); waking them.", name,
                     len(woken), extra={"event_id": event_id, "project_id": project_id,
                                        "user_id": user_id})


def occurred_at(at: Any, now: datetime) -> datetime:
    """When the event happened (``at``, stamped by the API or the provider's receipt), so an
    event read late (a backlog, a paused process) still beats a deadline it met; never later
    than ``now``, and ``now`` when ``at`` is not a time."""
    try:
        moment = datetime.fromisoformat(str(at).replace("Z", "+00:00"))
    except ValueError:
        return now
    if moment.tzinfo is None:
        return now
    return min(moment, now)


def _instance_id(payload: dict[str, Any]) -> str | None:
    value = payload.get("instanceId")
    if isinstance(value, str) and value:
        return value
    timer = payload.get("timer")
    if isinstance(timer, str) and timer:
        return instance_of(timer)
    return None


def _project_id(entries: list[Entry]) -> str | None:
    for entry in entries:
        value = entry.payload.get("projectId")
        if isinstance(value, str):
            return value
    return None
