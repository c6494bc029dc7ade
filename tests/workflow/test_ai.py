"""The ai service against the OpenAI simulator: generated text reaches the outbound task,
rejections are dead-lettered after exactly one request, 5xx are retried up to the limit and
429s are parked with the scheduler."""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from notifkit import metrics
from notifkit.config import AiSettings, Settings
from notifkit.dedup import ai_key
from notifkit.ids import uuid7
from notifkit.keys import Keys
from notifkit.services.ai import AiService, content_for, headline
from notifkit.streams import decode, xadd
from simulators import SimulatorServer
from simulators.providers.openai import prompt_tokens
from tests.support.compiling import watch_compiles
from tests.support.streams import xrange

PROMPT = "Write a friendly note telling {{ user.attributes.name }} that {{ data.amount }} is paid."


@pytest.fixture
def ai_settings(settings: Settings, sim: SimulatorServer) -> Settings:
    # Entries are reclaimable at once, so a drain runs the whole retry cycle.
    return settings.replace(
        ai=AiSettings(api_key="sk-test", base_url=f"{sim.base_url}/v1", model="gpt-4o-mini"),
        reclaim_min_idle_s=0.0, provider_timeout_s=5.0,
    )


@pytest.fixture
async def ai(ai_settings: Settings) -> AsyncIterator[AiService]:
    service = AiService(ai_settings)
    yield service
    await service.stop()


@pytest.fixture
async def template(db: asyncpg.Pool, project_id: str) -> str:
    await db.execute(
        """INSERT INTO templates (project_id, id, content, ai) VALUES ($1, 'paid', $2, $3)""",
        project_id,
        {"email": {"subject": "Paid: {{ data.amount }}", "text": "fallback"}},
        {"model": "gpt-4o-mini", "prompt": PROMPT, "channels": ["email", "sms"]},
    )
    return "paid"


def ai_task(project_id: str, *, channel: str = "email", model: str = "gpt-4o-mini",
            event_id: str | None = None) -> dict[str, Any]:
    """An AiTask as the engine writes it."""
    event_id = event_id or uuid7()
    context = {"data": {"amount": "12.00"},
               "user": {"id": "ada", "attributes": {"name": "Ada"}, "timezone": None,
                        "locale": None},
               "notification": {"id": event_id, "template": "paid", "priority": "normal",
                                "campaignId": None},
               "channel": channel}
    return {
        "taskId": f"{event_id}:{channel}", "eventId": event_id, "projectId": project_id,
        "userId": "ada", "channel": channel, "priority": "normal", "template": "paid",
        "topic": None, "to": ["ada@example.com" if channel == "email" else "+15005550006"],
        "content": {}, "campaignId": None, "createdAt": "2027-01-15T08:00:00.000Z",
        "ai": {"model": model, "prompt": PROMPT}, "context": context,
    }


async def set_template_ai(db: asyncpg.Pool, project_id: str, **ai: str) -> None:
    """Edit the ``paid`` template's ai block, as a PUT of the template does: the ai service
    reads the prompt and model from the template when it asks the model."""
    await db.execute("UPDATE templates SET ai = ai || $3::jsonb WHERE project_id = $1 "
                     "AND id = $2", project_id, "paid", ai)


async def stream(redis: Redis, name: str) -> list[dict[str, Any]]:
    return [decode(fields) for _id, fields in await xrange(redis, name)]


async def timeline(db: asyncpg.Pool, task_id: str) -> list[tuple[int, str, str]]:
    """(attempt, kind, status) of a task's timeline rows, in the order they were written."""
    rows = await db.fetch("SELECT attempt, kind, status FROM message_logs WHERE task_id = $1 "
                          "ORDER BY id", task_id)
    return [(r["attempt"], r["kind"], r["status"]) for r in rows]


async def requests_made(sim: SimulatorServer) -> int:
    stats = await sim.stats()
    openai_stats: Mapping[str, Any] = stats.get("openai", {})
    return int(openai_stats.get("requests", 0))


