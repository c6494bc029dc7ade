"""Quiet hours, throttles and suppressions through the real enricher, engine, scheduler and
events services: the decisions land on the timeline and the deferred sends leave on time."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import asyncpg
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.ids import uuid7
from notifkit.keys import Keys
from notifkit.services.engine import EngineService
from notifkit.services.enricher import EnricherService
from notifkit.services.events import EventsService
from notifkit.streams import xadd

from .helpers import FakeClock, SchedulerFactory
from .pipeline import EMAIL, add_template, add_user, drain, entries, send, set_project_settings
from .pipeline import timeline as event_timeline


class Clock:
    """The engine's clock (seconds), moved by the test."""

    def __init__(self, when: datetime) -> None:
        self.now_s = when.timestamp()

    def __call__(self) -> float:
        return self.now_s


def ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


def kinds(rows: list[dict[str, Any]], channel: str = "email") -> list[tuple[str, str]]:
    return [(r["kind"], r["status"]) for r in rows if r["channel"] == channel]


async def test_quiet_hours_defer_to_the_right_instant_across_dst_and_critical_bypasses(
    settings: Settings, db: asyncpg.Pool, redis: Redis, keys: Keys, project_id: str,
    make_scheduler: SchedulerFactory, clock: FakeClock,
) -> None:
    # Given two users with quiet hours 22:00-07:00, in Berlin and in New York
    await add_user(db, project_id, "berlin", contacts=[("email", "b@example.com")],
                   timezone="Europe/Berlin", quiet=("22:00", "07:00"))
    await add_user(db, project_id, "newyork", contacts=[("email", "n@example.com")],
                   timezone="America/New_York", quiet=("22:00", "07:00"))
    await add_template(db, project_id, "code", {"email": EMAIL})
    engine_clock = Clock(datetime(2026, 3, 28, 23, 0, tzinfo=UTC))  # Berlin: 00:00 CET
    enricher = EnricherService(settings)
    engine = EngineService(settings, clock=engine_clock)
    scheduler = make_scheduler()
    try:
        # When a normal and a critical send reach Berlin at midnight before the spring change
        deferred = await send(redis, keys, db, project_id, "code", "berlin")
        urgent = await send(redis, keys, db, project_id, "code", "berlin", priority="critical")
        await drain(enricher, engine)
        # And a normal send reaches New York during the repeated hour of the fall change
        engine_clock.now_s = datetime(2026, 11, 1, 6, 30, tzinfo=UTC).timestamp()  # 01:30 EST
        late = await send(redis, keys, db, project_id, "code", "newyork")
        await drain(enricher, engine)
    finally:
        await enricher.close()
        await engine.close()

    # Then the critical one is queued at once, the others wait for 07:00 local
    assert [t["eventId"] for t in await entries(redis, keys.outbound("critical"))] == [urgent]
    scheduled = {t["payload"]["eventId"]: t for t in await entries(redis, keys.scheduled)}
    berlin_end = datetime(2026, 3, 29, 5, 0, tzinfo=UTC)  # 07:00 CEST, 8 hours after 22:00 CET
    newyork_end = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)  # 07:00 EST
    assert scheduled[deferred]["dueAt"] == ms(berlin_end)
    assert scheduled[late]["dueAt"] == ms(newyork_end)
    assert {t["reason"] for t in scheduled.values()} == {"quietHours"}
    assert kinds(await event_timeline(db, deferred)) == [("deferred", "scheduled")]
    assert kinds(await event_timeline(db, urgent)) == [("queued", "processing")]

    # And the scheduler lets each go at that instant, not a millisecond before
    for now, expected in ((ms(berlin_end) - 1, set()), (ms(berlin_end), {deferred}),
                          (ms(newyork_end) - 1, {deferred}),
                          (ms(newyork_end), {deferred, late})):
        clock.now_ms = now
        await scheduler.run_until_idle()
        assert {t["eventId"] for t in await entries(redis, keys.outbound("normal"))} == expected


async def test_sends_over_the_throttle_are_recorded_with_the_reason_and_critical_bypasses(
    settings: Settings, db: asyncpg.Pool, redis: Redis, keys: Keys, project_id: str,
) -> None:
    # Given a project allowing 2 sends per user per minute
    await set_project_settings(db, project_id, {"throttle": {"limit": 2, "windowSeconds": 60}})
    await add_user(db, project_id, "u1", contacts=[("email", "u1@example.com")])
    await add_template(db, project_id, "code", {"email": EMAIL})
    engine_clock = Clock(datetime(2026, 6, 1, 12, 0, tzinfo=UTC))
    enricher = EnricherService(settings)
    engine = EngineService(settings, clock=engine_clock)
    try:
        # When three normal sends and a critical one arrive within the minute
        sends = [await send(redis, keys, db, project_id, "code", "u1") for _ in range(3)]
        await drain(enricher, engine)
        critical = await send(redis, keys, db, project_id, "code", "u1", priority="critical")
        await drain(enricher, engine)
        # And another normal one a minute later
        engine_clock.now_s += 60
        later = await send(redis, keys, db, project_id, "code", "u1")
        await drain(enricher, engine)
    finally:
        await enricher.close()
        await engine.close()

    outcomes = [kinds(await event_timeline(db, e)) for e in sends]
    assert sorted(outcomes) == [[("queued", "processing")]] * 2 + [[("throttled", "throttled")]]
    [throttled] = [e for e, o in zip(sends, outcomes, strict=True) if o[0][0] == "throttled"]
    [row] = await event_timeline(db, throttled)
    assert "throttled" in row["detail"]
    assert row["task_id"]  # a recipient row, visible in GET /v1/notifications/{id}
    assert kinds(await event_timeline(db, critical)) == [("queued", "processing")]
    assert kinds(await event_timeline(db, later)) == [("queued", "processing")]
    queued = {t["eventId"] for p in ("critical", "normal")
              for t in await entries(redis, keys.outbound(p))}
    assert queued == set(sends) - {throttled} | {critical, later}


