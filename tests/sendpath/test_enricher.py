"""The enricher: recipients resolved, profiles loaded in one go, one message per recipient."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from notifkit.db.logs import Kind, LogRow, Status, insert_logs
from notifkit.errors import MalformedPayload
from notifkit.ids import derived_uuid7, uuid7
from notifkit.keys import Keys
from notifkit.messages import parse_inbound
from notifkit.services.api.routes.notifications import notification_body
from notifkit.services.enricher import EnricherService
from notifkit.streams import encode
from tests.support.streams import xrange

from .conftest import ServiceFactory
from .helpers import add_project, add_user, drain, entries, send, timeline


async def test_a_list_of_users_becomes_one_enriched_message_per_known_user(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="notifkit.enricher")
    # Given two users with contacts and preferences, and a third id nobody registered
    await add_user(db, project, "u1", contacts=[("email", "u1@example.com"), ("sms", "+15550001")],
                   channels={"sms": False}, topics={"marketing": False},
                   attributes={"name": "Ada"}, timezone="Europe/Berlin", locale="de")
    await add_user(db, project, "u2", contacts=[("push", "tok-2")])
    await db.execute("INSERT INTO quiet_hours VALUES ($1, 'u2', '22:00', '07:00:30')", project)
    enricher = await services(EnricherService)

    # When a notification to all three is enriched
    event_id = await send(redis, keys, db, project, "welcome", ["u1", "u2", "ghost", "u1"],
                          data={"plan": "pro"})
    await enricher.run_until_idle()

    # Then each known user gets exactly one enriched message with their profile
    out = {m["user"]["id"]: m for m in await entries(redis, keys.enriched("normal"))}
    assert set(out) == {"u1", "u2"}
    u1 = out["u1"]
    assert u1["eventId"] == event_id
    assert u1["data"] == {"plan": "pro"}
    assert u1["user"] == {"id": "u1", "attributes": {"name": "Ada"},
                          "timezone": "Europe/Berlin", "locale": "de"}
    assert u1["contacts"] == {"email": ["u1@example.com"], "sms": ["+15550001"]}
    assert u1["preferences"] == {"channels": {"sms": False}, "topics": {"marketing": False},
                                 "quietHours": None}
    # (seconds only where quiet hours were given with seconds)
    assert out["u2"]["preferences"]["quietHours"] == {"start": "22:00", "end": "07:00:30"}

    # And the unknown user is on the timeline as skipped; the enricher leaves the
    # notification's row alone (its progress is read from the timeline)
    [row] = await timeline(db, event_id)
    assert (row["user_id"], row["kind"], row["status"], row["detail"]) == (
        "ghost", "skipped", "skipped", "unknown user")
    status = await db.fetchval("SELECT status FROM notifications WHERE id = $1", event_id)
    assert status == "accepted"
    # And the log counts the recipients enriched, not the ids asked for
    [said] = [r.getMessage() for r in caplog.records
              if r.name == "notifkit.enricher" and getattr(r, "event_id", None) == event_id]
    assert said == "Enriched 2 recipients of the notification; skipped 1 unknown user(s)."


async def test_a_disabled_contact_is_not_loaded(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory
) -> None:
    await add_user(db, project, "u1", contacts=[("push", "dead"), ("push", "alive")])
    await db.execute("UPDATE user_contacts SET enabled = false WHERE target = 'dead'")
    enricher = await services(EnricherService)

    await send(redis, keys, db, project, "t", "u1")
    await enricher.run_until_idle()

    [message] = await entries(redis, keys.enriched("normal"))
    assert message["contacts"] == {"push": ["alive"]}


async def test_the_same_event_twice_is_enriched_once(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory
) -> None:
    # Given the same inbound message written twice (an upstream retry)
    await add_user(db, project, "u1")
    enricher = await services(EnricherService)
    event_id = await send(redis, keys, db, project, "t", "u1", idempotency_key="order-1")
    [raw] = await xrange(redis, keys.inbound("normal"))
    await redis.xadd(keys.inbound("normal"), raw[1])  # type: ignore[arg-type]

    await enricher.run_until_idle()

    assert len(await entries(redis, keys.enriched("normal"))) == 1
    assert await timeline(db, event_id) == []  # the copy is no other notification to skip
    ttl = await redis.ttl(keys.processed("enricher", f"{project}:order-1"))
    assert 3600 < ttl <= 24 * 3600


async def test_an_idempotency_key_that_is_an_earlier_notifications_id_is_no_duplicate(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory
) -> None:
    # Given a notification sent without an idempotency key, whose mark is its event id, and
    # another whose caller chose that id as its key (a follow-up keyed on the first, say)
    await add_user(db, project, "u1")
    enricher = await services(EnricherService)
    first = await send(redis, keys, db, project, "t", "u1")
    await enricher.run_until_idle()
    second = await send(redis, keys, db, project, "t", "u1", idempotency_key=first)

    # When the second is enriched
    await enricher.run_until_idle()

    # Then it goes on: the API took it for a new notification, and no notification was sent
    # under that key before, so nothing may skip it as a duplicate
    assert [m["eventId"] for m in await entries(redis, keys.enriched("normal"))] \
        == [first, second]
    assert await timeline(db, second) == []


async def test_one_idempotency_key_in_two_projects_is_two_notifications(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory
) -> None:
    other = await add_project(db)
    for owner in (project, other):
        await add_user(db, owner, "u1")
    enricher = await services(EnricherService)
    sent = [await send(redis, keys, db, owner, "t", "u1", idempotency_key="order-1")
            for owner in (project, other)]
    await enricher.run_until_idle()
    out = await entries(redis, keys.enriched("normal"))
    assert [(m["eventId"], m["projectId"]) for m in out] == list(zip(sent, (project, other),
                                                                       strict=True))


async def test_a_second_notification_under_a_used_idempotency_key_is_skipped_not_left(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory
) -> None:
    # Given two notifications with one caller idempotency key (the API lost its record of the
    # first, say its answer to the XADD never came back, and accepted the caller's retry)
    await add_user(db, project, "u1")
    enricher = await services(EnricherService)
    first = await send(redis, keys, db, project, "t", "u1", idempotency_key="order-9")
    second = await send(redis, keys, db, project, "t", "u1", idempotency_key="order-9")

    # When both are enriched
    await enricher.run_until_idle()

    # Then the first goes on alone, and the second ends skipped, naming the first, rather
    # than reading 'accepted' for ever
    [out] = await entries(redis, keys.enriched("normal"))
    assert out["eventId"] == first
    assert await timeline(db, first) == []
    [row] = await timeline(db, second)
    assert (row["task_id"], row["user_id"], row["channel"], row["status"]) == (
        second, None, "", "skipped")
    assert row["detail"] == (f"duplicate of notification {first} (the same idempotency key); "
                             "not sent again")


async def test_a_segment_is_fanned_out_in_pages_through_continuations(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory
) -> None:
    # Given a segment of 250 members and an enricher that fans out 100 recipients a batch
    await _segment_of(db, project, 250, digits=4)
    enricher = await services(EnricherService, recipients_per_batch=100)

    # When it is enriched
    await send(redis, keys, db, project, "t", {"segment": "beta"}, priority="low")
    await enricher.run_until_idle()

    # Then every member got exactly one message, and the continuations said where to go on
    users = [m["user"]["id"] for m in await entries(redis, keys.enriched("low"))]
    assert sorted(users) == [f"m{i:04d}" for i in range(1, 251)]
    inbound = await entries(redis, keys.inbound("low"))
    assert [m.get("segmentAfter") for m in inbound] == [None, "m0100", "m0200"]


async def test_a_notification_reads_processing_until_its_last_page_is_enriched(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory
) -> None:
    """A continuation waits its turn at the end of the inbound stream (or for the reclaim
    after a crash): meanwhile the first page's recipients may all be sent, and the
    notification used to read 'sent' with most of the segment not yet enriched."""
    # Given a segment of 250 members, enriched 100 a batch
    await _segment_of(db, project, 250, digits=4)
    enricher = await services(EnricherService, recipients_per_batch=100)
    event_id = await send(redis, keys, db, project, "t", {"segment": "beta"})

    # When only the first page is enriched, and each of its recipients is sent
    await enricher.worker.run_until_idle(reclaim=False, max_rounds=1)
    first = await entries(redis, keys.enriched("normal"))
    assert len(first) == 100
    await insert_logs(db, [_sent(project, event_id, m["user"]["id"]) for m in first])

    # Then the notification is still in progress
    body = await notification_body(db, project, event_id)
    assert body is not None
    assert body["status"] == "processing", body

    # And once the last page is enriched and sent too, it reads sent
    await enricher.run_until_idle()
    rest = (await entries(redis, keys.enriched("normal")))[100:]
    assert len(rest) == 150
    await insert_logs(db, [_sent(project, event_id, m["user"]["id"]) for m in rest])
    body = await notification_body(db, project, event_id)
    assert body is not None
    assert body["status"] == "sent", body


def _sent(project: str, event_id: str, user_id: str) -> LogRow:
    return LogRow(project_id=project, event_id=event_id,
                  task_id=derived_uuid7(event_id, user_id, "email"), user_id=user_id,
                  channel="email", kind=Kind.SENT, status=Status.SENT, attempt=1)


async def test_a_large_payload_is_fanned_out_in_pages_bounded_by_bytes(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory
) -> None:
    """Each recipient's message carries the send's data: 2,000 recipients of a send with
    1 MiB of data would be 2 GB in one batch. Pages are bounded by bytes as well as by count,
    for a segment and for a list of users alike."""
    # Given twelve users in a segment, and an enricher that fans out about 40 kB a batch
    await _segment_of(db, project, 12, digits=2)
    enricher = await services(EnricherService, bytes_per_batch=40_000)
    data = {"body": "x" * 9_000}
    everyone = [f"m{i:02d}" for i in range(1, 13)]

    # When a send with 9 kB of data goes to the segment, and another to the list (and a
    # stranger)
    await send(redis, keys, db, project, "t", {"segment": "beta"}, data=data, priority="low")
    listed = await send(redis, keys, db, project, "t", [*reversed(everyone), "ghost"],
                        data=data)
    await enricher.run_until_idle()

    # Then every user got exactly one message of each, and the rest went on as continuations
    # of a few recipients each
    for priority in ("low", "normal"):
        await _each_once_in_pages(redis, keys, priority, everyone)
        assert all(m["data"] == data for m in await entries(redis, keys.enriched(priority)))
    # And the stranger on the list (first in id order) is still on its timeline, beside the
    # rows saying the recipients went out in pages and that the last page is done
    assert [(r["user_id"], r["kind"], r["detail"]) for r in await timeline(db, listed)] == [
        ("ghost", "skipped", "unknown user"),
        (None, "fanout", "recipients are enriched in pages; more follow"),
        (None, "fanned_out", "every recipient enriched")]


async def test_pages_are_bounded_by_the_bytes_of_the_users_profiles_too(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory
) -> None:
    """Every recipient's message carries its user's attributes, which a tenant may fill: a
    page sized by the send alone put 240 users of 900 kB each in one write of 216 MB."""
    # Given twelve users with 9 kB of attributes each, in a segment, and an enricher that
    # fans out about 40 kB a batch
    await _segment_of(db, project, 12, digits=2)
    await db.execute("UPDATE users SET attributes = $2 WHERE project_id = $1", project,
                     {"blob": "b" * 9_000})
    enricher = await services(EnricherService, bytes_per_batch=40_000)
    everyone = [f"m{i:02d}" for i in range(1, 13)]

    # When a small send goes to the segment, and another to the list (in no order)
    await send(redis, keys, db, project, "t", {"segment": "beta"}, priority="low")
    listed = await send(redis, keys, db, project, "t", [*reversed(everyone), "ghost"])
    await enricher.run_until_idle()

    # Then every user got exactly one message of each, in pages of a few recipients each
    for priority in ("low", "normal"):
        await _each_once_in_pages(redis, keys, priority, everyone)
    assert [(r["user_id"], r["kind"]) for r in await timeline(db, listed)] == [
        ("ghost", "skipped"), (None, "fanout"), (None, "fanned_out")]


@pytest.mark.parametrize("to", [{"segment": "beta"}, ["m3", "m1", "m2"]],
                         ids=["segment", "list"])
async def test_a_last_page_exactly_full_ends_the_fan_out(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
    to: dict[str, str] | list[str],
) -> None:
    """A page says more follow only when a recipient past it exists: a continuation after
    the last recipient would be one more entry and page mark for nothing, and the
    notification's timeline would say 'more follow' of a page that holds no one."""
    # Given three users, and an enricher whose pages hold one recipient each
    await _segment_of(db, project, 3, digits=1)
    enricher = await services(EnricherService, bytes_per_batch=1)

    # When a notification to the three is enriched
    event_id = await send(redis, keys, db, project, "t", to)
    await enricher.run_until_idle()

    # Then it took three pages, the last one full and without a continuation
    users = [m["user"]["id"] for m in await entries(redis, keys.enriched("normal"))]
    assert users == ["m1", "m2", "m3"]
    pages = [m.get("segmentAfter") for m in await entries(redis, keys.inbound("normal"))]
    assert pages == [None, "m1", "m2"]
    assert [(r["kind"], r["detail"]) for r in await timeline(db, event_id)] == [
        ("fanout", "recipients are enriched in pages; more follow"),
        ("fanned_out", "every recipient enriched")]


