"""The events service: outcomes and receipts land on the timeline once, hard bounces and
complaints suppress the address, custom events go on to the workflow service."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.ids import untasked_row_id, uuid7
from notifkit.keys import Keys
from notifkit.services.events import EventsService, is_hard_bounce
from notifkit.streams import decode, xadd
from notifkit.worker import Entry, failed_event
from tests.support.streams import xrange

EventsFactory = Callable[..., EventsService]
AT = "2026-05-28T20:26:40.000Z"


async def put(redis: Redis, keys: Keys, *events: dict[str, Any]) -> None:
    for event in events:
        await xadd(redis, keys.events_inbound, event, maxlen=100_000)


async def timeline(db: asyncpg.Pool, task_id: str) -> list[tuple[str, str, int, str]]:
    rows = await db.fetch(
        "SELECT kind, status, attempt, channel FROM message_logs WHERE task_id = $1 "
        "ORDER BY id", task_id,
    )
    return [(r["kind"], r["status"], r["attempt"], r["channel"]) for r in rows]


def sent_event(project_id: str, event_id: str, task_id: str, message_id: str,
               channel: str = "email", attempt: int = 1) -> dict[str, Any]:
    return {
        "type": "notification:sent", "projectId": project_id, "eventId": event_id,
        "taskId": task_id, "userId": "user-1", "channel": channel, "provider": "resend",
        "providerMessageId": message_id, "attempt": attempt, "campaignId": "spring", "at": AT,
    }


def receipt(project_id: str, message_id: str, kind: str, raw: Any = None,
            provider: str = "resend") -> dict[str, Any]:
    return {"type": "receipt", "projectId": project_id, "provider": provider,
            "providerMessageId": message_id, "kind": kind, "at": AT, "raw": raw or {}}


async def record_send(db: asyncpg.Pool, project_id: str, task_id: str, destination: str,
                      message_id: str, channel: str = "email",
                      provider: str = "resend") -> None:
    """What delivery leaves in the outbox after the provider accepted a send."""
    await db.execute(
        "INSERT INTO delivery_outbox (task_id, channel, destination, project_id, provider, "
        "provider_message_id, status) VALUES ($1, $2, $3, $4, $5, $6, 'sent')",
        task_id, channel, destination, project_id, provider, message_id,
    )


async def test_outcomes_are_recorded_once_with_their_status(
    make_events: EventsFactory, redis: Redis, keys: Keys, db: asyncpg.Pool, project_id: str,
) -> None:
    events = make_events()
    event_id = uuid7()
    outcomes = [
        sent_event(project_id, event_id, "task-sent", "msg-1"),
        {"type": "notification:failed", "projectId": project_id, "eventId": event_id,
         "taskId": "task-failed", "userId": "user-1", "channel": "sms", "provider": "twilio",
         "providerMessageId": None, "attempt": 2, "error": "503 from twilio", "at": AT},
        {"type": "notification:invalid_token", "projectId": project_id, "eventId": event_id,
         "taskId": "task-invalid", "userId": "user-1", "channel": "push", "provider": "fcm",
         "providerMessageId": None, "attempt": 1, "error": "UNREGISTERED", "at": AT},
        # the worker's dead-lettering of a delivery entry (worker.failed_event)
        {"type": "notification:failed", "projectId": project_id, "eventId": event_id,
         "taskId": "task-dead", "userId": "user-1", "channel": "email", "campaignId": None,
         "stream": keys.outbound("normal"), "entryId": "1-0", "error": "RuntimeError: boom",
         "attempts": 3, "at": AT},
        # ... of an enricher entry: no task yet, a row about the whole notification
        {"type": "notification:failed", "projectId": project_id, "eventId": event_id,
         "taskId": None, "userId": None, "channel": None, "stream": keys.inbound("normal"),
         "entryId": "2-0", "error": "RuntimeError: db down", "attempts": 5, "at": AT},
        # ... of a scheduler entry: names no notification, nothing to record
        {"type": "notification:failed", "projectId": project_id, "eventId": None,
         "taskId": "task-x", "stream": keys.scheduled, "entryId": "3-0", "error": "x",
         "attempts": 3, "at": AT},
    ]
    # When the outcomes arrive, and arrive again (a replay)
    await put(redis, keys, *outcomes)
    await events.run_until_idle()
    await put(redis, keys, *outcomes)
    await events.run_until_idle()
    # Then each is one row with the status it implies
    assert await timeline(db, "task-sent") == [("sent", "sent", 1, "email")]
    assert await timeline(db, "task-failed") == [("failed", "failed", 2, "sms")]
    assert await timeline(db, "task-invalid") == [("failed", "failed", 1, "push")]
    assert await timeline(db, "task-dead") == [("dead_lettered", "dead_lettered", 3, "email")]
    assert await timeline(db, event_id) == [("dead_lettered", "dead_lettered", 5, "")]
    assert await timeline(db, "task-x") == []
    row = await db.fetchrow("SELECT * FROM message_logs WHERE task_id = 'task-sent'")
    assert (row["provider"], row["provider_message_id"], row["campaign_id"], row["user_id"]) == (
        "resend", "msg-1", "spring", "user-1")


async def test_a_dead_lettered_engine_entry_is_a_row_about_its_recipient(
    make_events: EventsFactory, redis: Redis, keys: Keys, db: asyncpg.Pool, project_id: str,
) -> None:
    # Given two recipients' engine entries of one notification dead-lettered (an engine
    # entry is an enriched message: one recipient, no task yet)
    events = make_events()
    event_id = uuid7()
    dead = []
    for n, user in enumerate(("user-1", "user-2")):
        entry = Entry(keys.enriched("normal"), f"1-{n}", {
            "projectId": project_id, "eventId": event_id, "user": {"id": user}}, attempt=3)
        dead.append(failed_event(entry, {"error": "RuntimeError: boom", "attempts": 3,
                                         "failedAt": AT}))
    await put(redis, keys, *dead)
    await events.run_until_idle()
    # Then each recipient has its own row, as the GET shows recipients, and neither is lost
    for user in ("user-1", "user-2"):
        task = untasked_row_id(event_id, user)
        assert await timeline(db, task) == [("dead_lettered", "dead_lettered", 3, "")]
        assert await db.fetchval("SELECT user_id FROM message_logs WHERE task_id = $1",
                                 task) == user
    assert await timeline(db, event_id) == []


async def test_a_dead_lettered_scheduler_entry_is_a_row_about_the_task_it_holds(
    make_events: EventsFactory, redis: Redis, keys: Keys, db: asyncpg.Pool, project_id: str,
) -> None:
    # Given a scheduler entry (a task to move to outbound later) dead-lettered before it
    # reached a shard: its notification and recipient are the held task's
    events = make_events()
    event_id = uuid7()
    task = {"projectId": project_id, "eventId": event_id, "taskId": "task-held",
            "userId": "user-1", "channel": "sms", "priority": "normal", "campaignId": "c1"}
    entry = Entry(keys.scheduled, "1-0", {
        "taskId": "task-held", "projectId": project_id, "dueAt": 1, "reason": "sendAt",
        "stream": keys.outbound("normal"), "payload": task}, attempt=3)
    dead = failed_event(entry, {"error": "RuntimeError: boom", "attempts": 3, "failedAt": AT})
    assert (dead["eventId"], dead["userId"], dead["channel"], dead["campaignId"]) == (
        event_id, "user-1", "sms", "c1")
    await put(redis, keys, dead)
    await events.run_until_idle()
    # Then the task's timeline says it was dead-lettered, rather than nothing at all
    assert await timeline(db, "task-held") == [("dead_lettered", "dead_lettered", 3, "sms")]
    assert await db.fetchval("SELECT user_id FROM message_logs WHERE task_id = 'task-held'") \
        == "user-1"


async def test_an_outcome_delivery_already_recorded_is_acked_without_a_second_write(
    make_events: EventsFactory, redis: Redis, keys: Keys, db: asyncpg.Pool, project_id: str,
) -> None:
    # Given a sent event that says delivery wrote its row, and one that does not
    events = make_events()
    event_id = uuid7()
    await put(redis, keys, {**sent_event(project_id, event_id, "task-recorded", "msg-1"),
                            "recorded": True},
              sent_event(project_id, event_id, "task-unrecorded", "msg-2"))
    # When the events service runs
    await events.run_until_idle()
    # Then only the second becomes a row (delivery's own row stands for the first), and both
    # are acked
    assert await timeline(db, "task-recorded") == []
    assert await timeline(db, "task-unrecorded") == [("sent", "sent", 1, "email")]
    summary: Any = await redis.xpending(keys.events_inbound, events.worker.group)
    assert summary["pending"] == 0


async def test_a_dead_lettering_already_on_the_timeline_is_not_repeated(
    make_events: EventsFactory, redis: Redis, keys: Keys, db: asyncpg.Pool, project_id: str,
) -> None:
    """Delivery writes its own dead_lettered row (counting parked attempts too); the worker's
    failed event for the same task must not add a second one."""
    event_id = uuid7()
    await db.execute(
        "INSERT INTO message_logs (project_id, event_id, task_id, channel, attempt, kind, status)"
        " VALUES ($1, $2, 'task-d', 'email', 4, 'dead_lettered', 'dead_lettered')",
        project_id, event_id,
    )
    await put(redis, keys, {
        "type": "notification:failed", "projectId": project_id, "eventId": event_id,
        "taskId": "task-d", "channel": "email", "stream": keys.outbound("normal"),
        "entryId": "1-0", "error": "PermanentFailure: 400", "attempts": 1, "at": AT})
    await make_events().run_until_idle()
    assert await timeline(db, "task-d") == [("dead_lettered", "dead_lettered", 4, "email")]


async def test_a_replay_that_is_dead_lettered_again_shows_on_the_timeline(
    make_events: EventsFactory, redis: Redis, keys: Keys, db: asyncpg.Pool, project_id: str,
) -> None:
    """A DLQ replay starts a new round whose attempts are numbered after the earlier ones:
    its dead-lettering is a row of its own, while a repeat of either round's adds nothing."""
    event_id = uuid7()

    def dead(attempts: int, attempt: int) -> dict[str, Any]:
        return {"type": "notification:failed", "projectId": project_id, "eventId": event_id,
                "taskId": None, "userId": None, "channel": None,
                "stream": keys.enriched("normal"), "entryId": f"{attempt}-0",
                "error": "AttributeError: boom", "attempts": attempts, "attempt": attempt,
                "at": AT}

    # Given an engine entry dead-lettered, replayed and dead-lettered again (each event twice)
    await put(redis, keys, dead(3, 3), dead(3, 3))
    await make_events().run_until_idle()
    await put(redis, keys, dead(3, 6), dead(3, 6))
    await make_events().run_until_idle()
    # Then the timeline shows both dead-letterings, once each
    assert await timeline(db, event_id) == [("dead_lettered", "dead_lettered", 3, ""),
                                            ("dead_lettered", "dead_lettered", 6, "")]