async def test_generated_text_becomes_the_outbound_tasks_content_and_tokens_are_recorded(
    ai: AiService, sim: SimulatorServer, redis: Redis, keys: Keys, db: asyncpg.Pool,
    project_id: str, template: str,
) -> None:
    # Given an AI task for e-mail
    task = ai_task(project_id)
    await xadd(redis, keys.ai_pending, task, 10_000)
    # When the ai service drains its stream
    await ai.run_until_idle()
    # Then one outbound task carries the model's text, with the template's subject rendered
    [message] = await sim.messages("openai")
    out = await stream(redis, keys.outbound("normal"))
    assert len(out) == 1
    generated = message["content"]["completion"]
    assert out[0]["content"]["text"] == generated
    assert out[0]["content"]["subject"] == "Paid: 12.00"
    assert out[0]["content"]["html"].startswith("<p>")
    assert out[0]["taskId"] == task["taskId"]
    assert "ai" not in out[0]
    assert "context" not in out[0]
    # the prompt was rendered with the recipient's data
    prompts = [m["content"] for m in message["content"]["messages"] if m["role"] == "user"]
    assert prompts == ["Write a friendly note telling Ada that 12.00 is paid."]
    # and tokens are recorded in ai_usage and in the timeline's metadata
    usage = await db.fetchrow("SELECT * FROM ai_usage WHERE task_id = $1", task["taskId"])
    assert usage is not None
    # as the model counted them: each count in its own column
    assert usage["prompt_tokens"] == prompt_tokens(message["content"]["messages"])
    assert usage["completion_tokens"] == len(generated.split())
    assert usage["prompt_tokens"] != usage["completion_tokens"]
    meta = await db.fetchval(
        "SELECT metadata FROM message_logs WHERE task_id = $1 AND kind = 'generated'",
        task["taskId"],
    )
    assert meta["ai"]["totalTokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert await requests_made(sim) == 1


async def test_template_content_that_does_not_render_is_named_on_the_generated_row(
    ai: AiService, sim: SimulatorServer, redis: Redis, keys: Keys, db: asyncpg.Pool,
    project_id: str, template: str,
) -> None:
    """The template's own subject failing for this recipient's data (a variable it lacks)
    was dropped in silence: the e-mail went out with the answer's first sentence as its
    subject and the timeline said only that content was written. The generated row now
    says what did not render, as the engine's row does for a template failing there."""
    await db.execute("UPDATE templates SET content = $3 WHERE project_id = $1 AND id = $2",
                     project_id, "paid",
                     {"email": {"subject": "Paid: {{ data.missing.field }}"}})
    task = ai_task(project_id)
    await xadd(redis, keys.ai_pending, task, 10_000)
    await ai.run_until_idle()
    [out] = await stream(redis, keys.outbound("normal"))
    [message] = await sim.messages("openai")
    assert out["content"]["subject"] == headline(message["content"]["completion"])
    detail = await db.fetchval(
        "SELECT detail FROM message_logs WHERE task_id = $1 AND kind = 'generated'",
        task["taskId"])
    assert detail.startswith("content written by gpt-4o-mini (")
    assert "the template's email content does not render (channels.email.subject: " in detail
    assert detail.endswith("the model's text sent without it")


async def test_a_duplicate_task_for_the_same_recipient_and_channel_costs_nothing(
    ai: AiService, sim: SimulatorServer, redis: Redis, keys: Keys, project_id: str,
    template: str,
) -> None:
    task = ai_task(project_id, channel="sms")
    await xadd(redis, keys.ai_pending, task, 10_000)
    await xadd(redis, keys.ai_pending, task, 10_000)
    await ai.run_until_idle()
    assert await requests_made(sim) == 1
    out = await stream(redis, keys.outbound("normal"))
    assert len(out) == 1
    assert set(out[0]["content"]) == {"text"}


async def test_the_same_recipients_other_channel_is_not_taken_for_a_duplicate(
    ai: AiService, sim: SimulatorServer, redis: Redis, keys: Keys, project_id: str,
    template: str,
) -> None:
    """The ai dedup key holds the channel: one notification's e-mail and SMS for one
    recipient are two texts, each written once."""
    email = ai_task(project_id, channel="email")
    sms = ai_task(project_id, channel="sms", event_id=email["eventId"])
    for task in (email, sms, sms):
        await xadd(redis, keys.ai_pending, task, 10_000)
    await ai.run_until_idle()
    assert await requests_made(sim) == 2
    out = await stream(redis, keys.outbound("normal"))
    assert sorted(task["channel"] for task in out) == ["email", "sms"]


@pytest.mark.parametrize("fault", ["status-400", "unknown-model", "invalid-token"])
async def test_a_rejection_is_dead_lettered_after_exactly_one_request(
    fault: str, ai: AiService, sim: SimulatorServer, redis: Redis, keys: Keys,
    db: asyncpg.Pool, project_id: str, template: str,
) -> None:
    # Given a model that rejects the request (400, or 404 model_not_found: an unknown model,
    # or the simulator's invalid_token fault on the model)
    if fault == "status-400":
        await sim.add_fault("error", "openai", status=400)
        task = ai_task(project_id)
    elif fault == "invalid-token":
        await sim.add_fault("invalid_token", "openai", to="gpt-4o-mini")
        task = ai_task(project_id)
    else:
        await set_template_ai(db, project_id, model="no-such-model")
        task = ai_task(project_id, model="no-such-model")
    await xadd(redis, keys.ai_pending, task, 10_000)
    # When the service drains (reclaiming at once, so any retry would happen now)
    await ai.run_until_idle()
    # Then the task is in the DLQ, nothing is sent, and the model was asked once
    [dead] = await stream(redis, keys.dlq)
    assert dead["payload"]["taskId"] == task["taskId"]
    assert "PermanentFailure" in dead["error"]
    assert dead["attempts"] == 1
    assert await stream(redis, keys.outbound("normal")) == []
    assert await requests_made(sim) == 1
    assert ai.worker.stats.dead_lettered == 1


async def sent_without_the_model(
    ai: AiService, redis: Redis, keys: Keys, db: asyncpg.Pool, project_id: str, channel: str,
    prompt: str = "About {{ data.missing.field }}.",
) -> tuple[dict[str, Any], str]:
    """Run a task whose prompt does not render for its data: the outbound task the ai service
    writes without the model, and its generation_failed row's detail."""
    await set_template_ai(db, project_id, prompt=prompt)
    task = ai_task(project_id, channel=channel)
    task["ai"]["prompt"] = prompt
    await xadd(redis, keys.ai_pending, task, 10_000)
    await ai.run_until_idle()
    [out] = await stream(redis, keys.outbound("normal"))
    assert out["taskId"] == task["taskId"]
    detail: str = await db.fetchval(
        "SELECT detail FROM message_logs WHERE task_id = $1 AND kind = 'generation_failed'",
        task["taskId"])
    return out, detail


@pytest.mark.parametrize(("channel", "expected"), [
    # the template's own e-mail content renders: it goes out as written
    ("email", {"subject": "Paid: 12.00", "text": "fallback"}),
    # no SMS content in the template: the engine's generic content for the channel
    ("sms", {"text": "Paid: amount: 12.00"}),
])
async def test_a_prompt_that_does_not_render_sends_the_templates_content_without_the_model(
    channel: str, expected: dict[str, str], ai: AiService, sim: SimulatorServer, redis: Redis,
    keys: Keys, db: asyncpg.Pool, project_id: str, template: str,
) -> None:
    """Like a template that fails to render in the engine, a prompt that fails for this
    recipient's data does not stop the send: the message goes out with the content a send
    without AI would carry, the timeline says why, and the model is not asked."""
    out, detail = await sent_without_the_model(
        ai, redis, keys, db, project_id, channel,
        "Tell {{ user.attributes.name }} about {{ data.missing.field }}.")
    assert {k: out["content"][k] for k in expected} == expected
    assert "ai" not in out
    assert "context" not in out
    assert await stream(redis, keys.dlq) == []
    assert await requests_made(sim) == 0
    assert detail.startswith("the AI prompt does not render")
    assert ("template's content" if channel == "email" else "generic content") in detail


async def test_without_the_model_a_templates_text_too_long_for_sms_is_cut_to_fit(
    ai: AiService, redis: Redis, keys: Keys, db: asyncpg.Pool, project_id: str, template: str,
) -> None:
    """The template's own SMS text over Twilio's 1,600 characters went out whole, to be
    refused for good (21617): it is cut as the engine cuts it, and the row says so."""
    await db.execute("UPDATE templates SET content = jsonb_set(content, '{sms}', $3::jsonb) "
                     "WHERE project_id = $1 AND id = $2", project_id, "paid",
                     {"text": "{{ data.amount }} " + "ok " * 600})
    out, detail = await sent_without_the_model(ai, redis, keys, db, project_id, "sms")
    assert out["content"] == {"text": ("12.00 " + "ok " * 600)[:1599].rstrip() + "…"}
    assert detail.endswith("the template's content sent instead; sms text cut to 1,600 "
                           "characters")


@pytest.mark.parametrize("email", [{"subject": "Paid"}, {"subject": "Paid", "text": " "}],
                         ids=["text-left-out", "text-blank"])
async def test_without_the_model_a_template_leaving_its_field_empty_sends_generic_content(
    email: dict[str, str], ai: AiService, redis: Redis, keys: Keys, db: asyncpg.Pool,
    project_id: str, template: str,
) -> None:
    """A channel the ai writes may leave out the field the model fills; without the model,
    that content would go out empty (an SMS with no body is refused at the provider)."""
    await db.execute("UPDATE templates SET content = jsonb_set(content, '{email}', $3::jsonb) "
                     "WHERE project_id = $1 AND id = $2", project_id, "paid", email)
    out, detail = await sent_without_the_model(ai, redis, keys, db, project_id, "email")
    assert out["content"]["text"].strip()
    assert "generic content" in detail


async def test_a_503_is_retried_up_to_the_attempt_limit(
    ai: AiService, ai_settings: Settings, sim: SimulatorServer, redis: Redis, keys: Keys,
    project_id: str, template: str,
) -> None:
    await sim.add_fault("error", "openai", status=503)
    task = ai_task(project_id)
    await xadd(redis, keys.ai_pending, task, 10_000)
    await ai.run_until_idle()
    assert await requests_made(sim) == ai_settings.max_attempts
    [dead] = await stream(redis, keys.dlq)
    assert dead["attempts"] == ai_settings.max_attempts
    assert await stream(redis, keys.outbound("normal")) == []


async def test_a_task_parked_before_has_only_its_remaining_attempts(
    ai: AiService, ai_settings: Settings, sim: SimulatorServer, redis: Redis, keys: Keys,
    project_id: str, template: str,
) -> None:
    # Given a task parked once already on a 429 (one attempt spent), and a model answering 503
    await sim.add_fault("error", "openai", status=503)
    task = {**ai_task(project_id), "priorAttempts": 1}
    await xadd(redis, keys.ai_pending, task, 10_000)

    # Then it asks the model only for the attempts left, and is dead-lettered saying so
    await ai.run_until_idle()
    assert await requests_made(sim) == ai_settings.max_attempts - 1
    [dead] = await stream(redis, keys.dlq)
    assert f"after {ai_settings.max_attempts} attempts" in dead["error"], dead["error"]


async def test_a_503_that_clears_before_the_limit_delivers(
    ai: AiService, sim: SimulatorServer, redis: Redis, keys: Keys, db: asyncpg.Pool,
    project_id: str, template: str,
) -> None:
    await sim.add_fault("error", "openai", status=503, times=2)
    task = ai_task(project_id)
    await xadd(redis, keys.ai_pending, task, 10_000)
    await ai.run_until_idle()
    assert await requests_made(sim) == 3
    assert len(await stream(redis, keys.outbound("normal"))) == 1
    assert await stream(redis, keys.dlq) == []
    # The timeline shows both failed attempts, then the content written
    assert await timeline(db, task["taskId"]) == [
        (1, "generation_failed", "processing"), (2, "generation_failed", "processing"),
        (0, "generated", "processing")]


async def test_a_429_parks_the_task_with_the_scheduler_until_retry_after(
    ai: AiService, sim: SimulatorServer, redis: Redis, keys: Keys, db: asyncpg.Pool,
    project_id: str, template: str,
) -> None:
    await sim.add_fault("rate_limit", "openai", retry_after_s=7, times=1)
    task = ai_task(project_id)
    await xadd(redis, keys.ai_pending, task, 10_000)
    before_ms = int(time.time() * 1000)
    await ai.run_until_idle()
    [parked] = await stream(redis, keys.scheduled)
    assert parked["reason"] == "rateLimited"
    assert parked["stream"] == keys.ai_pending
    assert parked["taskId"] == task["taskId"]
    assert parked["dueAt"] >= before_ms + 7000
    assert (parked["payload"]["parkCount"], parked["payload"]["priorAttempts"]) == (1, 1)
    assert await stream(redis, keys.dlq) == []
    # The timeline says it waits, for how long and why
    [row] = await db.fetch(
        "SELECT attempt, kind, status, detail, provider, metadata FROM message_logs "
        "WHERE task_id = $1", task["taskId"])
    assert (row["attempt"], row["kind"], row["status"], row["provider"]) == (
        1, "generation_deferred", "scheduled", "openai")
    assert "parked for 7 s" in row["detail"]
    assert row["metadata"] == {"retryAfterSeconds": 7, "parkCount": 1, "reason": "rateLimited"}
    # When the scheduler hands it back, the dedup key is free and the text is written
    await xadd(redis, keys.ai_pending, parked["payload"], 10_000)
    await ai.run_until_idle()
    [out] = await stream(redis, keys.outbound("normal"))
    assert await requests_made(sim) == 2
    # Delivery counts its own attempts from zero, and holds no turn in the model's bucket
    assert "priorAttempts" not in out
    assert "parkCount" not in out
    assert "bucketTurn" in parked["payload"]
    assert "bucketTurn" not in out


async def test_a_replayed_ai_tasks_earlier_attempts_are_not_deliverys(
    ai: AiService, redis: Redis, keys: Keys, project_id: str, template: str,
) -> None:
    # Given an AI task replayed from the DLQ after three attempts
    await xadd(redis, keys.ai_pending, {**ai_task(project_id), "_replayedAttempts": 3}, 10_000)
    await ai.run_until_idle()
    # Then its outbound task does not number delivery's attempts after the AI stage's
    [out] = await stream(redis, keys.outbound("normal"))
    assert "_replayedAttempts" not in out


async def test_a_task_replayed_after_its_templates_model_was_fixed_uses_the_fixed_model(
    ai: AiService, sim: SimulatorServer, redis: Redis, keys: Keys, db: asyncpg.Pool,
    project_id: str, template: str,
) -> None:
    """An unknown model is dead-lettered at once; the fix is the template's, so a replay after
    it must ask the model the template names now, not the one the task was routed with."""
    # Given a template naming a model the provider does not know, and its task dead-lettered
    await set_template_ai(db, project_id, model="no-such-model")
    await xadd(redis, keys.ai_pending, ai_task(project_id, model="no-such-model"), 10_000)
    await ai.run_until_idle()
    [dead] = await stream(redis, keys.dlq)
    # When the template is fixed and the entry replayed (as POST /v1/dlq/{id}/replay does)
    await set_template_ai(db, project_id, model="gpt-4o-mini")
    await xadd(redis, keys.ai_pending, {**dead["payload"], "_replayOf": "dlq/1-0",
                                        "_replayedAttempts": dead["attempts"]}, 10_000)
    await ai.run_until_idle()
    # Then the fixed model writes the content and the task goes on to delivery
    [out] = await stream(redis, keys.outbound("normal"))
    assert out["taskId"] == dead["payload"]["taskId"]
    models = [m["content"]["model"] for m in await sim.messages("openai")]
    assert models[0] == "gpt-4o-mini"
    assert len(await stream(redis, keys.dlq)) == 1


async def test_a_prompt_edited_while_the_task_waited_is_the_one_rendered(
    ai: AiService, sim: SimulatorServer, redis: Redis, keys: Keys, db: asyncpg.Pool,
    project_id: str, template: str,
) -> None:
    """The ai service renders the template's prompt as it is when the model is asked (as it
    reads the template's channel content then): a task that waited (sendAt, a 429) or was
    replayed gets the template as it now is."""
    await set_template_ai(db, project_id, prompt="Thank {{ user.id }}.")
    await xadd(redis, keys.ai_pending, ai_task(project_id), 10_000)
    await ai.run_until_idle()
    [message] = await sim.messages("openai")
    prompts = [m["content"] for m in message["content"]["messages"] if m["role"] == "user"]
    assert prompts == ["Thank ada."]


async def test_parkings_count_towards_the_attempt_limit(
    ai: AiService, sim: SimulatorServer, redis: Redis, keys: Keys, db: asyncpg.Pool,
    project_id: str, template: str,
) -> None:
    """Three attempts per task, 429s included: a task rate limited every time is parked
    twice, then dead-lettered on its third 429, not parked again."""
    await sim.add_fault("rate_limit", "openai", retry_after_s=1)
    task = ai_task(project_id)
    await xadd(redis, keys.ai_pending, task, 10_000)
    for parking in (1, 2):
        await ai.run_until_idle()
        parked = (await stream(redis, keys.scheduled))[-1]
        assert parked["payload"]["priorAttempts"] == parking
        await xadd(redis, keys.ai_pending, parked["payload"], 10_000)
    await ai.run_until_idle()
    [dead] = await stream(redis, keys.dlq)
    assert "still rate limited after 3 attempts" in dead["error"]
    assert len(await stream(redis, keys.scheduled)) == 2
    assert await requests_made(sim) == 3
    # Each parking is in the timeline; the last attempt's row is the dead letter's
    assert await timeline(db, task["taskId"]) == [
        (1, "generation_deferred", "scheduled"), (2, "generation_deferred", "scheduled")]


def test_content_for_fills_the_channels_body_and_a_missing_subject() -> None:
    email = content_for("email", "Your invoice is paid. Thanks!\n\nSee you.", {})
    assert email["subject"] == "Your invoice is paid."
    assert email["html"] == "<p>Your invoice is paid. Thanks!</p><p>See you.</p>"
    # a line break within a paragraph (a sign-off under its greeting) stays one in the HTML,
    # which a mail client shows instead of the text; what the model writes is escaped
    signed = content_for("email", "Paid.\n\nBest,\nThe <b>team</b>", {"subject": "s"})
    assert signed["html"] == "<p>Paid.</p><p>Best,<br>\nThe &lt;b&gt;team&lt;/b&gt;</p>"
    push = content_for("push", "Hello there", {"title": "Kept"})
    assert push == {"title": "Kept", "body": "Hello there"}
    # a subject or title the template left empty, or that rendered blank, is the model's too
    for blank in ("", " \n"):
        assert content_for("email", "Paid. Thanks", {"subject": blank})["subject"] == "Paid."
        assert content_for("push", "Hello there", {"title": blank})["title"] == "Hello there"
    assert headline("x" * 100, 10) == "x" * 9 + "…"


async def test_a_model_that_times_out_is_retried(
    ai_settings: Settings, sim: SimulatorServer, redis: Redis, keys: Keys, project_id: str,
    template: str,
) -> None:
    await sim.add_fault("timeout", "openai", times=1)
    service = AiService(ai_settings.replace(provider_timeout_s=0.3))
    try:
        await xadd(redis, keys.ai_pending, ai_task(project_id), 10_000)
        await service.run_until_idle()
    finally:
        await service.stop()
    assert len(await stream(redis, keys.outbound("normal"))) == 1
    assert await stream(redis, keys.dlq) == []
    assert service.worker.stats.failed == 1


async def test_a_reclaimed_task_whose_content_was_written_does_not_ask_the_model_again(
    ai: AiService, sim: SimulatorServer, redis: Redis, keys: Keys, db: asyncpg.Pool,
    project_id: str, template: str,
) -> None:
    # Given a process that took the task, had the model's answer recorded in ai_usage and
    # died before its ack: the entry is pending under a consumer that is gone, and the dedup
    # mark it claimed is still there
    task = ai_task(project_id)
    entry_id = await xadd(redis, keys.ai_pending, task, 10_000)
    await redis.xgroup_create(keys.ai_pending, keys.group("ai"), id="0", mkstream=True)
    await redis.xreadgroup(keys.group("ai"), "ai-gone-1", {keys.ai_pending: ">"})
    owner = f"{keys.ai_pending}/{entry_id}"
    await redis.set(keys.processed("ai", ai_key(task["eventId"], "ada", "email")), owner,
                    ex=3600)
    written = {"subject": "Paid: 12.00", "text": "Written before the crash.",
               "html": "<p>Written before the crash.</p>"}
    await db.execute(
        "INSERT INTO ai_usage (task_id, project_id, event_id, user_id, channel, model, "
        "prompt_tokens, completion_tokens, content) "
        "VALUES ($1, $2, $3, 'ada', 'email', 'gpt-4o-mini', 40, 12, $4)",
        task["taskId"], project_id, task["eventId"], written)
    # When a live ai service reclaims it
    await ai.run_until_idle()
    # Then the written content goes out as it was, without asking (and paying) again
    assert await requests_made(sim) == 0
    [out] = await stream(redis, keys.outbound("normal"))
    assert out["taskId"] == task["taskId"]
    assert out["content"] == written
    assert await stream(redis, keys.dlq) == []
    assert (await redis.xpending(keys.ai_pending, keys.group("ai")))["pending"] == 0


async def test_an_unreadable_answer_is_retried_and_the_timeline_says_it_was_not_json(
    ai: AiService, ai_settings: Settings, sim: SimulatorServer, redis: Redis, keys: Keys,
    db: asyncpg.Pool, project_id: str, template: str,
) -> None:
    # Given a model whose 200 answers are cut short (not JSON)
    await sim.add_fault("malformed", "openai")
    task = ai_task(project_id)
    await xadd(redis, keys.ai_pending, task, 10_000)
    # When the service drains, retrying up to the limit
    await ai.run_until_idle()
    # Then the task is dead-lettered after the limit and every account of why says what the
    # answer was, not how the code tripped over it
    [dead] = await stream(redis, keys.dlq)
    assert dead["attempts"] == ai_settings.max_attempts
    details = await db.fetch("SELECT detail FROM message_logs WHERE task_id = $1 "
                             "AND kind = 'generation_failed'", task["taskId"])
    assert details
    for said in [dead["error"], *(r["detail"] for r in details)]:
        assert "is not JSON" in said, said
        assert "NoneType" not in said, said


async def test_a_model_that_cannot_be_reached_is_retried_with_a_readable_reason(
    ai_settings: Settings, redis: Redis, keys: Keys, db: asyncpg.Pool, project_id: str,
    template: str,
) -> None:
    # Given an OpenAI base URL nothing listens on (a port just closed)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    service = AiService(ai_settings.replace(ai=AiSettings(
        api_key="sk-test", base_url=f"http://127.0.0.1:{port}/v1", model="gpt-4o-mini")))
    task = ai_task(project_id)
    try:
        await xadd(redis, keys.ai_pending, task, 10_000)
        await service.run_until_idle()
    finally:
        await service.stop()
    # Then the timeline says the host could not be reached, in words, not a Python repr
    [detail, *_] = [r["detail"] for r in await db.fetch(
        "SELECT detail FROM message_logs WHERE task_id = $1 AND kind = 'generation_failed' "
        "ORDER BY id", task["taskId"])]
    assert detail.startswith(f"could not reach the model: Cannot connect to host 127.0.0.1:{port}")
    assert "ConnectionKey(" not in detail