async def test_a_continuation_whose_members_left_the_segment_ends_it_without_a_skip(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
) -> None:
    """A continuation page may find no one (the rest of the segment's members were removed
    meanwhile): the notification already went to its first page's members, so that is the
    end of its fan-out, not a segment without members skipped as a whole."""
    # Given a segment of two, paged one member at a time, whose first page is enriched
    await _segment_of(db, project, 2, digits=1)
    enricher = await services(EnricherService, bytes_per_batch=1)
    event_id = await send(redis, keys, db, project, "t", {"segment": "beta"})
    await enricher.worker.run_until_idle(reclaim=False, max_rounds=1)
    assert [m["user"]["id"] for m in await entries(redis, keys.enriched("normal"))] == ["m1"]

    # When the other member leaves the segment before the continuation is read
    await db.execute("DELETE FROM user_segments WHERE project_id = $1 AND user_id = 'm2'",
                     project)
    await enricher.run_until_idle()

    # Then the fan-out ends with no one more, and nothing on the timeline says skipped
    assert [m["user"]["id"] for m in await entries(redis, keys.enriched("normal"))] == ["m1"]
    assert [(r["kind"], r["status"]) for r in await timeline(db, event_id)] == [
        ("fanout", "processing"), ("fanned_out", "processing")]