async def test_a_replayed_tasks_dead_lettering_delivery_recorded_is_not_repeated(
    make_events: EventsFactory, redis: Redis, keys: Keys, db: asyncpg.Pool, project_id: str,
) -> None:
    # Given a task dead-lettered once (attempt 1), replayed, and dead-lettered again by
    # delivery itself, which counted its parked attempts too (attempt 5 where the worker says 4)
    event_id = uuid7()
    for attempt in (1, 5):
        await db.execute(
            "INSERT INTO message_logs (project_id, event_id, task_id, channel, attempt, kind, "
            "status) VALUES ($1, $2, 'task-r', 'email', $3, 'dead_lettered', 'dead_lettered')",
            project_id, event_id, attempt,
        )
    await put(redis, keys, {
        "type": "notification:failed", "projectId": project_id, "eventId": event_id,
        "taskId": "task-r", "channel": "email", "stream": keys.outbound("normal"),
        "entryId": "1-0", "error": "AttemptsExhausted: 503", "attempts": 3, "attempt": 4,
        "at": AT})
    await make_events().run_until_idle()
    # Then the worker's event adds no second row for that round
    assert await timeline(db, "task-r") == [("dead_lettered", "dead_lettered", 1, "email"),
                                            ("dead_lettered", "dead_lettered", 5, "email")]