async def test_the_deployment_default_throttle_applies_unless_the_project_turns_it_off(
    settings: Settings, db: asyncpg.Pool, redis: Redis, keys: Keys, project_id: str,
) -> None:
    strict = settings.replace(throttle_limit=1, throttle_window_s=3600)
    other = str(await db.fetchval(
        "INSERT INTO projects (name, settings) VALUES ('no-throttle', $1) RETURNING id",
        {"throttle": {"limit": 0}}))
    for project in (project_id, other):
        await add_user(db, project, "u1", contacts=[("email", "u1@example.com")])
        await add_template(db, project, "code", {"email": EMAIL})
    enricher, engine = EnricherService(strict), EngineService(strict)
    try:
        default = [await send(redis, keys, db, project_id, "code", "u1") for _ in range(2)]
        off = [await send(redis, keys, db, other, "code", "u1") for _ in range(2)]
        await drain(enricher, engine)
    finally:
        await enricher.close()
        await engine.close()
    first_kinds = [kinds(await event_timeline(db, e))[0][0] for e in default]
    assert sorted(first_kinds) == ["queued", "throttled"]
    assert [kinds(await event_timeline(db, e))[0][0] for e in off] == ["queued", "queued"]


async def test_a_critical_send_bypasses_the_deployment_default_throttle_too(
    settings: Settings, db: asyncpg.Pool, redis: Redis, keys: Keys, project_id: str,
) -> None:
    """The bypass is the priority's, not the project's settings': with one send an hour
    allowed by default, a critical send after a normal one still goes out, and takes no
    place in the window."""
    strict = settings.replace(throttle_limit=1, throttle_window_s=3600)
    await add_user(db, project_id, "u1", contacts=[("email", "u1@example.com")])
    await add_template(db, project_id, "code", {"email": EMAIL})
    enricher, engine = EnricherService(strict), EngineService(strict)
    try:
        first = await send(redis, keys, db, project_id, "code", "u1")
        await drain(enricher, engine)
        critical = await send(redis, keys, db, project_id, "code", "u1", priority="critical")
        await drain(enricher, engine)
        second = await send(redis, keys, db, project_id, "code", "u1")
        await drain(enricher, engine)
    finally:
        await enricher.close()
        await engine.close()
    assert kinds(await event_timeline(db, first)) == [("queued", "processing")]
    assert kinds(await event_timeline(db, critical)) == [("queued", "processing")]
    assert kinds(await event_timeline(db, second)) == [("throttled", "throttled")]
    assert [t["eventId"] for t in await entries(redis, keys.outbound("critical"))] == [critical]


async def test_a_hard_bounce_suppresses_the_address_and_the_next_send_skips_it(
    settings: Settings, db: asyncpg.Pool, redis: Redis, keys: Keys, project_id: str,
) -> None:
    await add_user(db, project_id, "u1", contacts=[("email", "bounced@example.com")])
    await add_template(db, project_id, "code", {"email": EMAIL})
    enricher, engine, events = (EnricherService(settings), EngineService(settings),
                                EventsService(settings))
    try:
        # Given a first send that the provider accepted (as delivery records it) ...
        first = await send(redis, keys, db, project_id, "code", "u1")
        await drain(enricher, engine)
        [task] = await entries(redis, keys.outbound("normal"))
        await db.execute(
            "INSERT INTO delivery_outbox (task_id, channel, destination, project_id, provider, "
            "provider_message_id, status) VALUES ($1, 'email', $2, $3, 'resend', 're_1', "
            "'sent')", task["taskId"], task["to"][0], project_id)
        await xadd(redis, keys.events_inbound, {
            "type": "notification:sent", "projectId": project_id, "eventId": first,
            "taskId": task["taskId"], "userId": "u1", "channel": "email",
            "provider": "resend", "providerMessageId": "re_1", "attempt": 1,
            "campaignId": None, "at": "2026-06-01T12:00:00.000Z"}, maxlen=1000)
        # ... and then reported a hard bounce (the api's receipt of Resend's webhook)
        await xadd(redis, keys.events_inbound, {
            "type": "receipt", "projectId": project_id, "provider": "resend",
            "channel": "email", "providerMessageId": "re_1", "kind": "bounced",
            "at": "2026-06-01T12:00:05.000Z", "webhookId": f"resend:{uuid7()}:0",
            "to": "bounced@example.com",
            "raw": {"type": "email.bounced", "data": {
                "email_id": "re_1", "to": ["bounced@example.com"],
                "bounce": {"message": "The recipient's email provider sent a hard bounce "
                                      "message.", "subType": "General", "type": "Permanent"}}}},
            maxlen=1000)
        await drain(events)
        # When the next notification goes to the same user
        second = await send(redis, keys, db, project_id, "code", "u1")
        await drain(enricher, engine)
    finally:
        for service in (enricher, engine, events):
            await service.close()

    # Then the address is suppressed, the first send's timeline shows the bounce ...
    suppression = await db.fetchrow("SELECT channel, target, reason FROM suppressions")
    assert dict(suppression) == {"channel": "email", "target": "bounced@example.com",
                                 "reason": "bounce"}
    assert kinds(await event_timeline(db, first)) == [
        ("queued", "processing"), ("sent", "sent"), ("bounced", "failed")]
    # ... and the second is not sent, with the reason on its timeline
    assert len(await entries(redis, keys.outbound("normal"))) == 1
    [row] = await event_timeline(db, second)
    assert (row["kind"], row["status"]) == ("suppressed", "suppressed")
    assert "suppressed" in row["detail"]
