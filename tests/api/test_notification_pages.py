"""GET /v1/notifications/{eventId} in pages: a notification's recipients come at most
RECIPIENTS_PER_ANSWER (or ``limit``) to an answer, with ``nextCursor``, while its status and own
timeline still cover every recipient, computed in PostgreSQL as the timeline fold computes them.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from notifkit.services.api.app import operations
from notifkit.services.api.openapi import document
from notifkit.services.api.routes import notifications as routes
from notifkit.services.api.validation import iso
from tests.api.conftest import Api, Project

# Every (kind, status) pair a recipient's row may carry, the odd ones included: a late
# 'processing' after an outcome, a replay, a failed attempt handed on, a bounce, an arrival.
ROW_KINDS = [
    ("queued", "processing"), ("processing", "processing"), ("replayed", "processing"),
    ("failed", "processing"), ("sent", "sent"), ("delivered", "delivered"),
    ("opened", "delivered"), ("bounced", "failed"), ("failed", "failed"),
    ("dead_lettered", "dead_lettered"), ("deferred", "scheduled"), ("scheduled", "scheduled"),
    ("skipped", "skipped"), ("suppressed", "suppressed"), ("throttled", "throttled"),
    ("accepted", "accepted"),
]
START = datetime(2030, 1, 1, tzinfo=UTC)
INSERT = (
    "INSERT INTO message_logs (project_id, event_id, task_id, user_id, channel, attempt, kind, "
    "status, detail, provider_message_id, created_at) "
    "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
)
# What GET answered before it came in pages: every row of the notification at once.
OLD_TIMELINE = (
    "SELECT task_id, user_id, channel, attempt, kind, status, detail, provider_message_id, "
    "created_at FROM message_logs WHERE project_id = $1 AND event_id = $2 ORDER BY created_at, id"
)


@pytest.fixture
async def template(api: Api, project: Project) -> str:
    reply = await api.call("PUT", "/v1/templates/invoice", key=project.full, json={
        "channels": {"email": {"subject": "s", "text": "t"}}})
    assert reply.status == 201
    return "invoice"


async def send(api: Api, project: Project, template: str) -> str:
    reply = await api.call("POST", "/v1/notifications", key=project.send,
                           json={"to": ["u1", "u2"], "template": template})
    assert reply.status == 202
    return str(reply.body["id"])


def random_rows(rng: random.Random, project: str, event: str, recipients: int,
                first_attempt: int = 0) -> list[tuple[Any, ...]]:
    """Rows of ``recipients`` recipients in a random mix, interleaved in time, several on the
    same instant (their ids order them), some about a recipient but on no channel. Task ids
    are the event's (rows are unique by task, channel, attempt and kind across events)."""
    rows: list[tuple[Any, ...]] = []
    for n in range(recipients):
        task, channel = f"{event}-{n}", rng.choice(["email", "sms", "push", ""])
        used: set[tuple[int, str]] = set()
        for _ in range(rng.randint(1, 7)):
            kind, status = rng.choice(ROW_KINDS)
            attempt = first_attempt + rng.randint(0, 2)
            if (attempt, kind) in used:  # (task, channel, attempt, kind) is unique
                continue
            used.add((attempt, kind))
            # A row may name no user, or (as no writer does) another: the first named counts.
            user = rng.choice([f"u{n % 7}", f"u{n % 7}", f"v{n % 5}", None])
            rows.append((project, event, task, user, channel, attempt, kind, status,
                         f"{kind} detail", rng.choice([None, "m1", "m2"]),
                         START + timedelta(seconds=rng.randint(0, 40))))
    rng.shuffle(rows)  # ids in no particular order against the times
    return rows


async def old_body(db: asyncpg.Pool, project: str, event: str) -> dict[str, Any]:
    """The answer as GET made it before: every row read, the fold run over all of them."""
    row = await db.fetchrow(
        "SELECT template_id, priority, recipients_spec, channels, campaign_id, send_at, "
        "created_at FROM notifications WHERE id = $1 AND project_id = $2", event, project)
    assert row is not None
    recipients, timeline = routes.timelines(event, await db.fetch(OLD_TIMELINE, project, event))
    return {
        "id": event,
        "status": routes.summary_status({r["status"] for r in recipients}, timeline),
        "template": row["template_id"], "priority": row["priority"],
        "to": row["recipients_spec"], "channels": row["channels"],
        "campaignId": row["campaign_id"], "sendAt": iso(row["send_at"]),
        "createdAt": iso(row["created_at"]),
        "recipients": recipients, "timeline": timeline,
    }


async def get(api: Api, project: Project, event: str, **params: str) -> dict[str, Any]:
    reply = await api.call("GET", f"/v1/notifications/{event}", key=project.full,
                           params=params)
    assert reply.status == 200, reply.body
    body: dict[str, Any] = reply.body
    return body