async def test_receipts_land_on_the_sent_attempt_once(
    make_events: EventsFactory, redis: Redis, keys: Keys, db: asyncpg.Pool, project_id: str,
) -> None:
    events = make_events()
    event_id = uuid7()
    await record_send(db, project_id, "task-1", "ada@example.com", "msg-1")
    await put(redis, keys, sent_event(project_id, event_id, "task-1", "msg-1", attempt=2))
    click = {"data": {"click": {"link": "https://example.com/offer"}}}
    receipts = [receipt(project_id, "msg-1", kind, raw)
                for kind, raw in (("delivered", None), ("opened", None), ("clicked", click))]
    await put(redis, keys, *receipts, *receipts)  # the provider repeats its webhooks
    await events.run_until_idle()
    assert await timeline(db, "task-1") == [
        ("sent", "sent", 2, "email"),
        ("delivered", "delivered", 2, "email"),
        ("opened", "delivered", 2, "email"),
        ("clicked", "delivered", 2, "email"),
    ]
    clicked = await db.fetchrow("SELECT * FROM message_logs WHERE kind = 'clicked'")
    assert clicked["metadata"]["link"] == "https://example.com/offer"
    assert str(clicked["event_id"]) == event_id
    assert clicked["campaign_id"] == "spring"
    assert await db.fetchval("SELECT count(*) FROM suppressions") == 0


async def test_receipts_wake_workflows_waiting_for_their_kind(
    make_events: EventsFactory, redis: Redis, keys: Keys, db: asyncpg.Pool, project_id: str,
) -> None:
    event_id = uuid7()
    await record_send(db, project_id, "task-1", "ada@example.com", "msg-1")
    await put(redis, keys, sent_event(project_id, event_id, "task-1", "msg-1"))
    click = {"data": {"click": {"link": "https://example.com/offer"}}}
    receipts = [receipt(project_id, "msg-1", "opened"), receipt(project_id, "msg-1", "clicked",
                                                                 click)]
    await put(redis, keys, *receipts, *receipts)  # the provider repeats its webhooks
    await make_events().run_until_idle()
    forwarded = [decode(fields) for _id, fields in await xrange(redis, keys.workflow_inbound)]
    assert [(e["name"], e["userId"], e["projectId"]) for e in forwarded] == [
        ("opened", "user-1", project_id), ("clicked", "user-1", project_id)] * 2
    first, second = forwarded[:2], forwarded[2:]
    # A repeated webhook is the same event (same id), so it wakes nobody new.
    assert [e["eventId"] for e in first] == [e["eventId"] for e in second]
    assert first[0]["eventId"] != first[1]["eventId"]
    assert first[1]["data"] == {
        "notificationId": event_id, "taskId": "task-1", "channel": "email",
        "provider": "resend", "providerMessageId": "msg-1", "link": "https://example.com/offer"}
    assert first[1]["at"] == AT