async def test_a_malformed_task_is_acked_and_counted(
    ai: AiService, sim: SimulatorServer, redis: Redis, keys: Keys,
    caplog: pytest.LogCaptureFixture,
) -> None:
    counter = metrics.MALFORMED.labels("ai", keys.ai_pending)
    before = counter._value.get()
    await xadd(redis, keys.ai_pending, {"taskId": "t-1", "no": "shape"}, 10_000)
    await ai.run_until_idle()
    assert counter._value.get() == before + 1
    assert await requests_made(sim) == 0
    assert await stream(redis, keys.dlq) == []
    assert await redis.xpending(keys.ai_pending, keys.group("ai")) == {
        "pending": 0, "min": None, "max": None, "consumers": []}
    # Reported with where it was, as the workers report theirs
    [report] = [r for r in caplog.records if r.getMessage().startswith("Acked an AI task")]
    assert getattr(report, "stream", None) == keys.ai_pending
    assert getattr(report, "entry_id", None)


@pytest.mark.parametrize("field", ["projectId", "eventId"])
async def test_a_task_whose_ids_are_no_uuids_is_acked_and_counted_not_dead_lettered(
    ai: AiService, sim: SimulatorServer, redis: Redis, keys: Keys, project_id: str,
    template: str, field: str,
) -> None:
    """Such a task can never be processed (its ids go into UUID columns): it failed every
    attempt in PostgreSQL and reached the DLQ, with the good tasks of its batch retried
    beside it, where CONTRACT §3.6 acks a malformed payload at once, as every other service
    does."""
    counter = metrics.MALFORMED.labels("ai", keys.ai_pending)
    before = counter._value.get()
    bad = {**ai_task(project_id), field: "not-a-uuid"}
    good = ai_task(project_id, channel="sms")
    await xadd(redis, keys.ai_pending, bad, 10_000)
    await xadd(redis, keys.ai_pending, good, 10_000)
    await ai.run_until_idle()
    assert counter._value.get() == before + 1
    assert await stream(redis, keys.dlq) == []
    [out] = await stream(redis, keys.outbound("normal"))
    assert out["taskId"] == good["taskId"]
    assert await redis.xpending(keys.ai_pending, keys.group("ai")) == {
        "pending": 0, "min": None, "max": None, "consumers": []}


