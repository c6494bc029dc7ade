"""POST /v1/notifications (validation, enqueueing, idempotency), its timeline, /v1/messages."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from notifkit.keys import Keys
from notifkit.messages import parse_inbound
from notifkit.services.api.app import operations
from notifkit.services.api.idempotency import replay_earlier
from notifkit.services.api.openapi import document
from notifkit.services.api.routes import notifications as routes
from notifkit.services.api.validation import list_scope, scoped_cursor
from notifkit.streams import decode
from tests.api.conftest import Api, Project
from tests.support.streams import xrange


@pytest.fixture
async def template(api: Api, project: Project) -> str:
    reply = await api.call("PUT", "/v1/templates/invoice", key=project.full, json={
        "channels": {"email": {"subject": "s", "text": "t"}, "sms": {"text": "t"}}})
    assert reply.status == 201
    return "invoice"


async def inbound(redis: Redis, api: Api, priority: str = "normal") -> list[dict[str, Any]]:
    entries = await xrange(redis, Keys(api.settings.namespace).inbound(priority))
    return [decode(fields) for _id, fields in entries]


async def test_a_send_is_accepted_recorded_and_enqueued(
    api: Api, project: Project, template: str, redis: Redis, db: asyncpg.Pool
) -> None:
    reply = await api.call("POST", "/v1/notifications", key=project.send, json={
        "to": ["u1", "u2", "u1"], "template": template, "data": {"amount": "12.00"},
        "channels": ["email"], "priority": "critical", "sendAt": "2026-12-01T10:00:00+01:00",
        "campaignId": "black-friday"})
    assert reply.status == 202
    assert reply.body == {"id": reply.body["id"], "status": "accepted"}
    event_id = reply.body["id"]
    assert uuid.UUID(event_id).version == 7
    [message] = await inbound(redis, api, "critical")
    parse_inbound(message)
    assert message == {
        "eventId": event_id, "projectId": project.id, "template": "invoice",
        "to": {"userIds": ["u1", "u2"]}, "data": {"amount": "12.00"}, "channels": ["email"],
        "priority": "critical", "sendAt": "2026-12-01T09:00:00.000Z",
        "campaignId": "black-friday", "idempotencyKey": None,
        "createdAt": message["createdAt"]}
    row = await db.fetchrow("SELECT * FROM notifications WHERE id = $1", event_id)
    assert row["project_id"] == uuid.UUID(project.id)
    assert row["recipients_spec"] == ["u1", "u2"]
    assert await inbound(redis, api, "normal") == []


@pytest.mark.parametrize(("to", "expected"), [
    ("u1", {"userId": "u1"}), ({"segment": "beta"}, {"segment": "beta"}),
])
async def test_recipients_as_user_or_segment(
    api: Api, project: Project, template: str, redis: Redis, to: Any, expected: Any
) -> None:
    reply = await api.call("POST", "/v1/notifications", key=project.full,
                           json={"to": to, "template": template})
    assert reply.status == 202
    [message] = await inbound(redis, api)
    assert message["to"] == expected
    assert message["channels"] is None


async def test_optional_fields_sent_as_null_are_left_out(
    api: Api, project: Project, template: str, redis: Redis
) -> None:
    """Given a client that spells an absent optional field as null (as GET shows it), when it
    sends, then the send is accepted with the defaults, not refused."""
    reply = await api.call("POST", "/v1/notifications", key=project.send, json={
        "to": "u1", "template": template, "data": None, "channels": None, "priority": None,
        "sendAt": None, "campaignId": None})
    assert reply.status == 202, reply.body
    [message] = await inbound(redis, api)
    assert (message["data"], message["channels"], message["priority"], message["sendAt"],
            message["campaignId"]) == ({}, None, "normal", None, None)
    event = await api.call("POST", "/v1/events", key=project.send,
                           json={"name": "paid", "userId": "u1", "data": None})
    assert event.status == 202, event.body
    preview = await api.call("POST", f"/v1/templates/{template}/preview", key=project.full,
                             json={"data": None})
    assert preview.status == 200, preview.body


@pytest.mark.parametrize(("given", "enqueued"), [
    ("2028-02-29t23:30:00z", "2028-02-29T23:30:00.000Z"),  # leap day, lower-case t and z
    ("2026-12-01T09:00:00.123456789Z", "2026-12-01T09:00:00.123Z"),
    # RFC 3339 bounds no fraction (time-secfrac = "." 1*DIGIT): picoseconds are a time too
    ("2026-12-01T09:00:00.123456789012Z", "2026-12-01T09:00:00.123Z"),
    ("2026-12-01T09:00:00-00:00", "2026-12-01T09:00:00.000Z"),
    ("2026-12-02T00:30:00+14:00", "2026-12-01T10:30:00.000Z"),
    ("2026-03-29T02:30:00+05:45", "2026-03-28T20:45:00.000Z"),
    ("9999-12-31T23:59:59Z", "9999-12-31T23:59:59.000Z"),
    # A leap second (RFC 3339 time-second 60, in the last minute of an hour in the writer's
    # offset) is the instant that follows it, as POSIX time counts it
    ("2016-12-31T23:59:60Z", "2017-01-01T00:00:00.000Z"),
    ("2016-12-31T23:59:60.25Z", "2017-01-01T00:00:00.250Z"),
    ("2017-01-01T05:29:60+05:30", "2017-01-01T00:00:00.000Z"),
])
async def test_a_send_at_in_any_rfc_3339_spelling_is_enqueued_as_the_same_instant_in_utc(
    api: Api, project: Project, template: str, redis: Redis, given: str, enqueued: str
) -> None:
    reply = await api.call("POST", "/v1/notifications", key=project.send, json={
        "to": "u1", "template": template, "sendAt": given})
    assert reply.status == 202, reply.body
    [message] = await inbound(redis, api)
    assert message["sendAt"] == enqueued


@pytest.mark.parametrize(("body", "fields"), [
    ({}, {"to", "template"}),
    ({"to": [], "template": "invoice"}, {"to"}),
    ({"to": ["u"] * 1001, "template": "invoice"}, {"to"}),
    ({"to": ["ok", 5, ""], "template": "invoice"}, {"to[1]", "to[2]"}),
    ({"to": {"segment": ""}, "template": "invoice"}, {"to.segment"}),
    ({"to": {"segment": " \t "}, "template": "invoice"}, {"to.segment"}),
    ({"to": {"segments": "x"}, "template": "invoice"}, {"to.segments", "to.segment"}),
    ({"to": 3, "template": "invoice"}, {"to"}),
    ({"to": "u1", "template": "nope"}, {"template"}),
    ({"to": "u1", "template": "invoice", "channels": ["email", "fax"]}, {"channels[1]"}),
    ({"to": "u1", "template": "invoice", "channels": []}, {"channels"}),
    ({"to": "u1", "template": "invoice", "priority": "urgent"}, {"priority"}),
    ({"to": "u1", "template": "invoice", "sendAt": "tomorrow"}, {"sendAt"}),
    ({"to": "u1", "template": "invoice", "sendAt": "2026-12-01T09:00:00"}, {"sendAt"}),
    # RFC 3339's offset minutes run 00-59 and its hours 00-23: no reading +06:00 into +05:60
    ({"to": "u1", "template": "invoice", "sendAt": "2026-12-01T09:00:00+05:60"}, {"sendAt"}),
    ({"to": "u1", "template": "invoice", "sendAt": "2026-12-01T09:00:00-00:99"}, {"sendAt"}),
    ({"to": "u1", "template": "invoice", "sendAt": "2026-02-29T09:00:00Z"}, {"sendAt"}),
    ({"to": "u1", "template": "invoice", "sendAt": "2026-12-01T09:00:60Z"}, {"sendAt"}),
    ({"to": "u1", "template": "invoice", "sendAt": "9999-12-31T23:59:60Z"}, {"sendAt"}),
    ({"to": "u1", "template": "invoice", "sendAt": "2026-12-01T09:00:00Z\n"}, {"sendAt"}),
    ({"to": "u1", "template": "invoice", "campaignId": 7, "data": []},
     {"campaignId", "data"}),
    ({"to": "u1", "template": "invoice", "extra": 1}, {"extra"}),
])
async def test_every_invalid_field_is_named_and_nothing_is_enqueued(
    api: Api, project: Project, template: str, redis: Redis, body: dict[str, Any],
    fields: set[str],
) -> None:
    reply = await api.call("POST", "/v1/notifications", key=project.send, json=body)
    assert reply.status == 400, reply.body
    assert set(reply.fields) == fields
    assert await inbound(redis, api) == []


async def test_a_campaign_id_is_at_most_255_characters(
    api: Api, project: Project, template: str, redis: Redis
) -> None:
    """One bound for a send, the /v1/messages filter and the OpenAPI document of both: a send
    naming a longer campaign is refused (no filter could find it), the longest one is kept."""
    longest = await api.call("POST", "/v1/notifications", key=project.send,
                             json={"to": "u1", "template": template, "campaignId": "c" * 255})
    too_long = await api.call("POST", "/v1/notifications", key=project.send,
                              json={"to": "u1", "template": template, "campaignId": "c" * 256})
    assert longest.status == 202, longest.body
    assert too_long.status == 400
    assert too_long.error["details"] == [
        {"field": "campaignId", "message": "must be at most 255 characters"}]
    [message] = await inbound(redis, api)
    assert message["campaignId"] == "c" * 255
    for length, status in ((255, 200), (256, 400)):
        filtered = await api.call("GET", "/v1/messages", key=project.full,
                                  params={"campaignId": "c" * length})
        assert filtered.status == status, filtered.body
    doc = document(operations())
    [param] = [p for p in doc["paths"]["/v1/messages"]["get"]["parameters"]
               if p["name"] == "campaignId"]
    [sent, _null] = doc["components"]["schemas"]["NotificationCreate"]["properties"][
        "campaignId"]["anyOf"]
    assert param["schema"]["maxLength"] == sent["maxLength"] == 255


async def test_a_channel_the_template_has_no_content_for_is_accepted(
    api: Api, project: Project, template: str, redis: Redis
) -> None:
    # Only a channel outside the five is a 400 (API.md); the engine sends generic content
    # on a channel the template lacks (tests/sendpath/test_engine.py).
    reply = await api.call("POST", "/v1/notifications", key=project.send,
                           json={"to": "u1", "template": template, "channels": ["push"]})
    assert reply.status == 202, reply.body
    [queued] = await inbound(redis, api)
    assert queued["channels"] == ["push"]


async def test_an_idempotent_replay_returns_the_first_response_and_enqueues_nothing(
    api: Api, project: Project, template: str, redis: Redis, db: asyncpg.Pool
) -> None:
    body = {"to": "u1", "template": template}
    headers = {"x-idempotency-key": "order-42"}
    first = await api.call("POST", "/v1/notifications", key=project.send, json=body,
                           headers=headers)
    stream = Keys(api.settings.namespace).inbound("normal")
    assert first.status == 202
    assert "x-idempotent-replay" not in first.headers
    assert await redis.xlen(stream) == 1
    again = await api.call("POST", "/v1/notifications", key=project.send, json=body,
                           headers=headers)
    assert again.status == 202
    assert again.body == first.body
    assert again.headers["x-idempotent-replay"] == "true"
    assert await redis.xlen(stream) == 1
    assert await db.fetchval("SELECT count(*) FROM notifications") == 1
    [message] = await inbound(redis, api)
    assert message["idempotencyKey"] == "order-42"
    # The key belongs to the project: another project may use the same one.
    other = await api.project("other")
    await api.call("PUT", "/v1/templates/invoice", key=other.full,
                   json={"channels": {"sms": {"text": "t"}}})
    elsewhere = await api.call("POST", "/v1/notifications", key=other.send, json=body,
                               headers=headers)
    assert elsewhere.status == 202
    assert elsewhere.body["id"] != first.body["id"]


async def test_concurrent_identical_requests_enqueue_once(
    api: Api, project: Project, template: str, redis: Redis
) -> None:
    body = {"to": "u1", "template": template}
    replies = await asyncio.gather(*(
        api.call("POST", "/v1/notifications", key=project.send, json=body,
                 headers={"x-idempotency-key": "burst"}) for _ in range(8)))
    assert {r.status for r in replies} == {202}
    assert len({r.body["id"] for r in replies}) == 1
    assert sum(r.headers.get("x-idempotent-replay") == "true" for r in replies) == 7
    assert await redis.xlen(Keys(api.settings.namespace).inbound("normal")) == 1


async def test_a_retry_that_found_no_answer_yet_waits_for_the_first_and_replays_it(
    api: Api, project: Project, template: str, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two requests with one key both look for an earlier answer before either claims the
    key: the loser of the claim waits for the winner's answer and replays it, marked as a
    replay, and nothing is enqueued twice."""
    both_looked = asyncio.Barrier(2)

    async def looked_up_together(*args: Any) -> Any:
        earlier = await replay_earlier(*args)
        await both_looked.wait()
        return earlier

    monkeypatch.setattr(routes, "replay_earlier", looked_up_together)
    body = {"to": "u1", "template": template}
    replies = await asyncio.gather(*(
        api.call("POST", "/v1/notifications", key=project.send, json=body,
                 headers={"x-idempotency-key": "pair"}) for _ in range(2)))
    assert [r.status for r in replies] == [202, 202]
    assert replies[0].body == replies[1].body
    assert sorted(r.headers.get("x-idempotent-replay") or "" for r in replies) == ["", "true"]
    assert await redis.xlen(Keys(api.settings.namespace).inbound("normal")) == 1