async def test_each_webhook_delivery_is_its_own_workflow_event(
    make_events: EventsFactory, redis: Redis, keys: Keys, db: asyncpg.Pool, project_id: str,
) -> None:
    await record_send(db, project_id, "task-1", "ada@example.com", "msg-1")
    await put(redis, keys, sent_event(project_id, uuid7(), "task-1", "msg-1"))
    clicks = [{**receipt(project_id, "msg-1", "clicked"), "webhookId": f"resend:{svix_id}:0"}
              for svix_id in ("msg_a", "msg_b", "msg_a")]  # a second click, then a retry
    await put(redis, keys, *clicks)
    await make_events().run_until_idle()
    forwarded = [decode(fields) for _id, fields in await xrange(redis, keys.workflow_inbound)]
    first, second, retried = (e["eventId"] for e in forwarded)
    assert first != second
    assert retried == first
    assert await timeline(db, "task-1") == [("sent", "sent", 1, "email"),
                                            ("clicked", "delivered", 1, "email")]


RESEND_HARD_BOUNCE = {"type": "email.bounced", "data": {
    "email_id": "msg-2", "to": ["gone@example.com"],
    "bounce": {"message": "The recipient's email provider sent a hard bounce message.",
               "subType": "General", "type": "Permanent"}}}
RESEND_SOFT_BOUNCE = {"type": "email.bounced", "data": {
    "email_id": "msg-3", "to": ["full@example.com"],
    "bounce": {"message": "Mailbox full", "subType": "MailboxFull", "type": "Transient"}}}


async def test_a_hard_bounce_or_a_complaint_suppresses_the_address(
    make_events: EventsFactory, redis: Redis, keys: Keys, db: asyncpg.Pool, project_id: str,
) -> None:
    events = make_events()
    event_id = uuid7()
    for task, address, message in (("task-2", "gone@example.com", "msg-2"),
                                   ("task-3", "full@example.com", "msg-3"),
                                   ("task-4", "angry@example.com", "msg-4")):
        await record_send(db, project_id, task, address, message)
        await put(redis, keys, sent_event(project_id, event_id, task, message))
    await events.run_until_idle()
    # When a hard bounce, a soft bounce and a complaint arrive
    await put(redis, keys,
              receipt(project_id, "msg-2", "bounced", RESEND_HARD_BOUNCE),
              receipt(project_id, "msg-3", "bounced", RESEND_SOFT_BOUNCE),
              receipt(project_id, "msg-4", "delivered"),
              receipt(project_id, "msg-4", "complained"))
    await events.run_until_idle()
    # Then the hard bounce and the complaint suppress their addresses; the soft bounce doesn't
    rows = await db.fetch(
        "SELECT channel, target, reason, detail FROM suppressions WHERE project_id = $1 "
        "ORDER BY target", project_id)
    assert [(r["channel"], r["target"], r["reason"]) for r in rows] == [
        ("email", "angry@example.com", "complaint"),
        ("email", "gone@example.com", "bounce"),
    ]
    assert "hard bounce" in rows[1]["detail"]
    assert await timeline(db, "task-2") == [("sent", "sent", 1, "email"),
                                            ("bounced", "failed", 1, "email")]
    assert await timeline(db, "task-3") == [("sent", "sent", 1, "email"),
                                            ("bounced", "failed", 1, "email")]
    detail = await db.fetchval("SELECT detail FROM message_logs WHERE task_id = 'task-2' "
                               "AND kind = 'bounced'")
    # (the provider's sentence ends with a full stop; the row's clause follows it as one)
    assert detail == ("bounced (resend): The recipient's email provider sent a hard bounce "
                      "message; address suppressed")
    # and the soft bounce's row says why nothing was suppressed
    detail = await db.fetchval("SELECT detail FROM message_logs WHERE task_id = 'task-3' "
                               "AND kind = 'bounced'")
    assert detail == ("bounced (resend): Mailbox full; a soft bounce: the address is not "
                      "suppressed")


