"""The engine: one enriched recipient -> the channels it is sent on, rendered and routed.

Per read batch: templates, suppressions and project settings are loaded in one query each;
then for every recipient the channel decisions (:mod:`.channels`), the engine dedup
(``rawEventId:recipientId:channel``), the per-user throttle (critical bypasses), quiet hours
(critical bypasses) and ``sendAt`` decide where each channel's task goes:

    outbound:{p}   rendered task, due now
    ai:pending     a task of one of the template's AI channels (content written by the ai service)
    scheduled      due later (sendAt, quiet hours); the scheduler moves it on when due

A recipient of a notification canceled since, due now (its ``sendAt`` passed while it was on its
way), is dropped with a 'canceled' row: one due later goes on to the scheduler, which drops it.
A fallback (``fallbackFrom``) goes on: it continues a task already handed to delivery.

Every decision is one ``message_logs`` row, written for the whole batch at once. Task ids are
derived from (event, recipient, channel), so a rerun of the same entry produces the same ids.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar

from notifkit import quiet_hours, throttle
from notifkit import templates as jinja
from notifkit.clock import from_ms, iso_from_ms, to_ms, utc_now_iso
from notifkit.config import Settings
from notifkit.db.logs import Kind, LogRow, Status, insert_logs
from notifkit.db.routing import Template, load_routing
from notifkit.dedup import Dedup, engine_key
from notifkit.ids import derived_uuid7, is_uuid, untasked_row_id, uuid7_ms
from notifkit.messages import (
    AiTask,
    EnrichedMessage,
    FallbackContext,
    ScheduledTask,
    parse_enriched,
)
from notifkit.services.base import WorkerService
from notifkit.services.engine.channels import Decision, decide
from notifkit.services.engine.render import context_for, render
from notifkit.services.payloads import parse_each
from notifkit.services.timeline import canceled_row
from notifkit.unsubscribe import unsubscribe_url
from notifkit.wording import counted
from notifkit.worker import Entry, attempts_before

log = logging.getLogger("notifkit.engine")


@dataclass
class _Send:
    """A channel decided to be sent, on its way through dedup, throttle and routing."""

    entry: Entry
    message: EnrichedMessage
    template: Template
    decision: Decision
    task_id: str
    due_ms: int | None  # None = now
    due_reason: str  # sendAt | quietHours


class EngineService(WorkerService):
    name: ClassVar[str] = "engine"
    # Key probes and batch writes only: short-lived generic plans (notifkit.db.pool).
    generic_plans: ClassVar[bool] = True
    # One batch in flight per priority stream: entries arriving meanwhile go in the next,
    # larger batch, which shares its round trips (about 40 % lower latency at 500/s offered,
    # see benchmarks/RESULTS.md). Per stream, so critical entries never wait for
    # a batch of low ones.
    max_batches: ClassVar[int | None] = 1

    def __init__(self, settings: Settings, **options: Any) -> None:
        super().__init__(settings, **options)
        self.clock = options.get("clock") or time.time  # seconds; tests move time

    def streams(self) -> list[str]:
        return self.keys.enriched_all()

    async def process(self, batch: list[Entry]) -> None:
        parsed = parse_each(self.name, batch, parse_enriched)
        if not parsed:
            return
        now_ms = int(self.clock() * 1000)
        routing = await load_routing(
            self.pool,
            [(m["projectId"], m["template"]) for _e, m in parsed],
            [(m["projectId"], channel, target)
             for _e, m in parsed for channel, targets in m["contacts"].items()
             for target in targets],
            {m["projectId"] for _e, m in parsed if m["priority"] != "critical"},
            # A fallback continues a task handed to delivery, which a cancel leaves alone.
            [m["eventId"] for _e, m in parsed
             if not m.get("fallbackFrom") and is_uuid(m["eventId"])],
        )
        templates, suppressed, settings_of = (routing.templates, routing.suppressed,
                                              routing.settings)
        # A template this process has not compiled yet is compiled beside the event loop:
        # the largest take seconds, which every other batch would wait for.
        fresh = [field for template in templates.values()
                 for channel, content in template.content.items() if isinstance(content, dict)
                 for field in jinja.uncompiled(content, channel)]
        await jinja.warm_beside_loop(fresh)
        logs: list[LogRow] = []
        sends: list[_Send] = []
        for entry, m in parsed:
            template = templates.get((m["projectId"], m["template"]))
            if template is None:
                # A fallback whose template was deleted meanwhile: the row is about the channel
                # the chain would have gone on to, where the recipient's timeline looks.
                chain = m.get("fallbackChain") or [""]
                logs.append(_row(m, chain[0], derived_uuid7(m["eventId"], m["user"]["id"],
                                                            chain[0]),
                                 Kind.FAILED, Status.FAILED, "template not found"))
                continue
            mine = {(c, t): why for (p, c, t), why in suppressed.items()
                    if p == m["projectId"]}
            try:
                due_ms, reason = self._due(m, now_ms)
                decisions = decide(m, template, mine)
            except Exception as exc:  # this entry's own data is unusable; the batch goes on
                entry.fail(exc)
                continue
            # Due later, the scheduler drops it (and says so); due now (its sendAt passed while
            # it was on its way), nothing else would.
            canceled = due_ms is None and (m["projectId"], m["eventId"]) in routing.canceled
            for decision in decisions:
                task_id = derived_uuid7(m["eventId"], m["user"]["id"], decision.channel)
                if decision.send and canceled:
                    campaign = m.get("campaignId")
                    logs.append(canceled_row(
                        m["projectId"], m["eventId"], task_id, m["user"]["id"],
                        decision.channel, campaign if isinstance(campaign, str) else None,
                        " before it was routed"))
                elif decision.send:
                    sends.append(_Send(entry, m, template, decision, task_id, due_ms, reason))
                else:
                    status = Status.SUPPRESSED if decision.kind is Kind.SUPPRESSED \
                        else Status.SKIPPED
                    logs.append(_row(m, decision.channel, task_id, decision.kind or Kind.SKIPPED,
                                     status, decision.reason))
        sends = await self._deduplicate(sends, now_ms)
        sends = await self._throttle(sends, logs, now_ms, settings_of)
        for send in sends:
            self._route(send, logs)
        logs.extend(_replay_done(entry, m) for entry, m in parsed
                    if "_replayOf" in entry.payload and entry.error is None)
        await insert_logs(self.pool, logs)

    # -- the steps ------------------------------------------------------------------
    def _due(self, m: EnrichedMessage, now_ms: int) -> tuple[int | None, str]:
        """When the recipient's message is due and why: ``sendAt``, pushed past the user's
        quiet hours unless the send is critical. ``None`` = due now."""
        due_ms, reason = max(now_ms, _parse_ms(m.get("sendAt")) or now_ms), "sendAt"
        if m["priority"] != "critical" and not self.settings.injects("ignore_quiet_hours"):
            quiet_end = quiet_hours.deferral(
                m["preferences"].get("quietHours"), m["user"].get("timezone"),
                from_ms(due_ms),
            )
            if quiet_end is not None:
                due_ms, reason = to_ms(quiet_end), "quietHours"
        return (due_ms if due_ms > now_ms else None), reason

    async def _deduplicate(self, sends: list[_Send], now_ms: int) -> list[_Send]:
        ttl_default = self.settings.idempotency_ttl_s
        claims: list[tuple[Entry, str, int | None]] = []
        for s in sends:
            ttl = ttl_default
            if s.due_ms is not None:  # the mark must outlive the wait for a scheduled send
                ttl = ttl_default + (s.due_ms - now_ms) // 1000 + 1
            claims.append((s.entry,
                           engine_key(s.message["eventId"], s.message["user"]["id"],
                                      s.decision.channel), ttl))
        allowed = await Dedup(self.redis, self.keys, "engine", ttl_default).claim_many(claims)
        kept = []
        for s, ok in zip(sends, allowed, strict=True):
            if ok:
                kept.append(s)
            else:
                log.info("Skipped a duplicate of a channel already routed.",
                         extra=_ids(s.message, s.task_id))
        return kept

    async def _throttle(self, sends: list[_Send], logs: list[LogRow], now_ms: int,
                        settings_of: dict[str, dict[str, Any]]) -> list[_Send]:
        checked = [s for s in sends if s.message["priority"] != "critical"]
        if not checked:
            return sends
        # One notification is one send however many channels it goes out on: the window's
        # member is the event id, so its second channel finds the first one's mark. A send
        # that waits (sendAt, quiet hours) counts when it goes out.
        checks = [
            throttle.ThrottleCheck(
                s.message["projectId"], s.message["user"]["id"],
                throttle.rule_for(settings_of.get(s.message["projectId"]), self.settings),
                member=s.message["eventId"], at_ms=s.due_ms,
            )
            for s in checked
        ]
        decisions = await throttle.check_many(self.redis, self.keys, checks, now_ms)
        refused = {id(s) for s, d in zip(checked, decisions, strict=True) if not d.allowed}
        for s, c, d in zip(checked, checks, decisions, strict=True):
            if not d.allowed:
                # The rule too: the project's or the deployment's, a count alone does not say.
                rule = c.rule
                # A send that waits is throttled in the window it would go out in.
                around = "" if s.due_ms is None else f" around {iso_from_ms(s.due_ms)}"
                logs.append(_row(
                    s.message, s.decision.channel, s.task_id, Kind.THROTTLED, Status.THROTTLED,
                    f"throttled: the limit is {counted(rule.limit, 'send')} per "
                    f"{rule.window_s} s, and the window{around} already holds {d.count}",
                    metadata={"limit": rule.limit, "windowSeconds": rule.window_s,
                              "count": d.count}))
        return [s for s in sends if id(s) not in refused]

    def _route(self, s: _Send, logs: list[LogRow]) -> None:
        m, channel = s.message, s.decision.channel
        unsubscribe = None
        if channel == "email":
            unsubscribe = unsubscribe_url(self.settings, m["projectId"], m["user"]["id"],
                                          channel, s.template.topic, s.decision.destinations[0],
                                          sent_ms=uuid7_ms(m["eventId"]))
        context = context_for(m, channel, unsubscribe)
        task: dict[str, Any] = {
            "taskId": s.task_id, "eventId": m["eventId"], "projectId": m["projectId"],
            "userId": m["user"]["id"], "channel": channel, "priority": m["priority"],
            "template": m["template"], "topic": s.template.topic,
            "to": s.decision.destinations, "content": {}, "campaignId": m.get("campaignId"),
            "createdAt": utc_now_iso(),
        }
        for name in ("workflowInstanceId", "workflowStep"):
            if name in m:
                task[name] = m[name]  # type: ignore[literal-required]
        if unsubscribe is not None:
            task["unsubscribeUrl"] = unsubscribe
        if s.decision.chain:
            task["fallback"] = _fallback(m, s.decision.chain, s.decision.route)

        ai = s.template.ai or {}
        notes = ""  # what the row says besides where the task went, wherever it went
        if channel in (ai.get("channels") or []):
            ai_task: AiTask = {**task, "ai": {"model": ai.get("model", ""),  # type: ignore[typeddict-item]
                                              "prompt": ai.get("prompt", "")},
                               "context": context}
            stream, payload, detail = self.keys.ai_pending, dict(ai_task), "waiting for AI content"
        else:
            task["content"], template_error, cuts = render(s.template, channel, context)
            stream, payload, detail = self.keys.outbound(m["priority"]), task, "queued"
            if template_error is not None:
                # Rendered now, also for a send that waits: its row must say so as well.
                notes += f"; the template failed ({template_error}), generic content sent"
                log.warning("The %s template failed to render (%s); sending generic content.",
                            channel, template_error, extra=_ids(m, s.task_id))
            elif not isinstance(s.template.content.get(channel), dict):
                # A channel the send or the fallback chain names, but the template has no
                # content for: the recipient gets the generic text, and the row says why.
                notes += f"; the template has no {channel} content, generic content sent"
            # The recipient gets less than the content says: the row says what was cut.
            notes += "".join(f"; {note}" for note in cuts)

        fallback_from = m.get("fallbackFrom")
        if fallback_from:
            went = {"skipped": "was skipped", "suppressed": "was suppressed"}.get(
                str(fallback_from.get("outcome")), "failed")
            notes += f" (fallback after {fallback_from['channel']} {went})"
        if s.due_ms is None:
            s.entry.emit(stream, payload)
            logs.append(_row(m, channel, s.task_id, Kind.QUEUED, Status.PROCESSING,
                             detail + notes))
            return
        reason = s.due_reason
        at = iso_from_ms(s.due_ms)
        # The user's quiet hours were read now: delivery reads them again when it comes due.
        payload["heldUntil"] = at
        scheduled: ScheduledTask = {
            "taskId": s.task_id, "projectId": m["projectId"], "dueAt": s.due_ms,
            "stream": stream, "payload": payload, "reason": reason,
        }
        s.entry.emit(self.keys.scheduled, scheduled)
        metadata = {"dueAt": at, "reason": reason}
        if reason == "sendAt":
            kind, why = Kind.SCHEDULED, "scheduled"
        else:
            why, metadata["timezone"] = quiet_hours.deferred_for(
                m["preferences"].get("quietHours"), m["user"].get("timezone"))
            kind = Kind.DEFERRED
        logs.append(_row(m, channel, s.task_id, kind, Status.SCHEDULED,
                         f"{why} until {at}{notes}", metadata=metadata))


def _fallback(m: EnrichedMessage, chain: list[str], route: list[str]) -> FallbackContext:
    """What delivery needs to go on along the chain: the recipient, with only the route's
    contacts (delivery re-enters it on enriched:{p} restricted to the rest of the route, so a
    channel passed over says why, suppressed addresses included)."""
    recipient: dict[str, Any] = {k: v for k, v in m.items()
                                 if k not in ("fallbackChain", "fallbackFrom", "contacts")}
    recipient["contacts"] = {c: t for c, t in m["contacts"].items() if c in route}
    return {"chain": chain, "route": route,
            "recipient": recipient}  # type: ignore[typeddict-item]


def _row(
    m: EnrichedMessage, channel: str, task_id: str, kind: Kind, status: Status,
    detail: str | None, metadata: dict[str, Any] | None = None, attempt: int = 0,
) -> LogRow:
    return LogRow(
        project_id=m["projectId"], event_id=m["eventId"], task_id=task_id,
        user_id=m["user"]["id"], channel=channel, kind=kind, status=status, attempt=attempt,
        detail=detail, campaign_id=m.get("campaignId"), metadata=metadata or {},
    )


def _replay_done(entry: Entry, m: EnrichedMessage) -> LogRow:
    """The row that ends a replayed entry's recipient row (channel '', no task yet: where its
    dead_lettered and replayed rows are), which the replay left in progress: the recipient's
    outcome is now its channels' own rows. ``skipped`` ranks below every other outcome, so the
    notification's status is what those channels reach."""
    return _row(m, "", untasked_row_id(m["eventId"], m["user"]["id"]), Kind.SKIPPED,
                Status.SKIPPED, "routed again after the replay: each channel's rows follow",
                attempt=attempts_before(entry.payload))


def _parse_ms(value: str | None) -> int | None:
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return to_ms(moment)


def _ids(m: EnrichedMessage, task_id: str) -> dict[str, Any]:
    return {"service": "engine", "event_id": m["eventId"], "task_id": task_id,
            "project_id": m["projectId"]}

