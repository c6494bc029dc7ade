"""The engine's one routing statement: templates, suppressions and settings, per project."""

from __future__ import annotations

import asyncpg

from notifkit.db.routing import load_routing

from .helpers import add_project, add_template


async def test_one_statement_answers_each_lookup_for_its_own_project(db: asyncpg.Pool) -> None:
    # Given two projects with a template of the same id, different content and settings,
    # and one suppressed address in the first only
    a = await add_project(db, {"throttle": {"limit": 1, "windowSeconds": 60}})
    b = await add_project(db)
    # (a fallback entry that is not a channel name is ignored)
    await add_template(db, a, "welcome", {"email": {"subject": "A"}}, topic="news",
                       fallback=["push", "email", 3],  # type: ignore[list-item]
                       ai={"channels": ["email"]})
    await add_template(db, b, "welcome", {"email": {"subject": "B"}})
    await db.execute("INSERT INTO suppressions (project_id, channel, target, reason) "
                     "VALUES ($1, 'email', 'x@example.com', 'unsubscribed')", a)

    # When a batch mixing both projects is routed
    routing = await load_routing(
        db,
        [(a, "welcome"), (b, "welcome"), (b, "missing"), (a, "welcome")],
        [(a, "email", "x@example.com"), (b, "email", "x@example.com"),
         (a, "email", "y@example.com")],
        [a, b],
    )

    # Then each project sees its own template, suppressions and settings, and nothing else
    assert set(routing.templates) == {(a, "welcome"), (b, "welcome")}
    ta = routing.templates[(a, "welcome")]
    assert (ta.content, ta.topic, ta.fallback, ta.ai) == (
        {"email": {"subject": "A"}}, "news", ["push", "email"], {"channels": ["email"]})
    tb = routing.templates[(b, "welcome")]
    assert (tb.content, tb.topic, tb.fallback, tb.ai) == ({"email": {"subject": "B"}}, None,
                                                          [], None)
    assert routing.suppressed == {(a, "email", "x@example.com"): "unsubscribed"}
    assert routing.settings == {a: {"throttle": {"limit": 1, "windowSeconds": 60}}, b: {}}


async def test_an_empty_batch_asks_nothing(db: asyncpg.Pool) -> None:
    routing = await load_routing(db, [], [], [])
    assert (routing.templates, routing.suppressed, routing.settings) == ({}, {}, {})


async def test_a_suppression_holds_on_its_own_channel_only(db: asyncpg.Pool) -> None:
    # Given a number that replied STOP to SMS
    project = await add_project(db)
    await db.execute("INSERT INTO suppressions (project_id, channel, target, reason) "
                     "VALUES ($1, 'sms', '+15550001', 'unsubscribed')", project)

    # When the same string is a target on another channel too
    routing = await load_routing(
        db, [], [(project, "sms", "+15550001"), (project, "webhook", "+15550001")], [])

    # Then only the SMS target is suppressed
    assert routing.suppressed == {(project, "sms", "+15550001"): "unsubscribed"}