# Invalid number, replied STOP, not a mobile number, unreachable, unknown, landline: each
# a number that can never receive (30003, unreachable handset, is the passing one below).
@pytest.mark.parametrize("code", ["21211", "21610", "21614", "30004", "30005", "30006"])
async def test_a_twilio_failure_for_a_number_that_can_never_receive_suppresses_it(
    make_events: EventsFactory, redis: Redis, keys: Keys, db: asyncpg.Pool, project_id: str,
    code: str,
) -> None:
    # Given two SMS sent, then Twilio reporting both "failed": one number can never receive
    # (`code`), the other failed for a passing reason (30003, handset unreachable)
    events = make_events()
    event_id = uuid7()
    for task, number, message in (("task-s1", "+14155550101", "SM1"),
                                  ("task-s2", "+14155550102", "SM2")):
        await record_send(db, project_id, task, number, message, "sms", "twilio")
        await put(redis, keys, {**sent_event(project_id, event_id, task, message, "sms"),
                                "provider": "twilio"})
    await events.run_until_idle()
    await put(redis, keys,
              receipt(project_id, "SM1", "failed", {"MessageStatus": "failed",
                                                     "ErrorCode": code}, "twilio"),
              receipt(project_id, "SM2", "failed", {"MessageStatus": "failed",
                                                     "ErrorCode": "30003"}, "twilio"))
    await events.run_until_idle()
    # Then only the number that can never receive is suppressed, and both stay "failed" on
    # the timeline
    rows = await db.fetch("SELECT channel, target, reason FROM suppressions")
    assert [tuple(r) for r in rows] == [("sms", "+14155550101", "bounce")]
    assert await timeline(db, "task-s1") == [("sent", "sent", 1, "sms"),
                                             ("failed", "failed", 1, "sms")]


async def test_a_receipt_that_overtakes_the_send_record_is_retried(
    make_events: EventsFactory, settings: Settings, redis: Redis, keys: Keys,
    db: asyncpg.Pool, project_id: str,
) -> None:
    # Given failed attempts reclaimable at once, and a bounce for a message not recorded yet
    events = make_events(settings=settings.replace(reclaim_min_idle_s=0.0))
    await put(redis, keys, receipt(project_id, "msg-9", "bounced", RESEND_HARD_BOUNCE))
    await events.open()  # else the attempt fails before it looks for the send
    await events.worker.run_until_idle(reclaim=False)
    assert await db.fetchval("SELECT count(*) FROM suppressions") == 0
    summary = await redis.xpending(keys.events_inbound, keys.group("events"))
    assert summary["pending"] == 1
    # When delivery's record appears, the retry finds it
    event_id = uuid7()
    await record_send(db, project_id, "task-9", "gone@example.com", "msg-9")
    await put(redis, keys, sent_event(project_id, event_id, "task-9", "msg-9"))
    await events.run_until_idle()
    assert await timeline(db, "task-9") == [("sent", "sent", 1, "email"),
                                            ("bounced", "failed", 1, "email")]
    assert await db.fetchval("SELECT target FROM suppressions") == "gone@example.com"
    summary = await redis.xpending(keys.events_inbound, keys.group("events"))
    assert summary["pending"] == 0


async def test_a_hard_bounce_matching_no_send_still_suppresses_its_address(
    make_events: EventsFactory, settings: Settings, redis: Redis, keys: Keys,
    db: asyncpg.Pool, project_id: str,
) -> None:
    # Given a hard and a soft bounce for messages notifkit has no record of, and a complaint
    # naming its address with an upper-case domain (contacts store the domain lower-cased)
    events = make_events(settings=settings.replace(reclaim_min_idle_s=0.0))
    hard = {**receipt(project_id, "msg-x", "bounced", RESEND_HARD_BOUNCE),
            "channel": "email", "to": "gone@example.com"}
    soft = {**receipt(project_id, "msg-y", "bounced", RESEND_SOFT_BOUNCE),
            "channel": "email", "to": "busy@example.com"}
    raw = {"type": "email.complained", "data": {"to": ["Angry@Example.ORG"]}}
    angry = {**receipt(project_id, "msg-w", "complained", raw), "channel": "email"}
    await put(redis, keys, hard, soft, angry)

    # When they are retried to the attempt limit
    await events.run_until_idle()

    # Then all are dead-lettered, and the hard bounce's and the complaint's addresses are
    # suppressed all the same, spelled as the contacts they must stop sends to
    assert len(await xrange(redis, keys.dlq)) == 3
    rows = await db.fetch("SELECT channel, target, reason FROM suppressions ORDER BY target")
    assert [tuple(r) for r in rows] == [("email", "Angry@example.org", "complaint"),
                                        ("email", "gone@example.com", "bounce")]


async def test_a_receipt_about_another_projects_send_is_acked_and_changes_nothing(
    make_events: EventsFactory, settings: Settings, redis: Redis, keys: Keys,
    db: asyncpg.Pool, project_id: str,
) -> None:
    # Given one provider account serving two projects: it posts every event to each
    # project's endpoint, so project B gets a hard bounce of project A's send, echoing its task
    events = make_events(settings=settings.replace(reclaim_min_idle_s=0.0))
    other = str(await db.fetchval("INSERT INTO projects (name) VALUES ('b') RETURNING id"))
    await record_send(db, project_id, "task-a", "ada@example.com", "msg-a")
    await put(redis, keys, sent_event(project_id, uuid7(), "task-a", "msg-a"))
    await events.run_until_idle()
    await put(redis, keys, {**receipt(other, "msg-a", "bounced", RESEND_HARD_BOUNCE),
                            "channel": "email", "to": "ada@example.com", "taskId": "task-a"})

    # When the events service reads it
    await events.run_until_idle()

    # Then it is done with at once: not retried into B's dead-letter queue (where B would
    # read A's recipient), no suppression in B, nothing on anyone's timeline
    assert await xrange(redis, keys.dlq) == []
    summary = await redis.xpending(keys.events_inbound, keys.group("events"))
    assert summary["pending"] == 0
    assert await db.fetchval("SELECT count(*) FROM suppressions") == 0
    assert await timeline(db, "task-a") == [("sent", "sent", 1, "email")]