async def test_a_reused_key_gets_the_first_response_whatever_the_body(
    api: Api, project: Project, template: str, redis: Redis
) -> None:
    """API.md: the same key again within 24 h -> the first response again, nothing enqueued
    (a retry may rebuild its body); the same key on another route is a 409."""
    headers = {"x-idempotency-key": "k"}
    first = await api.call("POST", "/v1/notifications", key=project.send,
                           json={"to": "u1", "template": template}, headers=headers)
    reply = await api.call("POST", "/v1/notifications", key=project.send,
                           json={"to": "u2", "template": template}, headers=headers)
    assert (reply.status, reply.body) == (202, first.body)
    assert reply.headers.get("x-idempotent-replay") == "true"
    assert await redis.xlen(Keys(api.settings.namespace).inbound("normal")) == 1
    await api.call("PUT", "/v1/workflows/w1", key=project.full,
                   json={"steps": [{"type": "wait", "seconds": 1}]})
    elsewhere = await api.call("POST", "/v1/workflows/w1/trigger", key=project.full,
                               json={"userId": "u1"}, headers=headers)
    assert (elsewhere.status, elsewhere.fields) == (409, ["x-idempotency-key"])
    assert elsewhere.error["code"] == "idempotency_key_reused"
    too_long = await api.call("POST", "/v1/notifications", key=project.send,
                              json={"to": "u1", "template": template},
                              headers={"x-idempotency-key": "k" * 256})
    assert too_long.status == 400
    assert too_long.fields == ["x-idempotency-key"]