async def test_pages_of_two_notifications_whose_keys_and_cursors_hold_colons_both_go_on(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory
) -> None:
    """Page marks joined the notification's key and the cursor with ':' bare: key 'batch'
    after member 'de:u1' and key 'batch:de' after member 'u1' were one mark, and the second
    notification's page was dropped as a duplicate of the first's."""
    # Given two segments, and an enricher whose pages hold one recipient each
    for user_id, segment in (("de:u1", "de"), ("de:u2", "de"), ("u1", "all"), ("u2", "all")):
        await add_user(db, project, user_id, segments=[segment])
    enricher = await services(EnricherService, bytes_per_batch=1)

    # When one goes out under the key 'batch', then the other under 'batch:de'
    await send(redis, keys, db, project, "t", {"segment": "de"}, idempotency_key="batch")
    await enricher.run_until_idle()
    await send(redis, keys, db, project, "t", {"segment": "all"}, idempotency_key="batch:de")
    await enricher.run_until_idle()

    # Then every member of both got its message
    users = [m["user"]["id"] for m in await entries(redis, keys.enriched("normal"))]
    assert sorted(users) == ["de:u1", "de:u2", "u1", "u2"]


async def test_a_recipient_is_loaded_with_its_own_projects_profile_alone(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory
) -> None:
    # Given a user id that two projects both have, each with its own contacts, preferences
    # and quiet hours
    other = await add_project(db)
    await add_user(db, other, "u1", contacts=[("email", "other@example.com")],
                   channels={"email": False}, topics={"news": False},
                   attributes={"name": "Other"})
    await db.execute("INSERT INTO quiet_hours VALUES ($1, 'u1', '22:00', '07:00')", other)
    await add_user(db, project, "u1", contacts=[("sms", "+15550001")],
                   attributes={"name": "Mine"})
    enricher = await services(EnricherService)

    # When this project sends to its u1
    await send(redis, keys, db, project, "t", "u1")
    await enricher.run_until_idle()

    # Then the message carries this project's profile, none of the other's
    [message] = await entries(redis, keys.enriched("normal"))
    assert message["user"]["attributes"] == {"name": "Mine"}
    assert message["contacts"] == {"sms": ["+15550001"]}
    assert message["preferences"] == {"channels": {}, "topics": {}, "quietHours": None}


