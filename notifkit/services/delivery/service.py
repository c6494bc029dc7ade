"""Delivery: one outbound task -> the provider, exactly once where the provider allows it.

Per read batch:

1. dedup on the task id (a task parked and brought back by the scheduler releases its mark);
   a task that waited on the scheduler reads the user's quiet hours again: set or moved
   while it waited, they hold it once more until they end;
2. ``delivery_outbox`` claimed for every (task, channel, destination) in one query: a
   destination already ``sent`` is never sent again; one left ``sending`` by an earlier
   attempt may have reached the provider (crash or lost response);
3. the sends run concurrently, each through the provider's shared token bucket (and the
   project's override) and bounded by ``PROVIDER_TIMEOUT_SECONDS``; every accepted send is
   recorded ``sent`` in the outbox as soon as it is accepted (writes that finish together
   share one query), except the batch's last send to finish and sends to a provider that
   takes the task id as its idempotency key, whose records go with step 5;
4. each task's answers become one action (:mod:`.outcomes`): sent, fallback (an enriched
   message restricted to the chain's next channel; also for a channel without a transport),
   retry, park on ``scheduled`` after a 429, invalid (contact disabled), or dead-lettered;
5. the outbox outcomes and the timeline rows are written in one statement, disabled contacts
   in another; outcome events, fallbacks and parked tasks go out atomically with the ack.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar, TypeVar, cast

from notifkit import metrics, quiet_hours
from notifkit.clock import iso_from_ms, to_ms, utc_now_iso
from notifkit.coalesce import Coalescer
from notifkit.config import Settings
from notifkit.db import outbox
from notifkit.db.logs import Kind, LogRow, Status, insert_first_of_kind
from notifkit.db.routing import project_settings, quiet_hours_of
from notifkit.dedup import Dedup, delivery_key
from notifkit.errors import AttemptsExhausted, PermanentFailure, RetryLater
from notifkit.ids import is_uuid
from notifkit.messages import OutboundTask, ScheduledTask, parse_outbound
from notifkit.ratelimit import ALL_PROJECTS, Bucket, TokenBuckets
from notifkit.services.base import WorkerService
from notifkit.services.delivery.outcomes import Action, Attempted, Verdict, judge
from notifkit.services.payloads import parse_each, parse_one
from notifkit.services.scheduler import release_throttle
from notifkit.services.timeline import Recipient, task_row
from notifkit.transports.base import (
    Message,
    Outcome,
    SendResult,
    Transport,
    TransportContext,
    storable,
)
from notifkit.transports.registry import MISSING, build_transports
from notifkit.worker import Entry, attempts_before, batch_stream

log = logging.getLogger("notifkit.delivery")

_T = TypeVar("_T")

# (task id, channel, destination, outbox status, provider message id)
SentRow = tuple[str, str, str, str, str | None]

# The longest a send waits in-process for notifkit's own token bucket; a longer wait parks the
# task on the scheduler instead, so a slot is never held long enough to be reclaimed.
MAX_BUCKET_WAIT_S = 2.0
DEFAULT_PARK_S = 1.0
# How far apart two processes' clocks may be (see _hold_for_quiet_hours).
CLOCK_SKEW_S = 2.0
PROJECT_SETTINGS_TTL_S = 30.0
# Projects whose rateLimits a process remembers at once: past it, those not asked for are
# forgotten (and read again when next asked for), so a process sending for every project
# there is for months holds no more than this.
MAX_PROJECT_SETTINGS = 10_000


class DeliveryService(WorkerService):
    name: ClassVar[str] = "delivery"
    # Key probes and batch writes only: short-lived generic plans (notifkit.db.pool).
    generic_plans: ClassVar[bool] = True
    # A batch runs in phases (dedup, outbox claim, sends, writes) and holds its slots until the
    # last one ends. Batches of a quarter of the slots overlap, so sends are always in flight
    # while other batches claim or write: about 10-30 % more throughput on the benchmark.
    batch_share = 4
    claims_on_read = True
    # A task whose last attempt died with its process is finished from the outbox: 'sent' if
    # that attempt's send was recorded, else dead-lettered, never sent a fourth time.
    settles_exhausted = True

    def __init__(self, settings: Settings, **options: Any) -> None:
        super().__init__(settings, **options)
        self.transports: dict[str, Transport] = build_transports(
            settings, options.get("transports") or ()
        )
        # provider -> sends per second across all delivery processes (default: the
        # transport's own rate_per_s; None = no bucket).
        self.provider_rates: dict[str, float] = dict(options.get("provider_rates") or {})
        self.buckets = TokenBuckets(self.redis)
        self.clock = options.get("clock") or time.time  # seconds; tests move time
        self.dedup = Dedup(self.redis, self.keys, "delivery", settings.idempotency_ttl_s)
        self._opened: list[Transport] = []
        self._project_settings: dict[str, tuple[float, dict[str, Any]]] = {}
        # Every accepted send is recorded 'sent' as soon as it is accepted (a crash right
        # after finds it). One recorder per stream serves every batch of that stream in
        # flight: sends accepted while a write is out go together in the next one. Per
        # stream, so a critical send's write never queues behind a low one, and runs (in the
        # context of the batch that started it) on the critical stream's own connections.
        self._recorders: dict[str | None, Coalescer[SentRow, None]] = {}

    def streams(self) -> list[str]:
        return self.keys.outbound_all()

    async def open(self) -> None:
        await super().open()
        if not self._opened:
            ctx = TransportContext(self.settings, self.redis, self.db)
            for transport in dict.fromkeys(self.transports.values()):
                await transport.open(ctx)
                self._opened.append(transport)

    async def close(self) -> None:
        opened, self._opened = self._opened, []
        for transport in opened:
            try:
                await transport.close()
            except Exception:
                log.exception("Closing the %s transport failed; carrying on.",
                              transport.provider)
        await super().close()

    def claim_key(self, stream: str, payload: dict[str, Any]) -> tuple[str, int] | None:
        task = parse_one(payload, parse_outbound)
        return None if task is None else self.dedup.mark_of(delivery_key(task["taskId"]))

    # -- the batch --------------------------------------------------------------------
    async def process(self, batch: list[Entry]) -> None:
        parsed = parse_each(self.name, batch, parse_outbound)
        tasks = await self._deduplicate(parsed)
        if not tasks:
            return
        logs: list[LogRow] = []
        tasks = await self._hold_for_quiet_hours(tasks, logs)
        runnable: list[tuple[Entry, OutboundTask, Transport]] = []
        for entry, task in tasks:
            transport = self.transports.get(task["channel"])
            if transport is None:
                why = (f"no {task['channel']} transport is configured; set "
                       f"{MISSING.get(task['channel'], 'one in code')}")
                attempt = self._attempt(entry, task)
                if self._has_next(task):
                    # Nothing was sent: the recipient is reached on the chain's next channel,
                    # as after a provider's refusal.
                    self._fall_back(entry, task, None, Verdict(Action.FALLBACK, why), attempt,
                                    False, logs)
                    continue
                logs.append(task_row(task, attempt, Kind.DEAD_LETTERED, Status.DEAD_LETTERED,
                                     why))
                entry.fail(PermanentFailure(why))
            else:
                runnable.append((entry, task, transport))

        previous = await outbox.claim(self.pool, [
            outbox.Claim(t["taskId"], t["channel"], dest, t["projectId"], tr.provider,
                         t["userId"], t.get("topic"))
            for _e, t, tr in runnable for dest in t["to"]
        ])
        limits = await self._limits({t["projectId"] for _e, t, _tr in runnable})
        sends = _Sends(sum(len(t["to"]) for _e, t, _tr in runnable))
        attempted = await _every(*(
            self._send_task(e, task, transport, previous, limits, sends)
            for e, task, transport in runnable
        ))

        settled: list[SentRow] = list(sends.unrecorded)
        disabled: list[tuple[str, str, str, str]] = []
        first_of_kind: list[LogRow] = []
        unsent: dict[str, Recipient] = {}  # task id -> recipient: skipped, reached no one
        for (entry, task, transport), answers in zip(runnable, attempted, strict=True):
            attempt = self._attempt(entry, task)
            verdict = judge(answers, has_next_channel=self._has_next(task),
                            attempt=attempt, max_attempts=self.settings.max_attempts)
            if verdict.action is Action.RETRY and entry.attempt >= self.worker.max_attempts:
                # No attempt left for the destinations that failed: those accepted stand.
                verdict = (Verdict(Action.SENT, "accepted")
                           if any(a.result.sent for a in answers)
                           else Verdict(Action.DEAD, verdict.reason))
            for a in answers:
                outcome = a.result.outcome
                if outcome is Outcome.INVALID_RECIPIENT and not (a.suppressed or a.removed) \
                        and not self.settings.injects("keep_invalid_contacts"):  # test fault
                    disabled.append((task["projectId"], task["channel"], a.destination,
                                     "invalid_recipient"))
                if outcome is not Outcome.SENT and not a.result.maybe_accepted \
                        and not _may_have_gone_out(previous, task, a.destination):
                    settled.append((task["taskId"], task["channel"], a.destination,
                                    outbox.FAILED, None))
            await self._apply(entry, task, transport, answers, verdict, attempt, logs,
                              first_of_kind)
            if verdict.action in (Action.SKIPPED, Action.SUPPRESSED) \
                    and task["priority"] != "critical":  # critical sends are not counted
                unsent[task["taskId"]] = (task["projectId"], task["eventId"], task["userId"])

        # Independent writes, issued together (each on its own pooled connection).
        await asyncio.gather(outbox.settle_and_log(self.pool, settled, logs),
                             outbox.disable_contacts(self.pool, disabled),
                             insert_first_of_kind(self.pool, first_of_kind))
        if unsent:
            await self._release_unsent(unsent)

    async def _hold_for_quiet_hours(
        self, tasks: list[tuple[Entry, OutboundTask]], logs: list[LogRow]
    ) -> list[tuple[Entry, OutboundTask]]:
        """The tasks to send now. One that waited on the scheduler (``heldUntil``) was
        routed with the user's quiet hours as they were then: a user who set or moved them
        meanwhile, so that now falls inside them, has it held again until they end, as the
        engine would have. Critical sends go regardless, as in the engine."""
        waited = [(e, t) for e, t in tasks
                  if t.get("heldUntil") and t["priority"] != "critical"
                  and is_uuid(t["projectId"])]
        if not waited or self.settings.injects("ignore_quiet_hours"):
            return tasks
        quiet = await quiet_hours_of(self.pool, [(t["projectId"], t["userId"])
                                                 for _e, t in waited])
        now = datetime.fromtimestamp(self.clock(), UTC)
        held: set[int] = set()
        for entry, task in waited:
            hours, timezone = quiet.get((task["projectId"], task["userId"]), (None, None))
            until = quiet_hours.deferral(hours, timezone, now)
            # Not for the last moments of the period: the scheduler may run on a clock a
            # little ahead of this one, and moved the task on as the period ended.
            if until is not None and (until - now).total_seconds() > CLOCK_SKEW_S:
                held.add(id(entry))
                await self._hold(entry, task, until, quiet_hours.deferred_for(hours, timezone),
                                 logs)
        return [(e, t) for e, t in tasks if id(e) not in held]

    async def _hold(self, entry: Entry, task: OutboundTask, until: datetime,
                    why: tuple[str, str], logs: list[LogRow]) -> None:
        """Back to the scheduler until ``until``; the hold is not an attempt."""
        attempt = self._attempt(entry, task)
        due_ms = to_ms(until)
        at = iso_from_ms(due_ms)
        waiting: dict[str, Any] = {**task, "priorAttempts": attempt - 1, "heldUntil": at}
        await self._to_scheduler(entry, waiting, due_ms, "quietHours")
        detail, timezone = why
        logs.append(task_row(task, attempt, Kind.DEFERRED, Status.SCHEDULED,
                             f"{detail} until {at}; they changed while the send waited", None,
                             metadata={"dueAt": at, "reason": "quietHours",
                                       "timezone": timezone}))
        log.info("Held a scheduled send again: the user's quiet hours, set meanwhile, cover "
                 "it.", extra=_ids(task))

    async def _to_scheduler(self, entry: Entry, payload: dict[str, Any], due_ms: int,
                            reason: str) -> None:
        """The task (as ``payload``) waits on the scheduler until ``due_ms``, going out with
        this entry's ack, and comes back as a new entry with the same task id, which the
        released dedup mark lets through."""
        scheduled: ScheduledTask = {
            "taskId": payload["taskId"], "projectId": payload["projectId"], "dueAt": due_ms,
            "stream": self.keys.outbound(payload["priority"]), "payload": payload,
            "reason": reason,
        }
        entry.emit(self.keys.scheduled, scheduled)
        await self.dedup.release(entry)

    async def _release_unsent(self, unsent: dict[str, Recipient]) -> None:
        """Sends skipped here (the user turned the channel off, or the address was suppressed,
        while the task waited) reached no one: like a canceled send, they leave the user's
        throttle window, unless another task of the notification went to that user."""
        try:
            await release_throttle(self.pool, self.redis, self.keys, unsent.values(),
                                   unsent=set(unsent))
        except Exception as exc:  # the window over-counts until it expires; the sends stand
            log.warning("Could not take skipped sends out of their throttle windows (%s).",
                        exc, extra={"service": self.name})

    def _recorder(self) -> Coalescer[SentRow, None]:
        stream = batch_stream.get()
        recorder = self._recorders.get(stream)
        if recorder is None:
            recorder = self._recorders[stream] = Coalescer(self._record_sent)
        return recorder

    async def _record_sent(self, rows: list[SentRow]) -> list[None]:
        await outbox.settle(self.pool, rows)
        return [None] * len(rows)

    def _has_next(self, task: OutboundTask) -> bool:
        """Whether the task's fallback chain has a channel left to try."""
        return (bool(task.get("fallback", {}).get("chain"))
                and not self.settings.injects("skip_fallback"))  # test-only fault

    def _attempt(self, entry: Entry, task: OutboundTask) -> int:
        """This attempt's number for the task, counting its earlier (parked) entries."""
        return int(task.get("priorAttempts", 0)) + entry.attempt

    async def _deduplicate(
        self, parsed: list[tuple[Entry, OutboundTask]]
    ) -> list[tuple[Entry, OutboundTask]]:
        allowed = await self.dedup.claim_many(
            [(e, delivery_key(t["taskId"]), None) for e, t in parsed])
        kept = []
        for (entry, task), ok in zip(parsed, allowed, strict=True):
            if ok:
                kept.append((entry, task))
            else:
                log.info("Skipped a duplicate of a task already being delivered.",
                         extra=_ids(task))
        return kept

    # -- sending --------------------------------------------------------------------------
    async def _send_task(
        self,
        entry: Entry,
        task: OutboundTask,
        transport: Transport,
        previous: dict[tuple[str, str, str], outbox.Previous],
        limits: dict[str, dict[str, Any]],
        sends: _Sends,
    ) -> list[Attempted]:
        buckets = self._buckets(task, transport, limits)

        async def one(destination: str) -> Attempted:
            try:
                attempted = await attempt(destination)
            finally:
                sends.outstanding -= 1
            if attempted.result.sent and not attempted.already_sent:
                row = (task["taskId"], task["channel"], destination, outbox.SENT,
                       attempted.result.provider_message_id)
                if sends.outstanding == 0 or transport.idempotent:
                    # The batch's last send: its outcome write is next and takes this row
                    # along, one commit where there were two. A provider that honours the
                    # task id as an idempotency key needs no write of its own either: if
                    # this process dies before the outcome write, the retry's send is
                    # answered with this one's message, never delivered twice.
                    sends.unrecorded.append(row)
                else:
                    await self._recorder().submit(row)
            return attempted

        async def attempt(destination: str) -> Attempted:
            before = previous.get((task["taskId"], task["channel"], destination))
            if before is not None and before.status == outbox.SENT:
                return Attempted(destination, SendResult(
                    Outcome.SENT, before.provider_message_id, "already sent (outbox)"),
                    already_sent=True)
            if before is not None and before.blocked == outbox.SUPPRESSED:
                return Attempted(destination, SendResult(
                    Outcome.INVALID_RECIPIENT,
                    detail="address suppressed after the task was queued; not sent"),
                    suppressed=True)
            if before is not None and before.blocked in _LEFT_OUT:
                return Attempted(destination, SendResult(
                    Outcome.INVALID_RECIPIENT, detail=_LEFT_OUT[before.blocked]),
                    removed=True)
            if before is not None and before.blocked == outbox.DISABLED:
                # A provider called it invalid (maybe this task's earlier attempt, for
                # another of its devices): never retried on that address.
                return Attempted(destination, SendResult(
                    Outcome.INVALID_RECIPIENT,
                    detail="contact disabled after the task was queued; not sent"))
            if entry.exhausted:
                # Its last attempt died with its process, unrecorded: no attempt is left.
                return Attempted(destination, SendResult(
                    Outcome.RETRY, detail="the last attempt never finished (its process "
                    "stopped before recording an answer)",
                    maybe_accepted=before is not None and before.status == outbox.SENDING))
            possible_duplicate = (before is not None and before.status == outbox.SENDING
                                  and not transport.idempotent)
            wait_s = await self.buckets.take_soon(buckets, MAX_BUCKET_WAIT_S,
                                                  turn_came=task.get("bucketTurn", False))
            if wait_s > 0:
                return Attempted(destination, SendResult(
                    Outcome.RATE_LIMITED,
                    detail=f"{_limit_named(buckets, transport.provider, task['channel'])} "
                           "is used up",
                    retry_after_s=wait_s), local_limit=True)
            started = time.perf_counter()
            # From here the attempt happened, whatever fails after it (PostgreSQL included).
            entry.irreversible = True
            raised = False
            try:
                result = await transport.send(_message(task, destination))
            except Exception as exc:  # one message's failure stays its own
                result, raised = _raised(task, transport, exc), True
            result = _storable(result)
            metrics.PROVIDER_LATENCY.labels(task["channel"], transport.provider).observe(
                time.perf_counter() - started)
            metrics.DELIVERIES.labels(task["channel"], transport.provider,
                                      result.outcome.value).inc()
            return Attempted(destination, result, possible_duplicate, raised=raised,
                             removed=result.removed and not result.sent)

        return await _every(*(one(d) for d in task["to"]))

    def _buckets(self, task: OutboundTask, transport: Transport,
                 limits: dict[str, dict[str, Any]]) -> list[Bucket]:
        provider = transport.provider
        buckets = []
        rate = self.provider_rates.get(provider, transport.rate_per_s)
        if rate:
            buckets.append(Bucket.per_second(self.keys.provider_bucket(provider, ALL_PROJECTS),
                                             rate))
        override = (limits.get(task["projectId"]) or {}).get(task["channel"])
        if isinstance(override, int | float) and not isinstance(override, bool) and override > 0:
            buckets.append(Bucket.per_second(
                self.keys.provider_bucket(provider, task["projectId"]), float(override)))
        return buckets

    async def _limits(self, project_ids: set[str]) -> dict[str, dict[str, Any]]:
        """Each project's ``settings.rateLimits`` (cached for a few seconds)."""
        now = time.monotonic()
        # What is known is taken now: another batch may make room while this one reads.
        known = {p: entry[1] for p in project_ids
                 if (entry := self._project_settings.get(p)) is not None and entry[0] >= now}
        stale = [p for p in project_ids if p not in known]
        if stale:
            loaded = await project_settings(self.pool, stale)
            if len(self._project_settings) + len(stale) > MAX_PROJECT_SETTINGS:
                self._forget_project_settings(now, project_ids, len(stale))
            for project_id in stale:
                limits = (loaded.get(project_id) or {}).get("rateLimits")
                known[project_id] = limits if isinstance(limits, dict) else {}
                self._project_settings[project_id] = (now + PROJECT_SETTINGS_TTL_S,
                                                      known[project_id])
        return known

    def _forget_project_settings(self, now: float, keep: set[str], adding: int) -> None:
        """Make room for ``adding`` more: drop what has expired, and if that is not
        enough, all but ``keep`` (the projects being asked for)."""
        kept = {p: entry for p, entry in self._project_settings.items()
                if entry[0] >= now or p in keep}
        if len(kept) + adding > MAX_PROJECT_SETTINGS:
            kept = {p: entry for p, entry in kept.items() if p in keep}
        self._project_settings = kept

    # -- acting on the verdict ------------------------------------------------------------
    async def _apply(
        self, entry: Entry, task: OutboundTask, transport: Transport,
        answers: list[Attempted], verdict: Verdict, attempt: int, logs: list[LogRow],
        first_of_kind: list[LogRow],
    ) -> None:
        provider = transport.provider
        ids = _ids(task)
        action = verdict.action
        # Destinations called invalid beside others that had another answer (a user's
        # devices): the row's reason is the others', so it says the contacts were disabled too.
        tried = [a for a in answers if not (a.suppressed or a.removed)]
        disabled = sum(1 for a in tried if a.result.outcome is Outcome.INVALID_RECIPIENT)
        note = ""
        noted: dict[str, Any] = {}
        if 0 < disabled < len(tried):
            note = (f"; {disabled} of {len(task['to'])} destinations not sent: invalid "
                    "recipient, contact disabled")
            noted = {"disabled": disabled}
        if action is Action.SENT:
            sent = [a for a in answers if a.result.sent]
            duplicate = any(a.possible_duplicate for a in sent)
            metadata: dict[str, Any] = {"destinations": len(task["to"]),
                                        "accepted": len(sent)}
            metadata.update(noted)
            detail = f"accepted by {provider}{note}"
            if duplicate:
                metadata["possibleDuplicate"] = True
                detail += ("; sent again after an earlier attempt's answer was lost, and "
                           f"{provider} has no idempotency key: the recipient may get it twice")
                log.warning("Sent a task again after an earlier attempt's answer was lost; "
                            "%s has no idempotency key, so the recipient may get it twice.",
                            provider, extra=ids)
            message_id = sent[0].result.provider_message_id
            row = task_row(task, attempt, Kind.SENT, Status.SENT, detail, provider, message_id,
                           metadata)
            if all(a.already_sent for a in sent):
                # An earlier attempt sent it and may have recorded its row before its
                # process died unacked: one 'sent' row per task, not one per attempt.
                first_of_kind.append(row)
            else:
                logs.append(row)
            entry.emit(self.keys.events_inbound,
                       _event("notification:sent", task, provider, message_id, attempt))
            return
        if action is Action.SUPPRESSED:
            logs.append(task_row(task, attempt, Kind.SUPPRESSED, Status.SUPPRESSED,
                                 verdict.reason, provider))
            log.info("Not sent: the address was suppressed after the task was queued.",
                     extra=ids)
            return
        if action is Action.SKIPPED:
            logs.append(task_row(task, attempt, Kind.SKIPPED, Status.SKIPPED, verdict.reason,
                                 provider))
            log.info("Not sent: %s.", verdict.reason, extra=ids)
            return
        invalid = any(a.result.outcome is Outcome.INVALID_RECIPIENT
                      and not (a.suppressed or a.removed) for a in answers)
        if invalid:
            log.warning("The provider rejected the %s address; the contact is disabled and "
                        "never used again.", task["channel"], extra=ids)
        if action is Action.INVALID:
            logs.append(task_row(task, attempt, Kind.FAILED, Status.FAILED,
                                 f"invalid recipient, contact disabled: {verdict.reason}", provider,
                                 metadata={"reason": "invalid_recipient"}))
            entry.emit(self.keys.events_inbound,
                       _event("notification:invalid_token", task, provider, None, attempt,
                              verdict.reason))
            return
        if action is Action.FALLBACK:
            self._fall_back(entry, task, provider, verdict, attempt, invalid, logs, note,
                            noted)
            return
        if action is Action.PARK:
            wait_s = verdict.retry_after_s if verdict.retry_after_s else DEFAULT_PARK_S
            if self.settings.injects("ignore_retry_after"):  # test-only fault
                wait_s = 0.0
            due_ms = int((time.time() + wait_s) * 1000)
            parked: dict[str, Any] = dict(task)
            if verdict.counts_as_attempt:
                parked["parkCount"] = int(task.get("parkCount", 0)) + 1
                parked["priorAttempts"] = attempt
                parked.pop("bucketTurn", None)
            else:
                parked["priorAttempts"] = attempt - 1
                parked["bucketTurn"] = True
            await self._to_scheduler(entry, parked, due_ms, "rateLimited")
            kind = Kind.DEFERRED if verdict.counts_as_attempt else Kind.RATE_LIMITED
            logs.append(task_row(task, attempt, kind, Status.SCHEDULED,
                                 f"{verdict.reason}{note}; parked for {wait_s:g} s", provider,
                                 metadata={"retryAfterSeconds": wait_s,
                                           "parkCount": parked.get("parkCount", 0),
                                           # Which wait: a row updated by a repeated wait
                                           # is one of the same reason (db/logs.py).
                                           "reason": "rateLimited" if verdict.counts_as_attempt
                                           else "ownRate", **noted}))
            log.info("Rate limited by %s; parked for %.1f s.", provider, wait_s, extra=ids)
            return
        if action is Action.RETRY:
            logs.append(task_row(task, attempt, Kind.FAILED, Status.PROCESSING,
                                 f"{verdict.reason}{note}; will retry", provider,
                                 metadata=noted))
            entry.fail(RetryLater(verdict.reason))
            return
        # PERMANENT or DEAD: the worker dead-letters the entry and emits notification:failed.
        logs.append(task_row(task, attempt, Kind.DEAD_LETTERED, Status.DEAD_LETTERED,
                             f"{verdict.reason}{note}", provider, metadata=noted))
        error = AttemptsExhausted if action is Action.DEAD else PermanentFailure
        entry.fail(error(verdict.reason))

    def _fall_back(self, entry: Entry, task: OutboundTask, provider: str | None,
                   verdict: Verdict, attempt: int, invalid: bool, logs: list[LogRow],
                   note: str = "", noted: dict[str, Any] | None = None) -> None:
        """Hand the recipient to the chain's next channel (``provider`` None: the channel has
        no transport). A channel that was never tried (every address suppressed, erased or
        turned off since routing) is recorded as such, with no outcome event: nothing
        failed. The re-entry goes out atomically with the ack, and the engine's dedup
        (event, recipient, channel) drops a second one."""
        fallback = task["fallback"]
        next_channel = fallback["chain"][0]
        metadata: dict[str, Any] = {"fallback": next_channel, **(noted or {})}
        if invalid:
            metadata["reason"] = "invalid_recipient"
        detail = f"{verdict.reason}{note}; trying {next_channel} next"
        came_from: dict[str, Any] = {"taskId": task["taskId"], "channel": task["channel"],
                                     "reason": verdict.reason}
        if verdict.left_out is Action.SUPPRESSED:
            logs.append(task_row(task, attempt, Kind.SUPPRESSED, Status.SUPPRESSED, detail,
                                 provider, metadata=metadata))
            came_from["outcome"] = "suppressed"
        elif verdict.left_out is Action.SKIPPED:
            logs.append(task_row(task, attempt, Kind.SKIPPED, Status.SKIPPED, detail, provider,
                                 metadata=metadata))
            came_from["outcome"] = "skipped"
        else:
            # Kind 'failed' (not a kind of its own) so the events service's row for the same
            # outcome event lands on this one instead of repeating it.
            logs.append(task_row(task, attempt, Kind.FAILED, Status.FAILED, detail, provider,
                                 metadata=metadata))
            outcome = "notification:invalid_token" if invalid else "notification:failed"
            entry.emit(self.keys.events_inbound,
                       _event(outcome, task, provider, None, attempt, verdict.reason))
        entry.emit(self.keys.enriched(task["priority"]), {
            **fallback["recipient"],
            # The route, so the engine records a channel it passes over on the way.
            "fallbackChain": fallback.get("route") or fallback["chain"],
            "fallbackFrom": came_from,
        })
        log.warning("Not sent on %s (%s); falling back to %s.", task["channel"],
                    verdict.reason, next_channel, extra=_ids(task))