@pytest.mark.parametrize("route", ["/v1/notifications", "/v1/events"])
async def test_a_key_is_answered_once_even_if_the_api_dies_right_after_enqueueing(
    api: Api, project: Project, template: str, redis: Redis, db: asyncpg.Pool,
    monkeypatch: pytest.MonkeyPatch, route: str,
) -> None:
    """Given an API process SIGKILLed after it enqueued a keyed send but before it stored the
    response (here: that step never runs), when the client retries with the same key, then
    it gets the first response and nothing is enqueued again. The response used to be stored
    by a separate call after the enqueue: the retry found only the first request's 'pending'
    claim (a 409 for 60 s) and, once that expired, was accepted as a new notification, which
    the enricher then dropped as a duplicate, leaving it 'accepted' for ever."""
    from notifkit.services.api import idempotency

    async def died_before_storing(self: Any, status: int, body: Any) -> None:
        return None

    monkeypatch.setattr(idempotency.IdempotencyKey, "finish", died_before_storing)
    monkeypatch.setattr(idempotency, "WAIT_TOTAL_S", 0.2)  # a pending claim: 409 at once
    keys = Keys(api.settings.namespace)
    stream = keys.inbound("normal") if route == "/v1/notifications" else keys.events_inbound
    body = ({"to": "u1", "template": template} if route == "/v1/notifications"
            else {"name": "paid", "userId": "u1"})
    headers = {"x-idempotency-key": "crash-1"}
    first = await api.call("POST", route, key=project.send, json=body, headers=headers)
    assert first.status == 202
    again = await api.call("POST", route, key=project.send, json=body, headers=headers)
    assert (again.status, again.body) == (202, first.body)
    assert again.headers.get("x-idempotent-replay") == "true"
    assert await redis.xlen(stream) == 1
    if route == "/v1/notifications":
        assert await db.fetchval("SELECT count(*) FROM notifications") == 1