async def test_a_segment_is_the_members_of_the_senders_project_alone(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory
) -> None:
    # Given another project whose segment has the same name, and whose member's id is also a
    # user of this project, who is not in this project's segment
    other = await add_project(db)
    await add_user(db, other, "a1", segments=["beta"])
    await add_user(db, project, "a1")
    await add_user(db, project, "b1", segments=["beta"])
    enricher = await services(EnricherService)

    # When this project sends to its segment
    event_id = await send(redis, keys, db, project, "t", {"segment": "beta"})
    await enricher.run_until_idle()

    # Then only its own member gets a message: the other project's members are not asked for
    # in this one, under their ids or any other
    out = await entries(redis, keys.enriched("normal"))
    assert [(m["projectId"], m["user"]["id"]) for m in out] == [(project, "b1")]
    assert await timeline(db, event_id) == []


async def test_a_segment_without_members_is_skipped_as_a_whole(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory
) -> None:
    # Given a send to a segment nobody is in
    enricher = await services(EnricherService)
    event_id = await send(redis, keys, db, project, "t", {"segment": "nobody"})

    # When it is enriched
    await enricher.run_until_idle()

    # Then nothing goes on, and the event's own timeline says why
    assert await entries(redis, keys.enriched("normal")) == []
    [row] = await timeline(db, event_id)
    assert (row["task_id"], row["user_id"], row["channel"], row["status"], row["detail"]) == (
        event_id, None, "", "skipped", "segment 'nobody' has no members")


