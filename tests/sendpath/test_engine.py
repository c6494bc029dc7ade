"""The engine: channel choice, rendering, dedup and routing, with every decision on the
timeline. Driven through the enricher from inbound messages, as in production."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

import asyncpg
import pytest
from redis.asyncio import Redis

from notifkit.clock import to_ms
from notifkit.ids import uuid7
from notifkit.keys import Keys
from notifkit.services.engine import EngineService
from notifkit.services.enricher import EnricherService
from notifkit.streams import decode, encode
from notifkit.unsubscribe import verify_token
from tests.support.compiling import watch_compiles
from tests.support.streams import xrange

from .conftest import ServiceFactory
from .helpers import add_template, add_user, drain, entries, send, timeline

EMAIL = {"subject": "Invoice {{ data.amount }}", "text": "Hi {{ user.attributes.name }}",
         "html": "<p>{{ data.amount }}</p>"}
SMS = {"text": "Paid {{ data.amount }}"}
PUSH = {"title": "Paid", "body": "{{ data.amount }}"}


async def pipeline(services: ServiceFactory, **engine_options: Any) -> tuple[Any, Any]:
    return await services(EnricherService), await services(EngineService, **engine_options)


def by_channel(tasks: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {t["channel"]: t for t in tasks}


async def test_each_requested_channel_is_rendered_and_queued(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory
) -> None:
    await add_user(db, project, "u1", contacts=[("email", "ada@example.com"),
                                                 ("sms", "+15550001")],
                   attributes={"name": "Ada"})
    await add_template(db, project, "invoice", {"email": EMAIL, "sms": SMS}, topic="billing")
    stages = await pipeline(services)

    event_id = await send(redis, keys, db, project, "invoice", "u1", data={"amount": "12.00"},
                          campaign_id="c1")
    await drain(*stages)

    tasks = by_channel(await entries(redis, keys.outbound("normal")))
    assert set(tasks) == {"email", "sms"}
    email = tasks["email"]
    assert email["to"] == ["ada@example.com"]
    assert email["content"] == {"subject": "Invoice 12.00", "text": "Hi Ada",
                                "html": "<p>12.00</p>"}
    assert email["campaignId"] == "c1"
    assert email["topic"] == "billing"
    token = email["unsubscribeUrl"].split("token=")[1]

    unsub = verify_token("test-secret-0123456789abcdef", unquote(token))
    assert (unsub.project_id, unsub.user_id, unsub.topic) == (project, "u1", "billing")
    assert unsub.sent_ms == uuid.UUID(event_id).int >> 80  # when it was accepted
    assert tasks["sms"]["content"] == {"text": "Paid 12.00"}
    assert "fallback" not in tasks["sms"]

    rows = await timeline(db, event_id)
    assert {(r["channel"], r["kind"], r["status"], r["task_id"]) for r in rows} == {
        ("email", "queued", "processing", email["taskId"]),
        ("sms", "queued", "processing", tasks["sms"]["taskId"]),
    }


async def test_preferences_topic_opt_out_suppression_and_missing_contacts_are_recorded(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory
) -> None:
    # Given one user per reason a channel is not sent on
    await add_user(db, project, "pref", contacts=[("email", "p@example.com")],
                   channels={"email": False})
    await add_user(db, project, "topic", contacts=[("email", "t@example.com")],
                   topics={"billing": False})
    await add_user(db, project, "supp", contacts=[("email", "s@example.com")])
    await db.execute("INSERT INTO suppressions (project_id, channel, target, reason) "
                     "VALUES ($1, 'email', 's@example.com', 'bounce')", project)
    await add_user(db, project, "none")
    await add_user(db, project, "off", contacts=[("email", "o@example.com")])
    await db.execute("UPDATE user_contacts SET enabled = false, disabled_reason = 'bounced' "
                     "WHERE project_id = $1 AND user_id = 'off'", project)
    await add_template(db, project, "invoice", {"email": EMAIL}, topic="billing")
    stages = await pipeline(services)

    event_id = await send(redis, keys, db, project, "invoice",
                          ["pref", "topic", "supp", "none", "off"], data={"amount": "1"})
    await drain(*stages)

    assert await entries(redis, keys.outbound("normal")) == []
    rows = {r["user_id"]: r for r in await timeline(db, event_id)}
    assert {u: (r["kind"], r["status"], r["detail"]) for u, r in rows.items()} == {
        "pref": ("skipped", "skipped", "channel disabled by preference"),
        "topic": ("skipped", "skipped", "topic opted out (billing)"),
        "supp": ("suppressed", "suppressed", "address suppressed (bounce)"),
        "none": ("skipped", "skipped", "no contact"),
        "off": ("skipped", "skipped", "contact disabled (bounced)"),
    }
    assert all(r["channel"] == "email" and r["task_id"] for r in rows.values())


async def test_another_projects_suppression_of_the_same_address_does_not_apply(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory
) -> None:
    """Suppressions are per project: one tenant's bounce of an address, looked up in the
    same engine batch, does not keep another tenant's send to that address back."""
    from .helpers import add_project
    other = await add_project(db)
    for owner in (project, other):
        await add_user(db, owner, "u1", contacts=[("email", "shared@example.com")])
        await add_template(db, owner, "invoice", {"email": EMAIL})
    await db.execute("INSERT INTO suppressions (project_id, channel, target, reason) "
                     "VALUES ($1, 'email', 'shared@example.com', 'bounce')", other)
    stages = await pipeline(services)

    mine = await send(redis, keys, db, project, "invoice", "u1", data={"amount": "1"})
    theirs = await send(redis, keys, db, other, "invoice", "u1", data={"amount": "1"})
    await drain(*stages)

    assert [t["eventId"] for t in await entries(redis, keys.outbound("normal"))] == [mine]
    assert [r["kind"] for r in await timeline(db, theirs)] == ["suppressed"]