async def test_a_reused_key_does_not_answer_a_body_of_the_wrong_shape(
    api: Api, project: Project, template: str, redis: Redis
) -> None:
    """The body's shape is checked before the first response is replayed: a key a client
    used before does not make malformed JSON, a missing or mistyped field or an unknown one
    acceptable. Each gets the 400 naming the field it gets without a key."""
    headers = {"x-idempotency-key": "rebuilt"}
    first = await api.call("POST", "/v1/notifications", key=project.send,
                           json={"to": "u1", "template": template}, headers=headers)
    assert first.status == 202
    garbled = await api.call("POST", "/v1/notifications", key=project.send,
                             data=b"{not json", headers={**headers,
                                                         "content-type": "application/json"})
    assert garbled.status == 400
    assert "x-idempotent-replay" not in garbled.headers
    for body, field in [({"template": template}, "to"),
                        ({"to": "u1", "template": 7}, "template"),
                        ({"to": "u1", "template": template, "sendAt": "soon"}, "sendAt"),
                        ({"to": "u1", "template": template, "colour": "red"}, "colour")]:
        keyed = await api.call("POST", "/v1/notifications", key=project.send, json=body,
                               headers=headers)
        unkeyed = await api.call("POST", "/v1/notifications", key=project.send, json=body)
        assert (keyed.status, keyed.fields) == (400, [field]), (body, keyed.body)
        assert keyed.body == unkeyed.body
        assert "x-idempotent-replay" not in keyed.headers
    assert await redis.xlen(Keys(api.settings.namespace).inbound("normal")) == 1
    # The key still answers a retry of the right shape with the first response.
    again = await api.call("POST", "/v1/notifications", key=project.send,
                           json={"to": "u1", "template": template}, headers=headers)
    assert (again.status, again.body) == (202, first.body)
    assert again.headers.get("x-idempotent-replay") == "true"


async def test_a_reused_key_replays_even_after_the_template_was_deleted(
    api: Api, project: Project, template: str, redis: Redis
) -> None:
    """What depends on stored state is checked after the replay: a retry of a send that was
    accepted gets its answer although its template is gone since, while without the key the
    same body is a 400."""
    headers = {"x-idempotency-key": "before-delete"}
    body = {"to": "u1", "template": template}
    first = await api.call("POST", "/v1/notifications", key=project.send, json=body,
                           headers=headers)
    assert first.status == 202
    deleted = await api.call("DELETE", f"/v1/templates/{template}", key=project.full)
    assert deleted.status == 204
    again = await api.call("POST", "/v1/notifications", key=project.send, json=body,
                           headers=headers)
    assert (again.status, again.body) == (202, first.body)
    assert again.headers.get("x-idempotent-replay") == "true"
    assert await redis.xlen(Keys(api.settings.namespace).inbound("normal")) == 1
    fresh = await api.call("POST", "/v1/notifications", key=project.send, json=body,
                           headers={"x-idempotency-key": "after-delete"})
    assert (fresh.status, fresh.fields) == (400, ["template"])


async def test_a_failed_send_releases_its_idempotency_key(
    api: Api, project: Project, template: str, redis: Redis
) -> None:
    headers = {"x-idempotency-key": "retry-me"}
    bad = await api.call("POST", "/v1/notifications", key=project.send,
                         json={"to": "u1", "template": "missing"}, headers=headers)
    assert bad.status == 400
    good = await api.call("POST", "/v1/notifications", key=project.send,
                          json={"to": "u1", "template": template}, headers=headers)
    assert good.status == 202
    assert "x-idempotent-replay" not in good.headers


