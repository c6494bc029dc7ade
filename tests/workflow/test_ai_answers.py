"""The ai service against answers a model can give that are not a plain short text: the
content is what is sent, so whatever the answer holds must not break the send or bill twice."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from redis.asyncio import Redis

from notifkit.config import AiSettings, Settings
from notifkit.errors import RetryLater
from notifkit.keys import Keys
from notifkit.services.ai import AiService, content_for
from notifkit.streams import xadd
from notifkit.transports.openai import MAX_ANSWER_BYTES, OpenAiClient
from notifkit.transports.webhook import _parsed as webhook_body
from tests.support.waiting import until_async
from tests.workflow.test_ai import ai_task, stream, template  # noqa: F401


class FakeModel:
    """A chat-completions endpoint that answers every request with ``self.body``."""

    def __init__(self) -> None:
        self.body: dict[str, Any] = {}
        self.requests = 0
        self.hold_sms = False  # SMS requests wait until ``release`` is set
        self.release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        self.requests += 1
        if self.hold_sms and "SMS" in json.dumps(await request.json()):
            await self.release.wait()
        return web.Response(text=json.dumps(self.body), content_type="application/json")

    def answer(self, content: Any, usage: Any = None) -> None:
        self.body = {
            "id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o-mini",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}],
            "usage": usage if usage is not None
            else {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25},
        }


@pytest.fixture
async def model() -> AsyncIterator[tuple[FakeModel, str]]:
    fake = FakeModel()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield fake, f"http://127.0.0.1:{port}/v1"
    await runner.cleanup()


@pytest.fixture
async def ai(settings: Settings, model: tuple[FakeModel, str]) -> AsyncIterator[AiService]:
    service = AiService(settings.replace(
        ai=AiSettings(api_key="sk-test", base_url=model[1], model="gpt-4o-mini"),
        reclaim_min_idle_s=0.0, provider_timeout_s=5.0))
    yield service
    await service.stop()


async def run(ai: AiService, redis: Redis, keys: Keys, tasks: list[dict[str, Any]]) -> None:
    for task in tasks:
        await xadd(redis, keys.ai_pending, task, 10_000)
    await ai.run_until_idle()


@pytest.mark.parametrize(("answer", "sent"), [
    ("Hello\x00 world", "Hello world"),
    ("Hi \ud800there", "Hi \ufffdthere"),
    ("Ring\x07 \x1b[31mred\x1b[0m\r\nnext\x85", "Ring [31mred[0m\nnext"),
])
async def test_an_answer_holding_characters_no_message_can_carry_is_sent_cleaned_and_paid_once(
    ai: AiService, model: tuple[FakeModel, str], redis: Redis, keys: Keys, db: asyncpg.Pool,
    project_id: str, template: str, answer: str, sent: str,  # noqa: F811
) -> None:
    # Given a model whose answer holds a NUL, a lone surrogate or other control characters
    # (PostgreSQL refuses the first two; none belongs in an e-mail or an SMS), for two
    # recipients whose tasks are read in one batch
    fake, _url = model
    fake.answer(answer)
    tasks = [ai_task(project_id), ai_task(project_id, channel="sms")]
    # When the ai service drains its stream
    await run(ai, redis, keys, tasks)
    # Then each task asked the model once, and goes out with the answer less those characters
    assert fake.requests == 2
    out = await stream(redis, keys.outbound("normal"))
    assert sorted(o["content"]["text"] for o in out) == [sent, sent]
    assert await stream(redis, keys.dlq) == []
    # and what was paid for is recorded
    usage = await db.fetch("SELECT task_id, content FROM ai_usage WHERE project_id = $1",
                           project_id)
    assert sorted(u["task_id"] for u in usage) == sorted(t["taskId"] for t in tasks)


@pytest.mark.parametrize("usage", [
    {"prompt_tokens": -5, "completion_tokens": 3},
    {"prompt_tokens": "many", "completion_tokens": 3},
    {"prompt_tokens": 10**12, "completion_tokens": 3},
    {"prompt_tokens": 2.5, "completion_tokens": [1]},
    "none",
])
async def test_usage_figures_that_cannot_be_stored_do_not_make_the_model_be_asked_again(
    ai: AiService, model: tuple[FakeModel, str], redis: Redis, keys: Keys, db: asyncpg.Pool,
    project_id: str, template: str, usage: Any,  # noqa: F811
) -> None:
    # Given a model that writes the text but reports its usage in figures no count can be
    fake, _url = model
    fake.answer("Your invoice is paid.", usage)
    task = ai_task(project_id)
    # When the ai service drains its stream
    await run(ai, redis, keys, [task])
    # Then the text goes out after one request, and the usage row holds counts it can hold
    assert fake.requests == 1
    [out] = await stream(redis, keys.outbound("normal"))
    assert out["content"]["text"] == "Your invoice is paid."
    row = await db.fetchrow("SELECT prompt_tokens, completion_tokens FROM ai_usage "
                            "WHERE task_id = $1", task["taskId"])
    assert row is not None
    assert row["prompt_tokens"] >= 0
    assert row["completion_tokens"] >= 0


@pytest.mark.parametrize("name", ["gpt\x00-4o", 42, ""])
async def test_a_model_name_in_the_answer_that_cannot_be_stored_is_the_one_asked_for(
    ai: AiService, model: tuple[FakeModel, str], redis: Redis, keys: Keys, db: asyncpg.Pool,
    project_id: str, template: str, name: Any,  # noqa: F811
) -> None:
    fake, _url = model
    fake.answer("Your invoice is paid.")
    fake.body["model"] = name
    task = ai_task(project_id)
    await run(ai, redis, keys, [task])
    assert fake.requests == 1
    assert len(await stream(redis, keys.outbound("normal"))) == 1
    stored = await db.fetchval("SELECT model FROM ai_usage WHERE task_id = $1", task["taskId"])
    assert stored == ("42" if name == 42 else "gpt-4o-mini")


async def test_an_sms_answer_longer_than_an_sms_provider_takes_is_cut_to_fit(
    ai: AiService, model: tuple[FakeModel, str], redis: Redis, keys: Keys,
    project_id: str, template: str,  # noqa: F811
) -> None:
    # Given a model that ignores the SMS length it was asked for (Twilio refuses a body over
    # 1,600 characters with 21617, which would throw away the paid-for answer)
    fake, _url = model
    fake.answer("word " * 1000)
    # When it writes an SMS
    await run(ai, redis, keys, [ai_task(project_id, channel="sms")])
    # Then the text sent fits, and says it was cut
    [out] = await stream(redis, keys.outbound("normal"))
    text = out["content"]["text"]
    assert len(text) <= 1600
    assert text.endswith("…")
    assert text.startswith("word word")


def test_a_push_body_is_cut_to_what_fcm_takes_counting_utf8_bytes() -> None:
    push = content_for("push", "日本" * 2000, {"title": "Kept"})
    assert push["title"] == "Kept"
    assert push["body"].endswith("…")
    assert len(json.dumps(push["body"], ensure_ascii=False).encode()) <= 2048
    short = content_for("sms", "Short one.", {})
    assert short == {"text": "Short one."}


async def test_an_answer_is_recorded_when_it_comes_not_when_the_slowest_of_its_batch_does(
    ai: AiService, model: tuple[FakeModel, str], redis: Redis, keys: Keys, db: asyncpg.Pool,
    project_id: str, template: str,  # noqa: F811
) -> None:
    # Given two tasks read in one batch, the e-mail's answered at once and the SMS's held by
    # a slow model
    fake, _url = model
    fake.answer("Your invoice is paid.")
    fake.hold_sms = True
    email, sms = ai_task(project_id), ai_task(project_id, channel="sms")
    for task in (email, sms):
        await xadd(redis, keys.ai_pending, task, 10_000)
    draining = asyncio.create_task(ai.run_until_idle())
    # When the e-mail's answer has come while the SMS's has not
    async def email_recorded() -> bool:
        return bool(await db.fetchval("SELECT count(*) FROM ai_usage WHERE task_id = $1",
                                      email["taskId"]) == 1)
    # Then the e-mail's content is in ai_usage already: a process dying now leaves a retry
    # that re-uses it rather than asking (and paying) again
    await until_async(email_recorded)
    assert fake.requests == 2
    fake.release.set()
    await draining
    assert await db.fetchval("SELECT count(*) FROM ai_usage WHERE project_id = $1",
                             project_id) == 2
    assert fake.requests == 2


@pytest.mark.parametrize("answer", ['{"to": "someone-else", "admin": true}', "42", "null",
                                    "[1, 2]"])
async def test_a_webhook_answer_that_reads_as_json_is_still_sent_as_the_text_it_is(
    ai: AiService, model: tuple[FakeModel, str], redis: Redis, keys: Keys,
    project_id: str, template: str, answer: str,  # noqa: F811
) -> None:
    # Given a model led (by data in its prompt, say) to answer with what parses as JSON
    fake, _url = model
    fake.answer(answer)
    # When it writes a webhook's body
    await run(ai, redis, keys, [ai_task(project_id, channel="webhook")])
    # Then the receiver gets the text, not a structure the model made up
    [out] = await stream(redis, keys.outbound("normal"))
    assert webhook_body(out["content"]["body"]) == answer


async def test_a_refusal_is_dead_lettered_after_one_request_not_asked_and_paid_for_again(
    ai: AiService, model: tuple[FakeModel, str], redis: Redis, keys: Keys, db: asyncpg.Pool,
    project_id: str, template: str,  # noqa: F811
) -> None:
    # Given a model that refuses (OpenAI: content null, the reason in message.refusal), as it
    # will again for the same prompt
    fake, _url = model
    fake.answer(None)
    fake.body["choices"][0]["message"]["refusal"] = "I'm sorry, I can't help with that."
    task = ai_task(project_id)
    # When the ai service drains its stream
    await run(ai, redis, keys, [task])
    # Then it asked once and the task is dead-lettered saying the model refused, and why
    assert fake.requests == 1
    [dead] = await stream(redis, keys.dlq)
    assert "refused" in dead["error"]
    assert "can't help with that" in dead["error"]
    assert await stream(redis, keys.outbound("normal")) == []


async def test_an_answer_larger_than_any_completion_is_not_read_into_memory_whole() -> None:
    """A gateway before the model answering 200 with an endless (or huge) body was read
    until the timeout, all of it held in memory: a slow provider must grow a pending list,
    never a process's memory (CONTRACT §3). The client stops at a bound no completion
    reaches, and the attempt fails as an unreadable answer does."""
    chunk = b"[" * 65536
    sent = 0

    async def endless(request: web.Request) -> web.StreamResponse:
        nonlocal sent
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        with contextlib.suppress(ConnectionError):
            while True:
                await response.write(chunk)
                sent += len(chunk)
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", endless)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    client = OpenAiClient(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-test",
                          timeout_s=60.0)
    try:
        started = time.monotonic()
        with pytest.raises(RetryLater) as failed:
            await client.complete(model="gpt-4o-mini", task_id="t-1",
                                  messages=[{"role": "user", "content": "hi"}])
        assert time.monotonic() - started < 30
        assert "larger than" in str(failed.value)
        assert sent < 4 * MAX_ANSWER_BYTES
    finally:
        await client.close()
        await runner.cleanup()