async def test_the_fallback_chain_sends_the_first_available_channel_only(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory
) -> None:
    # Given a chain push -> sms -> email, one user with every contact, one without push
    await add_user(db, project, "all", contacts=[("push", "tok-a"), ("push", "tok-b"),
                                                  ("sms", "+15550001"), ("email", "a@x.io")])
    await add_user(db, project, "nopush", contacts=[("sms", "+15550002"), ("email", "b@x.io")])
    await add_template(db, project, "alert", {"push": PUSH, "sms": SMS, "email": EMAIL,
                                              "inapp": {"text": "x"}},
                       fallback=["push", "sms", "email"])
    stages = await pipeline(services)

    event_id = await send(redis, keys, db, project, "alert", ["all", "nopush"],
                          data={"amount": "5"})
    await drain(*stages)

    # Then each user gets the first available chain channel plus in-app (not in the chain)
    tasks = await entries(redis, keys.outbound("normal"))
    sent = sorted((t["userId"], t["channel"]) for t in tasks)
    assert sent == [("all", "inapp"), ("all", "push"), ("nopush", "inapp"), ("nopush", "sms")]
    push = next(t for t in tasks if t["channel"] == "push")
    assert push["to"] == ["tok-a", "tok-b"]  # every device
    assert push["fallback"]["chain"] == ["sms", "email"]
    assert push["fallback"]["recipient"]["contacts"] == {"sms": ["+15550001"],
                                                        "email": ["a@x.io"]}
    sms = next(t for t in tasks if t["channel"] == "sms")
    assert sms["fallback"]["chain"] == ["email"]
    inapp = next(t for t in tasks if t["userId"] == "all" and t["channel"] == "inapp")
    assert inapp["to"] == ["all"]
    assert "fallback" not in inapp
    skipped = [(r["user_id"], r["channel"], r["detail"]) for r in await timeline(db, event_id)
               if r["kind"] == "skipped"]
    assert skipped == [("nopush", "push", "no contact")]