async def log(db: asyncpg.Pool, project: str, event: str, task: str, user: str | None,
              channel: str, kind: str, status: str, at: str, attempt: int = 0,
              campaign: str | None = None, message: str | None = None) -> None:
    await db.execute(
        "INSERT INTO message_logs (project_id, event_id, task_id, user_id, channel, attempt, "
        "kind, status, campaign_id, created_at, provider_message_id) VALUES ($1, $2, $3, $4, "
        "$5, $6, $7, $8, $9, $10::text::timestamptz, $11)",
        project, event, task, user, channel, attempt, kind, status, campaign, at, message)


async def test_the_notification_shows_each_recipients_timeline(
    api: Api, project: Project, template: str, db: asyncpg.Pool
) -> None:
    sent = await api.call("POST", "/v1/notifications", key=project.send,
                          json={"to": ["u1", "u2"], "template": template})
    event = sent.body["id"]
    rows = [
        ("t1", "u1", "email", "queued", "processing", "2030-01-01T00:00:01Z", 0),
        ("t1", "u1", "email", "sent", "sent", "2030-01-01T00:00:02Z", 0),
        ("t1", "u1", "email", "delivered", "delivered", "2030-01-01T00:00:03Z", 0),
        ("t2", "u1", "sms", "sent", "sent", "2030-01-01T00:00:02Z", 0),
        ("t2", "u1", "sms", "queued", "processing", "2030-01-01T00:00:04Z", 1),
        ("t3", "u2", "email", "skipped", "skipped", "2030-01-01T00:00:02Z", 0),
    ]
    for task, user, channel, kind, status, at, attempt in rows:
        await log(db, project.id, event, task, user, channel, kind, status, at, attempt)
    reply = await api.call("GET", f"/v1/notifications/{event}", key=project.full)
    assert reply.status == 200
    body = reply.body
    assert (body["id"], body["template"], body["priority"]) == (event, "invoice", "normal")
    by_task = {r["taskId"]: r for r in body["recipients"]}
    assert by_task["t1"]["status"] == "delivered"
    assert [e["kind"] for e in by_task["t1"]["timeline"]] == ["queued", "sent", "delivered"]
    assert by_task["t2"]["status"] == "sent"  # a later 'processing' never outranks 'sent'
    assert by_task["t3"] == {"userId": "u2", "channel": "email", "taskId": "t3",
                             "status": "skipped", "timeline": by_task["t3"]["timeline"]}
    assert body["status"] == "delivered"
    assert [e["kind"] for e in body["timeline"]] == ["accepted"]
    for missing in ("00000000-0000-7000-8000-000000000000", "nope"):
        assert (await api.call("GET", f"/v1/notifications/{missing}", key=project.full)
                ).status == 404


async def test_a_receipt_of_arrival_after_a_bounce_leaves_the_recipient_failed(
    api: Api, project: Project, template: str, db: asyncpg.Pool
) -> None:
    """Webhooks arrive in any order: a 'delivered' (or an open) the provider posts after its
    bounce of the same message does not make the bounced message, whose address is
    suppressed now, read as delivered. A bounce after a delivery is a late bounce and does
    count; and a push to two devices is two messages, one of which may arrive."""
    sent = await api.call("POST", "/v1/notifications", key=project.send,
                          json={"to": ["u1", "u2"], "template": template})
    event = sent.body["id"]
    rows = [
        ("t1", "u1", "email", "sent", "sent", "m1"),
        ("t1", "u1", "email", "bounced", "failed", "m1"),
        ("t1", "u1", "email", "delivered", "delivered", "m1"),
        ("t1", "u1", "email", "opened", "delivered", "m1"),
        ("t2", "u2", "email", "sent", "sent", "m2"),
        ("t2", "u2", "email", "delivered", "delivered", "m2"),
        ("t2", "u2", "email", "bounced", "failed", "m2"),
        ("t3", "u2", "push", "sent", "sent", "m3"), ("t3", "u2", "push", "bounced", "failed", "m3"),
        ("t3", "u2", "push", "delivered", "delivered", "m4"),
    ]
    for second, (task, user, channel, kind, status, message) in enumerate(rows, start=1):
        await log(db, project.id, event, task, user, channel, kind, status,
                  f"2030-01-01T00:00:{second:02}Z", 1, message=message)
    reply = await api.call("GET", f"/v1/notifications/{event}", key=project.full)
    by_task = {r["taskId"]: r for r in reply.body["recipients"]}
    assert by_task["t1"]["status"] == "failed"
    assert [e["kind"] for e in by_task["t1"]["timeline"]] == [
        "sent", "bounced", "delivered", "opened"]
    assert by_task["t2"]["status"] == "failed"
    assert by_task["t3"]["status"] == "delivered"