async def test_a_poison_entry_fails_alone_and_its_batch_neighbours_are_enriched(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory
) -> None:
    """Found by the dlq_poison scenario: an entry whose own data makes the enricher raise used
    to fail its whole read batch, so every notification read with it was retried with it and
    dead-lettered with it."""
    # Given a notification, then an entry that can never be enriched (its segment cursor is
    # not text), then another notification, all in one read batch
    await add_user(db, project, "u1")
    first = await send(redis, keys, db, project, "t", "u1")
    poison = str(uuid7())
    await redis.xadd(keys.inbound("normal"), encode({
        "eventId": poison, "projectId": project, "template": "t",
        "to": {"segment": "everyone"}, "priority": "normal", "segmentAfter": 12345}))
    second = await send(redis, keys, db, project, "t", "u1")
    enricher = await services(EnricherService)

    # When the enricher runs until idle (retrying the poison to its limit)
    await enricher.run_until_idle()

    # Then both notifications are enriched, and only the poison is dead-lettered
    out = {m["eventId"] for m in await entries(redis, keys.enriched("normal"))}
    assert out == {first, second}
    dead = [m["payload"]["eventId"] for m in await entries(redis, keys.dlq)]
    assert dead == [poison]


async def _each_once_in_pages(redis: Redis, keys: Keys, priority: str,
                              everyone: list[str]) -> None:
    """Every user got one message of the ``priority`` send, which went out in three pages or
    more: the first entry and its continuations, each after another member."""
    users = [m["user"]["id"] for m in await entries(redis, keys.enriched(priority))]
    assert sorted(users) == everyone, priority
    pages = [m.get("segmentAfter") for m in await entries(redis, keys.inbound(priority))]
    assert len(pages) >= 3, pages
    assert pages[0] is None, pages
    assert len(set(pages)) == len(pages), pages