async def test_a_chain_channel_without_template_content_gets_generic_content(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory
) -> None:
    # Given a chain push -> email on a template with e-mail content alone
    await add_user(db, project, "u1", contacts=[("push", "tok-a"), ("email", "a@x.io")])
    await add_template(db, project, "order-shipped", {"email": EMAIL},
                       fallback=["push", "email"])
    stages = await pipeline(services)

    await send(redis, keys, db, project, "order-shipped", "u1", data={"order": "A-1"})
    await drain(*stages)

    # Then push goes first, with the generic content, and can fall back to the e-mail
    [task] = await entries(redis, keys.outbound("normal"))
    assert task["channel"] == "push"
    assert task["content"] == {"title": "Order shipped", "body": "order: A-1"}
    assert task["fallback"]["chain"] == ["email"]
    # and its timeline row says why the push reads as it does
    [row] = [r for r in await timeline(db, task["eventId"]) if r["channel"] == "push"]
    assert row["detail"] == "queued; the template has no push content, generic content sent"


async def test_a_task_carries_only_the_chain_channels_it_could_fall_back_to(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory
) -> None:
    # Given a chain push -> sms -> email, a user reachable by push alone and one by push and
    # e-mail: a channel the user cannot be reached on is no fallback, so a 5xx on the last
    # reachable channel goes to the retry cycle instead of ending the send as failed
    await add_user(db, project, "pushonly", contacts=[("push", "tok-a")])
    await add_user(db, project, "pushmail", contacts=[("push", "tok-b"), ("email", "b@x.io")])
    await add_template(db, project, "alert", {"push": PUSH, "sms": SMS, "email": EMAIL},
                       fallback=["push", "sms", "email"])
    stages = await pipeline(services)

    await send(redis, keys, db, project, "alert", ["pushonly", "pushmail"], data={"amount": "5"})
    await drain(*stages)

    tasks = {t["userId"]: t for t in await entries(redis, keys.outbound("normal"))}
    assert sorted(tasks) == ["pushmail", "pushonly"]
    assert "fallback" not in tasks["pushonly"]
    assert tasks["pushmail"]["fallback"]["chain"] == ["email"]
    # ... while the route a fallback re-enters the engine with passes sms, so the timeline
    # says why it was passed over
    assert tasks["pushmail"]["fallback"]["route"] == ["sms", "email"]
    assert tasks["pushmail"]["fallback"]["recipient"]["contacts"] == {"email": ["b@x.io"]}


async def test_a_channel_without_template_content_gets_generic_content(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory
) -> None:
    await add_user(db, project, "u1", contacts=[("sms", "+15550001")])
    await add_template(db, project, "order-shipped", {"email": EMAIL})
    stages = await pipeline(services)

    await send(redis, keys, db, project, "order-shipped", "u1", channels=["sms"],
               data={"order": "A-1", "eta": "Friday"})
    await drain(*stages)

    [task] = await entries(redis, keys.outbound("normal"))
    assert task["content"] == {"text": "Order shipped: order: A-1, eta: Friday"}
    [row] = await timeline(db, task["eventId"])
    assert row["detail"] == "queued; the template has no sms content, generic content sent"


