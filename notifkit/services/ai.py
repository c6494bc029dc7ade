"""The ai service: writes a recipient's content with a model, then hands it to delivery.

Consumes ``ai:pending`` (:class:`~notifkit.messages.AiTask`, written by the engine for the
channels a template's ``ai`` block names). Per task:

1. dedup ``enrichedEventId:recipientId:channel:ai`` (1 h): a second task for the same
   recipient and channel is dropped;
2. render the template's prompt with the task's context (``data``, ``user``, ``notification``,
   ``channel``, ``items``) in the template sandbox; the prompt and model are the template's as
   it is now (read with its content), so a task that waited (``sendAt``, a 429) or is replayed
   from the DLQ after its template was fixed (an unknown model, say) gets the fix; the task's
   own copy, taken when the engine routed it, serves only once the template is gone or has
   no ``ai`` block;
3. ask the chat-completions endpoint (:mod:`notifkit.transports.openai`), with the channel
   in a system message so the answer fits it;
4. build the channel content: the template's own content for that channel, rendered, with its
   body field (email text/html, sms text, push body, in-app text, webhook body) replaced by
   the model's text; a missing email subject or push title is the answer's first sentence;
   an sms text or push title or body longer than the provider takes is cut to fit (as the
   engine cuts content it renders);
5. emit the outbound task (atomically with the ack) and record tokens in ``ai_usage`` and a
   ``generated`` row of the timeline whose metadata holds them.

A prompt that does not render for the task's context sends, without asking the model, what a
send without AI would: the template's content for the channel, or the generic content.

Every request to the model first takes a token from notifkit's own bucket for it
(``PROVIDER_RATE_LIMITS=openai=...``, shared by every ai process through Redis), as delivery's
sends do towards their providers: a token due within a moment is waited for, a later one parks
the task on the scheduler without spending an attempt (nothing reached the model).

Failures: a 4xx or an unknown model is permanent (dead-lettered at once: one request, never
repeated); 5xx and timeouts fail the attempt (the reclaim cycle retries, up to the limit); a
429 parks the task on the scheduler until Retry-After, up to the attempt limit. Content already
written for a task (a crash after the model answered) is re-used, never paid for twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import logging
import re
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar, cast

from notifkit import metrics
from notifkit.db import ai_usage
from notifkit.db.logs import Kind, LogRow, Status, insert_logs
from notifkit.dedup import Dedup, ai_key
from notifkit.errors import (
    AttemptsExhausted,
    MalformedPayload,
    PermanentFailure,
    RateLimited,
    RetryLater,
)
from notifkit.ids import is_uuid
from notifkit.messages import AiSpec, AiTask, ScheduledTask, outbound_from_ai, parse_outbound
from notifkit.ratelimit import ALL_PROJECTS, Bucket, TokenBuckets
from notifkit.services.base import WorkerService
from notifkit.services.engine.render import fit, generic
from notifkit.services.timeline import task_row
from notifkit.templates import (
    AI_WRITTEN_FIELDS,
    RenderError,
    render_channel,
    render_string,
    uncompiled,
    warm_beside_loop,
)
from notifkit.transports.openai import OpenAiClient
from notifkit.wording import counted
from notifkit.worker import Entry

log = logging.getLogger("notifkit.ai")

_RELEASE_MARK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

SYSTEM_PROMPTS: dict[str, str] = {
    "email": "You write the body of an e-mail notification. Reply with the text only.",
    "sms": "You write an SMS notification of at most 160 characters. Reply with the text only.",
    "push": "You write a short push notification body. Reply with the text only.",
    "inapp": "You write a short in-app notification. Reply with the text only.",
    "webhook": "You write a notification message. Reply with the text only.",
}
# The longest a task waits in-process for a token of notifkit's own bucket; a longer wait parks
# it, so a slot is never held long enough to be reclaimed (as in delivery).
MAX_BUCKET_WAIT_S = 2.0



class AiService(WorkerService):
    name: ClassVar[str] = "ai"

    def __init__(self, settings: Any, **options: Any) -> None:
        super().__init__(settings, **options)
        self.client: OpenAiClient = options.get("ai_client") or OpenAiClient.from_settings(
            settings
        )
        self.dedup = Dedup(self.redis, self.keys, "ai", settings.idempotency_ttl_s)
        self._release_mark = self.redis.register_script(_RELEASE_MARK)
        self.buckets = TokenBuckets(self.redis)
        rate = settings.provider_rates.get(self.client.provider)
        self._bucket = [Bucket.per_second(
            self.keys.provider_bucket(self.client.provider, ALL_PROJECTS), rate)] if rate else []

    def streams(self) -> Sequence[str]:
        return [self.keys.ai_pending]

    async def close(self) -> None:
        await self.client.close()
        await super().close()

    async def process(self, batch: list[Entry]) -> None:
        tasks: list[tuple[Entry, AiTask]] = []
        for entry in batch:
            try:
                tasks.append((entry, parse_ai_task(entry.payload)))
            except MalformedPayload as exc:
                metrics.MALFORMED.labels(self.name, entry.stream).inc()
                log.error("Acked an AI task that can never be processed: %s.", exc,
                          extra={"stream": entry.stream, "entry_id": entry.id})
        allowed = await self.dedup.claim_many(
            [(e, ai_key(t["eventId"], t["userId"], t["channel"]), None) for e, t in tasks]
        )
        fresh = []
        for (entry, task), ok in zip(tasks, allowed, strict=True):
            if ok:
                fresh.append((entry, task))
            else:
                log.info("Dropped a duplicate AI task for the same recipient and channel.",
                         extra={"task_id": task["taskId"], "event_id": task["eventId"]})
        if not fresh:
            return
        cached = await ai_usage.written(self.pool, [t["taskId"] for _e, t in fresh])
        templates, ai_blocks = await self._templates(fresh)
        fresh = [(entry, _current_ai(task, ai_blocks)) for entry, task in fresh]
        # Prompts and contents new to this process compile beside the event loop (the
        # largest take seconds).
        await warm_beside_loop(
            [field for _e, t in fresh if isinstance(t["ai"].get("prompt"), str)
             for field in uncompiled({"prompt": t["ai"]["prompt"]}, "")]
            + [field for content in templates.values() for channel, fields in content.items()
               if isinstance(fields, dict) for field in uncompiled(fields, channel)])
        logs: list[LogRow] = []
        # Model calls are slow and independent: the whole batch waits for them together.
        await asyncio.gather(
            *(self._write(entry, task, cached, templates, logs) for entry, task in fresh)
        )
        await insert_logs(self.pool, logs)

    async def _write(
        self, entry: Entry, task: AiTask, cached: dict[str, dict[str, Any]],
        templates: dict[tuple[str, str], dict[str, Any]], logs: list[LogRow],
    ) -> None:
        ids = {"task_id": task["taskId"], "event_id": task["eventId"]}
        channel = task["channel"]
        if task["taskId"] in cached:
            entry.emit(self.keys.outbound(task["priority"]),
                       outbound_from_ai(task, cached[task["taskId"]]))
            log.info("Re-used AI content written earlier for this task.", extra=ids)
            return
        try:
            prompt = render_string(task["ai"]["prompt"], task["context"], field="ai.prompt")
        except RenderError as exc:
            self._send_without_model(entry, task, str(exc), templates, logs)
            return
        model = task["ai"].get("model") or self.settings.ai.model
        messages = [
            {"role": "system", "content": SYSTEM_PROMPTS.get(channel, SYSTEM_PROMPTS["webhook"])},
            {"role": "user", "content": prompt},
        ]
        wait_s = await self.buckets.take_soon(self._bucket, MAX_BUCKET_WAIT_S,
                                              turn_came=task.get("bucketTurn", False))
        if wait_s > 0:
            limited = RateLimited(f"notifkit's {self.client.provider} rate limit is used up",
                                  after_s=wait_s)
            await self._park(entry, task, limited, logs, counts=False)
            return
        entry.irreversible = True  # a model's answer is paid for, whatever fails after it
        try:
            completion = await self.client.complete(
                model=model, messages=messages, task_id=task["taskId"]
            )
        except RateLimited as exc:
            await self._park(entry, task, exc, logs)
            return
        except RetryLater as exc:
            # A parked task's earlier attempts count: the limit is per task, not per entry.
            attempt = int(task.get("priorAttempts") or 0) + entry.attempt
            if attempt >= self.settings.max_attempts:
                # The dead-letter row says why, from notification:failed.
                entry.fail(AttemptsExhausted(f"gave up after {counted(attempt, 'attempt')}: {exc}"))
            else:
                entry.fail(exc)
                logs.append(task_row(task, attempt, Kind.GENERATION_FAILED, Status.PROCESSING,
                                     f"{exc}; will retry", self.client.provider))
            return
        except PermanentFailure as exc:
            entry.fail(exc)
            return
        base: dict[str, Any] = {}
        notes: tuple[str, ...] = ()
        channel_content = templates.get((task["projectId"], task["template"]), {}).get(channel)
        if isinstance(channel_content, dict):
            try:
                base = render_channel(channel_content, channel, task["context"])
            except RenderError as exc:
                # The model's text replaces the body and a subject or title is made from it
                # below; the template's other fields are lost, and the timeline says why, as
                # the engine's row says so of a template that fails there.
                base = {}
                notes = (f"the template's {channel} content does not render ({exc}); the "
                         "model's text sent without it",)
                log.warning("The template's %s content does not render (%s); sending the "
                            "model's text without it.", channel, exc, extra=ids)
        content = content_for(channel, completion.text, base)
        entry.emit(self.keys.outbound(task["priority"]), outbound_from_ai(task, content))
        # Recorded as soon as it is paid for, not when the batch's slowest answer comes: a
        # process dying in between leaves a retry that re-uses it instead of paying again.
        await ai_usage.record(self.pool, [ai_usage.Usage(
            task_id=task["taskId"], project_id=task["projectId"], event_id=task["eventId"],
            user_id=task["userId"], channel=channel, model=completion.model,
            prompt_tokens=completion.prompt_tokens,
            completion_tokens=completion.completion_tokens, content=content, notes=notes,
        )], datetime.now(UTC))
        log.info("AI content written with %s (%d tokens); queued for delivery.",
                 completion.model, completion.total_tokens, extra=ids)

    def _send_without_model(
        self, entry: Entry, task: AiTask, error: str,
        templates: dict[tuple[str, str], dict[str, Any]], logs: list[LogRow],
    ) -> None:
        """A prompt that fails for this recipient's data (a variable it lacks, say) does not
        stop the send, as a template that fails in the engine does not: the task goes out with
        what a send without AI would carry, the template's content for the channel or else the
        generic content, and the timeline says why."""
        channel = task["channel"]
        fields = templates.get((task["projectId"], task["template"]), {}).get(channel)
        content: dict[str, Any] | None = None
        if isinstance(fields, dict) and _has_body(fields, channel):
            with contextlib.suppress(RenderError):
                content = render_channel(fields, channel, task["context"])
        sent = "the template's content" if content is not None else "generic content"
        if content is None:
            content = generic(task["template"], channel, task["context"])
        content, cuts = fit(channel, content)
        entry.emit(self.keys.outbound(task["priority"]), outbound_from_ai(task, content))
        attempt = int(task.get("priorAttempts") or 0) + entry.attempt
        logs.append(task_row(task, attempt, Kind.GENERATION_FAILED, Status.PROCESSING,
                             f"the AI prompt does not render ({error}); {sent} sent instead"
                             + "".join(f"; {note}" for note in cuts)))
        log.warning("The AI prompt does not render (%s); sending %s without the model.",
                    error, sent, extra={"task_id": task["taskId"], "event_id": task["eventId"]})

    async def _park(self, entry: Entry, task: AiTask, exc: RateLimited,
                    logs: list[LogRow], *, counts: bool = True) -> None:
        """Hand the task to the scheduler until the provider's window reopens."""
        parks = int(task.get("parkCount") or 0) + 1
        # Each 429 is an attempt, and so is each failure before it: the task's attempts,
        # counted across its parkings, stop at the limit like any other entry's. A wait for
        # notifkit's own bucket is none: the model was not asked.
        attempt = int(task.get("priorAttempts") or 0) + entry.attempt - (0 if counts else 1)
        if counts and attempt >= self.settings.max_attempts:
            entry.fail(AttemptsExhausted(
                f"still rate limited after {counted(attempt, 'attempt')}: {exc}"))
            return
        after_s = exc.after_s if exc.after_s is not None else 1.0
        payload: dict[str, Any] = {**task, "parkCount": parks, "priorAttempts": attempt,
                                   "bucketTurn": not counts}
        parked: ScheduledTask = {
            "taskId": task["taskId"], "projectId": task["projectId"],
            "dueAt": int((time.time() + after_s) * 1000), "stream": self.keys.ai_pending,
            "payload": payload, "reason": "rateLimited",
        }
        entry.emit(self.keys.scheduled, parked)
        logs.append(task_row(task, attempt, Kind.GENERATION_DEFERRED, Status.SCHEDULED,
                             f"{exc}; parked for {after_s:g} s", self.client.provider,
                             metadata={"retryAfterSeconds": after_s, "parkCount": parks,
                                       "reason": "rateLimited" if counts else "ownRate"}))
        # The task comes back as a new entry: it must find the dedup key free.
        for mark in list(entry.marks):
            await self._release_mark(keys=[mark], args=[entry.owner])
            entry.marks.remove(mark)
        # Own-bucket parkings spend no attempt, so "parking N of the limit" would read as a
        # limit passed; only the provider's 429s count towards it.
        if counts:
            log.warning("The AI provider is rate limiting; parked the task for %.1f s "
                        "(attempt %d of %d).", after_s, attempt, self.settings.max_attempts,
                        extra={"task_id": task["taskId"], "event_id": task["eventId"]})
        else:
            log.info("notifkit's own rate for the AI provider is used up; parked the task for "
                     "%.1f s (parking %d, no attempt spent).", after_s, parks,
                     extra={"task_id": task["taskId"], "event_id": task["eventId"]})

    async def _templates(
        self, tasks: list[tuple[Entry, AiTask]]
    ) -> tuple[dict[tuple[str, str], dict[str, Any]], dict[tuple[str, str], Any]]:
        """The tasks' templates as they are now: each one's content, and its ``ai`` block."""
        pairs = sorted({(t["projectId"], t["template"]) for _e, t in tasks})
        rows = await self.pool.fetch(
            """SELECT t.project_id::text, t.id, t.content, t.ai
                 FROM templates t
                 JOIN unnest($1::uuid[], $2::text[]) AS want(project_id, id)
                   ON t.project_id = want.project_id AND t.id = want.id""",
            [p for p, _t in pairs], [t for _p, t in pairs],
        )
        return {(r[0], r[1]): r[2] for r in rows}, {(r[0], r[1]): r[3] for r in rows}


