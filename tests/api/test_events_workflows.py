"""POST /v1/events and the workflow routes: they validate, store and enqueue."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from notifkit.db import workflows as workflows_db
from notifkit.ids import uuid7
from notifkit.keys import Keys
from notifkit.streams import decode
from tests.api.conftest import Api, Project
from tests.support.streams import xrange


async def stream(redis: Redis, name: str) -> list[dict[str, Any]]:
    return [decode(fields) for _id, fields in await xrange(redis, name)]


@pytest.fixture
async def template(api: Api, project: Project) -> str:
    await api.call("PUT", "/v1/templates/welcome", key=project.full,
                   json={"channels": {"email": {"subject": "Hi", "text": "Welcome"}}})
    return "welcome"


async def test_an_event_goes_to_the_events_stream(
    api: Api, project: Project, redis: Redis
) -> None:
    reply = await api.call("POST", "/v1/events", key=project.send,
                           json={"name": "order.paid", "userId": "u1", "data": {"n": 1}})
    assert reply.status == 202
    [event] = await stream(redis, Keys(api.settings.namespace).events_inbound)
    assert event == {"type": "custom", "projectId": project.id, "name": "order.paid",
                     "userId": "u1", "data": {"n": 1}, "eventId": reply.body["id"],
                     "at": event["at"]}
    bad = await api.call("POST", "/v1/events", key=project.send,
                         json={"name": "", "userId": " u", "data": 1})
    assert bad.status == 400
    assert set(bad.fields) == {"name", "userId", "data"}


async def test_an_event_with_an_idempotency_key_is_recorded_once(
    api: Api, project: Project, redis: Redis
) -> None:
    # A retried event would wake a waiting workflow twice; the same key replays the first
    # answer and enqueues nothing, as on a send.
    headers = {"x-idempotency-key": "order-7-paid"}
    body = {"name": "order.paid", "userId": "u1"}
    first = await api.call("POST", "/v1/events", key=project.send, json=body, headers=headers)
    assert first.status == 202, first.body
    assert "x-idempotent-replay" not in first.headers
    again = await api.call("POST", "/v1/events", key=project.send, json=body, headers=headers)
    assert (again.status, again.body) == (202, first.body)
    assert again.headers["x-idempotent-replay"] == "true"
    assert await redis.xlen(Keys(api.settings.namespace).events_inbound) == 1
    # Another key is another event, and a key from a send is not an event's.
    other = await api.call("POST", "/v1/events", key=project.send, json=body,
                           headers={"x-idempotency-key": "order-8-paid"})
    assert other.status == 202
    assert other.body["id"] != first.body["id"]
    await api.call("PUT", "/v1/templates/t", key=project.full,
                   json={"channels": {"sms": {"text": "x"}}})
    sent = await api.call("POST", "/v1/notifications", key=project.send,
                          json={"to": "u1", "template": "t"}, headers={"x-idempotency-key": "s"})
    assert sent.status == 202
    reused = await api.call("POST", "/v1/events", key=project.send, json=body,
                            headers={"x-idempotency-key": "s"})
    assert (reused.status, reused.fields) == (409, ["x-idempotency-key"])
    assert await redis.xlen(Keys(api.settings.namespace).events_inbound) == 2



async def test_a_reused_event_key_does_not_answer_a_body_of_the_wrong_shape(
    api: Api, project: Project, redis: Redis
) -> None:
    """As on a send: the body's shape is checked before the first answer is replayed; a body
    of the right shape, even another one, gets the first answer."""
    headers = {"x-idempotency-key": "order-9-paid"}
    first = await api.call("POST", "/v1/events", key=project.send,
                           json={"name": "order.paid", "userId": "u1"}, headers=headers)
    assert first.status == 202, first.body
    garbled = await api.call("POST", "/v1/events", key=project.send, data=b"[1,",
                             headers={**headers, "content-type": "application/json"})
    assert garbled.status == 400
    for body, field in [({"name": "order.paid"}, "userId"),
                        ({"name": "order.paid", "userId": "u1", "data": 1}, "data"),
                        ({"name": "order.paid", "userId": "u1", "extra": True}, "extra")]:
        reply = await api.call("POST", "/v1/events", key=project.send, json=body,
                               headers=headers)
        assert (reply.status, reply.fields) == (400, [field]), (body, reply.body)
        assert "x-idempotent-replay" not in reply.headers
    other = await api.call("POST", "/v1/events", key=project.send,
                           json={"name": "order.shipped", "userId": "u2"}, headers=headers)
    assert (other.status, other.body) == (202, first.body)
    assert other.headers.get("x-idempotent-replay") == "true"
    assert await redis.xlen(Keys(api.settings.namespace).events_inbound) == 1

STEPS = [
    {"type": "send", "template": "welcome", "channels": ["email"]},
    {"type": "wait", "seconds": 3600},
    {"type": "waitForEvent", "event": "order.paid", "timeoutSeconds": 86400,
     "onTimeout": "continue"},
    {"type": "branch", "if": "steps[2] is none", "then": [
        {"type": "send", "template": "welcome"}], "else": []},
    {"type": "digest", "windowSeconds": 600, "template": "welcome"},
]


async def test_a_workflow_is_stored_and_replaced(
    api: Api, project: Project, template: str
) -> None:
    created = await api.call("PUT", "/v1/workflows/onboarding", key=project.full,
                             json={"steps": STEPS})
    assert created.status == 201, created.body
    assert created.body["steps"] == STEPS
    again = await api.call("PUT", "/v1/workflows/onboarding", key=project.full,
                           json={"steps": STEPS[:1]})
    assert again.status == 200
    fetched = await api.call("GET", "/v1/workflows/onboarding", key=project.full)
    assert fetched.body["steps"] == STEPS[:1]


async def test_workflows_are_listed_page_by_page_and_deleted(
    api: Api, project: Project, template: str, db: asyncpg.Pool
) -> None:
    for name in ("c", "a", "b"):
        await api.call("PUT", f"/v1/workflows/{name}", key=project.full, json={"steps": STEPS})
    other = await api.project("other")
    first = await api.call("GET", "/v1/workflows?limit=2", key=project.full)
    assert first.status == 200, first.body
    assert [w["id"] for w in first.body["items"]] == ["a", "b"]
    rest = await api.call("GET", f"/v1/workflows?limit=2&cursor={first.body['nextCursor']}",
                          key=project.full)
    assert ([w["id"] for w in rest.body["items"]], rest.body["nextCursor"]) == (["c"], None)
    assert (await api.call("GET", "/v1/workflows", key=other.full)).body["items"] == []
    started = await api.call("POST", "/v1/workflows/a/trigger", key=project.send,
                             json={"userId": "u1"})
    assert (await api.call("DELETE", "/v1/workflows/a", key=other.full)).status == 404
    assert (await api.call("DELETE", "/v1/workflows/a", key=project.send)).status == 403
    assert (await api.call("DELETE", "/v1/workflows/a", key=project.full)).status == 204
    assert (await api.call("DELETE", "/v1/workflows/a", key=project.full)).status == 404
    assert (await api.call("GET", "/v1/workflows/a", key=project.full)).status == 404
    again = await api.call("POST", "/v1/workflows/a/trigger", key=project.send,
                           json={"userId": "u1"})
    assert again.status == 404
    # An instance already started keeps its own copy of the steps.
    instance = await api.call("GET", f"/v1/workflow-instances/{started.body['instanceId']}",
                              key=project.full)
    assert instance.status == 200
    bad = await api.call("GET", "/v1/workflows?cursor=nonsense", key=project.full)
    assert (bad.status, bad.fields) == (400, ["cursor"])


async def test_workflow_errors_name_the_step(api: Api, project: Project, template: str) -> None:
    reply = await api.call("PUT", "/v1/workflows/w", key=project.full, json={"steps": [
        {"type": "send"},
        {"type": "wait", "seconds": -1},
        {"type": "branch", "if": "data.x ==", "then": [{"type": "send", "template": "ghost"}]},
        {"type": "teleport"},
    ]})
    assert reply.status == 400
    # one detail per problem: the unknown template too, though other steps are at fault
    assert set(reply.fields) == {"steps[0].template", "steps[1].seconds", "steps[2].if",
                                 "steps[2].then[0].template", "steps[3].type"}
    unknown = await api.call("PUT", "/v1/workflows/w", key=project.full, json={"steps": [
        {"type": "branch", "if": "true", "then": [{"type": "send", "template": "ghost"}]}]})
    assert unknown.fields == ["steps[0].then[0].template"]
    # What a send would refuse is refused here too: a channel named twice, a field no step of
    # that type has
    refused = await api.call("PUT", "/v1/workflows/w", key=project.full, json={"steps": [
        {"type": "send", "template": template, "channels": ["email", "email"]},
        {"type": "wait", "seconds": 5, "bogus": 1}]})
    assert set(refused.fields) == {"steps[0].channels", "steps[1].bogus"}
    # ... and what a send takes is taken: a channel the template has no content for (generic
    # content goes out there)
    no_content = await api.call("PUT", "/v1/workflows/w", key=project.full, json={"steps": [
        {"type": "wait", "seconds": 5},
        {"type": "send", "template": template, "channels": ["email", "push"]}]})
    assert no_content.status == 201, no_content.body
    empty = await api.call("PUT", "/v1/workflows/w", key=project.full, json={"steps": []})
    assert empty.fields == ["steps"]


async def test_a_branch_condition_python_cannot_compile_is_a_400(
    api: Api, project: Project
) -> None:
    """Jinja parses an attribute chain 199 deep; the Python it generates does not compile."""
    reply = await api.call("PUT", "/v1/workflows/w", key=project.full, json={"steps": [
        {"type": "branch", "if": "data" + ".a" * 199, "then": [], "else": []}]})
    assert reply.status == 400, reply.body
    assert reply.fields == ["steps[0].if"]
    assert "nested too deeply" in reply.error["details"][0]["message"]


async def test_a_step_cannot_wait_for_an_event_name_no_event_can_have(
    api: Api, project: Project,
) -> None:
    """POST /v1/events takes names of up to 200 characters, so a waitForEvent step naming a
    longer one would wait until its timeout whatever happened: it is refused up front."""
    longest = {"type": "waitForEvent", "event": "e" * 200, "timeoutSeconds": 60}
    ok = await api.call("PUT", "/v1/workflows/w", key=project.full, json={"steps": [longest]})
    assert ok.status == 201, ok.body
    event = await api.call("POST", "/v1/events", key=project.full,
                           json={"name": "e" * 200, "userId": "u1"})
    assert event.status == 202, event.body
    too_long = await api.call("PUT", "/v1/workflows/w", key=project.full, json={"steps": [
        {**longest, "event": "e" * 201}]})
    assert (too_long.status, too_long.fields) == (400, ["steps[0].event"])


async def test_a_trigger_creates_a_pending_instance_and_enqueues_it(
    api: Api, project: Project, template: str, redis: Redis, db: asyncpg.Pool
) -> None:
    await api.call("PUT", "/v1/workflows/onboarding", key=project.full, json={"steps": STEPS})
    reply = await api.call("POST", "/v1/workflows/onboarding/trigger", key=project.send,
                           json={"userId": "u1", "data": {"plan": "pro"}})
    assert reply.status == 202
    instance_id = reply.body["instanceId"]
    [entry] = await stream(redis, Keys(api.settings.namespace).workflow_inbound)
    assert entry == {"type": "trigger", "projectId": project.id, "workflowId": "onboarding",
                     "instanceId": instance_id, "userId": "u1", "data": {"plan": "pro"}}
    row = await db.fetchrow("SELECT status, steps, trigger_data FROM workflow_instances "
                            "WHERE id = $1", instance_id)
    assert (row["status"], row["steps"], row["trigger_data"]) == ("pending", STEPS,
                                                                 {"plan": "pro"})
    instance = await api.call("GET", f"/v1/workflow-instances/{instance_id}", key=project.full)
    assert instance.status == 200
    assert instance.body["workflowId"] == "onboarding"
    assert instance.body["status"] == "pending"
    assert instance.body["steps"] == []
    missing = await api.call("POST", "/v1/workflows/ghost/trigger", key=project.send,
                             json={"userId": "u1"})
    assert missing.status == 404
    without_data = await api.call("POST", "/v1/workflows/onboarding/trigger",
                                  key=project.send, json={"userId": "u1", "data": None})
    assert without_data.status == 202, without_data.body


async def test_a_trigger_with_an_idempotency_key_starts_one_instance(
    api: Api, project: Project, template: str, redis: Redis
) -> None:
    await api.call("PUT", "/v1/workflows/onboarding", key=project.full, json={"steps": STEPS})
    headers = {"x-idempotency-key": "signup-1"}
    first = await api.call("POST", "/v1/workflows/onboarding/trigger", key=project.send,
                           json={"userId": "u1"}, headers=headers)
    again = await api.call("POST", "/v1/workflows/onboarding/trigger", key=project.send,
                           json={"userId": "u1"}, headers=headers)
    assert first.body == again.body
    assert again.headers["x-idempotent-replay"] == "true"
    # A body of the wrong shape is a 400 whatever the key; another of the right shape gets
    # the first answer.
    without_user = await api.call("POST", "/v1/workflows/onboarding/trigger", key=project.send,
                                  json={"data": {}}, headers=headers)
    assert (without_user.status, without_user.fields) == (400, ["userId"])
    for body, field in [({"userId": 7}, "userId"), ({"userId": "u1", "data": []}, "data"),
                        ({"userId": "u1", "plan": "pro"}, "plan")]:
        reply = await api.call("POST", "/v1/workflows/onboarding/trigger", key=project.send,
                               json=body, headers=headers)
        assert (reply.status, reply.fields) == (400, [field]), (body, reply.body)
    garbled = await api.call("POST", "/v1/workflows/onboarding/trigger", key=project.send,
                             data=b"{", headers={**headers, "content-type": "application/json"})
    assert garbled.status == 400
    other_user = await api.call("POST", "/v1/workflows/onboarding/trigger", key=project.send,
                                json={"userId": "u2"}, headers=headers)
    assert (other_user.status, other_user.body) == (202, first.body)
    assert other_user.headers["x-idempotent-replay"] == "true"
    # What depends on stored state comes after the replay: with the workflow deleted since,
    # the retry still gets its answer.
    deleted = await api.call("DELETE", "/v1/workflows/onboarding", key=project.full)
    assert deleted.status == 204
    retry = await api.call("POST", "/v1/workflows/onboarding/trigger", key=project.send,
                           json={"userId": "u1"}, headers=headers)
    assert (retry.status, retry.body) == (202, first.body)
    assert retry.headers["x-idempotent-replay"] == "true"
    assert await redis.xlen(Keys(api.settings.namespace).workflow_inbound) == 1


async def expire_trigger_key(api: Api, project: Project, redis: Redis, db: asyncpg.Pool,
                             key: str, hours: int) -> None:
    """Age the key's instances by ``hours`` and drop its record from Redis, as its 24 h
    expiry does (or, within them, a Redis that lost its data)."""
    await db.execute("UPDATE workflow_instances SET created_at = created_at - $3::interval "
                     "WHERE project_id = $1 AND idempotency_key = $2",
                     project.id, key, timedelta(hours=hours))
    await redis.delete(Keys(api.settings.namespace).api_idempotency(project.id, key))


async def test_a_key_that_started_another_workflow_is_refused_until_its_24_hours_are_over(
    api: Api, project: Project, template: str, redis: Redis, db: asyncpg.Pool
) -> None:
    for name in ("first", "second"):
        await api.call("PUT", f"/v1/workflows/{name}", key=project.full, json={"steps": STEPS})
    headers = {"x-idempotency-key": "signup-2"}
    first = await api.call("POST", "/v1/workflows/first/trigger", key=project.send,
                           json={"userId": "u1"}, headers=headers)
    assert first.status == 202
    # Redis lost the key's record within its 24 h; the instance row still holds the key.
    await expire_trigger_key(api, project, redis, db, "signup-2", 23)
    other = await api.call("POST", "/v1/workflows/second/trigger", key=project.send,
                           json={"userId": "u2"}, headers=headers)
    assert (other.status, other.body["error"]["code"]) == (409, "idempotency_key_reused")
    same = await api.call("POST", "/v1/workflows/first/trigger", key=project.send,
                          json={"userId": "u1"}, headers=headers)
    assert (same.status, same.body) == (202, first.body)
    # Once they are over, the key is free for any workflow.
    await expire_trigger_key(api, project, redis, db, "signup-2", 2)
    other = await api.call("POST", "/v1/workflows/second/trigger", key=project.send,
                           json={"userId": "u2"}, headers=headers)
    assert other.status == 202, other.body
    assert other.body != first.body


async def test_a_trigger_key_replays_for_24_hours_and_then_starts_a_new_instance(
    api: Api, project: Project, template: str, redis: Redis, db: asyncpg.Pool
) -> None:
    await api.call("PUT", "/v1/workflows/onboarding", key=project.full, json={"steps": STEPS})
    headers = {"x-idempotency-key": "signup-3"}

    async def trigger() -> tuple[int, str, str | None]:
        reply = await api.call("POST", "/v1/workflows/onboarding/trigger", key=project.send,
                               json={"userId": "u1"}, headers=headers)
        return reply.status, reply.body["instanceId"], reply.headers.get("x-idempotent-replay")

    status, first, _ = await trigger()
    assert status == 202
    # 23 h on, with Redis's record lost, the instance row still answers for the key.
    await expire_trigger_key(api, project, redis, db, "signup-3", 23)
    assert await trigger() == (202, first, "true")
    # 25 h on the key's window is over, as a send's is: the same key starts a new instance,
    await expire_trigger_key(api, project, redis, db, "signup-3", 2)
    status, second, replayed = await trigger()
    assert (status, replayed) == (202, None)
    assert second != first
    # which the key answers from then on.
    assert await trigger() == (202, second, "true")
    # (The replay at 23 h queued the first again: no workflow service ran it, so it was
    # still pending.)
    inbound = await stream(redis, Keys(api.settings.namespace).workflow_inbound)
    assert [e["instanceId"] for e in inbound] == [first, first, second]
    keys = await db.fetch("SELECT id::text, idempotency_key FROM workflow_instances "
                          "ORDER BY created_at")
    assert [(r["id"], r["idempotency_key"]) for r in keys] == [(first, None),
                                                                (second, "signup-3")]


async def test_a_trigger_key_replays_for_a_deleted_workflow_after_redis_lost_its_record(
    api: Api, project: Project, template: str, redis: Redis, db: asyncpg.Pool
) -> None:
    """The instance row holds the key for its 24 h whether or not the workflow is still
    there: a retry after both the deletion and Redis losing the key's record gets the first
    answer, as it does with either alone, not a 404."""
    for name in ("onboarding", "other"):
        await api.call("PUT", f"/v1/workflows/{name}", key=project.full, json={"steps": STEPS})
    headers = {"x-idempotency-key": "signup-4"}
    first = await api.call("POST", "/v1/workflows/onboarding/trigger", key=project.send,
                           json={"userId": "u1"}, headers=headers)
    assert first.status == 202, first.body
    for name in ("onboarding", "other"):
        deleted = await api.call("DELETE", f"/v1/workflows/{name}", key=project.full)
        assert deleted.status == 204
    await expire_trigger_key(api, project, redis, db, "signup-4", 23)
    retry = await api.call("POST", "/v1/workflows/onboarding/trigger", key=project.send,
                           json={"userId": "u1"}, headers=headers)
    assert (retry.status, retry.body) == (202, first.body)
    assert retry.headers["x-idempotent-replay"] == "true"
    # Still pending (no workflow service here): queued again, as any replay from the row does,
    # so a trigger whose stream entry went with Redis's data still runs on its own steps.
    inbound = await stream(redis, Keys(api.settings.namespace).workflow_inbound)
    assert [e["instanceId"] for e in inbound] == [first.body["instanceId"]] * 2
    # The key named another workflow, deleted too: that one is unknown, as without a key.
    other = await api.call("POST", "/v1/workflows/other/trigger", key=project.send,
                           json={"userId": "u1"}, headers=headers)
    assert (other.status, other.body["error"]["code"]) == (404, "workflow_not_found")
    # Past the key's 24 h the deleted workflow is unknown again.
    await expire_trigger_key(api, project, redis, db, "signup-4", 2)
    late = await api.call("POST", "/v1/workflows/onboarding/trigger", key=project.send,
                          json={"userId": "u1"}, headers=headers)
    assert (late.status, late.body["error"]["code"]) == (404, "workflow_not_found")


async def test_concurrent_triggers_with_a_key_past_its_24_hours_start_one_instance(
    api: Api, project: Project, template: str, redis: Redis, db: asyncpg.Pool
) -> None:
    await api.call("PUT", "/v1/workflows/onboarding", key=project.full, json={"steps": STEPS})
    headers = {"x-idempotency-key": "signup-5"}
    first = await api.call("POST", "/v1/workflows/onboarding/trigger", key=project.send,
                           json={"userId": "u1"}, headers=headers)
    await expire_trigger_key(api, project, redis, db, "signup-5", 25)
    replies = await asyncio.gather(*(
        api.call("POST", "/v1/workflows/onboarding/trigger", key=project.send,
                 json={"userId": "u1"}, headers=headers) for _ in range(8)))
    assert {r.status for r in replies} == {202}
    [started] = {r.body["instanceId"] for r in replies}
    assert started != first.body["instanceId"]
    assert await db.fetchval("SELECT count(*) FROM workflow_instances") == 2
    assert await redis.xlen(Keys(api.settings.namespace).workflow_inbound) == 2


async def test_concurrent_inserts_under_a_key_past_its_window_make_one_instance(
    api: Api, project: Project, template: str, db: asyncpg.Pool
) -> None:
    """What the unique key and the expiry guarantee without Redis: API processes whose claims
    all went through (a claim outlived, or a Redis that lost them) insert one instance."""
    await api.call("PUT", "/v1/workflows/onboarding", key=project.full, json={"steps": STEPS})

    async def insert() -> bool:
        return await workflows_db.insert_triggered(
            db, instance_id=uuid7(), project_id=project.id, workflow_id="onboarding",
            user_id="u1", steps=STEPS, data={}, idempotency_key="signup-6",
            key_window_s=24 * 3600)

    assert await insert()
    await db.execute("UPDATE workflow_instances SET created_at = now() - interval '25 hours'")
    inserted = await asyncio.gather(*(insert() for _ in range(8)))
    assert sorted(inserted) == [False] * 7 + [True]
    assert await db.fetchval("SELECT count(*) FROM workflow_instances") == 2
    assert await db.fetchval("SELECT count(*) FROM workflow_instances "
                             "WHERE idempotency_key = 'signup-6'") == 1


async def test_instance_steps_come_from_workflow_steps(
    api: Api, project: Project, template: str, db: asyncpg.Pool
) -> None:
    await api.call("PUT", "/v1/workflows/onboarding", key=project.full, json={"steps": STEPS})
    reply = await api.call("POST", "/v1/workflows/onboarding/trigger", key=project.send,
                           json={"userId": "u1"})
    instance_id = reply.body["instanceId"]
    await db.execute(
        "INSERT INTO workflow_steps (instance_id, step_index, path, project_id, type, status, "
        "output, finished_at) VALUES ($1, 0, '0', $2, 'send', 'completed', $3, now())",
        instance_id, project.id, {"eventId": "e1"})
    instance = await api.call("GET", f"/v1/workflow-instances/{instance_id}", key=project.full)
    [step] = instance.body["steps"]
    assert (step["index"], step["type"], step["status"], step["output"]) == (
        0, "send", "completed", {"eventId": "e1"})