@dataclass
class _Sends:
    """A batch's destinations whose attempt has not ended yet, and the accepted sends left
    for the batch's outcome write to record."""

    outstanding: int
    unrecorded: list[SentRow] = field(default_factory=list)


# Destinations the user took away while the task waited: left out (skipped, or the fallback
# chain's next channel), never sent to. The timeline says why.
_LEFT_OUT = {
    outbox.OPTED_OUT: "the user turned this channel or topic off after the task was queued; "
                      "not sent",
    outbox.REMOVED: "no contact: it was removed after the task was queued; not sent",
}


async def _every(*sends: Awaitable[_T]) -> list[_T]:
    """``asyncio.gather`` that lets every send end before it raises the first failure (an
    outcome that could not be recorded, say): gather raises at once and leaves the others
    running, so a send could still reach its provider after the batch was judged, and a try
    that called the provider would not count as the attempt it was (see Entry.irreversible)."""
    results = await asyncio.gather(*sends, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return cast(list[_T], results)


def _message(task: OutboundTask, destination: str) -> Message:
    return Message(
        task_id=task["taskId"], event_id=task["eventId"], project_id=task["projectId"],
        user_id=task["userId"], channel=task["channel"], to=destination,
        content=task["content"], template=task["template"], topic=task.get("topic"),
        campaign_id=task.get("campaignId"), unsubscribe_url=task.get("unsubscribeUrl"),
        created_at=task.get("createdAt", ""),
    )


def _limit_named(buckets: list[Bucket], provider: str, channel: str) -> str:
    """The rate limit a send waits for, as its row says it: notifkit's for the provider, the
    project's for the channel (``rateLimits``), or either when both apply (the take says
    only how long, not which bucket was short)."""
    own = [b for b in buckets if not b.key.endswith(f":{ALL_PROJECTS}")]
    if not own:
        return f"notifkit's {provider} rate limit"
    project = f"this project's {channel} rate limit ({own[0].rate_per_s:g}/s)"
    if len(own) == len(buckets):
        return project
    return f"{project} or notifkit's {provider} rate limit"


def _event(kind: str, task: OutboundTask, provider: str | None, message_id: str | None,
           attempt: int, error: str | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": kind, "projectId": task["projectId"], "eventId": task["eventId"],
        "taskId": task["taskId"], "userId": task["userId"], "channel": task["channel"],
        "provider": provider, "providerMessageId": message_id,
        "attempt": attempts_before(task) + attempt,
        "campaignId": task.get("campaignId"), "at": utc_now_iso(),
        # Delivery writes the outcome's timeline row itself, before the ack that emits this
        # event: the events service need not write it again.
        "recorded": True,
    }
    if error is not None:
        event["error"] = error
    return event


def _raised(task: OutboundTask, transport: Transport, exc: Exception) -> SendResult:
    """An exception a transport raised instead of answering is this task's alone: never the
    failure of the batch it came in (whose other sends stand). A network error or timeout is
    retried, as the transports' own are (the request may have gone out); anything else failed
    on the message's own content (a body that cannot be built or encoded), which is the same
    on every attempt: a permanent failure, not retried."""
    detail = (f"the {transport.provider} transport could not send this message: "
              f"{type(exc).__name__}: {exc}")
    if isinstance(exc, OSError | TimeoutError):
        return SendResult(Outcome.RETRY, detail=detail, maybe_accepted=True)
    log.warning("Not sent: %s", detail, extra=_ids(task))
    return SendResult(Outcome.PERMANENT, detail=detail)


def _may_have_gone_out(previous: dict[tuple[str, str, str], outbox.Previous],
                       task: OutboundTask, destination: str) -> bool:
    """Whether an earlier attempt left the destination 'sending': its answer was lost, so it
    may have been accepted. A refusal now (a 5xx, a 429, our own bucket) leaves it so rather
    than 'failed': recorded 'failed', the send that finally went through was not flagged as
    the possible duplicate it is, and the duplicate was counted nowhere."""
    before = previous.get((task["taskId"], task["channel"], destination))
    return before is not None and before.status == outbox.SENDING


def _storable(result: SendResult) -> SendResult:
    """The answer as its timeline row and outcome event can hold it. A server's words are
    its own: an SMTP reply in Latin-1 (read as lone surrogates) or with a NUL failed the
    batch's outcome write on every attempt, so no row said why, the batch was retried to the
    attempt limit, and its last accepted send (recorded by that write) was sent again."""
    detail = storable(result.detail)
    message_id = result.provider_message_id
    if message_id is not None:
        message_id = storable(message_id)
    if detail == result.detail and message_id == result.provider_message_id:
        return result
    return dataclasses.replace(result, detail=detail, provider_message_id=message_id)


def _ids(task: OutboundTask) -> dict[str, Any]:
    return {"service": "delivery", "event_id": task["eventId"], "task_id": task["taskId"],
            "project_id": task["projectId"], "channel": task["channel"]}
