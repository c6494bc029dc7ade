"""The whole send path against the provider simulators: inbound -> enricher -> engine ->
delivery -> provider, with the failure classes of CONTRACT §5."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from typing import Any

import aiosmtplib
import asyncpg
import pytest
from aiohttp import web
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.keys import Keys
from notifkit.services.delivery import DeliveryService
from notifkit.services.delivery import service as delivery_service
from notifkit.services.engine import EngineService
from notifkit.services.enricher import EnricherService
from notifkit.services.events import EventsService
from notifkit.services.scheduler import SchedulerService
from notifkit.streams import ensure_group, xadd
from notifkit.transports.base import Message, Outcome, SendResult
from notifkit.transports.inapp import InAppTransport
from notifkit.transports.smtp import SmtpTransport
from notifkit.transports.webhook import SIGNATURE_HEADER, verify
from notifkit.worker import batch_stream
from simulators import SimulatorServer
from tests.support.streams import xrange
from tests.support.waiting import until_async

from .conftest import ServiceFactory, simulated
from .helpers import add_project, add_template, add_user, drain, entries, send, timeline

EMAIL = {"subject": "Invoice {{ data.amount }}", "text": "Hi {{ user.attributes.name }}"}
SMS = {"text": "Paid {{ data.amount }}"}
PUSH = {"title": "Paid", "body": "Amount {{ data.amount }}"}


async def stages(services: ServiceFactory, settings: Settings) -> tuple[Any, ...]:
    return (await services(EnricherService, settings),
            await services(EngineService, settings),
            await services(DeliveryService, settings))


async def with_events(services: ServiceFactory, settings: Settings) -> tuple[Any, ...]:
    """The send path plus the events service, which writes the outcome events' rows: they
    must land on delivery's own rows, not repeat them."""
    return (*await stages(services, settings), await services(EventsService, settings))


def kinds(rows: list[dict[str, Any]], channel: str) -> list[tuple[str, str, int]]:
    return [(r["kind"], r["status"], r["attempt"]) for r in rows if r["channel"] == channel]


