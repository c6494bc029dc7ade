"""Running one workflow instance, step by step, while holding its lock.

The instance's row says where it is (``cursor``, a step path); each step has a row in
``workflow_steps``. The runner starts at the cursor and executes steps until the instance
sleeps (``wait``, ``waitForEvent``, an open ``digest`` window) or ends. Finishing a step and
moving the cursor is one transaction, so a crash anywhere leaves the instance at a step that
is either not started, ``running`` (redo it) or ``waiting`` (look at it again). Redoing a step
is safe because every effect is keyed by the instance and the step's path:

- ``send``: the notification id is stored in the step row *before* the InboundMessage is
  written, and the message carries ``idempotencyKey = wf:{instanceId}:{path}``, so a send
  repeated after a crash is the same notification and the enricher drops the copy (24 h).
- ``wait``: the wake-up time is the step row's ``started_at`` + seconds.
- ``waitForEvent``: one waiter row per step, opened in the transaction that starts the step
  (a crash cannot leave the step started without it); an event and the timeout race on
  ``resolved_at IS NULL`` and exactly one wins.
- ``digest``: joining a window adds the instance's item at most once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from redis.asyncio import Redis

from notifkit import streams
from notifkit.clock import iso, to_ms
from notifkit.config import Settings
from notifkit.db import workflows as db
from notifkit.errors import RetryLater
from notifkit.ids import uuid7
from notifkit.keys import Keys
from notifkit.messages import InboundMessage
from notifkit.services.workflow.lock import HeldLock
from notifkit.services.workflow.timers import Timers
from notifkit.workflow_defs import (
    Path,
    enter_branch,
    evaluate_condition,
    first_path,
    format_path,
    next_path,
    parse_path,
    step_at,
    top_index,
)

log = logging.getLogger("notifkit.workflow")

Clock = Callable[[], float]


class LockLost(RetryLater):
    """The runner's lock expired or was taken over: it stops before its next step."""


@dataclass
class Advance:
    """The step is done; the instance goes on at ``next`` (None = the workflow is over)."""

    output: Any
    next: Path | None


@dataclass
class Sleep:
    """Look at this step again at ``until`` (or when an event wakes the instance)."""

    until: datetime
    output: Any = None


@dataclass
class Finish:
    """The instance ends at this step with ``status`` (stopped, failed, digested)."""

    status: str
    step_status: str
    output: Any


Outcome = Advance | Sleep | Finish


@dataclass
class _Run:
    instance: db.Instance
    rows: dict[str, db.StepRow]
    lock: HeldLock
    user: dict[str, Any] | None = None
    sent: list[str] = field(default_factory=list)