async def _segment_of(db: asyncpg.Pool, project: str, size: int, *, digits: int) -> None:
    """Users m1..m{size} (zero-padded to ``digits``), all in the segment 'beta'."""
    await db.execute(
        "INSERT INTO users (project_id, id) SELECT $1, 'm' || lpad(g::text, $3, '0') "
        "FROM generate_series(1, $2) g", project, size, digits)
    await db.execute(
        "INSERT INTO user_segments SELECT $1, id, 'beta' FROM users WHERE project_id = $1",
        project)


async def test_a_message_of_the_wrong_shape_is_acked_alone_and_its_batch_goes_on(
    db: asyncpg.Pool, redis: Redis, keys: Keys, project: str, services: ServiceFactory,
) -> None:
    """CONTRACT §3: a payload that cannot be parsed is acked at once, alone. One that parsed
    but failed its whole batch took its neighbours along, attempt after attempt, to the DLQ;
    one the engine refused later left its notification with no row at all."""
    await add_user(db, project, "u2", contacts=[("email", "b@x.io")])
    enricher = await services(EnricherService)
    good = {"eventId": uuid7(), "projectId": project, "template": "t",
            "to": {"userId": "u2"}, "data": {}, "channels": None, "priority": "normal",
            "sendAt": None, "campaignId": None, "idempotencyKey": None,
            "createdAt": "2026-12-04T00:00:00.000Z"}
    # campaignId 7 reached the batch's timeline INSERT (the unknown user's skipped row)
    bad = {**good, "eventId": uuid7(), "to": {"userId": "nobody"}, "campaignId": 7}
    await redis.xadd(keys.inbound("normal"), encode(bad))
    await redis.xadd(keys.inbound("normal"), encode(good))

    await drain(enricher)

    assert [m["user"]["id"] for m in await entries(redis, keys.enriched("normal"))] == ["u2"]
    assert await entries(redis, keys.dlq) == []
    assert (await redis.xpending(keys.inbound("normal"), keys.group("enricher")))["pending"] == 0
    assert enricher.worker.stats.failed == 0


@pytest.mark.parametrize("wrong", [
    {"campaignId": 7}, {"sendAt": 5}, {"idempotencyKey": 5}, {"channels": "email"},
    {"data": [1]}, {"createdAt": 5}, {"to": {"userIds": "u1"}}, {"to": {"userId": 5}},
    {"to": {"segment": ["beta"]}}, {"to": {"userIds": ["u1", 2]}},
])
def test_an_inbound_message_of_the_wrong_shape_does_not_parse(wrong: dict[str, Any]) -> None:
    """Refused where it is read (acked as malformed, counted), not passed on to fail later:
    the engine refused such a recipient's enriched message, so its notification ended with
    no row saying what became of it."""
    message = {"eventId": uuid7(), "projectId": str(uuid.uuid4()), "template": "t",
               "to": {"userId": "u1"}, "data": {}, "channels": None, "priority": "normal",
               "sendAt": None, "campaignId": None, "idempotencyKey": None,
               "createdAt": "2026-12-04T00:00:00.000Z", **wrong}
    with pytest.raises(MalformedPayload):
        parse_inbound(message)