async def test_a_notification_reaches_the_providers_rendered_with_its_timeline(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    # Given a user with an address, a number and a device, and a template for all three
    await add_user(db, project, "u1", attributes={"name": "Ada"},
                   contacts=[("email", "ada@example.com"), ("sms", "+15557654321"),
                             ("push", "device-1")])
    await add_template(db, project, "invoice", {"email": EMAIL, "sms": SMS, "push": PUSH})
    pipeline = await with_events(services, sim_settings)

    # When a notification is sent and the pipeline drains
    event_id = await send(redis, keys, db, project, "invoice", "u1", data={"amount": "12.00"})
    await drain(*pipeline)

    # Then each provider received its rendered message for the right recipient
    [email] = await sim.messages("resend")
    assert email["to"] == "ada@example.com"
    assert email["content"]["subject"] == "Invoice 12.00"
    assert email["content"]["text"] == "Hi Ada"
    assert email["content"]["headers"]["List-Unsubscribe"].startswith(
        "<http://127.0.0.1:8080/v1/unsubscribe?token=")
    assert email["content"]["headers"]["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert email["idempotencyKey"] == email["taskId"]
    [sms] = await sim.messages("twilio")
    assert (sms["to"], sms["content"]["body"]) == ("+15557654321", "Paid 12.00")
    [push] = await sim.messages("fcm")
    assert push["to"] == "device-1"
    assert push["content"]["notification"] == {"title": "Paid", "body": "Amount 12.00"}

    # And the timeline shows each step, with the provider's message id
    rows = await timeline(db, event_id)
    for channel, record in (("email", email), ("sms", sms), ("push", push)):
        assert kinds(rows, channel) == [("queued", "processing", 0), ("sent", "sent", 1)]
        sent = next(r for r in rows if r["channel"] == channel and r["kind"] == "sent")
        assert sent["task_id"] == record["taskId"]
        assert sent["provider_message_id"]
    # And outcome events went to the events stream, and the outbox says sent
    events = await entries(redis, keys.events_inbound)
    assert sorted((e["type"], e["channel"]) for e in events) == [
        ("notification:sent", "email"), ("notification:sent", "push"),
        ("notification:sent", "sms")]
    statuses = await db.fetch("SELECT status FROM delivery_outbox WHERE project_id = $1",
                              project)
    assert [r["status"] for r in statuses] == ["sent"] * 3


async def test_nothing_is_sent_where_preferences_suppressions_or_contacts_say_no(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    await add_user(db, project, "pref", contacts=[("sms", "+15550000001")],
                   channels={"sms": False})
    await add_user(db, project, "topic", contacts=[("sms", "+15550000002")],
                   topics={"billing": False})
    await add_user(db, project, "supp", contacts=[("sms", "+15550000003")])
    await db.execute("INSERT INTO suppressions (project_id, channel, target, reason) "
                     "VALUES ($1, 'sms', '+15550000003', 'complaint')", project)
    await add_user(db, project, "none")
    await add_template(db, project, "t", {"sms": SMS}, topic="billing")

    event_id = await send(redis, keys, db, project, "t", ["pref", "topic", "supp", "none"],
                          data={"amount": "1"})
    await drain(*await stages(services, sim_settings))

    assert await sim.messages() == []
    reasons = {r["user_id"]: r["detail"] for r in await timeline(db, event_id)}
    assert reasons == {"pref": "channel disabled by preference",
                       "topic": "topic opted out (billing)",
                       "supp": "address suppressed (complaint)", "none": "no contact"}


async def test_a_push_outage_falls_back_to_exactly_one_sms_per_recipient(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    # Given five users with a device and a number, a template falling back push -> sms,
    # and a push provider answering 503 to everything
    users = [f"u{i}" for i in range(5)]
    for i, user in enumerate(users):
        await add_user(db, project, user,
                       contacts=[("push", f"device-{i}"), ("sms", f"+1555000000{i}")])
    await add_template(db, project, "alert", {"push": PUSH, "sms": SMS},
                       fallback=["push", "sms"])
    await sim.add_fault("error", "fcm", status=503)

    event_id = await send(redis, keys, db, project, "alert", users, data={"amount": "9"})
    await drain(*await with_events(services, sim_settings))

    # Then every user got exactly one SMS, and no push went through
    sms = await sim.messages("twilio")
    assert sorted(m["to"] for m in sms) == [f"+1555000000{i}" for i in range(5)]
    assert all(m["acceptCount"] == 1 for m in sms)
    assert await sim.messages("fcm") == []
    assert (await sim.stats())["fcm"]["requests"] == 5  # one attempt each, then the fallback
    rows = await timeline(db, event_id)
    for user in users:
        mine = [r for r in rows if r["user_id"] == user]
        assert [(r["channel"], r["kind"]) for r in mine] == [
            ("push", "queued"), ("push", "failed"), ("sms", "queued"), ("sms", "sent")]
        fallback = next(r for r in mine if r["kind"] == "failed")
        assert fallback["status"] == "failed"
        assert fallback["metadata"]["fallback"] == "sms"
        assert "trying sms next" in fallback["detail"]
        queued_sms = next(r for r in mine if r["channel"] == "sms" and r["kind"] == "queued")
        assert "fallback after push failed" in queued_sms["detail"]


async def test_a_chain_of_three_is_followed_in_the_templates_order(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    # Given a chain push -> sms -> email, and push and SMS providers answering 503
    await add_user(db, project, "u1", contacts=[("push", "device-1"), ("sms", "+15550000001"),
                                                ("email", "u1@example.com")])
    await add_template(db, project, "alert", {"push": PUSH, "sms": SMS, "email": EMAIL},
                       fallback=["push", "sms", "email"])
    await sim.add_fault("error", "fcm", status=503)
    await sim.add_fault("error", "twilio", status=503)

    event_id = await send(redis, keys, db, project, "alert", "u1", data={"amount": "9"})
    await drain(*await stages(services, sim_settings))

    # Then each channel was tried once, in the chain's order, and the e-mail went out
    assert [(r["channel"], r["kind"]) for r in await timeline(db, event_id)] == [
        ("push", "queued"), ("push", "failed"), ("sms", "queued"), ("sms", "failed"),
        ("email", "queued"), ("email", "sent")]
    assert [m["to"] for m in await sim.messages("resend")] == ["u1@example.com"]


async def test_a_chain_channel_the_user_cannot_be_reached_on_is_on_the_timeline_when_reached(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    # Given a chain push -> sms -> email, a user without a phone number, and a push provider
    # answering 503 to the first user's device only
    for user in ("u1", "u2"):
        await add_user(db, project, user, contacts=[("push", f"device-{user}"),
                                                    ("email", f"{user}@example.com")])
    await add_template(db, project, "alert", {"push": PUSH, "sms": SMS, "email": EMAIL},
                       fallback=["push", "sms", "email"])
    await sim.add_fault("error", "fcm", status=503, to="device-u1")

    event_id = await send(redis, keys, db, project, "alert", ["u1", "u2"], data={"amount": "9"})
    await drain(*await stages(services, sim_settings))

    # Then the chain passed sms, which says why, on its way to the e-mail
    rows = await timeline(db, event_id)
    mine = [r for r in rows if r["user_id"] == "u1"]
    assert [(r["channel"], r["kind"]) for r in mine] == [
        ("push", "queued"), ("push", "failed"), ("sms", "skipped"), ("email", "queued"),
        ("email", "sent")]
    assert mine[2]["status"] == "skipped"
    assert mine[2]["detail"] == "no contact"
    assert [m["to"] for m in await sim.messages("resend")] == ["u1@example.com"]
    # And a chain that never got past push says nothing of the channels after it
    assert [(r["channel"], r["kind"]) for r in rows if r["user_id"] == "u2"] == [
        ("push", "queued"), ("push", "sent")]


async def test_an_invalid_push_token_disables_the_contact_and_the_fallback_is_used(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    await add_user(db, project, "u1", contacts=[("push", "stale-token"), ("sms", "+15550000001")])
    await add_template(db, project, "alert", {"push": PUSH, "sms": SMS},
                       fallback=["push", "sms"])
    await sim.add_fault("invalid_token", "fcm", to="stale-token")
    pipeline = await with_events(services, sim_settings)

    first = await send(redis, keys, db, project, "alert", "u1", data={"amount": "1"})
    await drain(*pipeline)

    # Then the token is disabled at once, the SMS went out, and push was tried once
    enabled = await db.fetchval("SELECT enabled FROM user_contacts WHERE target = 'stale-token'")
    assert enabled is False
    assert len(await sim.messages("twilio")) == 1
    assert (await sim.stats())["fcm"]["requests"] == 1
    events = [e["type"] for e in await entries(redis, keys.events_inbound)]
    assert "notification:invalid_token" in events
    push_rows = [r for r in await timeline(db, first) if r["channel"] == "push"]
    assert [(r["kind"], r["status"]) for r in push_rows] == [
        ("queued", "processing"), ("failed", "failed")]
    # (its row says the contact was disabled, as the row of a chain's last channel does)
    assert push_rows[1]["detail"].startswith("invalid recipient, contact disabled: ")

    # And a later notification never tries the token again
    second = await send(redis, keys, db, project, "alert", "u1", data={"amount": "2"})
    await drain(*pipeline)
    assert (await sim.stats())["fcm"]["requests"] == 1
    assert len(await sim.messages("twilio")) == 2
    # (and says why push was left out)
    assert ("push", "skipped", "contact disabled (the provider called the address invalid)") \
        in [(r["channel"], r["kind"], r["detail"]) for r in await timeline(db, second)]


async def test_a_token_called_invalid_is_not_tried_again_when_its_task_is_retried(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    # Given two devices: one the provider calls invalid, one failing transiently once
    await add_user(db, project, "u1", contacts=[("push", "dead-token"), ("push", "live-token")])
    await add_template(db, project, "t", {"push": PUSH})
    await sim.add_fault("invalid_token", "fcm", to="dead-token")
    await sim.add_fault("error", "fcm", to="live-token", times=1)

    event_id = await send(redis, keys, db, project, "t", "u1", data={"amount": "1"})
    await drain(*await stages(services, sim_settings))

    # Then the retry went to the live device only: the dead one was asked exactly once
    assert [m["to"] for m in await sim.messages("fcm")] == ["live-token"]
    assert (await sim.stats())["fcm"]["requests"] == 3
    rows = await timeline(db, event_id)
    assert kinds(rows, "push") == [
        ("queued", "processing", 0), ("failed", "processing", 1), ("sent", "sent", 2)]
    # and the failed attempt's row says the dead token's contact was disabled, not only why
    # the live one is retried
    failed = next(r for r in rows if r["kind"] == "failed")
    assert "1 of 2 destinations not sent: invalid recipient, contact disabled" in \
        failed["detail"]
    assert failed["metadata"]["disabled"] == 1


async def test_a_device_called_invalid_beside_one_that_falls_back_is_on_the_failed_row(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    """Every other row naming the contacts disabled beside another answer carried
    metadata.disabled; the row of a push that fell back to the chain's next channel said so
    in its detail only."""
    # Given two devices, one the provider calls invalid, the other failing with a 5xx, and
    # a chain push -> sms
    await add_user(db, project, "u1", contacts=[("push", "dead-token"), ("push", "live-token"),
                                                 ("sms", "+15557654321")])
    await add_template(db, project, "t", {"push": PUSH, "sms": SMS}, fallback=["push", "sms"])
    await sim.add_fault("invalid_token", "fcm", to="dead-token")
    await sim.add_fault("error", "fcm", to="live-token")

    event_id = await send(redis, keys, db, project, "t", "u1", data={"amount": "1"})
    await drain(*await with_events(services, sim_settings))

    # Then the SMS goes out, and the push's failed row says, in its detail and its metadata,
    # that one contact was disabled
    assert len(await sim.messages("twilio")) == 1
    [failed] = [r for r in await timeline(db, event_id)
                if (r["channel"], r["kind"]) == ("push", "failed")]
    assert "1 of 2 destinations not sent: invalid recipient, contact disabled; trying sms " \
        "next" in failed["detail"]
    assert (failed["metadata"]["fallback"], failed["metadata"]["disabled"]) == ("sms", 1)


async def test_a_device_called_invalid_beside_an_accepted_one_is_on_the_sent_row(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    """The send stands (one device has it), but the contact disabled beside it is a decision
    too: the timeline says so, not only user_contacts."""
    await add_user(db, project, "u1", contacts=[("push", "dead-token"), ("push", "live-token")])
    await add_template(db, project, "t", {"push": PUSH})
    await sim.add_fault("invalid_token", "fcm", to="dead-token")

    event_id = await send(redis, keys, db, project, "t", "u1", data={"amount": "1"})
    await drain(*await stages(services, sim_settings))

    assert await db.fetchval(
        "SELECT enabled FROM user_contacts WHERE target = 'dead-token'") is False
    [sent] = [r for r in await timeline(db, event_id) if r["kind"] == "sent"]
    assert sent["detail"] == ("accepted by fcm; 1 of 2 destinations not sent: invalid "
                              "recipient, contact disabled")
    assert sent["metadata"]["disabled"] == 1


async def test_a_device_that_failed_beside_an_accepted_one_is_retried_alone(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    await add_user(db, project, "u1", contacts=[("push", "phone"), ("push", "tablet")])
    await add_template(db, project, "t", {"push": PUSH, "sms": SMS}, fallback=["push", "sms"])
    await sim.add_fault("error", "fcm", to="tablet", times=1)

    event_id = await send(redis, keys, db, project, "t", "u1", data={"amount": "1"})
    await drain(*await stages(services, sim_settings))

    # Each device got it once, and no fallback: the recipient already had it
    assert sorted((m["to"], m["acceptCount"]) for m in await sim.messages("fcm")) == [
        ("phone", 1), ("tablet", 1)]
    assert await sim.messages("twilio") == []
    rows = [r for r in await timeline(db, event_id) if r["channel"] == "push"]
    assert [(r["kind"], r["status"], r["attempt"]) for r in rows] == [
        ("queued", "processing", 0), ("failed", "processing", 1), ("sent", "sent", 2)]
    assert rows[1]["detail"].startswith("accepted for 1 of 2 destinations; ")


async def test_an_address_suppressed_while_its_task_waited_is_not_sent_to(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    await add_user(db, project, "u1", contacts=[("email", "gone@example.com")])
    await add_user(db, project, "u2", contacts=[("email", "here@example.com")])
    await add_template(db, project, "t", {"email": EMAIL})
    enricher, engine, delivery = await stages(services, sim_settings)
    event_id = await send(redis, keys, db, project, "t", ["u1", "u2"], data={"amount": "1"})
    await drain(enricher, engine)

    # While the tasks wait for delivery, a bounce suppresses one address; another project's
    # bounce of the other address is that project's alone
    await db.execute("INSERT INTO suppressions (project_id, channel, target, reason) "
                     "VALUES ($1, 'email', 'gone@example.com', 'bounce')", project)
    await db.execute("INSERT INTO suppressions (project_id, channel, target, reason) "
                     "VALUES ($1, 'email', 'here@example.com', 'bounce')",
                     await add_project(db))
    await drain(delivery)

    assert [m["to"] for m in await sim.messages("resend")] == ["here@example.com"]
    rows = {r["user_id"]: r for r in await timeline(db, event_id) if r["kind"] != "queued"}
    assert (rows["u1"]["kind"], rows["u1"]["status"]) == ("suppressed", "suppressed")
    assert "suppressed" in rows["u1"]["detail"]
    assert (rows["u2"]["kind"], rows["u2"]["status"]) == ("sent", "sent")
    assert await entries(redis, keys.dlq) == []
    assert await db.fetchval("SELECT bool_and(enabled) FROM user_contacts") is True


async def test_a_scheduled_send_to_a_user_or_contact_erased_meanwhile_is_not_sent(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    # Given sends an hour away: to a user with an address and a phone, and to one whose push
    # device goes away while the other stays
    await add_user(db, project, "erased", contacts=[("email", "erased@example.com"),
                                                    ("sms", "+15550000009")])
    await add_user(db, project, "kept", contacts=[("push", "device-gone"),
                                                  ("push", "device-kept")])
    await add_template(db, project, "t", {"email": EMAIL, "sms": SMS, "push": PUSH,
                                          "inapp": {"text": "Paid"}})
    clock = Clock()
    pipeline = (*await stages(services, sim_settings),
                await services(SchedulerService, sim_settings, clock=clock))
    send_at = datetime.fromtimestamp(time.time() + 3600, UTC)
    event_id = await send(redis, keys, db, project, "t", ["erased", "kept"],
                          data={"amount": "1"},
                          send_at=send_at.isoformat().replace("+00:00", "Z"))
    await drain(*pipeline)

    # When the first user is erased (DELETE /v1/users/{id} cascades to the contacts) and the
    # second one's device is removed before the send time
    await db.execute("DELETE FROM users WHERE project_id = $1 AND id = 'erased'", project)
    await db.execute("DELETE FROM user_contacts WHERE project_id = $1 AND target = 'device-gone'",
                     project)
    clock.now_ms = int(send_at.timestamp() * 1000) + 1
    await drain(*pipeline)

    # Then nothing reaches the erased user, and only the remaining device gets the push
    assert await sim.messages("resend") == []
    assert await sim.messages("twilio") == []
    assert [m["to"] for m in await sim.messages("fcm")] == ["device-kept"]
    assert await db.fetchval("SELECT count(*) FROM inapp_messages WHERE user_id = 'erased'") == 0
    rows = await timeline(db, event_id)
    erased = {r["channel"]: (r["kind"], r["status"]) for r in rows
              if r["user_id"] == "erased" and r["kind"] != "scheduled"}
    assert erased == {c: ("skipped", "skipped") for c in ("email", "sms", "push", "inapp")}
    assert ("sent", "sent") in {(r["kind"], r["status"]) for r in rows
                                if r["user_id"] == "kept" and r["channel"] == "push"}
    assert await entries(redis, keys.dlq) == []


class ErasingInApp(InAppTransport):
    """The in-app transport, with the user erased (as DELETE /v1/users/{id} does, inbox
    included) after delivery checked that they exist and before the message is stored."""

    async def send(self, message: Message) -> SendResult:
        assert self._ctx is not None
        assert self._ctx.db is not None
        async with self._ctx.db.acquire() as conn, conn.transaction():
            await conn.execute("DELETE FROM users WHERE project_id = $1 AND id = $2",
                               message.project_id, message.user_id)
            await conn.execute("DELETE FROM inapp_messages WHERE project_id = $1 "
                               "AND user_id = $2", message.project_id, message.user_id)
        return await super().send(message)


async def test_an_in_app_message_for_a_user_erased_as_it_is_stored_is_not_kept(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sp_settings: Settings,
) -> None:
    # Given an in-app send whose user is erased between delivery's check and the insert
    await add_user(db, project, "erased")
    await add_template(db, project, "t", {"inapp": {"text": "Paid"}})
    pipeline = (await services(EnricherService, sp_settings),
                await services(EngineService, sp_settings),
                await services(DeliveryService, sp_settings, transports=[ErasingInApp()]))

    event_id = await send(redis, keys, db, project, "t", "erased", data={})
    await drain(*pipeline)

    # Then no message is left in an inbox a user created again under the id would read, and
    # the task is skipped as one whose user was erased before delivery's check
    assert await db.fetchval("SELECT count(*) FROM inapp_messages") == 0
    rows = await timeline(db, event_id)
    assert kinds(rows, "inapp") == [("queued", "processing", 0), ("skipped", "skipped", 1)]
    assert await entries(redis, keys.dlq) == []


async def test_a_scheduled_send_turned_off_by_preference_meanwhile_is_not_sent(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    # Given billing sends an hour away to three users with a phone
    for user, phone in (("chan", "+15550000011"), ("topic", "+15550000012"),
                        ("other", "+15550000013")):
        await add_user(db, project, user, contacts=[("sms", phone)])
    await add_template(db, project, "t", {"sms": SMS}, topic="billing")
    clock = Clock()
    pipeline = (*await stages(services, sim_settings),
                await services(SchedulerService, sim_settings, clock=clock))
    send_at = datetime.fromtimestamp(time.time() + 3600, UTC)
    event_id = await send(redis, keys, db, project, "t", ["chan", "topic", "other"],
                          data={"amount": "1"},
                          send_at=send_at.isoformat().replace("+00:00", "Z"))
    await drain(*pipeline)

    # When one turns SMS off, another the billing topic, and a third only another topic,
    # before the send time
    await db.execute("INSERT INTO user_channel_preferences VALUES ($1, 'chan', 'sms', false)",
                     project)
    await db.execute("INSERT INTO user_topic_preferences VALUES ($1, 'topic', 'billing', false)",
                     project)
    await db.execute("INSERT INTO user_topic_preferences VALUES ($1, 'other', 'news', false)",
                     project)
    clock.now_ms = int(send_at.timestamp() * 1000) + 1
    await drain(*pipeline)

    # Then only the third gets the SMS, and the others' timelines say why not
    assert [m["to"] for m in await sim.messages("twilio")] == ["+15550000013"]
    rows = [r for r in await timeline(db, event_id) if r["kind"] != "scheduled"]
    outcome = {r["user_id"]: (r["kind"], r["status"]) for r in rows
               if r["kind"] in ("skipped", "sent")}
    assert outcome == {"chan": ("skipped", "skipped"), "topic": ("skipped", "skipped"),
                       "other": ("sent", "sent")}
    assert await entries(redis, keys.dlq) == []


@pytest.mark.parametrize("priority", ["normal", "critical"])
async def test_quiet_hours_set_while_a_send_waits_hold_it_until_they_end(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings, priority: str,
) -> None:
    # Given an e-mail an hour away to a user without quiet hours
    await add_user(db, project, "u1", contacts=[("email", "late@example.com")], timezone="UTC",
                   attributes={"name": "Ada"})
    await add_template(db, project, "t", {"email": EMAIL})
    clock = Clock()
    delivery_clock = Clock()
    pipeline = (await services(EnricherService, sim_settings),
                await services(EngineService, sim_settings),
                await services(DeliveryService, sim_settings,
                               clock=lambda: delivery_clock.now_ms / 1000),
                await services(SchedulerService, sim_settings, clock=clock))
    send_at = datetime.fromtimestamp(time.time() + 3600, UTC).replace(microsecond=0)
    event_id = await send(redis, keys, db, project, "t", "u1", data={"amount": "1"},
                          priority=priority,
                          send_at=send_at.isoformat().replace("+00:00", "Z"))
    await drain(*pipeline)

    # When the user sets quiet hours around the send time before it comes
    quiet_end = send_at + timedelta(hours=2)
    await db.execute("INSERT INTO quiet_hours VALUES ($1, 'u1', $2, $3)", project,
                     (send_at - timedelta(minutes=30)).time(), quiet_end.time())
    clock.now_ms = delivery_clock.now_ms = int(send_at.timestamp() * 1000) + 1
    await drain(*pipeline)

    if priority == "critical":
        # Then a critical send goes at its time regardless, as the engine would have sent it
        assert [m["to"] for m in await sim.messages("resend")] == ["late@example.com"]
        return
    # Then nothing is sent, and the timeline says it waits for the quiet hours' end
    assert await sim.messages("resend") == []
    [held] = [r for r in await timeline(db, event_id) if r["kind"] == "deferred"]
    assert held["status"] == "scheduled"
    assert "deferred for quiet hours" in held["detail"]
    assert "changed while the send waited" in held["detail"]
    assert held["metadata"]["dueAt"] == \
        quiet_end.isoformat(timespec="milliseconds").replace("+00:00", "Z")

    # When the quiet hours end (delivery's clock a moment behind the scheduler's)
    clock.now_ms = int(quiet_end.timestamp() * 1000) + 1
    delivery_clock.now_ms = clock.now_ms - 1500
    await drain(*pipeline)

    # Then it is sent once, and nothing was dead-lettered
    assert [m["to"] for m in await sim.messages("resend")] == ["late@example.com"]
    assert await entries(redis, keys.dlq) == []


async def test_a_channel_left_out_since_routing_falls_back_as_skipped_not_failed(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    # Given an email -> sms chain for two users whose email tasks wait for delivery
    await add_user(db, project, "supp", contacts=[("email", "supp@example.com"),
                                                  ("sms", "+15550000021")])
    await add_user(db, project, "off", contacts=[("email", "off@example.com"),
                                                 ("sms", "+15550000022")])
    await add_template(db, project, "t", {"email": EMAIL, "sms": SMS}, fallback=["email", "sms"])
    enricher, engine, delivery = await stages(services, sim_settings)
    event_id = await send(redis, keys, db, project, "t", ["supp", "off"], data={"amount": "1"})
    await drain(enricher, engine)

    # When one address is suppressed and the other user turns email off meanwhile
    await db.execute("INSERT INTO suppressions (project_id, channel, target, reason) "
                     "VALUES ($1, 'email', 'supp@example.com', 'bounce')", project)
    await db.execute("INSERT INTO user_channel_preferences VALUES ($1, 'off', 'email', false)",
                     project)
    await drain(delivery, engine)

    # Then both get the SMS, and the email rows say why it was not sent: nothing failed
    assert sorted(m["to"] for m in await sim.messages("twilio")) == ["+15550000021",
                                                                       "+15550000022"]
    assert await sim.messages("resend") == []
    rows = await timeline(db, event_id)
    email = {r["user_id"]: r for r in rows if r["channel"] == "email" and r["kind"] != "queued"}
    assert {u: (r["kind"], r["status"]) for u, r in email.items()} == {
        "supp": ("suppressed", "suppressed"), "off": ("skipped", "skipped")}
    assert all("trying sms next" in r["detail"] for r in email.values())
    queued_sms = {r["user_id"]: r["detail"] for r in rows
                  if r["channel"] == "sms" and r["kind"] == "queued"}
    assert queued_sms == {"supp": "queued (fallback after email was suppressed)",
                          "off": "queued (fallback after email was skipped)"}
    failed = [e for e in await entries(redis, keys.events_inbound)
              if e.get("type") != "notification:sent"]
    assert failed == []


async def test_an_invalid_address_without_fallback_fails_without_retry(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    await add_user(db, project, "u1", contacts=[("sms", "+15005550001")])  # Twilio: 21211
    await add_template(db, project, "t", {"sms": SMS})

    event_id = await send(redis, keys, db, project, "t", "u1", data={"amount": "1"})
    await drain(*await stages(services, sim_settings))

    assert (await sim.stats())["twilio"]["requests"] == 1
    assert await db.fetchval("SELECT enabled FROM user_contacts") is False
    [row] = [r for r in await timeline(db, event_id) if r["kind"] == "failed"]
    assert row["status"] == "failed"
    assert "contact disabled" in row["detail"]
    assert await entries(redis, keys.dlq) == []


async def test_a_region_the_twilio_account_may_not_send_to_is_no_invalid_number(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    """Twilio's 21408 says the account's geographic permissions leave out the number's
    country: the operator's setting, not the recipient's number. The contact stays enabled
    and the task is dead-lettered, to be replayed once the region is enabled."""
    await add_user(db, project, "u1", contacts=[("sms", "+15005550003")])  # Twilio: 21408
    await add_template(db, project, "t", {"sms": SMS})

    event_id = await send(redis, keys, db, project, "t", "u1", data={"amount": "1"})
    await drain(*await stages(services, sim_settings))

    assert (await sim.stats())["twilio"]["requests"] == 1
    assert await db.fetchval("SELECT enabled FROM user_contacts") is True
    [row] = [r for r in await timeline(db, event_id) if r["kind"] == "dead_lettered"]
    assert "21408" in row["detail"]
    assert len(await entries(redis, keys.dlq)) == 1


async def test_lost_responses_are_not_duplicated_where_the_provider_honours_idempotency_keys(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    # Given Resend loses the answer to the first three sends
    users = [f"u{i}" for i in range(3)]
    for user in users:
        await add_user(db, project, user, contacts=[("email", f"{user}@example.com")])
    await add_template(db, project, "t", {"email": EMAIL})
    await sim.add_fault("lost_response", "resend", times=3)

    event_id = await send(redis, keys, db, project, "t", users, data={"amount": "1"})
    await drain(*await stages(services, sim_settings))

    # Then the retries replayed the idempotency key: one message each, no duplicates
    messages = await sim.messages("resend")
    assert sorted(m["to"] for m in messages) == [f"{u}@example.com" for u in users]
    assert [m["acceptCount"] for m in messages] == [1, 1, 1]
    assert (await sim.stats())["resend"]["duplicates"] == 0
    rows = await timeline(db, event_id)
    assert sorted(kinds(rows, "email")) == sorted(
        [("queued", "processing", 0), ("failed", "processing", 1), ("sent", "sent", 2)] * 3)
    assert not any(r["metadata"].get("possibleDuplicate") for r in rows)


async def test_lost_responses_are_duplicated_exactly_once_where_there_is_no_idempotency_key(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings, caplog: pytest.LogCaptureFixture,
) -> None:
    # Given Twilio loses the answer to the first two of four sends
    users = [f"u{i}" for i in range(4)]
    for i, user in enumerate(users):
        await add_user(db, project, user, contacts=[("sms", f"+1555000000{i}")])
    await add_template(db, project, "t", {"sms": SMS})
    await sim.add_fault("lost_response", "twilio", times=2)

    with caplog.at_level(logging.WARNING, logger="notifkit.delivery"):
        event_id = await send(redis, keys, db, project, "t", users, data={"amount": "1"})
        await drain(*await stages(services, sim_settings))

    # Then exactly the two lost responses became duplicates, and nothing else
    counts = sorted(m["acceptCount"] for m in await sim.messages("twilio"))
    assert counts == [1, 1, 1, 1, 2, 2]  # the two duplicates are the second accepts
    assert (await sim.stats())["twilio"]["duplicates"] == 2
    # And each is visible: on the timeline and in the log
    sent = [r for r in await timeline(db, event_id) if r["kind"] == "sent"]
    flagged = [r for r in sent if r["metadata"].get("possibleDuplicate")]
    assert len(sent) == 4
    assert len(flagged) == 2
    assert all("may get it twice" in r["detail"] for r in flagged)
    warnings = [r for r in caplog.records if "may get it twice" in r.getMessage()]
    assert {r.task_id for r in warnings} == {r["task_id"] for r in flagged}  # type: ignore[attr-defined]


@pytest.mark.parametrize("between", ["error", "rate_limit"])
async def test_a_lost_response_stays_a_possible_duplicate_past_a_refused_retry(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings, between: str,
) -> None:
    """The first answer is lost (Twilio took the SMS), the retry is refused (a 5xx, or a 429
    parked on the scheduler), the third send is accepted: the recipient has the SMS twice.
    The refusal recorded the destination 'failed', which erased the first attempt's
    'sending', so the send that went through was not flagged and the duplicate was counted
    nowhere."""
    await add_user(db, project, "u1", contacts=[("sms", "+15550000001")])
    await add_template(db, project, "t", {"sms": SMS})
    await sim.add_fault("lost_response", "twilio", times=1)
    await sim.add_fault(between, "twilio", times=1)
    clock = Clock()
    pipeline = (*await stages(services, sim_settings),
                await services(SchedulerService, sim_settings, clock=clock))

    event_id = await send(redis, keys, db, project, "t", "u1", data={"amount": "1"})
    await drain(*pipeline)
    clock.now_ms += 60_000  # past the park of a 429
    await drain(*pipeline)

    assert sorted(m["acceptCount"] for m in await sim.messages("twilio")) == [1, 2]
    [sent] = [r for r in await timeline(db, event_id) if r["kind"] == "sent"]
    assert sent["attempt"] == 3
    assert sent["metadata"].get("possibleDuplicate") is True, sent
    assert "may get it twice" in sent["detail"]


async def test_a_transient_failure_without_fallback_is_retried_by_the_reclaim_cycle(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    await add_user(db, project, "u1", contacts=[("email", "a@example.com")])
    await add_template(db, project, "t", {"email": EMAIL})
    await sim.add_fault("error", "resend", times=1)

    event_id = await send(redis, keys, db, project, "t", "u1", data={"amount": "1"})
    await drain(*await stages(services, sim_settings))

    assert len(await sim.messages("resend")) == 1
    assert kinds(await timeline(db, event_id), "email") == [
        ("queued", "processing", 0), ("failed", "processing", 1), ("sent", "sent", 2)]


async def test_a_provider_that_keeps_failing_dead_letters_the_task_after_the_attempt_limit(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    await add_user(db, project, "u1", contacts=[("email", "a@example.com")])
    await add_template(db, project, "t", {"email": EMAIL})
    await sim.add_fault("error", "resend")

    event_id = await send(redis, keys, db, project, "t", "u1", data={"amount": "1"})
    await drain(*await stages(services, sim_settings))

    assert (await sim.stats())["resend"]["requests"] == 3
    [dead] = await entries(redis, keys.dlq)
    assert dead["payload"]["channel"] == "email"
    assert kinds(await timeline(db, event_id), "email") == [
        ("queued", "processing", 0), ("failed", "processing", 1), ("failed", "processing", 2),
        ("dead_lettered", "dead_lettered", 3)]
    assert "notification:failed" in [e["type"] for e in await entries(redis, keys.events_inbound)]


async def test_a_replayed_task_that_fails_again_shows_its_new_attempts(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    # Given a task dead-lettered after three 503s
    await add_user(db, project, "u1", contacts=[("sms", "+15550000001")])
    await add_template(db, project, "t", {"sms": SMS})
    await sim.add_fault("error", "twilio", status=503)
    pipeline = await stages(services, sim_settings)
    event_id = await send(redis, keys, db, project, "t", "u1", data={"amount": "1"})
    await drain(*pipeline)
    [(dlq_id, fields)] = await xrange(redis, keys.dlq)
    record = json.loads(fields[b"data"])

    # When it is replayed (as POST /v1/dlq/{id}/replay writes it) and fails three times more
    replayed = {k: v for k, v in record["payload"].items()
                if k not in ("priorAttempts", "parkCount")}
    replayed.update(_replayOf=record["replayOf"], _replayedAttempts=record["attempts"])
    await redis.xdel(keys.dlq, dlq_id)
    await redis.xadd(record["stream"], {"data": json.dumps(replayed)})
    await drain(*pipeline)

    # Then the timeline shows the second round after the first, not nothing new
    assert kinds(await timeline(db, event_id), "sms") == [
        ("queued", "processing", 0),
        ("failed", "processing", 1), ("failed", "processing", 2),
        ("dead_lettered", "dead_lettered", 3),
        ("failed", "processing", 4), ("failed", "processing", 5),
        ("dead_lettered", "dead_lettered", 6)]
    [again] = await entries(redis, keys.dlq)
    assert again["attempts"] == 3  # the replay had the full limit again

    # And a replay once the provider is fixed is sent, as attempt 7
    await sim.clear_faults()
    replayed["_replayedAttempts"] = 6
    await redis.xadd(record["stream"], {"data": json.dumps(replayed)})
    await drain(*pipeline)
    assert kinds(await timeline(db, event_id), "sms")[-1] == ("sent", "sent", 7)


async def test_a_rejected_request_is_dead_lettered_at_once(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    await add_user(db, project, "u1", contacts=[("push", "device-1")])
    await add_template(db, project, "t", {"push": PUSH})
    await sim.add_fault("error", "fcm", status=403)

    await send(redis, keys, db, project, "t", "u1", data={"amount": "1"})
    await drain(*await stages(services, sim_settings))

    assert (await sim.stats())["fcm"]["requests"] == 1
    [dead] = await entries(redis, keys.dlq)
    assert dead["attempts"] == 1


class Clock:
    """The scheduler's clock (ms), moved by the test instead of waiting."""

    def __init__(self) -> None:
        self.now_ms = int(time.time() * 1000)

    def __call__(self) -> int:
        return self.now_ms


@pytest.mark.parametrize("priority", ["normal", "critical"])
async def test_a_429_parks_the_task_until_retry_after_then_it_is_sent_once(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings, priority: str,
) -> None:
    await add_user(db, project, "u1", contacts=[("sms", "+15550000001")])
    await add_template(db, project, "t", {"sms": SMS})
    await sim.add_fault("rate_limit", "twilio", times=1, retry_after_s=30)
    clock = Clock()
    pipeline = (*await stages(services, sim_settings),
                await services(SchedulerService, sim_settings, clock=clock))

    event_id = await send(redis, keys, db, project, "t", "u1", data={"amount": "1"},
                          priority=priority)
    await drain(*pipeline)

    # Then the task waits with the scheduler for the provider's Retry-After, to go back to
    # its own priority's stream (a critical task must not queue behind normal work)
    [parked] = await entries(redis, keys.scheduled)
    assert parked["reason"] == "rateLimited"
    assert parked["stream"] == keys.outbound(priority)
    assert parked["payload"]["parkCount"] == 1
    assert parked["payload"]["priorAttempts"] == 1
    created_ms = int((await xrange(redis, keys.scheduled))[0][0].decode().split("-")[0])
    assert 29_000 <= parked["dueAt"] - created_ms <= 31_000
    assert await sim.messages("twilio") == []

    # When the window reopens, the scheduler brings it back and it is sent once
    clock.now_ms = parked["dueAt"] + 1
    await drain(*pipeline)
    [sms] = await sim.messages("twilio")
    assert sms["acceptCount"] == 1
    assert kinds(await timeline(db, event_id), "sms") == [
        ("queued", "processing", 0), ("deferred", "scheduled", 1), ("sent", "sent", 2)]
    assert {p: len(await entries(redis, keys.outbound(p))) for p in ("critical", "normal")} \
        == {"critical": 0, "normal": 0, priority: 2}


async def test_a_task_still_rate_limited_at_the_attempt_limit_is_dead_lettered(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    await add_user(db, project, "u1", contacts=[("sms", "+15550000001")])
    await add_template(db, project, "t", {"sms": SMS})
    await sim.add_fault("rate_limit", "twilio", retry_after_s=1)
    clock = Clock()
    pipeline = (*await stages(services, sim_settings),
                await services(SchedulerService, sim_settings, clock=clock))
    event_id = await send(redis, keys, db, project, "t", "u1", data={"amount": "1"})
    await drain(*pipeline)

    for _ in range(2):  # each time the window reopens, the provider says 429 again
        clock.now_ms += 2_000
        await drain(*pipeline)

    assert (await sim.stats())["twilio"]["requests"] == 3
    [dead] = await entries(redis, keys.dlq)
    assert dead["error"].startswith("AttemptsExhausted: still rate limited after 3 attempts")
    # The record counts the task's attempts, not those of its last (parked) entry alone
    assert dead["attempts"] == 3
    [failed] = [e for e in await entries(redis, keys.events_inbound)
                if e["type"] == "notification:failed" and "stream" in e]
    assert failed["attempts"] == 3
    assert kinds(await timeline(db, event_id), "sms") == [
        ("queued", "processing", 0), ("deferred", "scheduled", 1), ("deferred", "scheduled", 2),
        ("dead_lettered", "dead_lettered", 3)]


@pytest.mark.parametrize("refusal", ["rate_limit fault", "configured limit"])
async def test_an_smtp_rate_limit_parks_the_task_like_a_429_then_it_is_sent_once(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sp_settings: Settings, refusal: str,
) -> None:
    # Given an SMTP server that answers the next message with a 4.7.x rate-limit reply:
    # "421 4.7.0" for the fault, "451 4.7.1" once the configured limit's burst is spent
    await add_user(db, project, "u1", attributes={"name": "Ada"},
                   contacts=[("email", "ada@example.com")])
    await add_template(db, project, "t", {"email": EMAIL})
    if refusal == "rate_limit fault":
        await sim.add_fault("rate_limit", "smtp", times=1)
    else:
        await sim.set_limit("smtp", 0.001, burst=1)
        spend = EmailMessage()
        spend["From"], spend["To"], spend["Subject"] = "a@example.com", "b@example.com", "burst"
        await aiosmtplib.send(spend, hostname=sim.smtp_host, port=sim.smtp_port, timeout=5)
    settings = simulated(sp_settings, sim, email="smtp")
    clock = Clock()
    pipeline = (*await stages(services, settings),
                await services(SchedulerService, settings, clock=clock))

    event_id = await send(redis, keys, db, project, "t", "u1", data={"amount": "1"})
    await drain(*pipeline)

    # Then the task waits with the scheduler, as after a 429 without Retry-After
    [parked] = await entries(redis, keys.scheduled)
    assert parked["reason"] == "rateLimited"
    assert parked["payload"]["parkCount"] == 1
    created_ms = int((await xrange(redis, keys.scheduled))[0][0].decode().split("-")[0])
    assert 0 < parked["dueAt"] - created_ms <= 2_000
    assert await sim.messages("smtp", task_id=parked["taskId"]) == []
    [deferred] = [r for r in await timeline(db, event_id) if r["kind"] == "deferred"]
    assert " 4.7." in deferred["detail"]
    assert deferred["metadata"]["retryAfterSeconds"] == 1.0

    # When the server takes mail again and the park is over, it is sent once
    await sim.clear_limits()
    clock.now_ms = parked["dueAt"] + 1
    await drain(*pipeline)
    [email] = await sim.messages("smtp", task_id=parked["taskId"])
    assert email["acceptCount"] == 1
    assert kinds(await timeline(db, event_id), "email") == [
        ("queued", "processing", 0), ("deferred", "scheduled", 1), ("sent", "sent", 2)]


async def test_a_send_at_in_the_future_is_delivered_when_the_scheduler_says_so(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    await add_user(db, project, "u1", contacts=[("sms", "+15550000001")])
    await add_template(db, project, "t", {"sms": SMS})
    clock = Clock()
    pipeline = (*await stages(services, sim_settings),
                await services(SchedulerService, sim_settings, clock=clock))
    send_at = datetime.fromtimestamp(time.time() + 3600, UTC)

    await send(redis, keys, db, project, "t", "u1", data={"amount": "1"},
               send_at=send_at.isoformat().replace("+00:00", "Z"))
    await drain(*pipeline)
    assert await sim.messages("twilio") == []

    clock.now_ms = int(send_at.timestamp() * 1000) + 1
    await drain(*pipeline)
    assert len(await sim.messages("twilio")) == 1


async def test_a_task_the_outbox_records_as_sent_is_not_sent_again(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    # Given a task whose send an earlier process recorded before it died
    await add_user(db, project, "u1", contacts=[("sms", "+15550000001")])
    await add_template(db, project, "t", {"sms": SMS})
    enricher, engine, delivery = await stages(services, sim_settings)
    await send(redis, keys, db, project, "t", "u1", data={"amount": "1"})
    await drain(enricher, engine)
    [task] = await entries(redis, keys.outbound("normal"))
    await db.execute(
        "INSERT INTO delivery_outbox (task_id, channel, destination, project_id, provider, "
        "provider_message_id, status) VALUES ($1, 'sms', '+15550000001', $2, 'twilio', "
        "'SM-earlier', 'sent')", task["taskId"], project)

    await drain(delivery)

    assert await sim.messages("twilio") == []
    [sent] = [r for r in await timeline(db, task["eventId"]) if r["kind"] == "sent"]
    assert sent["provider_message_id"] == "SM-earlier"


async def test_a_task_queued_twice_is_delivered_once_and_recorded_once(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    """The delivery dedup key is the task id: a second entry of one task (a mover that handed
    it over twice) is dropped as a duplicate, not sent, not recorded a second time."""
    await add_user(db, project, "u1", contacts=[("sms", "+15550000001")])
    await add_template(db, project, "t", {"sms": SMS})
    enricher, engine, delivery = await stages(services, sim_settings)
    event_id = await send(redis, keys, db, project, "t", "u1", data={"amount": "1"})
    await drain(enricher, engine)
    [task] = await entries(redis, keys.outbound("normal"))
    await xadd(redis, keys.outbound("normal"), task, 1000)

    await drain(delivery)

    assert len(await sim.messages("twilio")) == 1
    assert [(r["kind"], r["attempt"]) for r in await timeline(db, event_id)
            if r["channel"] == "sms" and r["kind"] != "queued"] == [("sent", 1)]


async def test_a_second_entry_of_a_task_being_sent_is_dropped_not_sent_beside_it(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    """The outbox alone would send it: its row says 'sending', which a task whose process
    died mid-send says too. The task's dedup mark is what tells a live send from a dead one."""
    await add_user(db, project, "u1", contacts=[("sms", "+15550000001")])
    await add_template(db, project, "t", {"sms": SMS})
    enricher, engine, first = await stages(services, sim_settings)
    second = await services(DeliveryService, sim_settings)
    await send(redis, keys, db, project, "t", "u1", data={"amount": "1"})
    await drain(enricher, engine)
    [task] = await entries(redis, keys.outbound("normal"))

    # Given one delivery process in the middle of the task's send (a slow provider)
    await sim.add_fault("latency", "twilio", delay_ms=300)
    sending = asyncio.create_task(first.worker.run_until_idle(reclaim=False))
    await until_async(lambda: outbox_says(db, task["taskId"], "sending"))

    # When another reads a second entry of the same task meanwhile
    await xadd(redis, keys.outbound("normal"), task, 1000)
    await second.worker.run_until_idle(reclaim=False)
    await sending

    # Then the provider got the message once
    assert len(await sim.messages("twilio")) == 1


async def outbox_says(db: asyncpg.Pool, task_id: str, status: str) -> bool:
    return bool(await db.fetchval(
        "SELECT status = $2 FROM delivery_outbox WHERE task_id = $1", task_id, status))


@pytest.mark.parametrize("recorded", ["sent", "sending"])
async def test_a_task_whose_last_attempt_never_finished_is_settled_from_the_outbox(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings, recorded: str,
) -> None:
    # Given a task on its last attempt, taken by a process that died during it: the
    # provider accepted and the outbox says 'sent' (the process died before its ack), or
    # the outbox says 'sending' (it died before the answer came)
    await add_user(db, project, "u1", contacts=[("sms", "+15550000001")])
    await add_template(db, project, "t", {"sms": SMS})
    enricher, engine, delivery = await stages(services, sim_settings)
    await send(redis, keys, db, project, "t", "u1", data={"amount": "1"})
    await drain(enricher, engine)
    stream, group = keys.outbound("normal"), keys.group("delivery")
    [(entry_id, fields)] = await xrange(redis, stream)
    task = json.loads(fields[b"data"])
    await db.execute(
        "INSERT INTO delivery_outbox (task_id, channel, destination, project_id, provider, "
        "provider_message_id, status) VALUES ($1, 'sms', '+15550000001', $2, 'twilio', $3, $4)",
        task["taskId"], project, "SM-last" if recorded == "sent" else None, recorded)
    await ensure_group(redis, stream, group)
    await redis.xreadgroup(group, "delivery-host-gone", {stream: ">"})
    await redis.set(keys.attempts(group, entry_id.decode(), stream), 3)

    # When a surviving process reclaims it
    await drain(delivery)

    # Then the provider is not asked a fourth time, and the task ends as the outbox says:
    # sent (not dead-lettered after it reached the recipient), or dead-lettered
    assert await sim.messages("twilio") == []
    rows = await timeline(db, task["eventId"])
    if recorded == "sent":
        assert await entries(redis, keys.dlq) == []
        [sent] = [r for r in rows if r["kind"] == "sent"]
        assert (sent["provider_message_id"], sent["attempt"]) == ("SM-last", 3)
    else:
        [dead] = await entries(redis, keys.dlq)
        assert dead["attempts"] == 3
        assert "never finished" in dead["error"]
        assert [r["kind"] for r in rows if r["kind"] == "sent"] == []
    assert await redis.xpending(stream, group) == {
        "pending": 0, "min": None, "max": None, "consumers": []}


@pytest.mark.parametrize("email", ["sendgrid", "smtp"])
async def test_the_other_email_transports_deliver_too(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sp_settings: Settings, email: str,
) -> None:
    await add_user(db, project, "u1", contacts=[("email", "ada@example.com")])
    await add_template(db, project, "t", {"email": EMAIL})

    await send(redis, keys, db, project, "t", "u1", data={"amount": "1"})
    await drain(*await stages(services, simulated(sp_settings, sim, email=email)))

    [message] = await sim.messages(email)
    assert message["to"] == "ada@example.com"
    assert message["taskId"]


async def test_webhooks_are_signed_and_in_app_messages_are_stored_and_announced(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim_settings: Settings, caplog: pytest.LogCaptureFixture,
) -> None:
    sim_settings = sim_settings.replace(webhook_allow_private_networks=True)  # a local receiver
    received: list[tuple[bytes, dict[str, str]]] = []

    async def hook(request: web.Request) -> web.Response:
        received.append((await request.read(), dict(request.headers)))
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    pubsub = redis.pubsub()
    await pubsub.subscribe(keys.inbox_channel(project, "u1"))
    try:
        await add_user(db, project, "u1", contacts=[("webhook", f"http://127.0.0.1:{port}/hook")])
        await add_template(db, project, "t", {
            "webhook": {"body": '{"amount": "{{ data.amount }}"}'},
            "inapp": {"text": "Paid {{ data.amount }}", "url": "{{ data.link }}"},
        })
        # A link from the send's data that would run script in the inbox is dropped
        event_id = await send(redis, keys, db, project, "t", "u1",
                              data={"amount": "7", "link": " JavaScript:alert(1)"})
        caplog.set_level(logging.WARNING, logger="notifkit.transports")
        await drain(*await stages(services, sim_settings))
        # and the record saying so names the notification, not only the task
        [dropped] = [vars(r) for r in caplog.records if "script scheme" in r.getMessage()]
        assert (dropped["event_id"], dropped["project_id"]) == (event_id, project)

        # The webhook: JSON with the rendered body, signed with the deployment's secret
        [(body, headers)] = received
        assert verify(sim_settings.secret, body, headers[SIGNATURE_HEADER])
        assert not verify("another-secret-0123456789", body, headers[SIGNATURE_HEADER])
        document = json.loads(body)
        assert document["body"] == {"amount": "7"}
        assert document["eventId"] == event_id
        assert headers["X-Notifkit-Task-Id"] == document["id"]

        # The in-app message: one row, announced on the user's inbox channel
        [row] = await db.fetch("SELECT user_id, content, task_id FROM inapp_messages")
        assert (row["user_id"], row["content"]) == ("u1", {"text": "Paid 7", "url": None})
        announced = None
        while announced is None:
            announced = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
        item = json.loads(announced["data"])
        assert item["taskId"] == row["task_id"]
        # the same time format as GET /v1/users/{userId}/inbox: UTC, milliseconds
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", item["createdAt"])
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
        await runner.cleanup()


async def test_a_webhook_to_a_private_address_fails_once_with_the_reason_and_nothing_sent(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim_settings: Settings,
) -> None:
    """A contact stored with an internal URL (before the API refused them, or with private
    networks allowed then) is a permanent failure at send: dead-lettered at the first
    attempt with the reason, not retried, nothing sent."""
    received: list[bytes] = []

    async def hook(request: web.Request) -> web.Response:
        received.append(await request.read())
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/hook"
        await add_user(db, project, "u1", contacts=[("webhook", url)])
        await add_template(db, project, "t", {"webhook": {"body": "{}"}})

        event_id = await send(redis, keys, db, project, "t", "u1")
        await drain(*await stages(services, sim_settings))

        assert received == []
        rows = await timeline(db, event_id)
        assert kinds(rows, "webhook") == [("queued", "processing", 0),
                                          ("dead_lettered", "dead_lettered", 1)]
        detail = rows[-1]["detail"]
        assert "destination refused: 127.0.0.1 is a loopback address" in detail
        assert "WEBHOOK_ALLOW_PRIVATE_NETWORKS" in detail
        # The contact stays: the deployment may allow private networks later.
        assert await db.fetchval("SELECT enabled FROM user_contacts") is True
    finally:
        await runner.cleanup()


async def test_a_channel_without_a_transport_is_dead_lettered_naming_the_settings(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sp_settings: Settings,
) -> None:
    await add_user(db, project, "u1", contacts=[("sms", "+15550000001")])
    await add_template(db, project, "t", {"sms": SMS})

    await send(redis, keys, db, project, "t", "u1", data={"amount": "1"})
    await drain(*await stages(services, sp_settings))  # no provider configured

    [dead] = await entries(redis, keys.dlq)
    assert "TWILIO_ACCOUNT_SID" in dead["error"]


async def one_sms_every_ten_seconds(db: asyncpg.Pool, users: int = 2) -> str:
    """A project whose rate limit allows one SMS every ten seconds, template 't' and ``users``
    users (u0, u1, ...) with a number each."""
    project = await add_project(db, {"rateLimits": {"sms": 0.1}})
    for i in range(users):
        await add_user(db, project, f"u{i}", contacts=[("sms", f"+1555000000{i}")])
    await add_template(db, project, "t", {"sms": SMS})
    return project


async def test_a_projects_rate_limit_holds_sends_back_without_using_attempts(
    db: asyncpg.Pool, redis: Redis, keys: Keys, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    # Given a project allowed one SMS every ten seconds, and two recipients
    project = await one_sms_every_ten_seconds(db)

    event_id = await send(redis, keys, db, project, "t", ["u0", "u1"], data={"amount": "1"})
    await drain(*await stages(services, sim_settings))

    # Then one SMS went out and the other waits for the bucket, with no attempt used, its row
    # naming the project's limit
    assert len(await sim.messages("twilio")) == 1
    [waits] = [r for r in await timeline(db, event_id) if r["kind"] == "rate_limited"]
    assert "this project's sms rate limit (0.1/s)" in waits["detail"], waits["detail"]
    [parked] = await entries(redis, keys.scheduled)
    assert parked["reason"] == "rateLimited"
    assert parked["payload"].get("parkCount", 0) == 0
    assert parked["payload"]["priorAttempts"] == 0
    created_ms = int((await xrange(redis, keys.scheduled))[0][0].decode().split("-")[0])
    assert 5_000 <= parked["dueAt"] - created_ms <= 10_500
    bucket = keys.provider_bucket("twilio", project)
    assert await redis.exists(bucket)


async def test_sends_held_by_the_projects_rate_limit_come_back_one_token_apart(
    db: asyncpg.Pool, redis: Redis, keys: Keys, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    # Given a project allowed one SMS every ten seconds, and four recipients at once
    project = await one_sms_every_ten_seconds(db, users=4)

    await send(redis, keys, db, project, "t", [f"u{i}" for i in range(4)],
               data={"amount": "1"})
    await drain(*await stages(services, sim_settings))

    # Then one SMS went out and the three others are parked for turns ten seconds apart, so
    # each finds its token when it comes back (all parked until the next token, two of the
    # three would find the bucket empty again and park once more)
    assert len(await sim.messages("twilio")) == 1
    parked = await entries(redis, keys.scheduled)
    assert len(parked) == 3
    created_ms = int((await xrange(redis, keys.scheduled))[0][0].decode().split("-")[0])
    waits_s = sorted((p["dueAt"] - created_ms) / 1000 for p in parked)
    for turn, wait_s in enumerate(waits_s, start=1):
        assert 10 * turn - 5 <= wait_s <= 10 * turn + 0.5, waits_s
    # ... and back at its turn, none queues for another
    assert all(p["payload"]["bucketTurn"] is True for p in parked)


async def test_a_task_held_by_notifkits_own_bucket_then_refused_429_shows_both(
    db: asyncpg.Pool, redis: Redis, keys: Keys, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    # Given a project allowed one SMS every ten seconds, and two recipients
    project = await one_sms_every_ten_seconds(db)
    clock = Clock()
    pipeline = (*await stages(services, sim_settings),
                await services(SchedulerService, sim_settings, clock=clock))
    event_id = await send(redis, keys, db, project, "t", ["u0", "u1"], data={"amount": "1"})
    await drain(*pipeline)
    [held] = await entries(redis, keys.scheduled)
    assert held["payload"]["bucketTurn"] is True  # parked for its turn in the bucket

    # When the held task comes back (its bucket refilled) and Twilio answers 429 once; the
    # 429's second of Retry-After is past on the scheduler's clock at once, and the bucket,
    # emptied by the refused request, holds the task again
    await redis.delete(keys.provider_bucket("twilio", project))
    await sim.add_fault("rate_limit", "twilio", times=1, retry_after_s=1)
    clock.now_ms = held["dueAt"] + 1
    await drain(*pipeline)
    # (parked by the provider's 429, the task holds no turn in notifkit's bucket; held by the
    # bucket again afterwards, it does)
    deferred, held_again = [e["payload"] for e in await entries(redis, keys.scheduled)
                            if e["payload"]["parkCount"]]
    assert "bucketTurn" not in deferred
    assert held_again["bucketTurn"] is True
    await redis.delete(keys.provider_bucket("twilio", project))
    clock.now_ms += 11_000
    await drain(*pipeline)

    # Then its timeline shows every hold and the 429 (at the same attempt as the first hold,
    # which used none) before the send
    assert len(await sim.messages("twilio")) == 2
    rows = [r for r in await timeline(db, event_id) if r["task_id"] == held["taskId"]]
    assert kinds(rows, "sms") == [
        ("queued", "processing", 0), ("rate_limited", "scheduled", 1),
        ("deferred", "scheduled", 1), ("rate_limited", "scheduled", 2), ("sent", "sent", 2)]


async def test_a_critical_sends_outbox_write_never_waits_behind_a_lower_streams(
    keys: Keys, services: ServiceFactory, sim_settings: Settings,
) -> None:
    delivery = await services(DeliveryService, sim_settings)
    # Given a low send's 'sent' write that is slow to come back
    writes: list[tuple[str | None, list[str]]] = []
    release, written = asyncio.Event(), asyncio.Event()

    async def record(rows: list[Any]) -> list[None]:
        writes.append((batch_stream.get(), [row[0] for row in rows]))
        written.set()
        await release.wait()
        return [None] * len(rows)

    delivery._record_sent = record  # type: ignore[method-assign]

    async def accepted(stream: str, task_id: str) -> None:
        batch_stream.set(stream)  # as the worker sets it for the batch's task
        await delivery._recorder().submit((task_id, "email", "a@example.com", "sent", None))

    async def writes_out(count: int) -> None:
        while len(writes) < count:
            written.clear()
            await written.wait()

    low = asyncio.create_task(accepted(keys.outbound("low"), "low-task"))
    await asyncio.wait_for(writes_out(1), 5)
    # When a critical send is accepted meanwhile
    critical = asyncio.create_task(accepted(keys.outbound("critical"), "critical-task"))
    # Then its write is out at once (not held until the low one returns), in its own
    # stream's context (its own connections)
    await asyncio.wait_for(writes_out(2), 5)
    assert writes == [(keys.outbound("low"), ["low-task"]),
                      (keys.outbound("critical"), ["critical-task"])]
    release.set()
    await asyncio.gather(low, critical)


def watch_sent_writes(delivery: DeliveryService) -> list[list[str]]:
    """The destinations of each 'sent' write delivery makes on its own (not with a batch's
    outcome write), as they happen."""
    written_alone: list[list[str]] = []
    record_sent = delivery._record_sent

    async def record(rows: list[Any]) -> list[None]:
        written_alone.append([row[2] for row in rows])
        await record_sent(rows)
        return [None] * len(rows)

    delivery._record_sent = record  # type: ignore[method-assign]
    return written_alone


async def test_a_batchs_last_accepted_send_is_recorded_by_its_outcome_write(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    # Given a push to a user's two devices, and delivery's own 'sent' writes watched
    await add_user(db, project, "u1", contacts=[("push", "phone"), ("push", "tablet")])
    await add_template(db, project, "t", {"push": PUSH})
    enricher, engine, delivery = await stages(services, sim_settings)
    written_alone = watch_sent_writes(delivery)

    # When the task is delivered
    await send(redis, keys, db, project, "t", "u1", data={"amount": "1"})
    await drain(enricher, engine, delivery)

    # Then the device accepted first was recorded at once, and the last one with the
    # batch's outcome: the outbox says sent for both, with the provider's ids
    messages = {m["to"]: m for m in await sim.messages("fcm")}
    assert sorted(messages) == ["phone", "tablet"]
    assert [len(alone) for alone in written_alone] == [1]
    rows = await db.fetch("SELECT destination, status, provider_message_id "
                          "FROM delivery_outbox WHERE project_id = $1", project)
    assert {r["destination"]: r["status"] for r in rows} == {"phone": "sent", "tablet": "sent"}
    for r in rows:  # FCM names a message projects/{project}/messages/{id}
        assert r["provider_message_id"].endswith("/" + messages[r["destination"]]["id"])


async def test_sends_through_an_idempotent_provider_are_recorded_by_the_outcome_write(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    # Given two e-mails sent together through Resend, which takes the task id as its
    # idempotency key, and delivery's own 'sent' writes watched
    await add_user(db, project, "u1", contacts=[("email", "one@example.com")])
    await add_user(db, project, "u2", contacts=[("email", "two@example.com")])
    await add_template(db, project, "t", {"email": {"subject": "Paid", "text": "Paid"}})
    enricher, engine, delivery = await stages(services, sim_settings)
    written_alone = watch_sent_writes(delivery)

    # When both are delivered in one batch
    await send(redis, keys, db, project, "t", ["u1", "u2"], data={"amount": "1"})
    await drain(enricher, engine, delivery)

    # Then neither needed a write of its own (a retry after a crash would be answered with
    # the first send's message, not delivered twice): the batch's outcome write recorded
    # both as sent, with the provider's ids
    messages = {m["to"]: m for m in await sim.messages("resend")}
    assert sorted(messages) == ["one@example.com", "two@example.com"]
    assert written_alone == []
    rows = await db.fetch("SELECT destination, status, provider_message_id "
                          "FROM delivery_outbox WHERE project_id = $1", project)
    assert {r["destination"]: (r["status"], r["provider_message_id"]) for r in rows} == {
        to: ("sent", m["id"]) for to, m in messages.items()}


class ContentBreakingSms:
    """An SMS transport that cannot build the message for one number (as a transport whose
    encoder refuses a message's content raises) and accepts every other."""

    channel = "sms"
    provider = "breaking-sms"
    idempotent = True
    rate_per_s = None

    def __init__(self, breaks_on: str) -> None:
        self.breaks_on = breaks_on
        self.calls: list[str] = []

    async def open(self, ctx: Any) -> None:
        return None

    async def close(self) -> None:
        return None

    async def send(self, message: Message) -> SendResult:
        self.calls.append(message.to)
        if message.to == self.breaks_on:
            raise ValueError("cannot encode this body")
        return SendResult(Outcome.SENT, f"id-{message.to}", "accepted", 200)


async def test_a_send_its_transport_raises_on_fails_alone_and_at_once(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sp_settings: Settings,
) -> None:
    # Given two recipients sent to together, and a transport that raises on one's message
    await add_user(db, project, "ok", contacts=[("sms", "+15550000001")])
    await add_user(db, project, "bad", contacts=[("sms", "+15550000002")])
    await add_template(db, project, "t", {"sms": SMS})
    transport = ContentBreakingSms("+15550000002")
    pipeline = (await services(EnricherService, sp_settings),
                await services(EngineService, sp_settings),
                await services(DeliveryService, sp_settings, transports=[transport]))

    event_id = await send(redis, keys, db, project, "t", ["ok", "bad"], data={"amount": "1"})
    await drain(*pipeline)

    # Then the other recipient's send stands, sent once, and the raising one is a permanent
    # failure: tried once, dead-lettered at once with the reason on its timeline
    assert sorted(transport.calls) == ["+15550000001", "+15550000002"]
    rows = await timeline(db, event_id)
    by_user = {u: [(r["kind"], r["status"], r["attempt"]) for r in rows
                   if r["user_id"] == u and r["channel"] == "sms"] for u in ("ok", "bad")}
    assert by_user["ok"] == [("queued", "processing", 0), ("sent", "sent", 1)]
    assert by_user["bad"] == [("queued", "processing", 0),
                              ("dead_lettered", "dead_lettered", 1)]
    dead_row = next(r for r in rows if r["user_id"] == "bad" and r["kind"] == "dead_lettered")
    assert "ValueError: cannot encode this body" in dead_row["detail"]
    [dead] = await entries(redis, keys.dlq)
    assert dead["attempts"] == 1


async def test_a_provider_answer_that_is_no_utf_8_text_is_recorded_and_settles_its_batch(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sp_settings: Settings,
) -> None:
    """An SMTP server that words its replies in Latin-1 ("550 5.1.1 Empfänger unbekannt")
    or puts a NUL in one: its text went into the timeline row and the outcome event as it
    was read (undecodable bytes as lone surrogates), which PostgreSQL and the stream codec
    refuse. The batch's outcome write failed on every attempt: no row said why, the task was
    retried to the attempt limit, and the batch's last accepted send, whose record rides on
    that write, was sent again."""
    replies = {b"latin@example.com": b"550 5.1.1 Empf\xe4nger unbekannt",
               b"nul@example.com": b"550 5.1.1 no such\x00user"}
    received: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"220 localhost ESMTP\r\n")
        in_data = False
        while line := await reader.readline():
            if in_data:
                if line.rstrip(b"\r\n") == b".":
                    in_data = False
                    await asyncio.sleep(0.3)  # the accepted send is the batch's last
                    writer.write(b"250 2.0.0 queued\r\n")
            elif line.upper().startswith(b"RCPT"):
                recipient = line.split(b"<", 1)[1].split(b">", 1)[0]
                refusal = replies.get(recipient)
                if refusal is None:
                    received.append(recipient)
                writer.write((refusal or b"250 2.1.5 OK") + b"\r\n")
            elif line.upper().startswith(b"DATA"):
                in_data = True
                writer.write(b"354 go ahead\r\n")
            elif line.upper().startswith(b"QUIT"):
                writer.write(b"221 bye\r\n")
                break
            else:
                writer.write(b"250 OK\r\n")
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = int(server.sockets[0].getsockname()[1])
    try:
        for user, address in (("ok", "ok@example.com"), ("latin", "latin@example.com"),
                              ("nul", "nul@example.com")):
            await add_user(db, project, user, contacts=[("email", address)])
        await add_template(db, project, "t", {"email": {"subject": "Hi", "text": "Hello"}})
        smtp = SmtpTransport(url=f"smtp://127.0.0.1:{port}", from_addr="n@example.com",
                             timeout_s=5.0)
        pipeline = (await services(EnricherService, sp_settings),
                    await services(EngineService, sp_settings),
                    await services(DeliveryService, sp_settings, transports=[smtp]))

        event_id = await send(redis, keys, db, project, "t", ["ok", "latin", "nul"],
                              data={"amount": "1"})
        await drain(*pipeline)
    finally:
        server.close()
        await server.wait_closed()

    # Then the accepted address got the e-mail once, and each refusal is on its timeline
    # row, the server's text readable, the contact disabled, nothing dead-lettered
    assert received == [b"ok@example.com"]
    rows = await timeline(db, event_id)
    sent = [(r["user_id"], r["kind"], r["attempt"]) for r in rows if r["kind"] != "queued"]
    assert sorted(sent) == [("latin", "failed", 1), ("nul", "failed", 1), ("ok", "sent", 1)]
    details = {r["user_id"]: r["detail"] for r in rows if r["kind"] == "failed"}
    assert details["latin"].endswith("SMTP 550: 5.1.1 Empf\ufffdnger unbekannt")
    assert details["nul"].endswith("SMTP 550: 5.1.1 no such\ufffduser")
    assert await db.fetchval("SELECT count(*) FROM user_contacts WHERE enabled") == 1
    assert await entries(redis, keys.dlq) == []
    events = await entries(redis, keys.events_inbound)
    assert sorted(e["type"] for e in events) == [
        "notification:invalid_token", "notification:invalid_token", "notification:sent"]


async def test_the_rate_limits_of_projects_a_delivery_process_remembers_are_bounded(
    services: ServiceFactory, db: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A delivery process runs for months and sends for every project there is: what it
    # remembers of their rateLimits must not grow with every project that ever sent.
    monkeypatch.setattr(delivery_service, "MAX_PROJECT_SETTINGS", 4, raising=False)
    delivery = await services(DeliveryService)
    limited = await add_project(db, {"rateLimits": {"email": 7}})
    others = [await add_project(db) for _ in range(10)]

    for project_id in others:
        assert await delivery._limits({project_id}) == {project_id: {}}
        assert len(delivery._project_settings) <= 4
    both = await delivery._limits({limited, others[0]})
    assert both == {limited: {"email": 7}, others[0]: {}}
    assert len(delivery._project_settings) <= 4


@pytest.mark.parametrize("wrong", [{"campaignId": 7}, {"topic": ["billing"]}])
async def test_a_task_of_the_wrong_shape_is_acked_alone_and_its_batch_is_sent(
    wrong: dict[str, Any], db: asyncpg.Pool, redis: Redis, keys: Keys, project: str,
    services: ServiceFactory, sim: SimulatorServer, sim_settings: Settings,
) -> None:
    """A field of the wrong type that parsed failed the batch's outcome write: every task
    read with it was sent, then retried and dead-lettered with it, though it had gone out."""
    for user in ("u1", "u2"):
        await add_user(db, project, user, contacts=[("email", f"{user}@example.com")])
    delivery = await services(DeliveryService, sim_settings)
    event_id = await send(redis, keys, db, project, "t", "u1", data={})

    def task(user: str, **fields: Any) -> dict[str, Any]:
        return {"taskId": f"task-{user}", "eventId": event_id, "projectId": project,
                "userId": user, "channel": "email", "priority": "normal", "template": "t",
                "to": [f"{user}@example.com"], "content": {"subject": "s", "text": "t"},
                "createdAt": "2026-12-04T00:00:00.000Z", **fields}

    await xadd(redis, keys.outbound("normal"), task("u1", **wrong), 10_000)
    await xadd(redis, keys.outbound("normal"), task("u2"), 10_000)
    await drain(delivery)

    assert [m["to"] for m in await sim.messages("resend")] == ["u2@example.com"]
    assert [r["kind"] for r in await timeline(db, event_id) if r["task_id"] == "task-u2"] \
        == ["sent"]
    assert await entries(redis, keys.dlq) == []
    assert delivery.worker.stats.failed == 0