async def test_a_timeline_shows_only_its_own_projects_rows(
    api: Api, project: Project, template: str, db: asyncpg.Pool
) -> None:
    """The timeline query is scoped by project like every other: rows another project wrote
    under the same event id (a provider's receipt posted to that project's webhook URL,
    say) are not this notification's."""
    other = await api.project("other")
    sent = await api.call("POST", "/v1/notifications", key=project.send,
                          json={"to": "u1", "template": template})
    event = sent.body["id"]
    await log(db, project.id, event, "t1", "u1", "email", "sent", "sent",
              "2030-01-01T00:00:01Z")
    await log(db, other.id, event, "t1", "u1", "email", "delivered", "delivered",
              "2030-01-01T00:00:02Z")
    await log(db, other.id, event, "t9", "intruder", "sms", "sent", "sent",
              "2030-01-01T00:00:02Z")
    reply = await api.call("GET", f"/v1/notifications/{event}", key=project.full)
    assert reply.status == 200
    [recipient] = reply.body["recipients"]
    assert (recipient["taskId"], recipient["status"]) == ("t1", "sent")
    assert [e["kind"] for e in recipient["timeline"]] == ["sent"]


async def test_a_throttled_recipient_is_an_outcome_not_work_in_progress(
    api: Api, project: Project, template: str, db: asyncpg.Pool
) -> None:
    async def status_of(rows: list[tuple[str, str, str, str]]) -> str:
        sent = await api.call("POST", "/v1/notifications", key=project.send,
                              json={"to": ["u1", "u2"], "template": template})
        event = sent.body["id"]
        for second, (task, user, kind, status) in enumerate(rows, start=1):
            await log(db, project.id, event, task, user, "email", kind, status,
                      f"2030-01-01T00:00:0{second}Z")
        reply = await api.call("GET", f"/v1/notifications/{event}", key=project.full)
        return str(reply.body["status"])

    # A throttled send is dropped for good: the other recipient's delivery is the outcome.
    assert await status_of([("a1", "u1", "sent", "sent"),
                            ("a2", "u2", "throttled", "throttled")]) == "sent"
    assert await status_of([("b1", "u1", "throttled", "throttled"),
                            ("b2", "u2", "skipped", "skipped")]) == "throttled"
    # While another recipient still waits, the notification is not finished.
    assert await status_of([("c1", "u1", "throttled", "throttled"),
                            ("c2", "u2", "deferred", "scheduled")]) == "scheduled"


async def test_a_fallback_chain_that_ended_in_the_dlq_reads_dead_lettered(
    api: Api, project: Project, template: str, db: asyncpg.Pool
) -> None:
    sent = await api.call("POST", "/v1/notifications", key=project.send,
                          json={"to": "u1", "template": template})
    event = sent.body["id"]
    rows = [("p", "push", "queued", "processing"), ("p", "push", "failed", "failed"),
            ("s", "sms", "queued", "processing"), ("s", "sms", "failed", "failed"),
            ("e", "email", "queued", "processing"), ("e", "email", "failed", "processing"),
            ("e", "email", "dead_lettered", "dead_lettered")]
    for second, (task, channel, kind, status) in enumerate(rows, start=1):
        await log(db, project.id, event, task, "u1", channel, kind, status,
                  f"2030-01-01T00:00:0{second}Z", attempt=second)
    reply = await api.call("GET", f"/v1/notifications/{event}", key=project.full)
    # The push and sms rows handed the recipient on; the email task waits in the DLQ.
    assert [r["status"] for r in reply.body["recipients"]] == ["failed", "failed",
                                                                "dead_lettered"]
    assert reply.body["status"] == "dead_lettered"


async def test_before_any_recipient_row_the_events_own_latest_row_is_the_status(
    api: Api, project: Project, template: str, db: asyncpg.Pool
) -> None:
    sent = await api.call("POST", "/v1/notifications", key=project.send,
                          json={"to": {"segment": "nobody"}, "template": template})
    event = sent.body["id"]
    reply = await api.call("GET", f"/v1/notifications/{event}", key=project.full)
    assert (reply.body["status"], reply.body["recipients"]) == ("accepted", [])

    # The enricher's row for a segment without members is about the whole event.
    await log(db, project.id, event, event, None, "", "skipped", "skipped",
              "2030-01-01T00:00:01Z", 0)
    reply = await api.call("GET", f"/v1/notifications/{event}", key=project.full)
    assert (reply.body["status"], reply.body["recipients"]) == ("skipped", [])
    assert [e["kind"] for e in reply.body["timeline"]] == ["accepted", "skipped"]