async def walk(api: Api, project: Project, event: str, limit: int) -> list[dict[str, Any]]:
    pages = [await get(api, project, event, limit=str(limit))]
    while pages[-1]["nextCursor"] is not None:
        pages.append(await get(api, project, event, limit=str(limit),
                               cursor=pages[-1]["nextCursor"]))
        assert len(pages) < 100
    return pages


async def test_without_parameters_a_small_notification_answers_as_before(
    api: Api, project: Project, template: str, db: asyncpg.Pool
) -> None:
    """Every recipient with its timeline, the status over all of them and the event's own
    timeline, in the order they always came, with nextCursor null: for notifications of a
    few recipients in every mix of statuses, the answer is the one the whole fold gave."""
    rng = random.Random(7)
    seen: set[str] = set()
    for _ in range(40):
        event = await send(api, project, template)
        await db.executemany(INSERT, random_rows(rng, project.id, event, rng.randint(0, 4)))
        old = await old_body(db, project.id, event)
        assert await get(api, project, event) == {**old, "nextCursor": None}
        seen.add(old["status"])
    # The mixes reached in-progress and finished summaries alike.
    assert {"processing", "delivered", "failed"} <= seen, seen


async def test_recipient_statuses_from_postgresql_equal_the_timeline_fold(
    api: Api, project: Project, template: str, db: asyncpg.Pool
) -> None:
    """The query that summarises a notification of any size without reading its rows gives
    each recipient the status (and user) the fold over its rows gives, bounces before and
    after arrivals, late and replayed 'processing' rows, ties in time included."""
    rng = random.Random(11)
    event = await send(api, project, template)
    await db.executemany(INSERT, random_rows(rng, project.id, event, 400))
    # Another project's rows under the same event and task ids are no recipient's here.
    other = await api.project("other")
    await db.executemany(INSERT, random_rows(rng, other.id, event, 50, first_attempt=3))
    folded, _ = routes.timelines(event, await db.fetch(OLD_TIMELINE, project.id, event))
    computed = await db.fetch(routes.RECIPIENT_STATUS_SQL, project.id, event, event)
    assert len(folded) == 400
    assert {(r["task_id"], r["channel"] or None): (r["user_id"], r["status"])
            for r in computed} == {
        (r["taskId"], r["channel"]): (r["userId"], r["status"]) for r in folded}
    assert len({r["status"] for r in folded}) >= 6


# Each rule of the fold, one recipient each: (kind, status, attempt, provider message id) rows
# in order, and the status the recipient reads.
RULES: list[tuple[list[tuple[str, str, int, str | None]], str]] = [
    ([("sent", "sent", 1, "m1"), ("delivered", "delivered", 1, "m1"),
      ("bounced", "failed", 1, "m1")], "failed"),  # a late bounce counts
    ([("sent", "sent", 1, "m1"), ("bounced", "failed", 1, "m1"),
      ("delivered", "delivered", 1, "m1")], "failed"),  # an arrival after its bounce does not
    ([("bounced", "failed", 1, None), ("delivered", "delivered", 1, None)], "failed"),
    ([("bounced", "failed", 1, "m1"), ("delivered", "delivered", 1, "m2")], "delivered"),
    ([("bounced", "failed", 1, "m1"), ("delivered", "delivered", 2, "m1")], "delivered"),
    # An arrival, then a failure of the same message that hands the recipient on: the
    # failure's 'processing' does not undo the arrival.
    ([("sent", "sent", 1, "m1"), ("delivered", "delivered", 1, "m1"),
      ("failed", "processing", 1, "m1")], "delivered"),
    # A skipped arrival after a wait leaves the recipient waiting.
    ([("bounced", "failed", 1, "m1"), ("deferred", "scheduled", 1, None),
      ("delivered", "delivered", 1, "m1")], "scheduled"),
    # No writer pairs a bounce with 'delivered', but the fold gives such a row a meaning: as
    # the first row it sets the status, later it is an arrival after its own bounce.
    ([("bounced", "delivered", 1, "m1")], "delivered"),
    ([("sent", "sent", 1, "m1"), ("bounced", "delivered", 1, "m1")], "sent"),
    ([("sent", "sent", 1, None), ("queued", "processing", 2, None)], "sent"),
    ([("dead_lettered", "dead_lettered", 1, None), ("replayed", "processing", 1, None)],
     "processing"),
    ([("deferred", "scheduled", 1, None), ("queued", "processing", 1, None)], "processing"),
    ([("queued", "processing", 1, None), ("processing", "processing", 2, None)],
     "processing"),
    ([("accepted", "accepted", 0, None)], "accepted"),
]