async def test_a_template_that_fails_to_render_says_so_also_on_a_send_that_waits(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a template using data the sends do not carry, one send now and one later
    await add_user(db, project, "u1", contacts=[("sms", "+15550001")])
    await add_template(db, project, "t", {"sms": SMS})
    stages = await pipeline(services)
    now = await send(redis, keys, db, project, "t", "u1", data={})
    later = await send(redis, keys, db, project, "t", "u1", data={},
                       send_at="2099-01-01T00:00:00Z")
    await drain(*stages)

    # Then both go out with generic content, and both rows say the template failed
    [queued] = await timeline(db, now)
    [scheduled] = await timeline(db, later)
    assert (queued["kind"], scheduled["kind"]) == ("queued", "scheduled")
    for row in (queued, scheduled):
        assert "the template failed (channels.sms.text:" in row["detail"]
        assert row["detail"].endswith("generic content sent")
    assert scheduled["detail"].startswith("scheduled until 2099-01-01T00:00:00.000Z; ")
    # and the operator's log says it too, once per send
    warned = [r for r in caplog.records if "template failed to render" in r.getMessage()]
    assert len(warned) == 2


async def test_a_future_send_and_quiet_hours_go_to_the_scheduler(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory
) -> None:
    # Given a clock at 23:00 UTC, a user in quiet hours (22:00-07:00 UTC) and one without
    now = datetime(2026, 6, 1, 23, 0, tzinfo=UTC).timestamp()
    await add_user(db, project, "night", contacts=[("sms", "+15550001")])
    await db.execute("INSERT INTO quiet_hours VALUES ($1, 'night', '22:00', '07:00')", project)
    await add_user(db, project, "day", contacts=[("sms", "+15550002")])
    await add_template(db, project, "t", {"sms": SMS})
    stages = await pipeline(services, clock=lambda: now)

    quiet = await send(redis, keys, db, project, "t", "night", data={"amount": "1"})
    later = await send(redis, keys, db, project, "t", "day", data={"amount": "1"},
                       send_at="2026-06-02T09:30:00Z")
    urgent = await send(redis, keys, db, project, "t", "night", data={"amount": "1"},
                        priority="critical")
    # (a sendAt already past, at noon, outside quiet hours: it is due now, in them)
    overdue = await send(redis, keys, db, project, "t", "night", data={"amount": "1"},
                         send_at="2026-06-01T12:00:00Z")
    await drain(*stages)

    # Then the critical one goes out now, the other three wait on the scheduled stream
    [now_task] = await entries(redis, keys.outbound("critical"))
    assert now_task["eventId"] == urgent
    scheduled = {s["payload"]["eventId"]: s for s in await entries(redis, keys.scheduled)}
    assert set(scheduled) == {quiet, later, overdue}
    morning = int(datetime(2026, 6, 2, 7, 0, tzinfo=UTC).timestamp() * 1000)
    for held in (quiet, overdue):
        assert (scheduled[held]["reason"], scheduled[held]["dueAt"]) == ("quietHours", morning)
    assert scheduled[later]["reason"] == "sendAt"
    assert scheduled[later]["stream"] == keys.outbound("normal")
    assert scheduled[later]["payload"]["content"] == {"text": "Paid 1"}
    [deferred] = await timeline(db, quiet)
    assert (deferred["kind"], deferred["status"]) == ("deferred", "scheduled")
    # It names the quiet hours and the zone they were read in: this user has no timezone, so
    # UTC, which the row did not say
    assert deferred["detail"] == ("deferred for quiet hours (22:00-07:00 UTC) until "
                                  "2026-06-02T07:00:00.000Z")
    assert deferred["metadata"]["timezone"] == "UTC"
    [planned] = await timeline(db, later)
    assert (planned["kind"], planned["status"]) == ("scheduled", "scheduled")
    # And the engine's dedup mark outlives the wait
    ttl = await redis.ttl(keys.processed("engine", f"{later}:day:sms"))
    assert ttl > 10 * 3600


async def test_a_send_due_on_the_calendars_last_day_in_quiet_hours_is_deferred(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory
) -> None:
    """The API takes a sendAt up to 9999-12-31T23:59:59.999Z; in quiet hours that end in year
    10000 the engine defers it to the calendar's last millisecond instead of failing the entry on
    every attempt until it is dead-lettered."""
    await add_user(db, project, "tokyo", contacts=[("sms", "+15550001")],
                   timezone="Asia/Tokyo")
    await db.execute("INSERT INTO quiet_hours VALUES ($1, 'tokyo', '22:00', '07:00')", project)
    await add_template(db, project, "t", {"sms": SMS})
    stages = await pipeline(services)

    event = await send(redis, keys, db, project, "t", "tokyo", data={"amount": "1"},
                       send_at="9999-12-31T23:30:00Z")
    await drain(*stages)

    [scheduled] = await entries(redis, keys.scheduled)
    assert scheduled["payload"]["eventId"] == event
    assert scheduled["reason"] == "quietHours"
    assert scheduled["dueAt"] == to_ms(datetime(9999, 12, 31, 23, 59, 59, 999_000, tzinfo=UTC))
    [deferred] = await timeline(db, event)
    assert (deferred["kind"], deferred["status"]) == ("deferred", "scheduled")


async def test_an_ai_channel_goes_to_the_ai_service(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory
) -> None:
    await add_user(db, project, "u1", contacts=[("email", "a@x.io"), ("sms", "+15550001")])
    await add_template(db, project, "digest", {"email": EMAIL, "sms": SMS},
                       ai={"model": "gpt-test", "prompt": "Summarise {{ data }}",
                           "channels": ["email"]})
    stages = await pipeline(services)

    await send(redis, keys, db, project, "digest", "u1", data={"amount": "3"})
    await drain(*stages)

    [ai] = await entries(redis, keys.ai_pending)
    assert ai["channel"] == "email"
    assert ai["content"] == {}
    assert ai["ai"] == {"model": "gpt-test", "prompt": "Summarise {{ data }}"}
    assert ai["context"]["data"] == {"amount": "3"}
    assert ai["context"]["unsubscribeUrl"] == ai["unsubscribeUrl"]
    assert [t["channel"] for t in await entries(redis, keys.outbound("normal"))] == ["sms"]


async def test_the_same_recipient_twice_is_routed_once(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory
) -> None:
    await add_user(db, project, "u1", contacts=[("sms", "+15550001")])
    await add_template(db, project, "t", {"sms": SMS})
    enricher, engine = await pipeline(services)
    await send(redis, keys, db, project, "t", "u1", data={"amount": "1"})
    await drain(enricher)
    [raw] = await xrange(redis, keys.enriched("normal"))
    # an upstream duplicate
    await redis.xadd(keys.enriched("normal"), raw[1])  # type: ignore[arg-type]

    await drain(engine)

    assert len(await entries(redis, keys.outbound("normal"))) == 1


async def test_the_per_user_throttle_logs_what_it_holds_back(
    db: asyncpg.Pool, redis: Redis, keys: Keys, services: ServiceFactory
) -> None:
    from .helpers import add_project
    project = await add_project(db, {"throttle": {"limit": 1, "windowSeconds": 3600}})
    await add_user(db, project, "u1", contacts=[("sms", "+15550001"), ("email", "a@x.io")])
    await add_template(db, project, "t", {"sms": SMS, "email": EMAIL})
    stages = await pipeline(services)

    first = await send(redis, keys, db, project, "t", "u1", data={"amount": "1"})
    await drain(*stages)
    second = await send(redis, keys, db, project, "t", "u1", data={"amount": "2"})
    await drain(*stages)

    # One notification is one send, on both its channels; the second is throttled
    assert {t["eventId"] for t in await entries(redis, keys.outbound("normal"))} == {first}
    rows = await timeline(db, second)
    assert {(r["channel"], r["kind"], r["status"]) for r in rows} == {
        ("sms", "throttled", "throttled"), ("email", "throttled", "throttled")}
    # The row names the rule that held it back (the project's, not the deployment's default),
    # as it said only how many sends the window held
    for row in rows:
        assert "1 send per 3600 s" in row["detail"], row["detail"]
        assert row["metadata"]["limit"] == 1
        assert row["metadata"]["windowSeconds"] == 3600


async def test_the_throttle_window_is_each_users_own(
    db: asyncpg.Pool, redis: Redis, keys: Keys, services: ServiceFactory
) -> None:
    """One send an hour per user: a send to one user does not use up another's window."""
    from .helpers import add_project
    project = await add_project(db, {"throttle": {"limit": 1, "windowSeconds": 3600}})
    for user, phone in (("u1", "+15550001"), ("u2", "+15550002")):
        await add_user(db, project, user, contacts=[("sms", phone)])
    await add_template(db, project, "t", {"sms": SMS})
    stages = await pipeline(services)

    first = await send(redis, keys, db, project, "t", "u1", data={"amount": "1"})
    second = await send(redis, keys, db, project, "t", "u2", data={"amount": "2"})
    await drain(*stages)

    assert {t["eventId"] for t in await entries(redis, keys.outbound("normal"))} == {
        first, second}
    assert [r["kind"] for r in await timeline(db, second)] == ["queued"]


async def test_a_scheduled_send_counts_against_the_throttle_when_it_goes_out(
    db: asyncpg.Pool, redis: Redis, keys: Keys, services: ServiceFactory
) -> None:
    """One send a day allowed: a reminder scheduled for next year does not hold back today's
    send, but a second send due at the same time as the reminder is throttled."""
    from .helpers import add_project
    project = await add_project(db, {"throttle": {"limit": 1, "windowSeconds": 86_400}})
    await add_user(db, project, "u1", contacts=[("sms", "+15550001")])
    await add_template(db, project, "t", {"sms": SMS})
    stages = await pipeline(services)

    reminder = await send(redis, keys, db, project, "t", "u1", data={"amount": "1"},
                          send_at="2099-01-01T00:00:00Z")
    today = await send(redis, keys, db, project, "t", "u1", data={"amount": "2"})
    twin = await send(redis, keys, db, project, "t", "u1", data={"amount": "3"},
                      send_at="2099-01-01T00:00:00Z")
    await drain(*stages)

    assert {t["eventId"] for t in await entries(redis, keys.outbound("normal"))} == {today}
    assert {s["payload"]["eventId"] for s in await entries(redis, keys.scheduled)} == {reminder}
    [held] = await timeline(db, twin)
    assert (held["kind"], held["status"]) == ("throttled", "throttled")
    # Its row says the window is the one it would have gone out in, not today's
    assert held["detail"] == ("throttled: the limit is 1 send per 86400 s, and the window "
                              "around 2099-01-01T00:00:00.000Z already holds 1")


async def test_a_poison_entry_fails_alone_and_its_batch_neighbours_are_routed(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory
) -> None:
    """Found by the dlq_poison scenario: an enriched entry whose own data makes the engine
    raise (quiet hours that are not an object) used to fail its whole read batch, so every
    recipient read with it was retried with it and dead-lettered with it."""
    # Given two enriched messages with a poison between them, all in one read batch
    await add_user(db, project, "u1", contacts=[("sms", "+15550001")])
    await add_user(db, project, "u2", contacts=[("sms", "+15550002")])
    await add_template(db, project, "t", {"sms": SMS})
    enricher, engine = await pipeline(services)
    await send(redis, keys, db, project, "t", ["u1", "u2"], data={"amount": "1"})
    await drain(enricher)
    raw = await xrange(redis, keys.enriched("normal"))
    poison = {**decode(raw[0][1]), "eventId": str(uuid7()),
              "preferences": {"quietHours": "never"}}
    await redis.delete(keys.enriched("normal"))
    await redis.xadd(keys.enriched("normal"), raw[0][1])  # type: ignore[arg-type]
    await redis.xadd(keys.enriched("normal"), encode(poison))
    await redis.xadd(keys.enriched("normal"), raw[1][1])  # type: ignore[arg-type]

    # When the engine runs until idle (retrying the poison to its limit)
    await engine.run_until_idle()

    # Then both recipients are routed, and only the poison is dead-lettered
    routed = {t["userId"] for t in await entries(redis, keys.outbound("normal"))}
    assert routed == {"u1", "u2"}
    dead = [m["payload"]["eventId"] for m in await entries(redis, keys.dlq)]
    assert dead == [poison["eventId"]]


async def test_a_template_new_to_the_process_compiles_beside_the_event_loop(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Compiling the largest fields takes seconds; on the event loop every batch waited.
    from notifkit import templates

    compiled_in = watch_compiles(monkeypatch)
    unique = f"Paid {{{{ data.amount }}}} ({uuid7()})"  # new to this process's cache
    await add_user(db, project, "u1", contacts=[("sms", "+15550001")])
    await add_template(db, project, "fresh", {"sms": {"text": unique}})
    stages = await pipeline(services)

    await send(redis, keys, db, project, "fresh", "u1", data={"amount": "3"})
    await drain(*stages)
    await send(redis, keys, db, project, "fresh", "u1", data={"amount": "4"})
    await drain(*stages)

    assert compiled_in == [(unique, False)]  # once, in a thread, before the first render
    texts = [t["content"]["text"] for t in await entries(redis, keys.outbound("normal"))]
    assert sorted(texts) == sorted(unique.replace("{{ data.amount }}", n) for n in "34")
    assert templates.uncompiled({"text": unique}, "sms") == []


async def test_a_template_that_fails_for_one_recipient_alone_sends_them_generic_content(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory
) -> None:
    # Given a template whose VIP paragraph fails however it fails (here a RuntimeError of
    # Jinja's cycler, a kind of error renders did not expect), and one VIP among two users
    await add_user(db, project, "vip", contacts=[("sms", "+15550001")],
                   attributes={"vip": True})
    await add_user(db, project, "plain", contacts=[("sms", "+15550002")],
                   attributes={"vip": False})
    await add_template(db, project, "t", {"sms": {
        "text": "{% if user.attributes.vip %}{{ cycler().next() }}{% endif %}"
                "Paid {{ data.amount }}"}})
    stages = await pipeline(services)

    event = await send(redis, keys, db, project, "t", ["vip", "plain"], data={"amount": "5"})
    await drain(*stages)

    # Then the VIP's message goes out with generic content, the other's as written
    tasks = {t["userId"]: t["content"] for t in await entries(redis, keys.outbound("normal"))}
    assert tasks == {"vip": {"text": "T: amount: 5"}, "plain": {"text": "Paid 5"}}
    rows = {r["user_id"]: r["detail"] for r in await timeline(db, event)}
    assert "RuntimeError" in rows["vip"]
    assert rows["vip"].endswith("generic content sent")
    assert rows["plain"] == "queued"


def enriched(project: str, user_id: str, target: str, **fields: Any) -> dict[str, Any]:
    """An enriched message as the enricher writes it, with ``fields`` replaced."""
    return {"eventId": uuid7(), "projectId": project, "template": "t", "priority": "normal",
            "data": {}, "channels": None, "sendAt": None, "campaignId": None,
            "createdAt": "2026-12-04T16:29:16.297Z",
            "user": {"id": user_id, "attributes": {}, "timezone": None, "locale": None},
            "contacts": {"email": [target]},
            "preferences": {"channels": {}, "topics": {}, "quietHours": None}, **fields}


@pytest.mark.parametrize("wrong", [
    {"campaignId": 7},  # refused by the batch's timeline INSERT
    {"fallbackFrom": "push", "fallbackChain": ["email"]},  # read as a mapping while routing
    {"fallbackFrom": {"outcome": "failed"}, "fallbackChain": ["email"]},  # no channel
    {"sendAt": 5},
])
async def test_a_message_of_the_wrong_shape_is_acked_alone_and_its_batch_goes_on(
    wrong: dict[str, Any], db: asyncpg.Pool, redis: Redis, keys: Keys, project: str,
    services: ServiceFactory,
) -> None:
    """CONTRACT §3: a payload that cannot be parsed is acked at once. One that parsed but
    failed its whole batch (a field of the wrong type reaching the batch's INSERT) took its
    neighbours along, attempt after attempt, into the dead-letter queue."""
    await add_user(db, project, "u1", contacts=[("email", "a@x.io")])
    await add_user(db, project, "u2", contacts=[("email", "b@x.io")])
    await add_template(db, project, "t", {"email": EMAIL})
    engine = await services(EngineService)
    await redis.xadd(keys.enriched("normal"), encode(enriched(project, "u1", "a@x.io", **wrong)))
    await redis.xadd(keys.enriched("normal"), encode(enriched(project, "u2", "b@x.io")))

    await drain(engine)

    assert [t["userId"] for t in await entries(redis, keys.outbound("normal"))] == ["u2"]
    # and the wrong one was acked at once: not retried, not dead-lettered
    assert await entries(redis, keys.dlq) == []
    assert (await redis.xpending(keys.enriched("normal"), keys.group("engine")))["pending"] == 0
    assert engine.worker.stats.failed == 0
