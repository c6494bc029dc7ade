"""Tenant isolation, as a property over generated ids, callers and routes.

Every query is scoped by the project of the API key, never by anything in the request. So for
any ids project A creates, project B's keys (full, send, or the admin key naming B) must get
404 on every route that names them, B's lists must show nothing of A's, and nothing B does may
change A's rows in PostgreSQL or A's entries in Redis, even when B has resources with the very
same ids and sends with the very same idempotency key. Each project's user has a send waiting
in the scheduler and a throttle window, as the running pipeline leaves them, so erasing B's
user of the same id shows whether A's are touched. A single route that forgot its
``project_id`` filter would leak another tenant's data: this property runs every project route
the server mounts (a route added without a case here fails it) against generated ids.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from typing import Any, cast
from urllib.parse import quote

import asyncpg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from notifkit.inbox_token import verify_inbox_token
from notifkit.keys import SCHEDULER_SHARDS, Keys, shard_of
from notifkit.services.api.app import operations
from notifkit.services.api.routing import Operation
from notifkit.services.scheduler import encode_entry
from notifkit.streams import decode, xadd
from tests.api.conftest import ADMIN, Api, Project, Reply
from tests.support.streams import xrange, xrevrange

# Caller-chosen ids: printable, no surrounding whitespace (the API's rule), and not the dot
# segments a URL normaliser would collapse. Path segments are percent-encoded, '/' included.
ids = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cc", "Cs", "Zl", "Zp", "Zs")),
    min_size=1, max_size=40,
).filter(lambda s: s.isprintable() and s not in (".", ".."))
idempotency_keys = st.from_regex(r"[A-Za-z0-9:_.-]{1,60}", fullmatch=True)

# Every route a project key or the admin key naming a project can call.
PROJECT_OPS: dict[tuple[str, str], Operation] = {
    (op.method, op.path): op for op in operations() if op.access in ("project", "ops")
}


# A workflow's steps carry no text: its first step's wait says whose it is.
WAIT_MARKERS = {"A": 1111, "B": 2222}


def path(value: str) -> str:
    return quote(value, safe="")


async def populate(api: Api, redis: Redis, db: asyncpg.Pool, project: Project, user: str,
                   template: str, workflow: str, idem: str, marker: str) -> dict[str, Any]:
    """Create one of every resource in ``project``; returns the ids notifkit made."""
    key = project.full
    made: dict[str, Any] = {}
    reply = await api.call("PUT", f"/v1/users/{path(user)}", key=key, json={
        "attributes": {"owner": marker}, "segments": [marker],
        "contacts": [{"channel": "email", "target": f"{marker.lower()}@example.com"}]})
    assert reply.status in (200, 201), reply.body
    made["contact"] = reply.body["contacts"][0]["id"]
    reply = await api.call("PUT", f"/v1/users/{path(user)}/preferences", key=key,
                           json={"topics": {marker: False}, "channels": {"sms": False}})
    assert reply.status == 200, reply.body
    reply = await api.call("PUT", f"/v1/templates/{path(template)}", key=key, json={
        "channels": {"sms": {"text": marker + "{{ user.attributes.owner }}"}}})
    assert reply.status in (200, 201), reply.body
    reply = await api.call("PUT", f"/v1/workflows/{path(workflow)}", key=key, json={"steps": [
        {"type": "wait", "seconds": WAIT_MARKERS[marker]}, {"type": "send", "template": template}]})
    assert reply.status in (200, 201), reply.body
    reply = await api.call("POST", "/v1/notifications", key=project.send,
                           headers={"x-idempotency-key": idem},
                           json={"to": user, "template": template, "campaignId": marker,
                                 # still cancelable: another project's cancel must not be
                                 "sendAt": "2099-01-01T00:00:00Z"})
    assert reply.status == 202, reply.body
    made["event"] = reply.body["id"]
    reply = await api.call("POST", f"/v1/workflows/{path(workflow)}/trigger", key=project.send,
                           headers={"x-idempotency-key": idem + "-trigger"},
                           json={"userId": user})
    assert reply.status == 202, reply.body
    made["instance"] = reply.body["instanceId"]
    made["message"] = str(await db.fetchval(
        "INSERT INTO inapp_messages (project_id, user_id, task_id, event_id, content) "
        "VALUES ($1, $2, $3, $4, $5) RETURNING id",
        project.id, user, str(uuid.uuid4()), made["event"], {"text": marker}))
    made["suppression"] = str(await db.fetchval(
        "INSERT INTO suppressions (project_id, channel, target, reason, detail) "
        "VALUES ($1, 'email', $2, 'bounce', $3) RETURNING id",
        project.id, f"{marker.lower()}@example.com", marker))
    made["task"] = str(uuid.uuid4())
    await db.execute(
        "INSERT INTO ai_usage (task_id, project_id, event_id, model, prompt_tokens, "
        "completion_tokens) VALUES ($1, $2, $3, $4, 7, 11)",
        made["task"], project.id, made["event"], f"model-{marker}")
    keys = Keys(api.settings.namespace)
    # The send as the engine parks it for its sendAt, and the user's throttle window.
    made["scheduled"] = task = str(uuid.uuid4())
    payload = {"taskId": task, "eventId": made["event"], "projectId": project.id,
               "userId": user, "channel": "email", "marker": marker}
    await db.execute(
        "INSERT INTO scheduled_payloads (task_id, project_id, due_at, stream, payload) "
        "VALUES ($1, $2, now() + interval '1 hour', $3, $4)",
        task, project.id, keys.outbound("normal"), payload)
    await redis.hset(keys.scheduled_payloads(shard_of(task)), task,
                     encode_entry(keys.outbound("normal"), project.id, payload))
    await redis.zadd(keys.scheduled_shard(shard_of(task)), {task: 4_102_444_800_000})
    await redis.zadd(keys.throttle(project.id, user), {made["event"]: 4_102_444_800_000})
    made["dlq"] = await xadd(redis, keys.dlq, {
        "stream": keys.enriched("normal"), "group": "notifkit:group:engine",
        "payload": {"projectId": project.id, "eventId": made["event"], "marker": marker},
        "projectId": project.id, "error": "x", "attempts": 3,
        "failedAt": "2030-01-01T00:00:00Z"}, 10_000)
    return made


async def state_of(api: Api, redis: Redis, db: asyncpg.Pool, project: str,
                   idem: str, user: str) -> dict[str, Any]:
    """Everything of ``project`` in PostgreSQL (every table with a project_id) and Redis."""
    tables = await db.fetch(
        "SELECT table_name FROM information_schema.columns WHERE table_schema = "
        "current_schema() AND column_name = 'project_id' ORDER BY table_name")
    assert len(tables) > 10, tables
    state: dict[str, Any] = {}
    for row in tables:
        name = row["table_name"]
        state[name] = [r[0] for r in await db.fetch(
            f'SELECT to_jsonb(t)::text FROM "{name}" t WHERE project_id = $1 ORDER BY 1',
            project)]
    keys = Keys(api.settings.namespace)
    state["dlq"] = [
        (entry_id, fields) for entry_id, fields in await xrange(redis, keys.dlq)
        if decode(fields).get("projectId") == project]
    state["idempotency"] = [await redis.get(keys.api_idempotency(project, key))
                            for key in (idem, idem + "-trigger")]
    state["scheduler"] = []
    for shard in SCHEDULER_SHARDS:
        # The redis fixture never decodes replies.
        waiting = cast(dict[bytes, bytes], await redis.hgetall(keys.scheduled_payloads(shard)))
        for task, value in sorted(waiting.items()):
            if value.split(b"\n")[1].decode() == project:  # stream, project, payload
                state["scheduler"].append(
                    (task, value, await redis.zscore(keys.scheduled_shard(shard), task)))
    state["throttle"] = await redis.zrange(keys.throttle(project, user), 0, -1, withscores=True)
    return state


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(user=ids, template=ids, workflow=ids, idem=idempotency_keys,
       b_reuses_ids=st.booleans(), caller=st.sampled_from(["full", "send", "admin"]))
async def test_ids_of_one_project_are_404_for_another(
    api: Api, redis: Redis, db: asyncpg.Pool, user: str, template: str, workflow: str,
    idem: str, b_reuses_ids: bool, caller: str,
) -> None:
    a = await api.project("A")
    b = await api.project("B")
    made = await populate(api, redis, db, a, user, template, workflow, idem, "A")
    # A's state as A left it: B making resources of the same ids must not change it either.
    before = await state_of(api, redis, db, a.id, idem, user)
    assert before["scheduler"], before
    assert before["throttle"], before
    if b_reuses_ids:
        await populate(api, redis, db, b, user, template, workflow, idem, "B")
    key = {"full": b.full, "send": b.send, "admin": ADMIN}[caller]
    named = b.id if caller == "admin" else None
    keys = Keys(api.settings.namespace)
    # What B's answers must never hold: A's markers, its project id and the ids notifkit made
    # for it (caller-chosen ids are B's own too when it reuses them).
    secrets = [a.id, "model-A", *(str(v) for v in made.values())]
    covered: set[tuple[str, str]] = set()
    exists = b_reuses_ids

    async def call(method: str, route: str, body: Any = None, *,
                   headers: dict[str, str] | None = None, query: dict[str, str] | None = None,
                   **params: str) -> Reply:
        assert (method, route) in PROJECT_OPS, (method, route)
        covered.add((method, route))
        target = route.format(**{name: path(value) for name, value in params.items()})
        reply = await api.call(method, target, key=key, json=body, headers=headers,
                               project=named, params=query)
        assert reply.status < 500, (method, target, reply.body)
        assert "A" not in _markers(reply.body), (method, target, reply.body)
        text = json.dumps(reply.body)
        for secret in secrets:
            if secret not in params.values():  # a 404 may name the id it was asked for
                assert secret not in text, (method, target, secret, reply.body)
        return reply

    def expect(method: str, route: str, status: int | tuple[int, ...]) -> Callable[
            [Reply], None]:
        allowed = caller != "send" or "send" in PROJECT_OPS[(method, route)].roles
        wanted = (status,) if isinstance(status, int) else status

        def verify(reply: Reply) -> None:
            if allowed:
                assert reply.status in wanted, (method, route, reply.status, reply.body)
            else:
                assert reply.status == 403, (method, route, reply.status, reply.body)
                assert reply.error["code"] == "forbidden"
        return verify

    async def check(method: str, route: str, status: int | tuple[int, ...], body: Any = None,
                    *, headers: dict[str, str] | None = None,
                    query: dict[str, str] | None = None, **params: str) -> Reply:
        reply = await call(method, route, body, headers=headers, query=query, **params)
        expect(method, route, status)(reply)
        return reply

    mine = 200 if exists else 404
    # Ids notifkit generated for A never resolve for B.
    await check("GET", "/v1/notifications/{eventId}", 404, eventId=made["event"])
    await check("POST", "/v1/notifications/{eventId}/cancel", 404, eventId=made["event"])
    await check("GET", "/v1/workflow-instances/{instanceId}", 404, instanceId=made["instance"])
    await check("POST", "/v1/workflow-instances/{instanceId}/cancel", 404,
                instanceId=made["instance"])
    await check("DELETE", "/v1/users/{userId}/contacts/{contactId}", 404, userId=user,
                contactId=made["contact"])
    await check("POST", "/v1/users/{userId}/inbox/{messageId}/read", 404, userId=user,
                messageId=made["message"])
    await check("GET", "/v1/dlq/{entryId}", 404, entryId=made["dlq"])
    await check("POST", "/v1/dlq/{entryId}/replay", 404, entryId=made["dlq"])
    await check("DELETE", "/v1/dlq/{entryId}", 404, entryId=made["dlq"])
    await check("DELETE", "/v1/suppressions/{suppressionId}", 404,
                suppressionId=made["suppression"])
    # Suppressing the address A suppressed makes B a suppression of its own.
    await check("POST", "/v1/suppressions", 201, {"channel": "email", "target": "a@example.com"})

    # Caller-chosen ids resolve to B's own resource, or to nothing.
    await check("GET", "/v1/users/{userId}", mine, userId=user)
    await check("GET", "/v1/templates/{templateId}", mine, templateId=template)
    await check("GET", "/v1/workflows/{workflowId}", mine, workflowId=workflow)
    await check("GET", "/v1/users/{userId}/inbox", mine, userId=user)
    # A token for B's user, never for A's user of the same id.
    token = await check("POST", "/v1/users/{userId}/inbox/token", 201 if exists else 404,
                        userId=user)
    if token.status == 201:
        assert verify_inbox_token(api.settings.secret, token.body["token"],
                                  time.time()).project_id == b.id
    preview = await check("POST", "/v1/templates/{templateId}/preview", mine,
                          {"userId": user, "data": {}}, templateId=template)
    if preview.status == 200:  # B's template rendered for B's user
        assert preview.body["channels"]["sms"]["text"] == "BB", preview.body
    await check("GET", "/v1/users/{userId}/preferences", mine, userId=user)
    await check("PUT", "/v1/users/{userId}/preferences", mine, {"topics": {"A": True}},
                userId=user)
    await check("POST", "/v1/users/{userId}/contacts", (200, 201) if exists else 404,
                {"channel": "sms", "target": "+14155550100"}, userId=user)

    # Sends, events and triggers act in B only, whatever key they share with A's. B's record
    # of its trigger's key is gone from Redis, as after 24 h: the instance row answers then.
    await redis.delete(keys.api_idempotency(b.id, idem + "-trigger"))
    for route, body, status in (
        ("/v1/notifications", {"to": user, "template": template}, 202 if exists else 400),
        ("/v1/workflows/{workflowId}/trigger", {"userId": user}, 202 if exists else 404),
    ):
        same_key = idem if route == "/v1/notifications" else idem + "-trigger"
        reply = await check("POST", route, status, body, headers={"x-idempotency-key": same_key},
                            workflowId=workflow)
        # A replay only of B's own first call with that key (call() checks it is none of A's).
        assert ("x-idempotent-replay" in reply.headers) == (exists and reply.status == 202), (
            route, reply.headers, reply.body)
    reply = await check("POST", "/v1/events", 202, {"name": "clicked", "userId": user})
    if reply.status == 202:
        [(_, fields)] = await xrevrange(redis, keys.events_inbound, count=1)
        assert decode(fields)["projectId"] == b.id

    # Lists show nothing of A's (call() checks every answer for A's markers and ids).
    for query in ({}, {"userId": user}, {"campaignId": "A"}, {"status": "accepted"},
                  {"eventId": made["event"]}):
        await check("GET", "/v1/messages", 200, query=query)
    await check("GET", "/v1/dlq", 200)
    # A list of summaries may hold nothing but caller-chosen ids (a template list shows no
    # content): the ids listed must be B's own.
    for route, own in (("/v1/workflows", workflow), ("/v1/templates", template)):
        listed = await check("GET", route, 200)
        if listed.status == 200:
            assert [i["id"] for i in listed.body["items"]] == ([own] if exists else []), (
                route, listed.body)
    for query in ({}, {"channel": "email"}, {"target": "a@example.com"}):
        await check("GET", "/v1/suppressions", 200, query=query)
    await check("GET", "/v1/streams", 200)
    usage = await check("GET", "/v1/usage/ai", 200)
    if usage.status == 200:
        assert usage.body["totalTokens"] == (18 if exists else 0), usage.body

    # The inbox stream carries B's user's messages only, and resumes none of A's.
    await _inbox_stream(api, redis, keys, a, b, key, named, user, made, exists,
                        caller == "send")
    covered.add(("GET", "/v1/users/{userId}/inbox/stream"))

    # B deleting and rewriting its own resources of the same ids leaves A's untouched.
    await check("DELETE", "/v1/users/{userId}", 204 if exists else 404, userId=user)
    await check("DELETE", "/v1/workflows/{workflowId}", 204 if exists else 404,
                workflowId=workflow)
    await check("DELETE", "/v1/templates/{templateId}", 204 if exists else 404,
                templateId=template)
    await check("PUT", "/v1/users/{userId}", 201, {"attributes": {"owner": "B"}}, userId=user)
    await check("PUT", "/v1/templates/{templateId}", 201,
                {"channels": {"sms": {"text": "B"}}}, templateId=template)
    await check("PUT", "/v1/workflows/{workflowId}", 201,
                {"steps": [{"type": "wait", "seconds": 1}]}, workflowId=workflow)

    assert covered == set(PROJECT_OPS), sorted(set(PROJECT_OPS) ^ covered)
    assert await state_of(api, redis, db, a.id, idem, user) == before


async def _inbox_stream(api: Api, redis: Redis, keys: Keys, a: Project, b: Project, key: str,
                        named: str | None, user: str, made: dict[str, Any], exists: bool,
                        send_key: bool) -> None:
    headers = {"Authorization": f"Bearer {key}", "Last-Event-ID": made["message"]}
    if named is not None:
        headers["x-project-id"] = named
    async with api.client.get(f"/v1/users/{path(user)}/inbox/stream",
                              headers=headers) as response:
        if send_key or not exists:
            assert response.status == (403 if send_key else 404)
            return
        assert response.status == 200
        assert await response.content.readuntil(b"\n\n") == b"retry: 3000\n: connected\n\n"
        # A's message for the same user id is published first; B's own after it.
        await redis.publish(keys.inbox_channel(a.id, user), json.dumps({"marker": "A"}))
        await redis.publish(keys.inbox_channel(b.id, user), json.dumps({"marker": "live"}))
        async with asyncio.timeout(10):
            frame = b""
            while b"event: message" not in frame:
                frame = await response.content.readuntil(b"\n\n")
        # Neither A's live message nor anything stored after A's message id came first.
        assert b'"marker": "live"' in frame, frame


def _markers(body: Any) -> set[str]:
    """The owner markers ("A"/"B") a response body carries in the places populate() put them."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if key in ("owner", "marker", "campaignId", "text", "detail") \
                        and item in ("A", "B"):
                    found.add(item)
                if key == "text" and isinstance(item, str) and item.startswith("A"):
                    found.add("A")  # A's template text, raw or rendered
                if key == "seconds" and item == WAIT_MARKERS["A"]:
                    found.add("A")  # A's workflow
                walk(item)
        elif isinstance(value, list):
            for item in value:
                if item in ("A", "B"):
                    found.add(item)
                walk(item)

    walk(body)
    return found
