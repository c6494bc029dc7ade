"""From the HTTP API to the provider and back: POST /v1/notifications, the pipeline drains,
the simulator has the message and GET /v1/notifications/{id} shows every step."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.services.delivery import DeliveryService
from notifkit.services.engine import EngineService, channels
from notifkit.services.enricher import EnricherService
from notifkit.services.events import EventsService
from simulators import SimulatorServer
from tests.api.conftest import Api

from .conftest import ServiceFactory
from .helpers import drain


async def test_a_notification_sent_through_the_api_reaches_the_provider_and_its_timeline(
    api: Api, redis: Redis, services: ServiceFactory, sim: SimulatorServer,
    sim_settings: Settings,
) -> None:
    # Given a project, a user with an e-mail address and a phone, and a template for both
    project = await api.project()
    user = await api.call("PUT", "/v1/users/ada", key=project.full, json={
        "attributes": {"name": "Ada"},
        "contacts": [{"channel": "email", "target": "ada@example.com"},
                     {"channel": "sms", "target": "+15557654321"}],
    })
    assert user.status in (200, 201), user.body
    template = await api.call("PUT", "/v1/templates/welcome", key=project.full, json={
        "channels": {"email": {"subject": "Welcome {{ user.attributes.name }}",
                               "text": "Your plan: {{ data.plan }}"},
                     "sms": {"text": "Welcome to {{ data.plan }}"}},
    })
    assert template.status in (200, 201), template.body

    # When it is sent through the API and the pipeline drains
    accepted = await api.call("POST", "/v1/notifications", key=project.send,
                              json={"to": "ada", "template": "welcome", "data": {"plan": "pro"}})
    assert accepted.status == 202, accepted.body
    await drain(*[await services(cls, sim_settings) for cls in
                  (EnricherService, EngineService, DeliveryService, EventsService)])

    # Then each provider has the rendered message for the right recipient
    [email] = await sim.messages("resend")
    assert (email["to"], email["content"]["subject"]) == ("ada@example.com", "Welcome Ada")
    assert email["content"]["text"] == "Your plan: pro"
    [sms] = await sim.messages("twilio")
    assert (sms["to"], sms["content"]["body"]) == ("+15557654321", "Welcome to pro")

    # And the notification's timeline shows each step for each channel
    shown = await api.call("GET", f"/v1/notifications/{accepted.body['id']}", key=project.full)
    assert shown.status == 200, shown.body
    recipients = {r["channel"]: r for r in shown.body["recipients"]}
    assert set(recipients) == {"email", "sms"}
    for channel, record in (("email", email), ("sms", sms)):
        recipient = recipients[channel]
        assert recipient["userId"] == "ada"
        assert recipient["taskId"] == record["taskId"]
        assert recipient["status"] == "sent"
        assert [step["kind"] for step in recipient["timeline"]] == ["queued", "sent"]
    assert shown.body["status"] == "sent"


async def test_two_projects_sharing_every_caller_chosen_name_each_deliver_their_own(
    api: Api, services: ServiceFactory, sim: SimulatorServer, sim_settings: Settings,
) -> None:
    """Two tenants that chose the same user id, template name, campaign and idempotency key,
    each with a throttle of one send per user: the dedup marks, throttle windows and
    idempotency records are per project, so each gets its own message, once, with its own
    content at its own address."""
    projects = {}
    for name in ("a", "b"):
        project = await api.project(name, throttle={"limit": 1, "windowSeconds": 3600})
        await api.call("PUT", "/v1/users/ada", key=project.full, json={
            "contacts": [{"channel": "email", "target": f"ada@{name}.example.com"}]})
        await api.call("PUT", "/v1/templates/welcome", key=project.full, json={
            "channels": {"email": {"subject": f"From {name}", "text": "{{ data.plan }}"}}})
        projects[name] = project
    events = {}
    for name, project in projects.items():
        accepted = await api.call(
            "POST", "/v1/notifications", key=project.send,
            headers={"x-idempotency-key": "order-42"},
            json={"to": "ada", "template": "welcome", "data": {"plan": name},
                  "campaignId": "launch"})
        assert accepted.status == 202, accepted.body
        assert "x-idempotent-replay" not in accepted.headers
        events[name] = accepted.body["id"]
    assert events["a"] != events["b"]

    await drain(*[await services(cls, sim_settings) for cls in
                  (EnricherService, EngineService, DeliveryService, EventsService)])

    sent = sorted((m["to"], m["content"]["subject"], m["content"]["text"])
                  for m in await sim.messages("resend"))
    assert sent == [("ada@a.example.com", "From a", "a"), ("ada@b.example.com", "From b", "b")]
    for name, project in projects.items():
        shown = await api.call("GET", f"/v1/notifications/{events[name]}", key=project.full)
        assert shown.body["status"] == "sent", shown.body
        [recipient] = shown.body["recipients"]
        assert (recipient["userId"], recipient["status"]) == ("ada", "sent")


async def test_a_templates_content_longer_than_its_provider_takes_is_sent_cut_to_fit(
    api: Api, services: ServiceFactory, sim: SimulatorServer, sim_settings: Settings,
) -> None:
    """An SMS text over Twilio's 1,600 characters (21617) and a push title and body past
    FCM's 4 KB were sent whole, refused for good and dead-lettered, while the preview showed
    them whole: both are cut to fit, the preview shows what the provider gets, and the queued
    row says what was cut."""
    project = await api.project()
    await api.call("PUT", "/v1/users/ada", key=project.full, json={
        "contacts": [{"channel": "sms", "target": "+15557654321"},
                     {"channel": "push", "target": "device-ada"}]})
    template = await api.call("PUT", "/v1/templates/report", key=project.full, json={
        "channels": {"sms": {"text": "Report: {{ data.lines }}"},
                     "push": {"title": "{{ data.headline }}", "body": "{{ data.lines }}"}}})
    assert template.status == 201, template.body
    data = {"lines": "Zeile für Zeile. " * 200, "headline": "日本語の見出し" * 100}
    preview = await api.call("POST", "/v1/templates/report/preview", key=project.full,
                             json={"data": data})
    assert preview.status == 200, preview.body

    accepted = await api.call("POST", "/v1/notifications", key=project.send,
                              json={"to": "ada", "template": "report", "data": data})
    assert accepted.status == 202, accepted.body
    await drain(*[await services(cls, sim_settings) for cls in
                  (EnricherService, EngineService, DeliveryService, EventsService)])

    # The providers took the cut content, the very content the preview showed
    [sms] = await sim.messages("twilio")
    text = sms["content"]["body"]
    assert len(text) == 1599  # 1,600 less the blank before the cut
    assert text.startswith("Report: Zeile für Zeile.")
    assert text.endswith("…")
    assert preview.body["channels"]["sms"] == {"text": text}
    [push] = await sim.messages("fcm")
    notification = push["content"]["notification"]
    assert notification["title"].endswith("…")
    assert notification["body"].endswith("…")
    assert preview.body["channels"]["push"] == notification
    shown = await api.call("GET", f"/v1/notifications/{accepted.body['id']}", key=project.full)
    assert shown.status == 200, shown.body
    assert shown.body["status"] == "sent"
    queued = {r["channel"]: r["timeline"][0] for r in shown.body["recipients"]}
    assert {channel: (step["kind"], step["detail"]) for channel, step in queued.items()} == {
        "sms": ("queued", "queued; sms text cut to 1,600 characters"),
        "push": ("queued", "queued; push title cut to 1,024 bytes; "
                           "push body cut to 2,048 bytes"),
    }


async def test_a_replayed_engine_entry_ends_with_its_channels_outcome(
    api: Api, redis: Redis, services: ServiceFactory, sim: SimulatorServer,
    sim_settings: Settings, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A recipient's engine entry dead-lettered, then replayed once the fault was gone, was
    routed and sent, but its recipient row (channel null) kept the replay's 'processing', so
    the notification read 'processing' for ever."""
    # Given a recipient whose engine entry fails until it is dead-lettered
    project = await api.project()
    await api.call("PUT", "/v1/users/ada", key=project.full,
                   json={"contacts": [{"channel": "email", "target": "ada@example.com"}]})
    await api.call("PUT", "/v1/templates/welcome", key=project.full,
                   json={"channels": {"email": {"subject": "Hi", "text": "Welcome"}}})

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("engine fault")

    # The engine's own reference to decide (it imported the name).
    monkeypatch.setattr("notifkit.services.engine.service.decide", broken)
    stages = [await services(cls, sim_settings) for cls in
              (EnricherService, EngineService, DeliveryService, EventsService)]
    accepted = await api.call("POST", "/v1/notifications", key=project.send,
                              json={"to": "ada", "template": "welcome"})
    event = accepted.body["id"]
    await drain(*stages)
    [dead] = (await api.call("GET", "/v1/dlq", key=project.full)).body["items"]
    assert dead["group"] == "notifkit:group:engine"
    shown = await api.call("GET", f"/v1/notifications/{event}", key=project.full)
    assert shown.body["status"] == "dead_lettered"

    # When the fault is gone and the entry is replayed
    monkeypatch.setattr("notifkit.services.engine.service.decide", channels.decide)
    replay = await api.call("POST", f"/v1/dlq/{dead['id']}/replay", key=project.full)
    assert replay.status == 202, replay.body
    await drain(*stages)

    # Then the e-mail goes out once and the notification ends 'sent', its recipient row
    # (channel null) no longer in progress
    assert len(await sim.messages("resend")) == 1
    shown = await api.call("GET", f"/v1/notifications/{event}", key=project.full)
    by_channel = {r["channel"]: r for r in shown.body["recipients"]}
    assert by_channel["email"]["status"] == "sent"
    assert [e["kind"] for e in by_channel[None]["timeline"]] == [
        "dead_lettered", "replayed", "skipped"]
    assert by_channel[None]["status"] == "skipped"
    assert shown.body["status"] == "sent"