async def test_an_unmatched_hard_bounce_suppresses_at_once_while_it_waits_for_its_send(
    make_events: EventsFactory, settings: Settings, redis: Redis, keys: Keys,
    db: asyncpg.Pool, project_id: str,
) -> None:
    # Given a hard bounce naming its address, for a message delivery has not recorded (yet)
    events = make_events(settings=settings.replace(reclaim_min_idle_s=0.0))
    hard = {**receipt(project_id, "msg-z", "bounced", RESEND_HARD_BOUNCE),
            "channel": "email", "to": "gone@example.com"}
    await put(redis, keys, hard)

    # When the first attempt finds no send
    await events.open()
    await events.worker.run_until_idle(reclaim=False)

    # Then the address is suppressed already, and the receipt still waits for its send
    rows = await db.fetch("SELECT channel, target, reason FROM suppressions")
    assert [tuple(r) for r in rows] == [("email", "gone@example.com", "bounce")]
    summary = await redis.xpending(keys.events_inbound, keys.group("events"))
    assert summary["pending"] == 1


async def test_a_receipt_found_by_the_timeline_alone(
    make_events: EventsFactory, redis: Redis, keys: Keys, db: asyncpg.Pool, project_id: str,
) -> None:
    """A message id the outbox does not know (another provider name in the webhook URL, say)
    is still found by the sent row; the address then comes from the receipt itself."""
    events = make_events()
    event_id = uuid7()
    await put(redis, keys, sent_event(project_id, event_id, "task-5", "msg-5"))
    raw = {"type": "email.bounced", "data": {"to": ["old@example.com"]}}
    await put(redis, keys, receipt(project_id, "msg-5", "bounced", raw, provider="mailer"))
    await events.run_until_idle()
    assert await timeline(db, "task-5") == [("sent", "sent", 1, "email"),
                                            ("bounced", "failed", 1, "email")]
    assert await db.fetchval("SELECT target FROM suppressions") == "old@example.com"


async def test_custom_events_go_to_the_workflow_service(
    make_events: EventsFactory, redis: Redis, keys: Keys, project_id: str,
) -> None:
    event_id = uuid7()
    await put(redis, keys, {"type": "custom", "projectId": project_id, "name": "order.paid",
                            "userId": "user-1", "data": {"orderId": 7}, "eventId": event_id,
                            "at": AT})
    await make_events().run_until_idle()
    [(_id, fields)] = await xrange(redis, keys.workflow_inbound)
    assert decode(fields) == {"type": "event", "projectId": project_id, "name": "order.paid",
                              "userId": "user-1", "data": {"orderId": 7}, "at": AT,
                              "eventId": event_id}


@pytest.mark.parametrize("event", [
    {"type": "receipt", "projectId": "nope", "provider": "resend", "providerMessageId": "m",
     "kind": "delivered"},
    {"type": "receipt", "projectId": str(uuid.uuid4()), "provider": "resend",
     "providerMessageId": "m", "kind": "teleported"},
    {"type": "custom", "projectId": str(uuid.uuid4()), "userId": "u"},
    {"type": "notification:sent", "projectId": 7},
    {"type": "who-knows"},
])
async def test_events_that_can_never_be_recorded_are_acked(
    make_events: EventsFactory, redis: Redis, keys: Keys, db: asyncpg.Pool,
    event: dict[str, Any],
) -> None:
    await put(redis, keys, event)
    await make_events().run_until_idle()
    summary = await redis.xpending(keys.events_inbound, keys.group("events"))
    assert summary["pending"] == 0
    assert await db.fetchval("SELECT count(*) FROM message_logs") == 0
    assert await redis.exists(keys.workflow_inbound) == 0


async def test_a_receipt_found_by_the_task_id_the_provider_echoes(
    make_events: EventsFactory, redis: Redis, keys: Keys, db: asyncpg.Pool, project_id: str,
) -> None:
    """The api passes on a task id the provider echoes back (our metadata) and the address
    the receipt names; they find the task when the message id does not."""
    events = make_events()
    event_id = uuid7()
    sent = sent_event(project_id, event_id, "task-6", "msg-6")
    sent["providerMessageId"] = None
    await put(redis, keys, sent)
    complaint = receipt(project_id, "unknown-id", "complained")
    complaint.update(taskId="task-6", channel="email", to="spam-hater@example.com")
    await put(redis, keys, complaint)
    await events.run_until_idle()
    assert await timeline(db, "task-6") == [("sent", "sent", 1, "email"),
                                            ("complained", "delivered", 1, "email")]
    row = await db.fetchrow("SELECT target, reason FROM suppressions")
    assert (row["target"], row["reason"]) == ("spam-hater@example.com", "complaint")


