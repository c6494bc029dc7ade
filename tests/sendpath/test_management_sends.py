"""What the management routes change on the real send path: a deleted suppression lets the
next send out, and a deleted template settles the sends already accepted for it (failed,
'template not found') without a dead letter, while a task already routed goes out."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.keys import Keys
from notifkit.services.base import Service
from notifkit.services.delivery import DeliveryService
from notifkit.services.engine import EngineService
from notifkit.services.enricher import EnricherService
from notifkit.services.events import EventsService
from simulators import SimulatorServer
from tests.api.conftest import Api, Project

from .conftest import ServiceFactory
from .helpers import drain

WELCOME = {"channels": {"email": {"subject": "Welcome", "text": "Hello {{ data.n }}"}}}


@pytest.fixture
async def pipeline(services: ServiceFactory, sim_settings: Settings) -> list[Service]:
    return [await services(cls, sim_settings) for cls in
            (EnricherService, EngineService, DeliveryService, EventsService)]


async def ada_with_welcome(api: Api) -> Project:
    project = await api.project()
    user = await api.call("PUT", "/v1/users/ada", key=project.full, json={
        "contacts": [{"channel": "email", "target": "ada@example.com"}]})
    assert user.status in (200, 201), user.body
    template = await api.call("PUT", "/v1/templates/welcome", key=project.full, json=WELCOME)
    assert template.status in (200, 201), template.body
    return project


async def send(api: Api, project: Project, n: int) -> str:
    accepted = await api.call("POST", "/v1/notifications", key=project.send,
                              json={"to": "ada", "template": "welcome", "data": {"n": n}})
    assert accepted.status == 202, accepted.body
    event_id: str = accepted.body["id"]
    return event_id


async def shown(api: Api, project: Project, event_id: str) -> dict[str, Any]:
    reply = await api.call("GET", f"/v1/notifications/{event_id}", key=project.full)
    assert reply.status == 200, reply.body
    body: dict[str, Any] = reply.body
    return body


async def test_a_deleted_suppression_lets_the_next_send_reach_the_provider(
    api: Api, db: asyncpg.Pool, pipeline: list[Service], sim: SimulatorServer, redis: Redis,
    sim_settings: Settings,
) -> None:
    # Given Ada's address was suppressed (as the events service records a hard bounce)
    project = await ada_with_welcome(api)
    await db.execute(
        "INSERT INTO suppressions (project_id, channel, target, reason, detail) "
        "VALUES ($1, 'email', 'ada@example.com', 'bounce', 'mailbox does not exist')",
        project.id)

    # When a send goes through the pipeline it is not sent: the timeline says suppressed
    first = await send(api, project, 1)
    await drain(*pipeline)
    assert await sim.messages("resend") == []
    before = await shown(api, project, first)
    assert before["status"] == "suppressed", before
    [recipient] = before["recipients"]
    assert "address suppressed (bounce)" in recipient["timeline"][-1]["detail"]

    # And once the suppression is found and deleted through the API
    listed = await api.call("GET", "/v1/suppressions", key=project.full,
                            params={"channel": "email", "target": "ada@example.com"})
    [suppression] = listed.body["items"]
    assert suppression["reason"] == "bounce"
    deleted = await api.call("DELETE", f"/v1/suppressions/{suppression['id']}",
                             key=project.full)
    assert deleted.status == 204, deleted.body

    # Then the very next send is delivered to the provider (no cache holds the old answer)
    second = await send(api, project, 2)
    await drain(*pipeline)
    [email] = await sim.messages("resend")
    assert (email["to"], email["content"]["text"]) == ("ada@example.com", "Hello 2")
    assert (await shown(api, project, second))["status"] == "sent"
    # The first send stays what it was: deleting the suppression re-sends nothing.
    assert (await shown(api, project, first))["status"] == "suppressed"
    assert await redis.xlen(Keys(sim_settings.namespace).dlq) == 0


async def test_a_suppression_added_through_the_api_stops_the_next_send(
    api: Api, pipeline: list[Service], sim: SimulatorServer,
) -> None:
    project = await ada_with_welcome(api)
    added = await api.call("POST", "/v1/suppressions", key=project.full,
                           json={"channel": "email", "target": "ada@EXAMPLE.com"})
    assert added.status == 201, added.body

    event_id = await send(api, project, 1)
    await drain(*pipeline)
    assert await sim.messages("resend") == []
    after = await shown(api, project, event_id)
    assert after["status"] == "suppressed", after
    [recipient] = after["recipients"]
    assert "address suppressed (manual)" in recipient["timeline"][-1]["detail"]


async def test_sends_of_a_deleted_template_fail_on_their_timeline_without_a_dead_letter(
    api: Api, pipeline: list[Service], sim: SimulatorServer,
    redis: Redis, sim_settings: Settings,
) -> None:
    project = await ada_with_welcome(api)
    enricher, engine, *_rest = pipeline
    # One send already routed by the engine (its content rendered) and one only accepted
    routed = await send(api, project, 1)
    await drain(enricher, engine)
    waiting = await send(api, project, 2)

    # When the template is deleted before the pipeline goes on
    assert (await api.call("DELETE", "/v1/templates/welcome", key=project.full)).status == 204
    await drain(*pipeline)

    # Then the routed task is delivered with the content rendered before the deletion,
    [email] = await sim.messages("resend")
    assert email["content"]["text"] == "Hello 1"
    assert (await shown(api, project, routed))["status"] == "sent"
    # and the accepted one ends failed, saying why, with nothing dead-lettered or pending
    failed = await shown(api, project, waiting)
    assert failed["status"] == "failed", failed
    [row] = [r for r in failed["recipients"] if r["status"] == "failed"]
    assert row["timeline"][-1]["detail"] == "template not found"
    keys = Keys(sim_settings.namespace)
    assert await redis.xlen(keys.dlq) == 0
    for service in pipeline:
        assert await service.run_until_idle() == 0


async def test_a_fallback_whose_template_was_deleted_fails_on_the_next_channel(
    api: Api, pipeline: list[Service], sim: SimulatorServer,
) -> None:
    # Given Ada reachable by SMS and e-mail, a template falling back from SMS to e-mail, and
    # Twilio failing
    project = await api.project()
    user = await api.call("PUT", "/v1/users/ada", key=project.full, json={"contacts": [
        {"channel": "sms", "target": "+15550000001"},
        {"channel": "email", "target": "ada@example.com"}]})
    assert user.status in (200, 201), user.body
    template = await api.call("PUT", "/v1/templates/welcome", key=project.full, json={
        "channels": {"sms": {"text": "Hi {{ data.n }}"}, **WELCOME["channels"]},
        "fallback": ["sms", "email"]})
    assert template.status in (200, 201), template.body
    await sim.add_fault("error", "twilio", status=400)
    enricher, engine, delivery, _events = pipeline
    event_id = await send(api, project, 1)
    await drain(enricher, engine)
    await drain(delivery)  # the SMS fails for good: its fallback waits for the engine

    # When the template is deleted before the fallback to e-mail is routed
    assert (await api.call("DELETE", "/v1/templates/welcome", key=project.full)).status == 204
    await drain(*pipeline)

    # Then nothing is sent by e-mail, and the e-mail's row says why (it had no channel)
    assert await sim.messages("resend") == []
    body = await shown(api, project, event_id)
    email = [r for r in body["recipients"] if r["channel"] == "email"]
    assert [r["timeline"][-1]["detail"] for r in email] == ["template not found"], body
    assert sorted(str(r["channel"]) for r in body["recipients"]) == ["email", "sms"], body