async def test_each_rule_of_the_fold_gives_the_same_status_in_postgresql(
    api: Api, project: Project, template: str, db: asyncpg.Pool
) -> None:
    event = await send(api, project, template)
    rows = [(project.id, event, f"{event}-{n}", "u1", "email", attempt, kind, status, None,
             message, START + timedelta(seconds=second))
            for n, (recipient, _) in enumerate(RULES)
            for second, (kind, status, attempt, message) in enumerate(recipient)]
    await db.executemany(INSERT, rows)
    folded, _ = routes.timelines(event, await db.fetch(OLD_TIMELINE, project.id, event))
    computed = {r["task_id"]: r["status"]
                for r in await db.fetch(routes.RECIPIENT_STATUS_SQL, project.id, event, event)}
    expected = [status for _, status in RULES]
    assert [r["status"] for r in folded] == expected
    assert [computed[f"{event}-{n}"] for n in range(len(RULES))] == expected


async def test_a_walk_by_cursor_lists_every_recipient_once_in_the_order_of_the_whole(
    api: Api, project: Project, template: str, db: asyncpg.Pool
) -> None:
    rng = random.Random(3)
    event = await send(api, project, template)
    await db.executemany(INSERT, random_rows(rng, project.id, event, 61))
    whole = await get(api, project, event)
    assert (len(whole["recipients"]), whole["nextCursor"]) == (61, None)
    assert whole == {**await old_body(db, project.id, event), "nextCursor": None}

    pages = await walk(api, project, event, 7)
    assert [len(p["recipients"]) for p in pages] == [7] * 8 + [5]
    assert [r for p in pages for r in p["recipients"]] == whole["recipients"]
    for page in pages:  # each page's summary covers every recipient, not the page's
        assert {k: v for k, v in page.items() if k not in ("recipients", "nextCursor")} == {
            k: v for k, v in whole.items() if k not in ("recipients", "nextCursor")}
    # A page that ends on the last recipient is the last: no empty page follows.
    assert [len(p["recipients"]) for p in await walk(api, project, event, 61)] == [61]


async def test_beyond_the_cap_the_answer_without_parameters_is_the_first_page(
    api: Api, project: Project, template: str, db: asyncpg.Pool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A list send (1,000 users, several channels each) always comes whole; a larger one
    comes in pages of the cap, the largest limit the document allows."""
    assert routes.RECIPIENTS_PER_ANSWER >= 10_000
    op = document(operations())["paths"]["/v1/notifications/{eventId}"]["get"]
    [limit] = [p for p in op["parameters"] if p["name"] == "limit"]
    assert limit["schema"]["maximum"] == routes.RECIPIENTS_PER_ANSWER
    assert "cursor" in {p["name"] for p in op["parameters"]}

    event = await send(api, project, template)
    await db.executemany(INSERT, random_rows(random.Random(5), project.id, event, 12))
    whole = await get(api, project, event)
    monkeypatch.setattr(routes, "RECIPIENTS_PER_ANSWER", 5)
    first = await get(api, project, event)
    assert first["recipients"] == whole["recipients"][:5]
    assert first["nextCursor"] is not None
    rest = await get(api, project, event, cursor=first["nextCursor"])
    assert rest["recipients"] == whole["recipients"][5:10]
    last = await get(api, project, event, cursor=rest["nextCursor"])
    assert (last["recipients"], last["nextCursor"]) == (whole["recipients"][10:], None)
    bad = await api.call("GET", f"/v1/notifications/{event}", key=project.full,
                         params={"limit": "6"})
    assert (bad.status, bad.fields) == (400, ["limit"])


async def test_a_bad_limit_or_cursor_is_a_400_naming_it(
    api: Api, project: Project, template: str, db: asyncpg.Pool
) -> None:
    event = await send(api, project, template)
    await db.executemany(INSERT, random_rows(random.Random(2), project.id, event, 3))
    path = f"/v1/notifications/{event}"

    async def fields(**params: str) -> list[str]:
        reply = await api.call("GET", path, key=project.full, params=params)
        assert reply.status == 400, reply.body
        assert reply.error["code"] == "validation_error"
        return reply.fields

    for limit in ("0", "-1", "10001", "abc", "1.5", "５"):
        assert await fields(limit=limit) == ["limit"], limit
    assert (await get(api, project, event, limit="10000"))["nextCursor"] is None
    for cursor in ("garbage", "e30", "W10"):
        assert await fields(cursor=cursor) == ["cursor"], cursor
    assert sorted(await fields(limit="0", cursor="garbage")) == ["cursor", "limit"]

    # Another notification's cursor, or another list's, is refused, not walked.
    other = await send(api, project, template)
    await db.executemany(INSERT, random_rows(random.Random(2), project.id, other, 3))
    foreign = (await get(api, project, other, limit="1"))["nextCursor"]
    assert foreign is not None
    assert await fields(cursor=foreign) == ["cursor"]
    messages = await api.call("GET", "/v1/messages", key=project.full, params={"limit": "1"})
    assert messages.body["nextCursor"] is not None
    assert await fields(cursor=messages.body["nextCursor"]) == ["cursor"]
    # A cursor made for this notification is no cursor into the message log either.
    own = (await get(api, project, event, limit="1"))["nextCursor"]
    reply = await api.call("GET", "/v1/messages", key=project.full, params={"cursor": own})
    assert (reply.status, reply.fields) == (400, ["cursor"])