async def test_a_receipt_echoing_its_task_ignores_another_task_with_the_same_message_id(
    make_events: EventsFactory, redis: Redis, keys: Keys, db: asyncpg.Pool, project_id: str,
) -> None:
    """Provider message ids can repeat (a simulator restarted with the same seed hands out the
    same ids again): the task id the receipt echoes decides which send it is about."""
    events = make_events()
    await record_send(db, project_id, "task-old", "ada@example.com", "msg-dup")
    await put(redis, keys, sent_event(project_id, uuid7(), "task-old", "msg-dup"))
    await events.run_until_idle()
    await record_send(db, project_id, "task-new", "bob@example.com", "msg-dup")
    await put(redis, keys, sent_event(project_id, uuid7(), "task-new", "msg-dup"))
    await events.run_until_idle()
    # A hard bounce for the newer send, found through the old record first in the outbox
    bounce = receipt(project_id, "msg-dup", "bounced", RESEND_HARD_BOUNCE)
    bounce.update(taskId="task-new", channel="email", to="bob@example.com")
    await put(redis, keys, bounce)
    await events.run_until_idle()
    assert await timeline(db, "task-new") == [("sent", "sent", 1, "email"),
                                              ("bounced", "failed", 1, "email")]
    assert await timeline(db, "task-old") == [("sent", "sent", 1, "email")]
    rows = await db.fetch("SELECT target FROM suppressions WHERE project_id = $1", project_id)
    assert [r["target"] for r in rows] == ["bob@example.com"]


async def test_a_twilio_bounce_row_names_its_error_code_and_whether_it_suppressed(
    make_events: EventsFactory, redis: Redis, keys: Keys, db: asyncpg.Pool, project_id: str,
) -> None:
    # Twilio's status callback carries an ErrorCode and no message: the code is the reason a
    # reader can look up, and a soft one (30003, handset unreachable) suppresses nothing.
    events = make_events()
    for task, number, message in (("task-s", "+15550000001", "SM-soft"),
                                  ("task-h", "+15550000002", "SM-hard")):
        await record_send(db, project_id, task, number, message, "sms", "twilio")
        await put(redis, keys, sent_event(project_id, uuid7(), task, message, "sms"))
    await events.run_until_idle()
    await put(redis, keys,
              receipt(project_id, "SM-soft", "bounced", {"MessageStatus": "undelivered",
                                                         "ErrorCode": "30003"}, "twilio"),
              receipt(project_id, "SM-hard", "bounced", {"MessageStatus": "undelivered",
                                                         "ErrorCode": "30005"}, "twilio"))
    await events.run_until_idle()
    details = dict(await db.fetch(
        "SELECT task_id, detail FROM message_logs WHERE kind = 'bounced' AND project_id = $1",
        project_id))
    assert details == {
        "task-s": "bounced (twilio): error 30003; a soft bounce: the address is not suppressed",
        "task-h": "bounced (twilio): error 30005; address suppressed",
    }


async def test_a_failed_receipt_row_quotes_the_providers_reason(
    make_events: EventsFactory, redis: Redis, keys: Keys, db: asyncpg.Pool, project_id: str,
) -> None:
    # Resend's email.failed says why under data.failed.reason (quota, domain, key): the only
    # clue a reader of the timeline gets, since the send itself was accepted.
    events = make_events()
    await record_send(db, project_id, "task-f", "ann@example.com", "re-failed")
    await put(redis, keys, sent_event(project_id, uuid7(), "task-f", "re-failed"))
    await events.run_until_idle()
    await put(redis, keys, receipt(project_id, "re-failed", "failed", {
        "type": "email.failed", "created_at": AT,
        "data": {"email_id": "re-failed", "to": ["ann@example.com"],
                 "failed": {"reason": "reached_daily_quota"}}}))
    await events.run_until_idle()
    detail = await db.fetchval(
        "SELECT detail FROM message_logs WHERE kind = 'failed' AND task_id = 'task-f'")
    assert detail == "failed (resend): reached_daily_quota"


@pytest.mark.parametrize(("raw", "extra", "hard"), [
    (RESEND_HARD_BOUNCE, {}, True),
    (RESEND_SOFT_BOUNCE, {}, False),
    ({"data": {"bounce": {"type": "Undetermined"}}}, {}, False),
    ({"event": "bounce", "type": "bounce", "reason": "550 5.1.1 unknown user"}, {}, True),
    ({"event": "bounce", "type": "blocked", "reason": "IP blocked"}, {}, False),
    ({"MessageStatus": "undelivered", "ErrorCode": "30003"}, {}, False),  # handset off
    ({"MessageStatus": "undelivered", "ErrorCode": "30005"}, {}, True),  # unknown number
    # true and false are no error code, though Python counts them as ints: the bounce type
    # decides, as without one.
    ({"event": "bounce", "type": "bounce", "ErrorCode": True}, {}, True),
    ({"event": "bounce", "type": "bounce", "ErrorCode": False}, {}, True),
    ({"MessageStatus": "undelivered", "ErrorCode": 30005}, {}, True),  # a JSON number
    ({}, {}, True),  # nothing says otherwise
    (RESEND_HARD_BOUNCE, {"hard": False}, False),  # the receipt's own word wins
    # ... and so does the word of the event a webhook posted, which is all a receipt from
    # the HTTP API can carry.
    ({"type": "email.bounced", "data": {"message_id": "m", "hard": False}}, {}, False),
    ({"event": "bounce", "hard": False}, {}, False),
    ({"type": "email.bounced", "data": {"message_id": "m", "hard": True}}, {}, True),
    ({"type": "email.bounced", "data": {"hard": "no"}}, {}, True),  # no boolean: no word
])
def test_which_bounces_are_hard(raw: dict[str, Any], extra: dict[str, Any], hard: bool) -> None:
    assert is_hard_bounce({"kind": "bounced", "raw": raw, **extra}) is hard


