"""A channel that fails for good moves on to the template's fallback chain like a 5xx does:
a permanent refusal (4xx), an invalid token or address, a channel without a transport, a 429
still there at the attempt limit. Against the provider simulators, real Redis and
PostgreSQL.

What does not move on: the transport raising on the message's own content (notifkit's fault,
dead-lettered for a replay once fixed), and a failure with no channel left (as before: the DLQ
and ``notification:failed``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from redis.asyncio import Redis

from notifkit.config import PushSettings, Settings
from notifkit.keys import Keys
from notifkit.services.delivery import DeliveryService
from notifkit.services.engine import EngineService
from notifkit.services.enricher import EnricherService
from notifkit.services.scheduler import SchedulerService
from notifkit.streams import ensure_group, xadd
from simulators import SimulatorServer
from tests.support.streams import xrange

from .conftest import ServiceFactory
from .helpers import add_template, add_user, drain, entries, send, timeline
from .test_delivery import EMAIL, PUSH, SMS, Clock, ContentBreakingSms, stages, with_events

CHAIN = ["push", "sms", "email"]
CONTENT = {"push": PUSH, "sms": SMS, "email": EMAIL}


def rows_of(rows: list[dict[str, Any]], user: str = "u1") -> list[tuple[str, str, str]]:
    return [(r["channel"], r["kind"], r["status"]) for r in rows if r["user_id"] == user]


def fell_back(first: str, then: str) -> list[tuple[str, str, str]]:
    """The timeline of a send that failed on ``first`` and went out on ``then``."""
    return [(first, "queued", "processing"), (first, "failed", "failed"),
            (then, "queued", "processing"), (then, "sent", "sent")]


async def add_chain_user(db: asyncpg.Pool, project: str, *, push: str = "device-1",
                         sms: str = "+15550000001") -> None:
    await add_user(db, project, "u1", contacts=[("push", push), ("sms", sms),
                                                ("email", "u1@example.com")])


async def outcome_events(redis: Redis, keys: Keys) -> list[tuple[str, str]]:
    return [(e["type"], e["channel"]) for e in await entries(redis, keys.events_inbound)]


@pytest.mark.parametrize("status", [400, 401, 403])
async def test_a_push_refused_for_good_falls_back_to_the_sms_once(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings, status: int,
) -> None:
    # Given a chain push -> sms -> email, and FCM refusing the push with a 4xx
    await add_chain_user(db, project)
    await add_template(db, project, "alert", CONTENT, fallback=CHAIN)
    await sim.add_fault("error", "fcm", status=status)

    event_id = await send(redis, keys, db, project, "alert", "u1", data={"amount": "9"})
    await drain(*await with_events(services, sim_settings))

    # Then push was tried once and the SMS went out once; nothing was dead-lettered
    assert (await sim.stats())["fcm"]["requests"] == 1
    [sms] = await sim.messages("twilio")
    assert (sms["to"], sms["acceptCount"]) == ("+15550000001", 1)
    assert await sim.messages("resend") == []
    assert await entries(redis, keys.dlq) == []
    # And the push row stays, failed with the provider's answer, before the SMS's rows
    rows = await timeline(db, event_id)
    assert rows_of(rows) == fell_back("push", "sms")
    failed = next(r for r in rows if r["kind"] == "failed")
    assert failed["detail"].startswith(f"HTTP {status}")
    assert failed["detail"].endswith("; trying sms next")
    assert failed["metadata"]["fallback"] == "sms"
    assert "fallback after push failed" in rows[2]["detail"]
    assert sorted(await outcome_events(redis, keys)) == [
        ("notification:failed", "push"), ("notification:sent", "sms")]
    # The device was refused the message, not called invalid: it stays enabled
    assert await db.fetchval(
        "SELECT enabled FROM user_contacts WHERE target = 'device-1'") is True


async def test_an_invalid_push_token_and_a_refused_sms_reach_the_email(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    # Given a chain push -> sms -> email, a stale device token, and a number in a region the
    # Twilio account may not send to (21408: a refusal, not an invalid number)
    await add_chain_user(db, project, push="stale-token", sms="+15005550003")
    await add_template(db, project, "alert", CONTENT, fallback=CHAIN)
    await sim.add_fault("invalid_token", "fcm", to="stale-token")

    event_id = await send(redis, keys, db, project, "alert", "u1", data={"amount": "9"})
    await drain(*await with_events(services, sim_settings))

    # Then each channel was tried once, in order, and the e-mail went out once
    assert [m["to"] for m in await sim.messages("resend")] == ["u1@example.com"]
    stats = await sim.stats()
    assert (stats["fcm"]["requests"], stats["twilio"]["requests"]) == (1, 1)
    assert rows_of(await timeline(db, event_id)) == [
        ("push", "queued", "processing"), ("push", "failed", "failed"),
        ("sms", "queued", "processing"), ("sms", "failed", "failed"),
        ("email", "queued", "processing"), ("email", "sent", "sent")]
    # And only the token called invalid was disabled
    enabled = dict(await db.fetch("SELECT target, enabled FROM user_contacts"))
    assert enabled == {"stale-token": False, "+15005550003": True, "u1@example.com": True}
    assert await entries(redis, keys.dlq) == []


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[str, list[int]]]:
    """A webhook receiver on this machine answering the status its path names; the
    requests it got are listed by that status."""
    got: list[int] = []

    async def hook(request: web.Request) -> web.Response:
        status = int(request.match_info["status"])
        got.append(status)
        return web.Response(status=status)

    app = web.Application()
    app.router.add_post("/hook/{status}", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/hook", got
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(("status", "disabled"), [(404, False), (410, True)])
async def test_a_webhook_gone_or_not_found_falls_back_to_the_email(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings, receiver: tuple[str, list[int]],
    status: int, disabled: bool,
) -> None:
    url, got = receiver
    await add_user(db, project, "u1", contacts=[("webhook", f"{url}/{status}"),
                                                ("email", "u1@example.com")])
    await add_template(db, project, "t", {"webhook": {"body": "{}"}, "email": EMAIL},
                       fallback=["webhook", "email"])
    settings = sim_settings.replace(webhook_allow_private_networks=True)

    event_id = await send(redis, keys, db, project, "t", "u1", data={"amount": "1"})
    await drain(*await stages(services, settings))

    assert got == [status]
    assert [m["to"] for m in await sim.messages("resend")] == ["u1@example.com"]
    assert rows_of(await timeline(db, event_id)) == fell_back("webhook", "email")
    # 410 Gone disables the URL for good; a 404 is a refusal of this message only
    assert await db.fetchval(
        "SELECT enabled FROM user_contacts WHERE channel = 'webhook'") is not disabled
    assert await entries(redis, keys.dlq) == []


async def test_a_channel_without_a_transport_falls_back_naming_the_settings(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    # Given a deployment without push configured, and a chain push -> sms
    await add_chain_user(db, project)
    await add_template(db, project, "alert", {"push": PUSH, "sms": SMS}, fallback=["push", "sms"])
    settings = sim_settings.replace(push=PushSettings())

    event_id = await send(redis, keys, db, project, "alert", "u1", data={"amount": "9"})
    await drain(*await with_events(services, settings))

    # Then the SMS went out once, and the push row says which settings are missing
    [sms] = await sim.messages("twilio")
    assert sms["acceptCount"] == 1
    assert await entries(redis, keys.dlq) == []
    rows = await timeline(db, event_id)
    assert rows_of(rows) == fell_back("push", "sms")
    failed = next(r for r in rows if r["kind"] == "failed")
    assert failed["detail"].startswith("no push transport is configured; set FCM_PROJECT_ID")
    assert failed["detail"].endswith("; trying sms next")
    assert failed["attempt"] == 1
    assert sorted(await outcome_events(redis, keys)) == [
        ("notification:failed", "push"), ("notification:sent", "sms")]
    assert await db.fetchval(
        "SELECT enabled FROM user_contacts WHERE target = 'device-1'") is True


async def test_a_429_still_there_at_the_attempt_limit_falls_back(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    # Given a chain sms -> email, and Twilio answering 429 to every attempt
    await add_user(db, project, "u1", contacts=[("sms", "+15550000001"),
                                                ("email", "u1@example.com")])
    await add_template(db, project, "t", {"sms": SMS, "email": EMAIL}, fallback=["sms", "email"])
    await sim.add_fault("rate_limit", "twilio", retry_after_s=1)
    clock = Clock()
    pipeline = (*await stages(services, sim_settings),
                await services(SchedulerService, sim_settings, clock=clock))

    event_id = await send(redis, keys, db, project, "t", "u1", data={"amount": "1"})
    await drain(*pipeline)
    # Then a 429 parks (it does not fall back) while attempts are left
    assert await sim.messages("resend") == []
    for _ in range(2):  # each time the window reopens, Twilio says 429 again
        clock.now_ms += 2_000
        await drain(*pipeline)

    # And at the limit the e-mail goes out, once, and nothing is dead-lettered
    assert (await sim.stats())["twilio"]["requests"] == 3
    assert [m["to"] for m in await sim.messages("resend")] == ["u1@example.com"]
    assert await entries(redis, keys.dlq) == []
    rows = await timeline(db, event_id)
    assert [(c, k, s) for c, k, s in rows_of(rows)] == [
        ("sms", "queued", "processing"), ("sms", "deferred", "scheduled"),
        ("sms", "deferred", "scheduled"), ("sms", "failed", "failed"),
        ("email", "queued", "processing"), ("email", "sent", "sent")]
    failed = next(r for r in rows if r["kind"] == "failed")
    assert failed["attempt"] == 3
    assert failed["detail"].startswith("still rate limited after 3 attempts")
    assert failed["detail"].endswith("; trying email next")


async def test_a_chain_that_fails_on_every_channel_ends_in_the_dlq_as_before(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    # Given a chain push -> sms, both refusing the message for good
    await add_chain_user(db, project)
    await add_template(db, project, "alert", {"push": PUSH, "sms": SMS}, fallback=["push", "sms"])
    await sim.add_fault("error", "fcm", status=403)
    await sim.add_fault("error", "twilio", status=403)

    event_id = await send(redis, keys, db, project, "alert", "u1", data={"amount": "9"})
    await drain(*await stages(services, sim_settings))

    # Then the chain's last channel is dead-lettered at once, as a refusal always was
    stats = await sim.stats()
    assert (stats["fcm"]["requests"], stats["twilio"]["requests"]) == (1, 1)
    assert rows_of(await timeline(db, event_id)) == [
        ("push", "queued", "processing"), ("push", "failed", "failed"),
        ("sms", "queued", "processing"), ("sms", "dead_lettered", "dead_lettered")]
    [dead] = await entries(redis, keys.dlq)
    assert (dead["payload"]["channel"], dead["attempts"]) == ("sms", 1)
    failed = [(e["channel"], "stream" in e) for e in await entries(redis, keys.events_inbound)
              if e["type"] == "notification:failed"]
    # (the push's from delivery's fallback, the SMS's from the dead-lettering)
    assert sorted(failed) == [("push", False), ("sms", True)]


async def test_a_message_the_transport_cannot_build_is_dead_lettered_not_fallen_back(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    """notifkit's own failure (the transport raised building the message) says nothing about
    the recipient's number: it is kept in the DLQ, to be replayed once fixed, rather than
    moved to another, maybe paid, channel."""
    await add_user(db, project, "u1", contacts=[("sms", "+15550000002"),
                                                ("email", "u1@example.com")])
    await add_template(db, project, "t", {"sms": SMS, "email": EMAIL}, fallback=["sms", "email"])
    transport = ContentBreakingSms("+15550000002")
    pipeline = (await services(EnricherService, sim_settings),
                await services(EngineService, sim_settings),
                await services(DeliveryService, sim_settings, transports=[transport]))

    event_id = await send(redis, keys, db, project, "t", "u1", data={"amount": "1"})
    await drain(*pipeline)

    assert transport.calls == ["+15550000002"]
    assert await sim.messages("resend") == []
    assert rows_of(await timeline(db, event_id)) == [
        ("sms", "queued", "processing"), ("sms", "dead_lettered", "dead_lettered")]
    assert len(await entries(redis, keys.dlq)) == 1


async def test_a_refused_task_delivered_twice_falls_back_once(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    """Per-stage dedup: a second entry of the refused task (a mover that handed it over
    twice) is dropped by delivery, and the fallback's re-entry handed to the engine twice
    routes the SMS once."""
    await add_chain_user(db, project)
    await add_template(db, project, "alert", CONTENT, fallback=CHAIN)
    await sim.add_fault("error", "fcm", status=403)
    enricher, engine, delivery = await stages(services, sim_settings)
    event_id = await send(redis, keys, db, project, "alert", "u1", data={"amount": "9"})
    await drain(enricher, engine)
    [task] = await entries(redis, keys.outbound("normal"))
    await xadd(redis, keys.outbound("normal"), task, 1000)

    await drain(delivery)
    # (the second entry was dropped: one push request, one fallback on enriched)
    assert (await sim.stats())["fcm"]["requests"] == 1
    re_entries = [e for e in await entries(redis, keys.enriched("normal"))
                  if e.get("fallbackFrom")]
    assert len(re_entries) == 1
    await xadd(redis, keys.enriched("normal"), json.loads(json.dumps(re_entries[0])), 1000)
    await drain(engine, delivery)

    [sms] = await sim.messages("twilio")
    assert sms["acceptCount"] == 1
    assert rows_of(await timeline(db, event_id)) == fell_back("push", "sms")


async def test_a_refused_task_reclaimed_after_its_process_died_falls_back_once(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    sim: SimulatorServer, sim_settings: Settings,
) -> None:
    """A process that died after reading the task emitted nothing (the fallback goes out
    with the ack): the survivor's attempt is the one that falls back, once."""
    await add_chain_user(db, project)
    await add_template(db, project, "alert", {"push": PUSH, "sms": SMS}, fallback=["push", "sms"])
    await sim.add_fault("error", "fcm", status=403)
    enricher, engine, delivery = await stages(services, sim_settings)
    event_id = await send(redis, keys, db, project, "alert", "u1", data={"amount": "9"})
    await drain(enricher, engine)
    stream, group = keys.outbound("normal"), keys.group("delivery")
    [(entry_id, _fields)] = await xrange(redis, stream)
    await ensure_group(redis, stream, group)
    await redis.xreadgroup(group, "delivery-host-gone", {stream: ">"})
    await redis.set(keys.attempts(group, entry_id.decode(), stream), 1)

    await drain(delivery, engine)

    assert (await sim.stats())["fcm"]["requests"] == 1
    [sms] = await sim.messages("twilio")
    assert sms["acceptCount"] == 1
    assert len([e for e in await entries(redis, keys.enriched("normal"))
                if e.get("fallbackFrom")]) == 1
    rows = await timeline(db, event_id)
    assert rows_of(rows) == fell_back("push", "sms")
    assert rows[1]["attempt"] == 2
    assert await redis.xpending(stream, group) == {
        "pending": 0, "min": None, "max": None, "consumers": []}