async def test_messages_filter_and_paginate_with_an_opaque_cursor(
    api: Api, project: Project, db: asyncpg.Pool
) -> None:
    event = str(uuid.uuid4())
    for i in range(7):
        await log(db, project.id, event, f"t{i}", "u1" if i % 2 else "u2",
                  "email" if i < 4 else "sms", "sent", "sent" if i != 3 else "failed",
                  f"2030-01-01T00:00:0{i}Z", campaign="c1" if i < 2 else None)
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": "3", **({"cursor": cursor} if cursor else {})}
        page = await api.call("GET", "/v1/messages", key=project.full, params=params)
        assert page.status == 200
        seen += [item["taskId"] for item in page.body["items"]]
        cursor = page.body["nextCursor"]
        if cursor is None:
            break
    assert seen == [f"t{i}" for i in reversed(range(7))]

    async def tasks(**params: str) -> list[str]:
        reply = await api.call("GET", "/v1/messages", key=project.full, params=params)
        assert reply.status == 200, reply.body
        return [item["taskId"] for item in reply.body["items"]]

    assert await tasks(userId="u1") == ["t5", "t3", "t1"]
    assert await tasks(campaignId="c1") == ["t1", "t0"]
    assert await tasks(status="failed") == ["t3"]
    assert await tasks(channel="sms") == ["t6", "t5", "t4"]
    assert await tasks(channel="email", userId="u2") == ["t2", "t0"]
    assert await tasks(eventId=event, limit="1") == ["t6"]
    for params, field in (({"limit": "0"}, "limit"), ({"limit": "501"}, "limit"),
                          ({"cursor": "garbage"}, "cursor"), ({"status": "gone"}, "status"),
                          ({"channel": "fax"}, "channel"), ({"eventId": "x"}, "eventId"),
                          # digits that are not ASCII ("²", "５"), and more than int() takes
                          ({"limit": "\u00b2"}, "limit"), ({"limit": "\uff15"}, "limit"),
                          ({"limit": "0" * 4400 + "5"}, "limit"),
                          # forged cursors: past bigint, and a bool for the id
                          ({"cursor": scoped_cursor(list_scope("/v1/messages", {}),
                                                    "2030-01-01T00:00:00+00:00", 2**64 - 1)},
                           "cursor"),
                          ({"cursor": scoped_cursor(list_scope("/v1/messages", {}),
                                                    "2030-01-01T00:00:00+00:00", True)},
                           "cursor")):
        reply = await api.call("GET", "/v1/messages", key=project.full, params=params)
        assert reply.status == 400
        assert reply.fields == [field]


async def test_a_cursor_walks_only_the_list_it_came_from(
    api: Api, project: Project, db: asyncpg.Pool
) -> None:
    """Taken to another filter (or path), a cursor answered 200 with that list's rows before
    its position silently left out."""
    event = str(uuid.uuid4())
    for i in range(6):
        await log(db, project.id, event, f"t{i}", "u1" if i % 2 else "u2", "email", "sent",
                  "sent", f"2030-01-01T00:00:0{i}Z")
    first = await api.call("GET", "/v1/messages", key=project.full,
                           params={"userId": "u1", "limit": "1"})
    cursor = first.body["nextCursor"]
    same = await api.call("GET", "/v1/messages", key=project.full,
                          params={"userId": "u1", "limit": "5", "cursor": cursor})
    assert [i["taskId"] for i in same.body["items"]] == ["t3", "t1"]
    for path, params in (("/v1/messages", {"userId": "u2"}), ("/v1/messages", {}),
                         ("/v1/suppressions", {})):
        other = await api.call("GET", path, key=project.full,
                               params={**params, "cursor": cursor})
        assert (other.status, other.fields) == (400, ["cursor"]), other.body
        assert "another list's cursor" in other.body["error"]["details"][0]["message"]


async def test_messages_filter_by_a_time_range_and_page_within_it(
    api: Api, project: Project, db: asyncpg.Pool
) -> None:
    """Given a campaign's log over several seconds, when a client asks for a time range
    (since inclusive, until exclusive, as /v1/usage/ai takes them), then it gets only the rows
    logged in it, newest first, its cursor pages stay in the range, and bounds that are no
    time or that are swapped are a 400 naming them."""
    event = str(uuid.uuid4())
    for i in range(6):
        await log(db, project.id, event, f"t{i}", "u1", "email", "sent", "sent",
                  f"2030-01-01T00:00:0{i}Z", campaign="c1")

    async def tasks(**params: str) -> list[str]:
        seen: list[str] = []
        cursor = None
        while True:
            query = {**params, "limit": "2", **({"cursor": cursor} if cursor else {})}
            reply = await api.call("GET", "/v1/messages", key=project.full, params=query)
            assert reply.status == 200, reply.body
            seen += [item["taskId"] for item in reply.body["items"]]
            cursor = reply.body["nextCursor"]
            if cursor is None:
                return seen

    assert await tasks(campaignId="c1", since="2030-01-01T00:00:01Z",
                       until="2030-01-01T00:00:04Z") == ["t3", "t2", "t1"]
    assert await tasks(since="2030-01-01T01:00:04+01:00") == ["t5", "t4"]
    assert await tasks(until="2030-01-01T00:00:01.000Z") == ["t0"]
    for params, fields in (({"since": "yesterday"}, ["since"]),
                           ({"until": "2030-01-01T00:00:00"}, ["until"]),
                           ({"since": "2030-01-01T00:00:02Z", "until": "2030-01-01T00:00:01Z"},
                            ["until"])):
        reply = await api.call("GET", "/v1/messages", key=project.full, params=params)
        assert (reply.status, reply.fields) == (400, fields), reply.body


async def test_every_bad_query_parameter_is_named_in_one_400(
    api: Api, project: Project
) -> None:
    """Given several bad query parameters at once, the 400 names each of them (the error
    contract's details name every field), not only the first one checked."""
    params = {"limit": "0", "userId": " u1", "campaignId": " ", "eventId": "x",
              "status": "gone", "channel": "fax", "cursor": "garbage"}
    reply = await api.call("GET", "/v1/messages", key=project.full, params=params)
    assert reply.status == 400
    assert sorted(reply.fields) == sorted(params)