def as_datetime(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def ms(moment: datetime) -> int:
    return to_ms(moment)


def micros(moment: datetime) -> int:
    """Microseconds since the epoch, exactly (a float timestamp rounds them)."""
    return (moment - _EPOCH) // timedelta(microseconds=1)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Runner:
    def __init__(
        self, *, pool: asyncpg.Pool, redis: Redis, settings: Settings, timers: Timers,
        clock: Clock,
    ) -> None:
        self.pool = pool
        self.redis = redis
        self.settings = settings
        self.keys = Keys(settings.namespace)
        self.timers = timers
        self.clock = clock

    def now(self) -> datetime:
        return as_datetime(self.clock())

    async def run(self, instance: db.Instance, lock: HeldLock) -> None:
        """Execute ``instance`` from its cursor until it sleeps or ends (or is canceled)."""
        if instance.finished:
            return
        try:
            await self._run(instance, lock)
        except db.InstanceCanceled:
            # Canceled through the API while this run held it: a step it had begun since
            # ends canceled too, and nothing more runs.
            await db.cancel_open_steps(self.pool, instance.project_id, instance.id)
            log.info("Workflow instance was canceled; it stops here.",
                     extra={"instance_id": instance.id})

    async def _run(self, instance: db.Instance, lock: HeldLock) -> None:
        run = _Run(instance, await db.step_rows(self.pool, instance), lock)
        path = parse_path(instance.cursor) if instance.cursor else first_path(instance.steps)
        if instance.status == "pending" or instance.cursor is None:
            await db.set_state(
                self.pool, instance, status="running",
                cursor=format_path(path) if path else None,
                current_step=top_index(path) if path else 0, wake_at=None, now=self.now(),
            )
        while path is not None:
            if lock.lost:
                raise LockLost("the instance's lock was lost mid-run; another runner has it")
            text = format_path(path)
            step = step_at(instance.steps, path)
            row = run.rows.get(text)
            if row is None:
                row = await self._start_step(instance, text, step)
                run.rows[text] = row
            outcome = await self._execute(run, step, path, row)
            if outcome is None:  # the step persisted its own outcome
                return
            if isinstance(outcome, Sleep):
                await self._sleep(instance, row, outcome)
                return
            now = self.now()
            slept = row.status == "waiting"
            async with self.pool.acquire() as conn, conn.transaction():
                # The instance's row first, in every transaction that writes both (as a
                # cancel does): set_state refuses a canceled instance before a step is touched.
                if isinstance(outcome, Finish):
                    await db.set_state(conn, instance, status=outcome.status, cursor=text,
                                       current_step=top_index(path), wake_at=None, now=now)
                    await db.update_step(conn, instance, row, status=outcome.step_status,
                                         output=outcome.output, finished_at=now)
                    log.info("Workflow instance ended %s at step %s.", outcome.status, text,
                             extra={"instance_id": instance.id})
                    nxt = None
                else:
                    nxt = outcome.next
                    await db.set_state(
                        conn, instance, status="running" if nxt else "completed",
                        cursor=format_path(nxt) if nxt else None,
                        current_step=top_index(nxt) if nxt else top_index(path),
                        wake_at=None, now=now,
                    )
                    await db.update_step(conn, instance, row, status="completed",
                                         output=outcome.output, finished_at=now)
            if slept:  # woken early (an event): its timer would only wake it for nothing
                await self.timers.cancel(instance.id, text)
            if isinstance(outcome, Finish):
                return
            path = nxt
        if instance.status != "completed":
            await db.set_state(self.pool, instance, status="completed", cursor=None,
                               current_step=instance.current_step, wake_at=None, now=self.now())
        log.info("Workflow instance completed.", extra={"instance_id": instance.id})

    async def _start_step(self, instance: db.Instance, text: str,
                          step: dict[str, Any]) -> db.StepRow:
        now = self.now()
        if step["type"] != "waitForEvent":
            return await db.start_step(self.pool, instance, text, step["type"], now)
        # The waiter opens with the step: opened after, a crash in between left the step
        # started with nothing to catch the user's event, and an event processed before the
        # step was redone was lost (the wait then ran to its timeout).
        async with self.pool.acquire() as conn, conn.transaction():
            row = await db.start_step(conn, instance, text, step["type"], now)
            await db.open_waiter(conn, instance, row, step["event"],
                                 waiter_expiry(row, step), now)
        return row

    async def _sleep(self, instance: db.Instance, row: db.StepRow, sleep: Sleep) -> None:
        output = sleep.output if sleep.output is not None else row.output
        now = self.now()
        if row.status != "waiting" or row.output != output or instance.status != "waiting" \
                or instance.wake_at != sleep.until:
            async with self.pool.acquire() as conn, conn.transaction():
                await db.set_state(conn, instance, status="waiting", cursor=row.path,
                                   current_step=instance.current_step, wake_at=sleep.until,
                                   now=now)
                await db.update_step(conn, instance, row, status="waiting", output=output,
                                     finished_at=None)
        # After the commit: a crash before this line leaves the entry pending, and its retry
        # comes back here.
        await self.timers.schedule(instance.id, row.path, ms(sleep.until))

    # -- steps ----------------------------------------------------------------------------

    async def _execute(
        self, run: _Run, step: dict[str, Any], path: Path, row: db.StepRow
    ) -> Outcome | None:
        kind = step["type"]
        if kind == "send":
            return await self._send(run, step, path, row)
        if kind == "wait":
            return self._wait(run, step, path, row)
        if kind == "waitForEvent":
            return await self._wait_for_event(run, step, path, row)
        if kind == "branch":
            return await self._branch(run, step, path)
        if kind == "digest":
            return await self._digest(run, step, path, row)
        return Finish("failed", "failed", {"error": f"unknown step type {kind!r}"})

    async def _send(
        self, run: _Run, step: dict[str, Any], path: Path, row: db.StepRow
    ) -> Outcome:
        output = row.output if isinstance(row.output, dict) else {}
        event_id = output.get("eventId")
        if not event_id:
            if (gone := await self._template_gone(self.pool, run.instance, step, path)):
                return Finish("failed", "failed", {"error": gone})
            event_id = uuid7(int(self.clock() * 1000))
            output = {"eventId": event_id}
            await self._remember_send(run, step, row, output, event_id)
        await self.publish(run.instance, step, row, event_id, None)
        return Advance(output, next_path(run.instance.steps, path))

    async def _template_gone(self, conn: db.Conn, instance: db.Instance, step: dict[str, Any],
                             path: Path) -> str | None:
        """Why a send or digest step cannot send (its template was deleted since the workflow
        was saved), None if it can. The step, and so the instance, fails with that reason:
        the engine would only record the send as failed, and the step as done."""
        if await db.template_exists(conn, instance.project_id, step["template"]):
            return None
        log.warning("Step %s names template %r, which no longer exists; the instance fails.",
                    format_path(path), step["template"], extra={"instance_id": instance.id})
        return f"template {step['template']!r} no longer exists in this project"

    async def _remember_send(
        self, run: _Run, step: dict[str, Any], row: db.StepRow, output: dict[str, Any],
        event_id: str,
    ) -> None:
        """Store the send's notification id before sending, so a redo sends the same one."""
        instance = run.instance
        now = self.now()
        async with self.pool.acquire() as conn, conn.transaction():
            await db.check_not_canceled(conn, instance)
            await db.update_step(conn, instance, row, status=row.status, output=output,
                                 finished_at=None)
            await db.record_notification(
                conn, event_id=event_id, project_id=instance.project_id,
                template=step["template"], priority=step.get("priority") or "normal",
                user_id=instance.user_id, data=instance.trigger_data,
                channels=step.get("channels"), idempotency_key=send_key(instance.id, row.path),
                now=now,
            )

    async def publish(
        self, instance: db.Instance, step: dict[str, Any], row: db.StepRow, event_id: str,
        digest_items: list[dict[str, Any]] | None,
    ) -> None:
        """XADD the step's InboundMessage (the enricher takes it from here)."""
        priority = step.get("priority") or "normal"
        message: InboundMessage = {
            "eventId": event_id,
            "projectId": instance.project_id,
            "template": step["template"],
            "to": {"userId": instance.user_id},
            "data": instance.trigger_data,
            "channels": step.get("channels"),
            "priority": priority,
            "sendAt": None,
            "campaignId": None,
            "idempotencyKey": send_key(instance.id, row.path),
            "createdAt": iso(self.now()),
            "workflowInstanceId": instance.id,
            "workflowStep": row.index,
        }
        if digest_items is not None:
            message["digestItems"] = digest_items
        await streams.xadd(self.redis, self.keys.inbound(priority), message,
                           self.settings.queue_max_len)
        log.info("Workflow step %s sent notification %s.", row.path, event_id,
                 extra={"instance_id": instance.id, "event_id": event_id,
                        "project_id": instance.project_id})

    def _wait(self, run: _Run, step: dict[str, Any], path: Path, row: db.StepRow) -> Outcome:
        until = row.started_at + timedelta(seconds=float(step["seconds"]))
        if self.now() < until:
            return Sleep(until)
        return Advance(None, next_path(run.instance.steps, path))

    async def _wait_for_event(
        self, run: _Run, step: dict[str, Any], path: Path, row: db.StepRow
    ) -> Outcome:
        instance = run.instance
        waiter = await db.get_waiter(self.pool, instance, row)
        if waiter is None:  # a step started before its waiter opened with it
            waiter = await db.open_waiter(self.pool, instance, row, step["event"],
                                          waiter_expiry(row, step), self.now())
        if waiter.resolved_at is None:
            if self.now() < waiter.expires_at:
                return Sleep(waiter.expires_at)
            if await db.resolve_timeout(self.pool, waiter, self.now()):
                waiter.resolved_by = "timeout"
            else:  # an event won the race
                waiter = await db.get_waiter(self.pool, instance, row) or waiter
        if waiter.resolved_by == "timeout":
            if (step.get("onTimeout") or "continue") == "stop":
                return Finish("stopped", "completed", None)
            return Advance(None, next_path(instance.steps, path))
        return Advance(waiter.event, next_path(instance.steps, path))

    async def _branch(self, run: _Run, step: dict[str, Any], path: Path) -> Outcome:
        instance = run.instance
        if run.user is None:
            run.user = await db.get_user(self.pool, instance.project_id, instance.user_id)
        outputs: dict[Any, Any] = {}
        for text, done in run.rows.items():
            if done.status in ("completed", "waiting"):
                outputs[text] = done.output
                if text.isdigit():
                    outputs[int(text)] = done.output
        context = {"data": instance.trigger_data, "user": run.user, "steps": outputs}
        try:
            result = evaluate_condition(step["if"], context)
        except Exception as exc:  # a user's expression: any failure ends the instance
            log.warning("Branch %s could not be evaluated (%s); the instance fails.",
                        format_path(path), exc, extra={"instance_id": instance.id})
            return Finish("failed", "failed", {"error": f"{type(exc).__name__}: {exc}"})
        name = "then" if result else "else"
        return Advance({"result": result, "branch": name},
                       enter_branch(instance.steps, path, name))

    async def _digest(
        self, run: _Run, step: dict[str, Any], path: Path, row: db.StepRow
    ) -> Outcome | None:
        instance = run.instance
        output = row.output if isinstance(row.output, dict) else {}
        window = await db.owned_window(self.pool, instance, row.path)
        if row.status == "running" and not output.get("digestId") and (
                window is None or window.closed_at is None):
            # A window it opened that a dead letter closed before its id was recorded is
            # still its own to send (others may have joined it); an open one is joined again,
            # which finds its item already there.
            return await self._join_digest(run, step, path, row)
        if window is None:  # the window row vanished: start over as a fresh joiner
            return await self._join_digest(run, step, path, row)
        if self.now() < window.window_ends_at and window.closed_at is None:
            return Sleep(window.window_ends_at)
        event_id = output.get("eventId")
        now = self.now()
        async with self.pool.acquire() as conn, conn.transaction():
            await db.allow_window_lock_waits(conn)
            await db.check_not_canceled(conn, instance)  # the instance's row first, as cancel
            items: list[dict[str, Any]] = await conn.fetchval(
                """UPDATE workflow_digests SET closed_at = COALESCE(closed_at, $3)
                    WHERE id = $1 AND project_id = $2 RETURNING items""",
                window.id, instance.project_id, now, timeout=db.DIGEST_QUERY_TIMEOUT_S,
            )
            if not event_id:
                # The window is closed either way: nobody joins a digest that cannot be sent.
                if (gone := await self._template_gone(conn, instance, step, path)):
                    return Finish("failed", "failed",
                                  {"digestId": window.id, "items": len(items), "error": gone})
                event_id = uuid7(int(self.clock() * 1000))
                output = {"digestId": window.id, "eventId": event_id, "items": len(items)}
                await db.update_step(conn, instance, row, status=row.status, output=output,
                                     finished_at=None)
                await db.record_notification(
                    conn, event_id=event_id, project_id=instance.project_id,
                    template=step["template"], priority=step.get("priority") or "normal",
                    user_id=instance.user_id, data=instance.trigger_data,
                    channels=step.get("channels"),
                    idempotency_key=send_key(instance.id, row.path), now=now,
                )
        shown = [{"data": item.get("data"), "at": item.get("at")}
                 for item in sorted(items, key=trigger_order)]
        await self.publish(instance, step, row, event_id, shown)
        return Advance(output, next_path(instance.steps, path))

    async def _join_digest(
        self, run: _Run, step: dict[str, Any], path: Path, row: db.StepRow
    ) -> Outcome | None:
        instance = run.instance
        now = self.now()
        item = {"data": instance.trigger_data, "at": iso(instance.created_at),
                "atMicros": micros(instance.created_at), "instanceId": instance.id}
        ends_at = now + timedelta(seconds=float(step["windowSeconds"]))
        async with self.pool.acquire() as conn, conn.transaction():
            await db.allow_window_lock_waits(conn)
            window = await db.join_digest(conn, instance, row.path, row.index, item, ends_at,
                                          now)
            # A canceled instance opens no window (it would take in later triggers, unsent)
            # and joins none. Checked after the join, which keeps the joins of concurrent
            # triggers in the order they were read; a window it opened is not committed yet,
            # so a cancel closing its windows does not wait on it.
            await db.check_not_canceled(conn, instance)
            if window.owner_instance_id != instance.id:
                await db.set_state(conn, instance, status="digested", cursor=row.path,
                                   current_step=top_index(path), wake_at=None, now=now)
                await db.update_step(
                    conn, instance, row, status="completed",
                    output={"digestedInto": window.owner_instance_id, "digestId": window.id},
                    finished_at=now,
                )
                log.info("Added this trigger to the open digest of instance %s; this "
                         "instance ends here.", window.owner_instance_id,
                         extra={"instance_id": instance.id})
                return None
        return Sleep(window.window_ends_at, {"digestId": window.id})


def waiter_expiry(row: db.StepRow, step: dict[str, Any]) -> datetime:
    """When a waitForEvent step times out: its timeout after the step began."""
    return row.started_at + timedelta(seconds=float(step["timeoutSeconds"]))


def trigger_order(item: dict[str, Any]) -> tuple[str, int, str]:
    """A digest item's place among its window's, oldest trigger first. Items join in the order
    their instances happened to run, which concurrent workers make arbitrary, and ``at`` is
    to the millisecond, which a burst of triggers shares: the instance's creation time to the
    microsecond (PostgreSQL's clock for triggers made through the API) orders those, and the
    instance id, unique, makes the order total. Items stored without ``atMicros`` (joined
    before it was recorded) fall back on the id within their millisecond."""
    micros_ = item.get("atMicros")
    return (str(item.get("at") or ""), micros_ if isinstance(micros_, int) else 0,
            str(item.get("instanceId") or ""))


def send_key(instance_id: str, path: str) -> str:
    """The idempotency key of a step's send: the enricher keeps one copy for 24 h."""
    return f"wf:{instance_id}:{path}"