async def test_a_receipt_postgresql_cannot_store_fails_alone(
    make_events: EventsFactory, settings: Settings, redis: Redis, keys: Keys,
    db: asyncpg.Pool, project_id: str,
) -> None:
    """A signed receipt can carry what no index holds (a message id of kilobytes, found by the
    task id it echoes): it goes to the DLQ by itself, not with every receipt read beside it."""
    events = make_events(settings=settings.replace(reclaim_min_idle_s=0.0))
    await put(redis, keys, sent_event(project_id, uuid7(), "task-a", "msg-a"),
              sent_event(project_id, uuid7(), "task-b", "msg-b"))
    await events.run_until_idle()
    huge = receipt(project_id, secrets.token_urlsafe(6000), "opened")  # incompressible
    huge.update(taskId="task-a", channel="email")
    await put(redis, keys, huge, receipt(project_id, "msg-b", "delivered"))

    await events.run_until_idle()

    assert await timeline(db, "task-b") == [("sent", "sent", 1, "email"),
                                            ("delivered", "delivered", 1, "email")]
    assert await timeline(db, "task-a") == [("sent", "sent", 1, "email")]
    [(_id, fields)] = await xrange(redis, keys.dlq)
    assert decode(fields)["payload"]["taskId"] == "task-a"
    summary = await redis.xpending(keys.events_inbound, keys.group("events"))
    assert summary["pending"] == 0


async def test_a_refused_address_does_not_stop_a_bounce_waiting_for_its_send(
    make_events: EventsFactory, settings: Settings, redis: Redis, keys: Keys,
    db: asyncpg.Pool, project_id: str,
) -> None:
    """A bounce that overtook its send and names an address no index holds cannot suppress
    that address at once; it still waits for its send, which names the address to suppress."""
    events = make_events(settings=settings.replace(reclaim_min_idle_s=0.0))
    bounce = {**receipt(project_id, "msg-q", "bounced", RESEND_HARD_BOUNCE),
              "channel": "email", "to": secrets.token_urlsafe(6000) + "@example.com"}
    await put(redis, keys, bounce)
    await events.open()
    await events.worker.run_until_idle(reclaim=False)
    assert await xrange(redis, keys.dlq) == []
    await record_send(db, project_id, "task-q", "gone@example.com", "msg-q")
    await put(redis, keys, sent_event(project_id, uuid7(), "task-q", "msg-q"))

    await events.run_until_idle()

    assert await timeline(db, "task-q") == [("sent", "sent", 1, "email"),
                                            ("bounced", "failed", 1, "email")]
    assert await db.fetchval("SELECT target FROM suppressions") == "gone@example.com"


async def test_a_dead_lettering_whose_error_holds_a_nul_is_recorded(
    make_events: EventsFactory, redis: Redis, keys: Keys, db: asyncpg.Pool, project_id: str,
) -> None:
    """A provider's error answer can hold any byte, a NUL too, which a text column refuses:
    the dead_lettered row is written all the same (the NUL shown as U+FFFD), and the
    outcome read with it is recorded, rather than both going to the DLQ."""
    events = make_events()
    event_id = uuid7()
    entry = Entry(keys.outbound("normal"), "1-0", {
        "projectId": project_id, "eventId": event_id, "taskId": "task-nul", "channel": "email",
        "userId": "user-1"}, attempt=3)
    dead = failed_event(entry, {"error": "RetryLater: HTTP 500: upstream \x00 broke",
                                "attempts": 3, "failedAt": AT})
    await put(redis, keys, dead, sent_event(project_id, uuid7(), "task-ok", "msg-ok"))

    await events.run_until_idle()

    assert await timeline(db, "task-nul") == [("dead_lettered", "dead_lettered", 3, "email")]
    assert await db.fetchval("SELECT detail FROM message_logs WHERE task_id = 'task-nul'") == (
        "dead-lettered after 3 attempts: RetryLater: HTTP 500: upstream \ufffd broke")
    assert await timeline(db, "task-ok") == [("sent", "sent", 1, "email")]
    assert await xrange(redis, keys.dlq) == []