async def test_a_filter_left_empty_is_no_filter(
    api: Api, project: Project, db: asyncpg.Pool
) -> None:
    """Given the message log, when a client fills in the documented
    ``/v1/messages?userId=&campaignId=&status=&channel=`` leaving filters empty, then each
    empty one is left out (as an empty ``limit`` or ``cursor`` is), not a 400 and not a filter
    on ''; the filters it fills in still apply."""
    event = str(uuid.uuid4())
    await log(db, project.id, event, "t1", "u1", "email", "sent", "sent",
              "2030-01-01T00:00:01Z", campaign="c1")
    await log(db, project.id, event, "t2", "u2", "sms", "sent", "failed",
              "2030-01-01T00:00:02Z")
    empty = await api.call("GET", "/v1/messages?userId=&campaignId=&status=&channel=",
                           key=project.full)
    assert empty.status == 200, empty.body
    assert [item["taskId"] for item in empty.body["items"]] == ["t2", "t1"]
    some = await api.call(
        "GET", "/v1/messages?userId=u1&campaignId=&status=&channel=&eventId=&since=&until="
               "&limit=&cursor=", key=project.full)
    assert some.status == 200, some.body
    assert [item["taskId"] for item in some.body["items"]] == ["t1"]


async def test_a_filter_given_twice_is_a_400_not_half_a_filter(
    api: Api, project: Project, db: asyncpg.Pool
) -> None:
    """Given messages for two users, when a client repeats a filter (?userId=u1&userId=u2,
    perhaps meaning either), then it gets a 400 naming the parameter, not u1's messages
    alone presented as the answer."""
    event = str(uuid.uuid4())
    await log(db, project.id, event, "t1", "u1", "email", "sent", "sent", "2030-01-01T00:00:01Z")
    await log(db, project.id, event, "t2", "u2", "email", "sent", "sent", "2030-01-01T00:00:02Z")
    for query, field in (("userId=u1&userId=u2", "userId"), ("limit=1&limit=2", "limit"),
                         ("channel=email&channel=sms", "channel")):
        reply = await api.call("GET", f"/v1/messages?{query}", key=project.full)
        assert (reply.status, reply.fields) == (400, [field]), reply.body
    once = await api.call("GET", "/v1/messages?userId=u2", key=project.full)
    assert [item["taskId"] for item in once.body["items"]] == ["t2"]


async def test_a_filter_whose_escapes_are_not_utf8_is_a_400(
    api: Api, project: Project, db: asyncpg.Pool
) -> None:
    """?userId=%FF was read as the user '%FF' (what ?userId=%25FF names): a filter on an id
    no client meant. It is a 400 naming the parameter; escapes of real UTF-8 still work."""
    event = str(uuid.uuid4())
    await log(db, project.id, event, "t1", "%FF", "email", "sent", "sent",
              "2030-01-01T00:00:01Z")
    await log(db, project.id, event, "t2", "é", "email", "sent", "sent", "2030-01-01T00:00:02Z")
    for query in ("userId=%FF", "userId=%ED%A0%80"):
        reply = await api.call("GET", f"/v1/messages?{query}", key=project.full)
        assert (reply.status, reply.fields) == (400, ["userId"]), reply.body
    literal = await api.call("GET", "/v1/messages?userId=%25FF", key=project.full)
    assert literal.status == 200, literal.body
    assert [item["taskId"] for item in literal.body["items"]] == ["t1"]
    accented = await api.call("GET", "/v1/messages?userId=%C3%A9", key=project.full)
    assert [item["taskId"] for item in accented.body["items"]] == ["t2"]


async def test_a_filter_no_send_could_have_used_is_a_400_naming_it(
    api: Api, project: Project, db: asyncpg.Pool
) -> None:
    """Given the message log, when a client filters on a user id a send refuses (white space
    at its ends, an invisible or control character, '..') or on a campaignId of white space
    alone or holding a control character, then it gets a 400 naming the parameter, as that
    value gets in a send's body, not an empty page that reads as 'no messages'; a user id
    with inner spaces still filters."""
    event = str(uuid.uuid4())
    await log(db, project.id, event, "t1", "ada lovelace", "email", "sent", "sent",
              "2030-01-01T00:00:01Z")
    for query, field in (("userId=%20u1", "userId"), ("userId=u1%09", "userId"),
                         ("userId=a%E2%80%8Bb", "userId"), ("userId=..", "userId"),
                         ("campaignId=%20", "campaignId"), ("campaignId=%09%20", "campaignId"),
                         ("campaignId=a%09b", "campaignId"), ("campaignId=c%C2%851", "campaignId")):
        reply = await api.call("GET", f"/v1/messages?{query}", key=project.full)
        assert (reply.status, reply.fields) == (400, [field]), (query, reply.body)
    inner = await api.call("GET", "/v1/messages?userId=ada%20lovelace", key=project.full)
    assert [item["taskId"] for item in inner.body["items"]] == ["t1"]
