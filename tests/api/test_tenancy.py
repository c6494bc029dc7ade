"""Tenant isolation, as a property over generated ids.

Every query is scoped by the project of the API key, never by anything in the request. So for
any ids project A creates, project B's key must get 404 on every route that names them, and
B's lists must show nothing of A's, even when B has resources with the very same ids. A single
route that forgot its ``project_id`` filter would leak another tenant's data: this property
runs every resource route against generated ids to catch it.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import asyncpg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from notifkit.keys import Keys
from notifkit.streams import xadd
from tests.api.conftest import Api, Project

# Caller-chosen ids: printable, no surrounding whitespace (the API's rule), and not the dot
# segments a URL normaliser would collapse. Path segments are percent-encoded, '/' included.
ids = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cc", "Cs", "Zl", "Zp", "Zs")),
    min_size=1, max_size=40,
).filter(lambda s: s.isprintable() and s not in (".", ".."))


def path(value: str) -> str:
    from urllib.parse import quote

    return quote(value, safe="")


async def populate(api: Api, redis: Redis, db: asyncpg.Pool, project: Project, user: str,
                   template: str, workflow: str, marker: str) -> dict[str, Any]:
    """Create one of every resource in ``project``; returns the ids notifkit made."""
    key = project.full
    made: dict[str, Any] = {}
    reply = await api.call("PUT", f"/v1/users/{path(user)}", key=key, json={
        "attributes": {"owner": marker}, "segments": [marker],
        "contacts": [{"channel": "email", "target": f"{marker.lower()}@example.com"}]})
    assert reply.status in (200, 201), reply.body
    made["contact"] = reply.body["contacts"][0]["id"]
    reply = await api.call("PUT", f"/v1/templates/{path(template)}", key=key,
                           json={"channels": {"sms": {"text": marker}}})
    assert reply.status in (200, 201), reply.body
    reply = await api.call("PUT", f"/v1/workflows/{path(workflow)}", key=key,
                           json={"steps": [{"type": "send", "template": template}]})
    assert reply.status in (200, 201), reply.body
    reply = await api.call("POST", "/v1/notifications", key=project.send,
                           json={"to": user, "template": template, "campaignId": marker})
    assert reply.status == 202, reply.body
    made["event"] = reply.body["id"]
    reply = await api.call("POST", f"/v1/workflows/{path(workflow)}/trigger", key=project.send,
                           json={"userId": user})
    assert reply.status == 202, reply.body
    made["instance"] = reply.body["instanceId"]
    made["message"] = str(await db.fetchval(
        "INSERT INTO inapp_messages (project_id, user_id, task_id, event_id, content) "
        "VALUES ($1, $2, $3, $4, $5) RETURNING id",
        project.id, user, str(uuid.uuid4()), made["event"], {"text": marker}))
    keys = Keys(api.settings.namespace)
    made["dlq"] = await xadd(redis, keys.dlq, {
        "stream": keys.enriched("normal"), "group": "notifkit:group:engine",
        "payload": {"projectId": project.id, "marker": marker}, "projectId": project.id,
        "error": "x", "attempts": 3, "failedAt": "2030-01-01T00:00:00Z"}, 10_000)
    return made


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(user=ids, template=ids, workflow=ids, b_reuses_ids=st.booleans())
async def test_ids_of_one_project_are_404_for_another(
    api: Api, redis: Redis, db: asyncpg.Pool, user: str, template: str, workflow: str,
    b_reuses_ids: bool,
) -> None:
    a = await api.project("A")
    b = await api.project("B")
    made = await populate(api, redis, db, a, user, template, workflow, "A")
    if b_reuses_ids:
        await populate(api, redis, db, b, user, template, workflow, "B")
    key = b.full
    u, t, w = path(user), path(template), path(workflow)

    async def status(method: str, route: str, body: Any = None, **kw: Any) -> int:
        reply = await api.call(method, route, key=key, json=body, **kw)
        assert "A" not in _markers(reply.body), (method, route, reply.body)
        return reply.status

    # Ids notifkit generated for A never resolve for B.
    assert await status("GET", f"/v1/notifications/{made['event']}") == 404
    assert await status("GET", f"/v1/workflow-instances/{made['instance']}") == 404
    assert await status("DELETE", f"/v1/users/{u}/contacts/{made['contact']}") == 404
    assert await status("POST", f"/v1/users/{u}/inbox/{made['message']}/read") == 404
    assert await status("POST", f"/v1/dlq/{made['dlq']}/replay") == 404
    assert await status("DELETE", f"/v1/dlq/{made['dlq']}") == 404

    # Caller-chosen ids resolve to B's own resource, or to nothing.
    expected = 200 if b_reuses_ids else 404
    assert await status("GET", f"/v1/users/{u}") == expected
    assert await status("GET", f"/v1/templates/{t}") == expected
    assert await status("GET", f"/v1/workflows/{w}") == expected
    assert await status("GET", f"/v1/users/{u}/inbox") == expected
    assert await status("POST", f"/v1/templates/{t}/preview", {"data": {}}) == expected
    assert await status("PUT", f"/v1/users/{u}/preferences", {"topics": {"x": False}}) \
        == expected
    assert await status("POST", f"/v1/users/{u}/contacts",
                        {"channel": "sms", "target": "+14155550100"}) in (
        (200, 201) if b_reuses_ids else (404,))
    trigger = await status("POST", f"/v1/workflows/{w}/trigger", {"userId": user})
    assert trigger == (202 if b_reuses_ids else 404)
    send = await status("POST", "/v1/notifications", {"to": user, "template": template})
    assert send == (202 if b_reuses_ids else 400)

    # Lists show nothing of A's.
    for route in ("/v1/messages", "/v1/dlq", f"/v1/users/{u}/inbox"):
        reply = await api.call("GET", route, key=key)
        assert "A" not in _markers(reply.body), route
        if reply.status == 200:
            text = json.dumps(reply.body)
            for value in made.values():
                assert str(value) not in text, (route, value)

    # B deleting its own user of the same id leaves A's untouched.
    assert await status("DELETE", f"/v1/users/{u}") == (204 if b_reuses_ids else 404)
    mine = await api.call("GET", f"/v1/users/{u}", key=a.full)
    assert mine.status == 200
    assert mine.body["attributes"] == {"owner": "A"}
    assert [c["id"] for c in mine.body["contacts"]][:1] == [made["contact"]]
    assert (await api.call("GET", f"/v1/templates/{t}", key=a.full)).body["channels"] == {
        "sms": {"text": "A"}}


def _markers(body: Any) -> set[str]:
    """The owner markers ("A"/"B") a response body carries in the places populate() put them."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if key in ("owner", "marker", "campaignId", "text") and item in ("A", "B"):
                    found.add(item)
                walk(item)
        elif isinstance(value, list):
            for item in value:
                if item in ("A", "B"):
                    found.add(item)
                walk(item)

    walk(body)
    return found