def _current_ai(task: AiTask, ai_blocks: dict[tuple[str, str], Any]) -> AiTask:
    """The task with its template's prompt and model as they are now. The engine copied them
    into the task when it routed it, but the cause of a dead-lettered AI task (an unknown
    model, a prompt the provider refuses) is fixed in the template: a replay that asked with
    the copy would fail again. A template since deleted, or left without an ``ai`` block,
    keeps the copy."""
    ai = ai_blocks.get((task["projectId"], task["template"]))
    if not isinstance(ai, dict) or not isinstance(ai.get("prompt"), str) or not ai["prompt"]:
        return task
    model = ai.get("model")  # none: OPENAI_MODEL, as the engine's copy says it
    current: AiSpec = {"prompt": ai["prompt"], "model": model if isinstance(model, str) else ""}
    if task["ai"].get("prompt") == current["prompt"] and task["ai"].get("model") == model:
        return task
    return cast(AiTask, {**task, "ai": current})


def parse_ai_task(payload: dict[str, Any]) -> AiTask:
    task: dict[str, Any] = dict(parse_outbound(payload))
    # They go into UUID columns (the template's lookup, ai_usage): another value would fail
    # every attempt there, an eventId only after the model was paid, as other services'
    # parsers (services.payloads) refuse it too.
    for name in ("projectId", "eventId"):
        if not is_uuid(task[name]):
            raise MalformedPayload(f"field {name!r} is not a UUID")
    ai = task.get("ai")
    if not isinstance(ai, dict) or not isinstance(ai.get("prompt"), str) or not ai["prompt"]:
        raise MalformedPayload("field 'ai.prompt' is missing")
    if not isinstance(task.get("context"), dict):
        raise MalformedPayload("field 'context' is not an object")
    return task  # type: ignore[return-value]