async def test_a_prompt_new_to_the_process_compiles_beside_the_event_loop(
    ai: AiService, redis: Redis, keys: Keys, db: asyncpg.Pool, project_id: str, template: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compiled = watch_compiles(monkeypatch)
    task = ai_task(project_id)
    prompt = f"{PROMPT} ({uuid7()})"  # new to this process's cache
    await set_template_ai(db, project_id, prompt=prompt)
    task["ai"]["prompt"] = prompt
    await xadd(redis, keys.ai_pending, task, 10_000)
    await ai.run_until_idle()

    assert (prompt, False) in compiled  # in a thread, before the render
    assert len(await stream(redis, keys.outbound("normal"))) == 1


async def test_notifkits_own_rate_for_the_model_parks_what_it_cannot_send_without_an_attempt(
    ai_settings: Settings, sim: SimulatorServer, redis: Redis, keys: Keys, db: asyncpg.Pool,
    project_id: str, template: str,
) -> None:
    """PROVIDER_RATE_LIMITS=openai=... holds every ai process under the model's rate, as
    delivery's buckets hold it under a provider's: a task that would wait longer than a moment
    for a token is parked with the scheduler, and the wait costs it no attempt (nothing
    reached the model)."""
    # Given one request per 100 s towards the model, and two tasks
    service = AiService(ai_settings.replace(provider_rates={"openai": 0.01}))
    try:
        tasks = [ai_task(project_id), ai_task(project_id)]
        for task in tasks:
            await xadd(redis, keys.ai_pending, task, 10_000)
        # When the ai service drains its stream
        await service.run_until_idle()
    finally:
        await service.stop()
    # Then the model was asked once; the other task waits on the scheduler, no attempt spent
    assert await requests_made(sim) == 1
    [out] = await stream(redis, keys.outbound("normal"))
    [parked] = await stream(redis, keys.scheduled)
    assert {out["taskId"], parked["taskId"]} == {t["taskId"] for t in tasks}
    assert parked["reason"] == "rateLimited"
    assert parked["dueAt"] > int(time.time() * 1000) + 60_000
    assert parked["payload"]["priorAttempts"] == 0
    assert parked["payload"]["bucketTurn"] is True  # back at its turn, it queues no more
    assert await stream(redis, keys.dlq) == []
    [row] = await db.fetch("SELECT kind, status, detail FROM message_logs WHERE task_id = $1",
                           parked["taskId"])
    assert (row["kind"], row["status"]) == ("generation_deferred", "scheduled")
    assert "notifkit's openai rate limit is used up" in row["detail"]
