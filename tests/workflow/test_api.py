"""The workflow and usage endpoints with the workflow service behind them: definitions
validated by step, triggers run, instances shown step by step, AI tokens totalled."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import asyncpg
import pytest
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.ids import uuid7
from notifkit.keys import Keys
from notifkit.services.api.routes import workflows as workflow_routes
from notifkit.services.events import EventsService
from notifkit.streams import as_str
from notifkit.workflow_defs import validate_steps
from tests.api.conftest import Api, Project
from tests.support.held_check import HeldCheck
from tests.support.streams import xrange

if TYPE_CHECKING:
    from collections.abc import Callable

    from notifkit.services.workflow import WorkflowService

    from .conftest import FakeClock, ServiceFactory


def break_the_runner(service: WorkflowService, monkeypatch: pytest.MonkeyPatch,
                     ) -> Callable[[], None]:
    """Make every step the service runs fail; the returned call mends it."""
    real_run = service.runner.run

    async def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the database refused the step")

    monkeypatch.setattr(service.runner, "run", broken)
    return lambda: monkeypatch.setattr(service.runner, "run", real_run)


async def record_dead_letters(settings: Settings) -> None:
    """Let the events service record what the workers dead-lettered meanwhile."""
    events = EventsService(settings)
    try:
        await events.run_until_idle()
    finally:
        await events.stop()


async def replay_the_dead_letter(api: Api, redis: Redis, settings: Settings,
                                 key: str | None = None) -> None:
    """Replay the only DLQ entry, with ``key`` or else the admin key."""
    [(dlq_id, _fields)] = await xrange(redis, Keys(settings.namespace).dlq)
    path = f"/v1/dlq/{as_str(dlq_id)}/replay"
    replay = await (api.admin("POST", path) if key is None else api.call("POST", path, key=key))
    assert replay.status == 202, replay.body


async def test_a_definition_is_validated_per_step(api: Api, project: Project) -> None:
    bad = await api.call("PUT", "/v1/workflows/onboarding", key=project.full, json={"steps": [
        {"type": "send", "template": "hello"},
        {"type": "waitForEvent", "event": "clicked", "timeoutSeconds": -1},
        {"type": "branch", "if": "data.x ==", "then": [{"type": "wait"}]},
    ]})
    assert bad.status == 400
    assert {"steps[1].timeoutSeconds", "steps[2].if", "steps[2].then[0].seconds"} <= set(
        bad.fields)


async def test_an_instance_shows_every_step_with_status_output_and_time(
    api: Api, project: Project, make_service: ServiceFactory, clock: FakeClock,
) -> None:
    put = await api.call("PUT", "/v1/workflows/onboarding", key=project.full, json={"steps": [
        {"type": "send", "template": "hello"},
        {"type": "wait", "seconds": 60},
        {"type": "branch", "if": "data.vip", "then": [{"type": "send", "template": "bye"}]},
    ]})
    assert put.status == 201, put.body
    trigger = await api.call("POST", "/v1/workflows/onboarding/trigger", key=project.send,
                             json={"userId": "u1", "data": {"vip": True}})
    assert trigger.status == 202, trigger.body
    instance_id = trigger.body["instanceId"]
    service = make_service()
    await service.run_until_idle()

    waiting = await api.call("GET", f"/v1/workflow-instances/{instance_id}", key=project.full)
    assert waiting.status == 200, waiting.body
    assert (waiting.body["status"], waiting.body["currentStep"]) == ("waiting", 1)
    assert [(s["index"], s["type"], s["status"]) for s in waiting.body["steps"]] == [
        (0, "send", "completed"), (1, "wait", "waiting"),
    ]
    assert waiting.body["steps"][0]["output"]["eventId"]

    clock.advance(60)
    await service.run_until_idle()
    done = await api.call("GET", f"/v1/workflow-instances/{instance_id}", key=project.full)
    assert done.body["status"] == "completed"
    steps = done.body["steps"]
    assert [(s["index"], s.get("path"), s["status"]) for s in steps] == [
        (0, "0", "completed"), (1, "1", "completed"), (2, "2", "completed"),
        (3, "2.then.0", "completed"),
    ]
    assert steps[2]["output"] == {"result": True, "branch": "then"}
    assert all(s["at"] for s in steps)


async def test_a_retried_trigger_runs_the_instance_its_dead_first_attempt_left_pending(
    api: Api, project: Project, db: asyncpg.Pool, make_service: ServiceFactory,
) -> None:
    put = await api.call("PUT", "/v1/workflows/onboarding", key=project.full,
                         json={"steps": [{"type": "send", "template": "hello"}]})
    assert put.status == 201, put.body
    # What an API process killed between its INSERT and its XADD leaves behind: the
    # instance row under the caller's key, no trigger on the stream, no answer in Redis.
    orphan = uuid7()
    await db.execute(
        "INSERT INTO workflow_instances (id, project_id, workflow_id, user_id, status, steps, "
        "trigger_data, idempotency_key) SELECT $1, project_id, id, 'u1', 'pending', steps, "
        "'{}'::jsonb, 'signup-u1' FROM workflow_definitions WHERE project_id = $2",
        orphan, project.id,
    )
    retry = await api.call("POST", "/v1/workflows/onboarding/trigger", key=project.send,
                           json={"userId": "u1"}, headers={"x-idempotency-key": "signup-u1"})
    assert retry.status == 202, retry.body
    assert retry.body == {"instanceId": orphan}

    await make_service().run_until_idle()
    shown = await api.call("GET", f"/v1/workflow-instances/{orphan}", key=project.full)
    assert shown.body["status"] == "completed", shown.body
    again = await api.call("POST", "/v1/workflows/onboarding/trigger", key=project.send,
                           json={"userId": "u1"}, headers={"x-idempotency-key": "signup-u1"})
    assert again.body == {"instanceId": orphan}


async def test_ai_usage_totals_per_project(
    api: Api, project: Project, db: asyncpg.Pool,
) -> None:
    other = await api.project("other")
    rows = [("t1", project.id, "gpt-4o-mini", 10, 5), ("t2", project.id, "gpt-4o-mini", 7, 3),
            ("t3", project.id, "gpt-4o", 1, 1), ("t4", other.id, "gpt-4o", 100, 100)]
    await db.executemany(
        "INSERT INTO ai_usage (task_id, project_id, model, prompt_tokens, completion_tokens) "
        "VALUES ($1, $2, $3, $4, $5)", rows,
    )
    usage = await api.call("GET", "/v1/usage/ai", key=project.full)
    assert usage.status == 200, usage.body
    assert (usage.body["requests"], usage.body["promptTokens"], usage.body["completionTokens"],
            usage.body["totalTokens"]) == (3, 18, 9, 27)
    assert [(m["model"], m["totalTokens"]) for m in usage.body["models"]] == [
        ("gpt-4o", 2), ("gpt-4o-mini", 25)]
    future = await api.call("GET", "/v1/usage/ai", key=project.full,
                            params={"since": "2999-01-01T00:00:00Z"})
    assert future.body["totalTokens"] == 0
    bad = await api.call("GET", "/v1/usage/ai", key=project.full, params={"since": "yesterday"})
    assert bad.status == 400
    assert bad.fields == ["since"]
    swapped = await api.call("GET", "/v1/usage/ai", key=project.full, params={
        "since": "2026-12-02T00:00:00Z", "until": "2026-12-01T00:00:00Z"})
    assert (swapped.status, swapped.fields) == (400, ["until"])
    empty = await api.call("GET", "/v1/usage/ai", key=project.full, params={
        "since": "2026-12-01T00:00:00Z", "until": "2026-12-01T00:00:00Z"})
    assert (empty.status, empty.body["totalTokens"]) == (200, 0)
    assert (await api.call("GET", "/v1/usage/ai", key=project.send)).status == 403


async def test_a_definition_is_checked_while_the_api_answers_other_requests(
    api: Api, project: Project, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Checking a large definition compiles every branch expression (seconds for the largest
    # bodies); on the event loop it held every other request meanwhile.
    check = HeldCheck(validate_steps)
    monkeypatch.setattr(workflow_routes, "validate_steps", check)
    other, put = await check.answers_meanwhile(
        api.call("PUT", "/v1/workflows/w", key=project.full,
                 json={"steps": [{"type": "send", "template": "hello"}]}),
        lambda: api.call("GET", "/v1/workflows/w", key=project.full),
    )
    assert (other.status, put.status) == (404, 201)


async def test_an_instance_whose_entry_was_dead_lettered_reads_failed_and_a_replay_carries_it_on(
    api: Api, project: Project, settings: Settings, make_service: ServiceFactory,
    clock: FakeClock, redis: Redis, monkeypatch: pytest.MonkeyPatch,
) -> None:
    put = await api.call("PUT", "/v1/workflows/later", key=project.full, json={"steps": [
        {"type": "wait", "seconds": 60}, {"type": "send", "template": "hello"},
    ]})
    assert put.status == 201, put.body
    trigger = await api.call("POST", "/v1/workflows/later/trigger", key=project.send,
                             json={"userId": "u1"})
    instance_id = trigger.body["instanceId"]
    chosen = settings.replace(max_attempts=1)
    service = make_service(settings=chosen)
    await service.run_until_idle()
    # Given the wake at the end of the wait failing until it is dead-lettered
    mend = break_the_runner(service, monkeypatch)
    clock.advance(60)
    await service.run_until_idle()
    await record_dead_letters(chosen)
    # Then the instance reads failed, with why
    failed = await api.call("GET", f"/v1/workflow-instances/{instance_id}", key=project.full)
    assert failed.body["status"] == "failed", failed.body
    assert "the database refused the step" in failed.body["error"]
    assert "dead-lettered" in failed.body["error"]
    # And once the cause is gone, replaying the entry from the DLQ carries it on to the end
    mend()
    await replay_the_dead_letter(api, redis, settings, key=project.full)
    await service.run_until_idle()
    done = await api.call("GET", f"/v1/workflow-instances/{instance_id}", key=project.full)
    assert done.body["status"] == "completed", done.body
    assert "error" not in done.body
    assert [(s["type"], s["status"]) for s in done.body["steps"]] == [
        ("wait", "completed"), ("send", "completed"),
    ]


async def test_a_dead_lettered_trigger_fails_its_pending_instance_until_it_is_replayed(
    api: Api, project: Project, settings: Settings, make_service: ServiceFactory,
    redis: Redis, monkeypatch: pytest.MonkeyPatch,
) -> None:
    put = await api.call("PUT", "/v1/workflows/now", key=project.full,
                         json={"steps": [{"type": "send", "template": "hello"}]})
    assert put.status == 201, put.body
    chosen = settings.replace(max_attempts=1)
    service = make_service(settings=chosen)
    await service.open()
    # Given the trigger failing until it is dead-lettered
    mend = break_the_runner(service, monkeypatch)
    trigger = await api.call("POST", "/v1/workflows/now/trigger", key=project.send,
                             json={"userId": "u1"})
    instance_id = trigger.body["instanceId"]
    await service.run_until_idle()
    await record_dead_letters(chosen)
    # Then the instance reads failed, with why
    failed = await api.call("GET", f"/v1/workflow-instances/{instance_id}", key=project.full)
    assert failed.body["status"] == "failed", failed.body
    assert "the database refused the step" in failed.body["error"]
    # And a replay runs it from the start
    mend()
    await replay_the_dead_letter(api, redis, settings, key=project.full)
    await service.run_until_idle()
    done = await api.call("GET", f"/v1/workflow-instances/{instance_id}", key=project.full)
    assert done.body["status"] == "completed", done.body
    assert [(s["type"], s["status"]) for s in done.body["steps"]] == [("send", "completed")]


async def test_a_digest_owner_failed_by_a_dead_letter_takes_in_no_later_trigger(
    api: Api, project: Project, settings: Settings, make_service: ServiceFactory,
    clock: FakeClock, redis: Redis, monkeypatch: pytest.MonkeyPatch,
) -> None:
    put = await api.call("PUT", "/v1/workflows/daily", key=project.full, json={"steps": [
        {"type": "digest", "windowSeconds": 60, "template": "digest"},
    ]})
    assert put.status == 201, put.body
    first = await api.call("POST", "/v1/workflows/daily/trigger", key=project.send,
                           json={"userId": "u1", "data": {"n": 1}})
    owner_id = first.body["instanceId"]
    chosen = settings.replace(max_attempts=1)
    service = make_service(settings=chosen)
    await service.run_until_idle()
    # Given the owner's wake at the end of its window dead-lettered, the instance failed
    mend = break_the_runner(service, monkeypatch)
    clock.advance(60)
    await service.run_until_idle()
    await record_dead_letters(chosen)
    failed = await api.call("GET", f"/v1/workflow-instances/{owner_id}", key=project.full)
    assert failed.body["status"] == "failed", failed.body
    # When the user is triggered again, before anyone replays the dead letter
    mend()
    second = await api.call("POST", "/v1/workflows/daily/trigger", key=project.send,
                            json={"userId": "u1", "data": {"n": 2}})
    await service.run_until_idle()
    # Then the new trigger opens a window of its own, which sends when it ends, instead of
    # joining the failed owner's, which nothing sends unless the dead letter is replayed
    later = await api.call("GET", f"/v1/workflow-instances/{second.body['instanceId']}",
                           key=project.full)
    assert later.body["status"] == "waiting", later.body
    assert "digestedInto" not in (later.body["steps"][0]["output"] or {}), later.body
    clock.advance(60)
    await service.run_until_idle()
    done = await api.call("GET", f"/v1/workflow-instances/{second.body['instanceId']}",
                          key=project.full)
    assert done.body["status"] == "completed", done.body
    assert done.body["steps"][0]["output"]["items"] == 1, done.body
    # And a replay of the dead letter still sends the owner's digest of what it collected
    await replay_the_dead_letter(api, redis, settings)
    await service.run_until_idle()
    resumed = await api.call("GET", f"/v1/workflow-instances/{owner_id}", key=project.full)
    assert resumed.body["status"] == "completed", resumed.body
    assert resumed.body["steps"][0]["output"]["items"] == 1, resumed.body