_SENTENCE = re.compile(r"^(.+?[.!?])(\s|$)")


def headline(text: str, limit: int = 78) -> str:
    """The first sentence of ``text``, cut to ``limit`` characters."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    match = _SENTENCE.match(first)
    line = match.group(1) if match else first
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


def _has_body(fields: dict[str, Any], channel: str) -> bool:
    """Whether a template's own content for a channel the ai writes says something: the
    field the model fills may be left out or a blank placeholder, and sent without the model
    such content would go out empty (an SMS without a body is refused by the provider)."""
    names = ("text", "html") if channel == "email" else (AI_WRITTEN_FIELDS.get(channel, "text"),)
    return any((isinstance(value, str) and value.strip()) or (isinstance(value, dict) and value)
               for value in (fields.get(name) for name in names))


def content_for(channel: str, text: str, base: dict[str, Any]) -> dict[str, Any]:
    """The channel's content with its body written by the model."""
    content = dict(base)
    if channel == "webhook":
        # A webhook's body is sent parsed when it reads as JSON (a template's author writes
        # it so); the model writes text, and an answer such as `{"admin": true}` or `42` (a
        # prompt's data can lead it there) is sent as that text, as a JSON string.
        text = json.dumps(text, ensure_ascii=False)
    content[AI_WRITTEN_FIELDS.get(channel, "text")] = text
    if channel == "email":
        paragraphs = [p.strip() for p in text.split("\n\n") if p.strip()]
        content["html"] = "".join(_html_paragraph(p) for p in paragraphs)
        if _blank(content.get("subject")):
            content["subject"] = headline(text)
    elif channel == "push" and _blank(content.get("title")):
        content["title"] = headline(text, 60)
    # An answer longer than the channel's provider takes (or a template's title) is cut to
    # fit, since sent whole it would be refused for good after it was paid for.
    return fit(channel, content)[0]


def _blank(value: object) -> bool:
    """A field the template left for the model: absent, empty or white space (a subject that
    rendered blank), which providers refuse or show as nothing."""
    return not isinstance(value, str) or not value.strip()


def _html_paragraph(text: str) -> str:
    # A mail client shows the HTML part, where a bare line break is a space: a sign-off under
    # its greeting would run into one line.
    return "<p>" + html.escape(text).replace("\n", "<br>\n") + "</p>"


