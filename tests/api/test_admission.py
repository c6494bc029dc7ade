"""The send path's coalesced round trips: concurrent sends share their queries and XADDs, yet
each one is accepted, refused or rolled back on its own."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, cast

import asyncpg
import pytest
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.ids import uuid7
from notifkit.keys import Keys
from notifkit.messages import InboundMessage
from notifkit.ratelimit import TokenBuckets
from notifkit.services.api.admission import KNOWN_TEMPLATE_TTL_S, Admission, ProjectMissing
from notifkit.services.api.state import ADMISSION
from tests.api.conftest import Api, Project
from tests.support.streams import xrange


@pytest.fixture
async def template(api: Api, project: Project) -> str:
    reply = await api.call("PUT", "/v1/templates/hello", key=project.full, json={
        "channels": {"email": {"subject": "s", "text": "t"}}})
    assert reply.status == 201
    return "hello"


async def test_concurrent_sends_are_each_accepted_recorded_and_enqueued_once(
    api: Api, project: Project, template: str, redis: Redis, db: asyncpg.Pool,
) -> None:
    replies = await asyncio.gather(*(
        api.call("POST", "/v1/notifications", key=project.send,
                 json={"to": f"user-{n}", "template": template, "data": {"n": n}})
        for n in range(60)))

    assert [r.status for r in replies] == [202] * 60
    ids = {r.body["id"] for r in replies}
    assert len(ids) == 60
    stream = Keys(api.settings.namespace).inbound("normal")
    assert await redis.xlen(stream) == 60
    rows = await db.fetch("SELECT id::text, data FROM notifications WHERE project_id = $1",
                          project.id)
    assert {r["id"] for r in rows} == ids
    assert sorted(r["data"]["n"] for r in rows) == list(range(60))
    accepted = await db.fetchval(
        "SELECT count(*) FROM message_logs WHERE project_id = $1 AND kind = 'accepted'",
        project.id)
    assert accepted == 60


async def test_an_unknown_template_among_concurrent_sends_is_refused_alone(
    api: Api, project: Project, template: str,
) -> None:
    names = [template, "nope", template, "nope", template]
    replies = await asyncio.gather(*(
        api.call("POST", "/v1/notifications", key=project.send,
                 json={"to": "u1", "template": name}) for name in names))
    assert [r.status for r in replies] == [202, 400, 202, 400, 202]
    assert replies[1].fields == ["template"]


async def test_a_send_whose_enqueue_fails_leaves_no_rows_and_its_neighbours_are_accepted(
    api: Api, project: Project, template: str, redis: Redis, db: asyncpg.Pool,
) -> None:
    # The low-priority stream's key holds a string, so an XADD to it fails with WRONGTYPE
    # while XADDs to the other priorities in the same pipeline succeed.
    keys = Keys(api.settings.namespace)
    await redis.set(keys.inbound("low"), "not a stream")
    priorities = ["normal", "low", "critical", "low", "normal"]
    replies = await asyncio.gather(*(
        api.call("POST", "/v1/notifications", key=project.send,
                 json={"to": "u1", "template": template, "priority": p}) for p in priorities))

    statuses = [r.status for r in replies]
    assert statuses[0] == statuses[2] == statuses[4] == 202
    assert statuses[1] >= 500
    assert statuses[3] >= 500
    accepted = {r.body["id"] for r in replies if r.status == 202}
    rows = await db.fetch("SELECT id::text FROM notifications WHERE project_id = $1",
                          project.id)
    assert {r["id"] for r in rows} == accepted
    logs = await db.fetch("SELECT event_id::text FROM message_logs WHERE project_id = $1",
                          project.id)
    assert {r["event_id"] for r in logs} == accepted
    assert await redis.xlen(keys.inbound("normal")) == 2
    assert await redis.xlen(keys.inbound("critical")) == 1


async def test_rows_left_by_a_failed_enqueue_with_postgresql_down_too_are_a_warning(
    api: Api, project: Project, template: str, redis: Redis, db: asyncpg.Pool,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """Both stores failing (the enqueue, then the cleanup of its rows) is an outage, not a
    bug: one warning naming the error, no traceback; reconciliation settles the rows."""
    keys = Keys(api.settings.namespace)
    await redis.set(keys.inbound("normal"), "not a stream")

    class DownPool:
        def acquire(self) -> Any:
            raise ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 5432)")

    forget = Admission._forget

    async def forget_with_postgresql_down(self: Admission, messages: Any) -> None:
        real, self.pool = self.pool, cast(asyncpg.Pool, DownPool())
        try:
            await forget(self, messages)
        finally:
            self.pool = real

    monkeypatch.setattr(Admission, "_forget", forget_with_postgresql_down)
    with caplog.at_level(logging.WARNING, logger="notifkit.api"):
        reply = await api.call("POST", "/v1/notifications", key=project.send,
                               json={"to": "u1", "template": template})

    assert reply.status >= 500
    [record] = [r for r in caplog.records if "Could not delete the rows" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert record.exc_info is None
    assert "ConnectionRefusedError" in record.getMessage()
    # The rows stay for reconciliation to settle.
    assert await db.fetchval("SELECT count(*) FROM notifications WHERE project_id = $1",
                             project.id) == 1


async def test_a_send_of_a_vanished_project_fails_alone_and_is_never_enqueued(
    settings: Settings, project: Project, redis: Redis, db: asyncpg.Pool,
) -> None:
    keys = Keys(settings.namespace)
    admission = Admission(settings, keys, redis, db, TokenBuckets(redis))
    gone = str(uuid.uuid4())  # no such project (deleted after its key was read, say)

    def message(project_id: str) -> InboundMessage:
        return {"eventId": uuid7(), "projectId": project_id, "template": "t",
                "to": {"userId": "u1"}, "data": {}, "channels": None, "priority": "normal",
                "sendAt": None, "campaignId": None, "idempotencyKey": None,
                "createdAt": "2026-11-30T00:00:00.000Z"}

    messages = [message(project.id), message(gone), message(project.id)]
    results = await asyncio.gather(*(admission.accept(m) for m in messages),
                                   return_exceptions=True)

    assert results[0] is None
    assert results[2] is None
    assert isinstance(results[1], ProjectMissing)
    entries = await xrange(redis, keys.inbound("normal"))
    assert len(entries) == 2
    written = {messages[0]["eventId"], messages[2]["eventId"]}
    stored = await db.fetch("SELECT id::text FROM notifications")
    assert {r["id"] for r in stored} == written
    logged = await db.fetch("SELECT event_id::text FROM message_logs WHERE kind = 'accepted'")
    assert {r["event_id"] for r in logged} == written

    # Alone in its statement, too.
    with pytest.raises(ProjectMissing):
        await admission.accept(message(gone))
    assert len(await xrange(redis, keys.inbound("normal"))) == 2
    assert await db.fetchval("SELECT count(*) FROM notifications") == 2


async def test_a_row_postgresql_refuses_fails_alone_and_its_neighbours_are_written(
    settings: Settings, project: Project, redis: Redis, db: asyncpg.Pool,
) -> None:
    """The batch statement is all or nothing: when it fails, each row is written on its own,
    so only the one that cannot be written (here a priority the table's check refuses) fails."""
    keys = Keys(settings.namespace)
    admission = Admission(settings, keys, redis, db, TokenBuckets(redis))

    def message(priority: str) -> InboundMessage:
        return {"eventId": uuid7(), "projectId": project.id, "template": "t",
                "to": {"userId": "u1"}, "data": {}, "channels": None, "priority": priority,
                "sendAt": None, "campaignId": None, "idempotencyKey": None,
                "createdAt": "2026-11-30T00:00:00.000Z"}

    messages = [message("normal"), message("urgent"), message("normal")]
    results = await asyncio.gather(*(admission.accept(m) for m in messages),
                                   return_exceptions=True)

    assert results[0] is None
    assert results[2] is None
    assert isinstance(results[1], asyncpg.CheckViolationError)
    assert len(await xrange(redis, keys.inbound("normal"))) == 2
    stored = await db.fetch("SELECT id::text FROM notifications")
    assert {r["id"] for r in stored} == {messages[0]["eventId"], messages[2]["eventId"]}


async def test_a_template_once_found_is_not_looked_up_again_and_an_unknown_one_always_is(
    api: Api, project: Project, template: str, db: asyncpg.Pool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a send that found its template, and a send to a template not created yet
    first = await api.call("POST", "/v1/notifications", key=project.send,
                           json={"to": "u1", "template": template})
    missing = await api.call("POST", "/v1/notifications", key=project.send,
                             json={"to": "u1", "template": "later"})
    assert (first.status, missing.status) == (202, 400)

    # When the first template's row goes away by hand and the second one is created
    await db.execute("DELETE FROM templates WHERE project_id = $1 AND id = $2",
                     project.id, template)
    created = await api.call("PUT", "/v1/templates/later", key=project.full, json={
        "channels": {"email": {"subject": "s", "text": "t"}}})
    assert created.status == 201

    # Then the known one is still accepted without asking PostgreSQL, the new one is found
    again = await api.call("POST", "/v1/notifications", key=project.send,
                           json={"to": "u1", "template": template})
    now_found = await api.call("POST", "/v1/notifications", key=project.send,
                               json={"to": "u1", "template": "later"})
    assert (again.status, now_found.status) == (202, 202)

    # And once the memory expires, the removed one is refused again
    app = api.client.app
    assert app is not None
    gate = app[ADMISSION]
    monkeypatch.setattr(gate, "clock", lambda: time.monotonic() + KNOWN_TEMPLATE_TTL_S + 1)
    expired = await api.call("POST", "/v1/notifications", key=project.send,
                             json={"to": "u1", "template": template})
    assert expired.status == 400


async def test_a_lookup_under_way_when_its_template_is_deleted_is_not_remembered(
    api: Api, project: Project, template: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lookup that read the row before the deletion's message arrived answers for the send
    that asked, but leaves nothing behind: the next send asks PostgreSQL again."""
    app = api.client.app
    assert app is not None
    gate: Admission = app[ADMISSION]
    real_load = gate._load_templates
    reading = asyncio.Event()
    release = asyncio.Event()

    async def slow_load(wanted: list[tuple[str, str]]) -> list[bool]:
        found = await real_load(wanted)  # the row is still there
        reading.set()
        await release.wait()
        return found

    monkeypatch.setattr(gate, "_templates", type(gate._templates)(slow_load))
    lookup = asyncio.create_task(gate.template_exists(project.id, template))
    await reading.wait()
    deleted = await api.call("DELETE", f"/v1/templates/{template}", key=project.full)
    assert deleted.status == 204
    # This process's own deletion is forgotten at once; the lookup was reading before it.
    release.set()
    assert await lookup is True

    monkeypatch.setattr(gate, "_templates", type(gate._templates)(real_load))
    refused = await api.call("POST", "/v1/notifications", key=project.send,
                             json={"to": "u1", "template": template})
    assert (refused.status, refused.fields) == (400, ["template"])


async def test_a_send_of_a_vanished_project_beside_a_refused_row_is_never_enqueued(
    settings: Settings, project: Project, redis: Redis, db: asyncpg.Pool,
) -> None:
    """When the batch statement fails and each row is written alone, a row of a project gone
    meanwhile writes nothing: its send fails as ProjectMissing rather than being enqueued
    with no notification row behind it."""
    keys = Keys(settings.namespace)
    admission = Admission(settings, keys, redis, db, TokenBuckets(redis))
    gone = str(uuid.uuid4())

    def message(project_id: str, priority: str) -> InboundMessage:
        return {"eventId": uuid7(), "projectId": project_id, "template": "t",
                "to": {"userId": "u1"}, "data": {}, "channels": None, "priority": priority,
                "sendAt": None, "campaignId": None, "idempotencyKey": None,
                "createdAt": "2026-11-30T00:00:00.000Z"}

    messages = [message(project.id, "normal"), message(project.id, "urgent"),
                message(gone, "normal")]
    results = await asyncio.gather(*(admission.accept(m) for m in messages),
                                   return_exceptions=True)

    assert results[0] is None
    assert isinstance(results[1], asyncpg.CheckViolationError)
    assert isinstance(results[2], ProjectMissing)
    assert len(await xrange(redis, keys.inbound("normal"))) == 1
    stored = await db.fetch("SELECT id::text FROM notifications")
    assert {r["id"] for r in stored} == {messages[0]["eventId"]}
