"""Canceling a scheduled notification against the real pipeline: the API, the enricher, the
engine, the scheduler (its ingest, poll lock and move script), delivery and the provider
simulator, on the real Redis and PostgreSQL.

A cancel must win or lose against the scheduler's poller as a whole: a task the answer shows
canceled never reaches the provider, and a task it does not show canceled is delivered. The
scheduler's clock is the test's, so "after the due time" needs no waiting; where the poller
runs on its own, the tests poll for the outcome with a deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.keys import Keys, shard_of
from notifkit.services.delivery.service import DeliveryService
from notifkit.services.engine import EngineService
from notifkit.services.enricher import EnricherService
from notifkit.services.scheduler import SchedulerService
from simulators import SimulatorServer
from tests.api.conftest import Api, Project, running_api
from tests.sendpath.conftest import simulated

from .helpers import FakeClock, SchedulerFactory, wipe_scheduler_state
from .pipeline import EMAIL, drain, simulated_resend

DEADLINE_S = 20.0


@pytest.fixture
def cancel_settings(settings: Settings, sim: SimulatorServer) -> Settings:
    return simulated_resend(settings, sim.base_url).replace(
        api_rate_per_second=10_000.0, api_rate_burst=10_000, scheduler_poll_interval_s=0.01,
        reclaim_min_idle_s=0.0, read_block_ms=20)


@pytest.fixture
async def api(cancel_settings: Settings) -> AsyncIterator[Api]:
    async with running_api(cancel_settings) as api:
        yield api


@pytest.fixture
async def project(api: Api) -> Project:
    project = await api.project()
    reply = await api.call("PUT", "/v1/templates/code", key=project.full,
                           json={"channels": {"email": EMAIL}})
    assert reply.status == 201, reply.body
    return project


@pytest.fixture
async def pipeline(cancel_settings: Settings) -> AsyncIterator[list[Any]]:
    services = [EnricherService(cancel_settings), EngineService(cancel_settings)]
    yield services
    for service in services:
        await service.close()


@pytest.fixture
async def delivery(cancel_settings: Settings) -> AsyncIterator[DeliveryService]:
    service = DeliveryService(cancel_settings)
    yield service
    await service.close()


def rfc3339(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def in_a_minute() -> tuple[str, int]:
    """A sendAt a minute from now, and its time in ms (the scheduler's clock is moved past
    it; nothing waits for it)."""
    moment = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=1)
    return rfc3339(moment), int(moment.timestamp() * 1000)


async def add_user(api: Api, project: Project, user_id: str, **fields: Any) -> None:
    reply = await api.call("PUT", f"/v1/users/{user_id}", key=project.full, json={
        "contacts": [{"channel": "email", "target": f"{user_id}@example.com"}], **fields})
    assert reply.status in (200, 201), reply.body


async def send(api: Api, project: Project, user_id: str | list[str], **fields: Any) -> str:
    reply = await api.call("POST", "/v1/notifications", key=project.send,
                           json={"to": user_id, "template": "code", "data": {"code": "7"},
                                 **fields})
    assert reply.status == 202, reply.body
    event_id: str = reply.body["id"]
    return event_id


async def cancel(api: Api, project: Project, event_id: str) -> dict[str, Any]:
    reply = await api.call("POST", f"/v1/notifications/{event_id}/cancel", key=project.full)
    assert reply.status == 200, reply.body
    body: dict[str, Any] = reply.body
    return body


async def show(api: Api, project: Project, event_id: str) -> dict[str, Any]:
    reply = await api.call("GET", f"/v1/notifications/{event_id}", key=project.full)
    assert reply.status == 200, reply.body
    body: dict[str, Any] = reply.body
    return body


def only_recipient(notification: dict[str, Any]) -> dict[str, Any]:
    [recipient] = notification["recipients"]
    return dict(recipient)


def shows_canceled(recipient: dict[str, Any]) -> bool:
    kinds = [row["kind"] for row in recipient["timeline"]]
    return bool(recipient["status"] == "skipped" and kinds[-1] == "canceled")


async def delivered_tasks(sim: SimulatorServer) -> set[str]:
    return {str(m["taskId"]) for m in await sim.messages("resend")}


async def waiting_in_shard(redis: Redis, keys: Keys, task_id: str) -> bool:
    return await redis.zscore(keys.scheduled_shard(shard_of(task_id)), task_id) is not None


async def until_delivered(task_id: str, scheduler: SchedulerService,
                          delivery: DeliveryService, sim: SimulatorServer) -> None:
    """Poll and deliver until the provider has the task, failing after the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while task_id not in await delivered_tasks(sim):
        assert time.monotonic() < deadline, "the send that was not canceled never arrived"
        await scheduler.run_until_idle()
        await delivery.run_until_idle()


async def rows_left(db: asyncpg.Pool, task_ids: list[str]) -> int:
    """The tasks' scheduled_payloads rows, which a rebuild would bring back."""
    count: int = await db.fetchval(
        "SELECT count(*) FROM scheduled_payloads WHERE task_id = ANY($1)", task_ids)
    return count


async def two_waiting(api: Api, project: Project, pipeline: list[Any],
                      scheduler: SchedulerService) -> tuple[str, str, int]:
    """Two sends (to ada, then bob) due in a minute, taken in by the scheduler: their ids and
    due time."""
    for user in ("ada", "bob"):
        await add_user(api, project, user)
    send_at, due_ms = in_a_minute()
    first = await send(api, project, "ada", sendAt=send_at)
    second = await send(api, project, "bob", sendAt=send_at)
    await drain(*pipeline)
    await scheduler.ingest_until_idle()
    return first, second, due_ms


async def test_a_task_canceled_in_its_shard_is_never_delivered(
    api: Api, project: Project, pipeline: list[Any], delivery: DeliveryService,
    make_scheduler: SchedulerFactory, clock: FakeClock, cancel_settings: Settings,
    sim: SimulatorServer, redis: Redis, db: asyncpg.Pool,
) -> None:
    # Given two sends scheduled for the same minute, both waiting in their shards
    keys = Keys(cancel_settings.namespace)
    scheduler = make_scheduler(settings=cancel_settings)
    canceled, kept, due_ms = await two_waiting(api, project, pipeline, scheduler)
    canceled_task = only_recipient(await show(api, project, canceled))["taskId"]
    kept_task = only_recipient(await show(api, project, kept))["taskId"]
    assert await waiting_in_shard(redis, keys, canceled_task)

    # When one of them is canceled
    answer = await cancel(api, project, canceled)

    # Then the answer shows its recipient canceled, as GET does from then on
    recipient = only_recipient(answer)
    assert shows_canceled(recipient), recipient
    assert [row["kind"] for row in recipient["timeline"]] == ["scheduled", "canceled"]
    assert "canceled by the API caller" in recipient["timeline"][-1]["detail"]
    assert answer["status"] == "skipped"
    assert not await waiting_in_shard(redis, keys, canceled_task)

    # And once their time has come, the other one is delivered and the canceled one never is
    clock.now_ms = due_ms + 1_000
    await until_delivered(kept_task, scheduler, delivery, sim)
    await scheduler.run_until_idle()
    await delivery.run_until_idle()
    assert canceled_task not in await delivered_tasks(sim)
    assert shows_canceled(only_recipient(await show(api, project, canceled)))
    # ... and neither task is left in PostgreSQL for a rebuild to bring back
    assert await rows_left(db, [canceled_task, kept_task]) == 0


async def test_a_cancel_racing_the_poller_either_cancels_or_reports_the_send_never_both(
    api: Api, project: Project, pipeline: list[Any], delivery: DeliveryService,
    make_scheduler: SchedulerFactory, clock: FakeClock, cancel_settings: Settings,
    sim: SimulatorServer, redis: Redis,
) -> None:
    # Given sends waiting in their shards, each due a millisecond after the one before
    keys = Keys(cancel_settings.namespace)
    base = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=1)
    events: list[str] = []
    for i in range(12):
        await add_user(api, project, f"u{i}")
        events.append(await send(api, project, f"u{i}",
                                 sendAt=rfc3339(base + timedelta(milliseconds=i))))
    await drain(*pipeline)
    scheduler = make_scheduler(settings=cancel_settings)
    await scheduler.ingest_until_idle()
    tasks = {e: only_recipient(await show(api, project, e))["taskId"] for e in events}
    base_ms = int(base.timestamp() * 1000)
    clock.now_ms = base_ms - 1

    # When the scheduler polls on its own while time passes over their due times, and every
    # one is canceled at the same time
    async def time_passes() -> None:
        for i in range(12):
            clock.now_ms = base_ms + i
            await asyncio.sleep(0.01)

    await scheduler.start()
    answers = await asyncio.gather(time_passes(), *(cancel(api, project, e) for e in events))
    outcome = {e: shows_canceled(only_recipient(a)) for e, a in zip(events, answers[1:],
                                                                   strict=True)}

    # Then each one the answer shows not canceled is delivered, within the deadline ...
    clock.now_ms = base_ms + 1_000
    expected = {tasks[e] for e, was_canceled in outcome.items() if not was_canceled}
    deadline = time.monotonic() + DEADLINE_S
    while not expected <= await delivered_tasks(sim):
        assert time.monotonic() < deadline, "a send the cancel reported as gone never arrived"
        await delivery.run_until_idle()
    for e in events:
        assert not await waiting_in_shard(redis, keys, tasks[e])
    await delivery.run_until_idle()
    # ... and none the answer shows canceled ever is, nor does its timeline change its mind
    delivered = await delivered_tasks(sim)
    for e, was_canceled in outcome.items():
        assert (tasks[e] in delivered) is not was_canceled, (e, was_canceled)
        assert shows_canceled(only_recipient(await show(api, project, e))) is was_canceled


async def test_a_cancel_before_the_task_reaches_the_scheduler_drops_it_there(
    api: Api, project: Project, pipeline: list[Any], delivery: DeliveryService,
    make_scheduler: SchedulerFactory, clock: FakeClock, cancel_settings: Settings,
    sim: SimulatorServer, db: asyncpg.Pool,
) -> None:
    # Given one send canceled as soon as it was accepted, one canceled while its task was on
    # the scheduler's stream, and one left alone, all due in a minute
    for user in ("ada", "bob", "cyd"):
        await add_user(api, project, user)
    send_at, due_ms = in_a_minute()
    at_once = await send(api, project, "ada", sendAt=send_at)
    answer = await cancel(api, project, at_once)
    assert answer["recipients"] == []
    assert [row["kind"] for row in answer["timeline"]] == ["accepted", "canceled"]
    on_stream = await send(api, project, "bob", sendAt=send_at)
    kept = await send(api, project, "cyd", sendAt=send_at)
    await drain(*pipeline)
    await cancel(api, project, on_stream)

    # When the scheduler takes them in, and their time comes
    scheduler = make_scheduler(settings=cancel_settings)
    await scheduler.ingest_until_idle()
    clock.now_ms = due_ms + 1_000
    kept_task = only_recipient(await show(api, project, kept))["taskId"]
    await until_delivered(kept_task, scheduler, delivery, sim)

    # Then the canceled ones never reach the provider, and their timelines say why
    dropped = [only_recipient(await show(api, project, e)) for e in (at_once, on_stream)]
    assert not {r["taskId"] for r in dropped} & await delivered_tasks(sim)
    for recipient in dropped:
        assert shows_canceled(recipient), recipient
        assert [row["kind"] for row in recipient["timeline"]] == ["scheduled", "canceled"]
        assert "canceled by the API caller" in recipient["timeline"][-1]["detail"]
    assert await rows_left(db, [r["taskId"] for r in dropped]) == 0


async def test_a_canceled_send_the_engine_routes_after_its_send_at_is_not_sent(
    api: Api, project: Project, cancel_settings: Settings, delivery: DeliveryService,
    sim: SimulatorServer,
) -> None:
    """A send canceled before its sendAt, whose recipients reach the engine only after it
    (a backlog, a large segment, a crash and a reclaim), is due at once: it must not go to
    delivery past the scheduler that would have dropped it."""
    # Given a send due in a minute, canceled as soon as it was accepted
    await add_user(api, project, "ada")
    send_at, due_ms = in_a_minute()
    event = await send(api, project, "ada", sendAt=send_at)
    await cancel(api, project, event)

    # When the enricher and the engine get to it after its sendAt, and delivery runs
    enricher = EnricherService(cancel_settings)
    engine = EngineService(cancel_settings, clock=lambda: due_ms / 1000 + 1)
    try:
        await drain(enricher, engine, delivery)
    finally:
        await enricher.close()
        await engine.close()

    # Then nothing reaches the provider, and the recipient's timeline says why
    assert await sim.messages("resend") == []
    recipient = only_recipient(await show(api, project, event))
    assert shows_canceled(recipient), recipient
    assert "canceled by the API caller" in recipient["timeline"][-1]["detail"]


async def test_a_fallback_of_a_send_handed_to_delivery_goes_on_after_a_cancel(
    api: Api, project: Project, cancel_settings: Settings, sim: SimulatorServer,
    make_scheduler: SchedulerFactory,
) -> None:
    """A task already handed to delivery is not affected by a cancel: when its channel fails,
    its fallback chain goes on."""
    reply = await api.call("PUT", "/v1/templates/code", key=project.full, json={
        "channels": {"email": EMAIL, "sms": {"text": "{{ data.code }}"}},
        "fallback": ["sms", "email"]})
    assert reply.status == 200, reply.body
    await add_user(api, project, "ada", contacts=[
        {"channel": "email", "target": "ada@example.com"},
        {"channel": "sms", "target": "+15550000001"}])
    await add_user(api, project, "bob")
    await sim.add_fault("error", "twilio", status=503)
    await sim.add_fault("rate_limit", "resend", to="bob@example.com", retry_after_s=3600)
    settings = cancel_settings.replace(sms=simulated(cancel_settings, sim).sms)
    enricher, engine, delivery = (EnricherService(settings), EngineService(settings),
                                  DeliveryService(settings))
    try:
        # Given ada's sms failed at delivery (her e-mail is next) and bob's e-mail waits in
        # the scheduler after a 429, when the notification is canceled
        event = await send(api, project, ["ada", "bob"])
        await drain(enricher, engine)
        await delivery.run_until_idle()
        await make_scheduler(settings=settings).ingest_until_idle()
        await cancel(api, project, event)
        # When the rest of the pipeline runs
        await drain(enricher, engine, delivery)
    finally:
        for service in (enricher, engine, delivery):
            await service.close()
    # Then ada's fallback e-mail went out all the same
    assert [m["to"] for m in await sim.messages("resend")] == ["ada@example.com"]


async def test_cancels_racing_the_scheduler_taking_their_tasks_in_leave_none_waiting(
    api: Api, project: Project, pipeline: list[Any], delivery: DeliveryService,
    make_scheduler: SchedulerFactory, clock: FakeClock, cancel_settings: Settings,
    sim: SimulatorServer, redis: Redis,
) -> None:
    # Given sends whose tasks are on the scheduler's stream
    keys = Keys(cancel_settings.namespace)
    send_at, due_ms = in_a_minute()
    events = []
    for i in range(12):
        await add_user(api, project, f"u{i}")
        events.append(await send(api, project, f"u{i}", sendAt=send_at))
    await drain(*pipeline)
    tasks = [only_recipient(await show(api, project, e))["taskId"] for e in events]

    # When the scheduler takes them in, a few at a time, while every one is canceled
    scheduler = make_scheduler(settings=cancel_settings.replace(worker_concurrency=2))
    await asyncio.gather(scheduler.ingest_until_idle(),
                         *(cancel(api, project, e) for e in events))

    # Then none is left waiting, and their time sends nothing
    for task_id in tasks:
        assert not await waiting_in_shard(redis, keys, task_id)
    clock.now_ms = due_ms + 1_000
    await scheduler.run_until_idle()
    await delivery.run_until_idle()
    assert not set(tasks) & await delivered_tasks(sim)
    for e in events:
        assert shows_canceled(only_recipient(await show(api, project, e)))


async def test_a_task_canceled_while_redis_had_lost_it_is_not_rebuilt(
    api: Api, project: Project, pipeline: list[Any], delivery: DeliveryService,
    make_scheduler: SchedulerFactory, clock: FakeClock, cancel_settings: Settings,
    sim: SimulatorServer, redis: Redis, db: asyncpg.Pool,
) -> None:
    # Given a canceled send whose task Redis had lost (only its row in PostgreSQL is left),
    # and one not canceled, lost with it
    keys = Keys(cancel_settings.namespace)
    scheduler = make_scheduler(settings=cancel_settings)
    canceled, kept, due_ms = await two_waiting(api, project, pipeline, scheduler)
    await wipe_scheduler_state(redis, keys)
    answer = only_recipient(await cancel(api, project, canceled))
    assert answer["status"] == "scheduled"  # nothing was in a shard to take out

    # When the scheduler rebuilds its shards from PostgreSQL, and their time comes
    clock.now_ms = due_ms + 1_000
    kept_task = only_recipient(await show(api, project, kept))["taskId"]
    await until_delivered(kept_task, scheduler, delivery, sim)

    # Then the canceled task was not brought back: never delivered, its row deleted
    assert answer["taskId"] not in await delivered_tasks(sim)
    recipient = only_recipient(await show(api, project, canceled))
    assert shows_canceled(recipient), recipient
    assert await rows_left(db, [answer["taskId"]]) == 0


async def test_a_quiet_hours_deferral_is_canceled_like_a_scheduled_send(
    api: Api, project: Project, pipeline: list[Any], delivery: DeliveryService,
    make_scheduler: SchedulerFactory, clock: FakeClock, cancel_settings: Settings,
    sim: SimulatorServer,
) -> None:
    # Given a send without sendAt, deferred because the user's quiet hours are now (UTC)
    now = datetime.now(UTC)
    quiet = {"start": (now - timedelta(hours=1)).strftime("%H:%M"),
             "end": (now + timedelta(hours=2)).strftime("%H:%M")}
    await add_user(api, project, "ada")
    reply = await api.call("PUT", "/v1/users/ada/preferences", key=project.full,
                           json={"quietHours": quiet})
    assert reply.status == 200, reply.body
    event_id = await send(api, project, "ada")
    await drain(*pipeline)
    scheduler = make_scheduler(settings=cancel_settings)
    await scheduler.ingest_until_idle()
    assert only_recipient(await show(api, project, event_id))["status"] == "scheduled"

    # When it is canceled
    recipient = only_recipient(await cancel(api, project, event_id))

    # Then it is canceled, and the end of the quiet hours sends nothing
    assert shows_canceled(recipient), recipient
    assert [row["kind"] for row in recipient["timeline"]] == ["deferred", "canceled"]
    clock.now_ms = int((now + timedelta(hours=3)).timestamp() * 1000)
    await scheduler.run_until_idle()
    await delivery.run_until_idle()
    assert recipient["taskId"] not in await delivered_tasks(sim)


async def test_a_quiet_hours_deferral_on_its_way_to_the_scheduler_is_canceled_there(
    api: Api, project: Project, pipeline: list[Any], delivery: DeliveryService,
    make_scheduler: SchedulerFactory, clock: FakeClock, cancel_settings: Settings,
    sim: SimulatorServer, db: asyncpg.Pool,
) -> None:
    """A deferral has no sendAt to say something still waits: its task, routed by the engine
    but not yet taken in by a scheduler (a backlog, every scheduler down), is still left to
    cancel, and the scheduler drops it when it arrives."""
    # Given a send without sendAt, deferred by the user's quiet hours (UTC), its task still
    # on the scheduler's stream
    now = datetime.now(UTC)
    quiet = {"start": (now - timedelta(hours=1)).strftime("%H:%M"),
             "end": (now + timedelta(hours=2)).strftime("%H:%M")}
    await add_user(api, project, "ada")
    reply = await api.call("PUT", "/v1/users/ada/preferences", key=project.full,
                           json={"quietHours": quiet})
    assert reply.status == 200, reply.body
    event_id = await send(api, project, "ada")
    await drain(*pipeline)
    assert only_recipient(await show(api, project, event_id))["status"] == "scheduled"

    # When it is canceled before the scheduler takes it in
    answer = only_recipient(await cancel(api, project, event_id))

    # Then the answer shows it still on its way, the scheduler drops it, and the end of the
    # quiet hours sends nothing
    assert answer["status"] == "scheduled", answer
    scheduler = make_scheduler(settings=cancel_settings)
    await scheduler.ingest_until_idle()
    clock.now_ms = int((now + timedelta(hours=3)).timestamp() * 1000)
    await scheduler.run_until_idle()
    await delivery.run_until_idle()
    assert answer["taskId"] not in await delivered_tasks(sim)
    recipient = only_recipient(await show(api, project, event_id))
    assert shows_canceled(recipient), recipient
    assert [row["kind"] for row in recipient["timeline"]] == ["deferred", "canceled"]
    assert await rows_left(db, [answer["taskId"]]) == 0


async def test_a_notification_already_sent_has_nothing_to_cancel(
    api: Api, project: Project, pipeline: list[Any], delivery: DeliveryService,
    sim: SimulatorServer,
) -> None:
    await add_user(api, project, "ada")
    event_id = await send(api, project, "ada")
    await drain(*pipeline, delivery)
    assert only_recipient(await show(api, project, event_id))["status"] == "sent"

    reply = await api.call("POST", f"/v1/notifications/{event_id}/cancel", key=project.full)

    assert reply.status == 409, reply.body
    assert reply.error["code"] == "nothing_to_cancel"
    assert only_recipient(await show(api, project, event_id))["status"] == "sent"
    assert len(await sim.messages("resend")) == 1


@pytest.fixture
async def throttled_project(api: Api) -> Project:
    """A project whose users get one send an hour."""
    project = await api.project("throttled", throttle={"limit": 1, "windowSeconds": 3600})
    reply = await api.call("PUT", "/v1/templates/code", key=project.full,
                           json={"channels": {"email": EMAIL}})
    assert reply.status == 201, reply.body
    return project


@pytest.mark.parametrize("where", ["in its shard", "on its way to the scheduler",
                                   "lost by Redis"])
async def test_a_canceled_send_no_longer_counts_against_the_throttle(
    where: str, api: Api, throttled_project: Project, pipeline: list[Any],
    delivery: DeliveryService, make_scheduler: SchedulerFactory, cancel_settings: Settings,
    sim: SimulatorServer, redis: Redis,
) -> None:
    # Given ada's one send of the hour, due in ten minutes, canceled while its task was in its
    # shard (the cancel takes it out), on its way to the scheduler (ingest refuses it) or lost
    # by Redis with the shards (the rebuild deletes it; her throttle window survived)
    project = throttled_project
    await add_user(api, project, "ada")
    send_at = rfc3339(datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=10))
    scheduled = await send(api, project, "ada", sendAt=send_at)
    await drain(*pipeline)
    scheduler = make_scheduler(settings=cancel_settings)
    if where != "on its way to the scheduler":
        await scheduler.ingest_until_idle()
    if where == "lost by Redis":
        await wipe_scheduler_state(redis, Keys(cancel_settings.namespace))
    claimed = shows_canceled(only_recipient(await cancel(api, project, scheduled)))
    assert claimed is (where == "in its shard")

    # When the scheduler takes in what is on its stream and polls (rebuilding its shards)
    await scheduler.ingest_until_idle()
    await scheduler.poll_once()
    assert shows_canceled(only_recipient(await show(api, project, scheduled)))

    # Then it never goes out, so a send due now still fits her window and reaches the provider
    event_id = await send(api, project, "ada")
    await drain(*pipeline, delivery)
    recipient = only_recipient(await show(api, project, event_id))
    assert recipient["status"] == "sent", recipient
    assert "throttled" not in [row["kind"] for row in recipient["timeline"]]
    assert recipient["taskId"] in await delivered_tasks(sim)


async def test_a_cancel_keeps_the_throttle_mark_of_a_send_handed_to_delivery(
    api: Api, throttled_project: Project, pipeline: list[Any], delivery: DeliveryService,
    make_scheduler: SchedulerFactory, cancel_settings: Settings, sim: SimulatorServer,
) -> None:
    # Given ada's one send of the hour, handed to delivery, refused by the provider's 429 and
    # parked with the scheduler
    project = throttled_project
    await add_user(api, project, "ada")
    rule = await sim.add_fault("rate_limit", "resend", retry_after_s=30)
    try:
        parked = await send(api, project, "ada")
        await drain(*pipeline, delivery)
    finally:
        await sim.remove_fault(rule["id"])
    await make_scheduler(settings=cancel_settings).ingest_until_idle()

    # When the cancel takes it out of the scheduler
    assert shows_canceled(only_recipient(await cancel(api, project, parked)))

    # Then it was a send all the same: another one due in the same window is throttled
    later = await send(api, project, "ada")
    await drain(*pipeline, delivery)
    assert only_recipient(await show(api, project, later))["status"] == "throttled"
    assert await delivered_tasks(sim) == set()


async def test_erasing_a_user_takes_their_dropped_sends_out_of_the_throttle(
    api: Api, throttled_project: Project, pipeline: list[Any], delivery: DeliveryService,
    make_scheduler: SchedulerFactory, cancel_settings: Settings, sim: SimulatorServer,
    redis: Redis,
) -> None:
    # Given ada's one send of the hour, due in ten minutes and waiting in its shard
    project = throttled_project
    await one_send_in_ten_minutes(api, project, pipeline, make_scheduler(settings=cancel_settings))

    # When ada is erased (which drops that send) and a user is created again under her id
    reply = await api.call("DELETE", "/v1/users/ada", key=project.full)
    assert reply.status == 204, reply.body
    # Her window went with her: it held her id, for as long as her latest send was due
    assert not await redis.exists(Keys(cancel_settings.namespace).throttle(project.id, "ada"))
    await add_user(api, project, "ada")

    # Then the dropped send, which never goes out, does not hold back the new user's send
    await assert_a_send_now_fits(api, project, pipeline, delivery, sim)


async def test_a_waiting_send_the_user_turned_off_no_longer_counts_against_the_throttle(
    api: Api, throttled_project: Project, pipeline: list[Any], delivery: DeliveryService,
    make_scheduler: SchedulerFactory, clock: FakeClock, cancel_settings: Settings,
    sim: SimulatorServer,
) -> None:
    # Given ada's one send of the hour, due in ten minutes, and e-mail turned off meanwhile
    project = throttled_project
    scheduler = make_scheduler(settings=cancel_settings)
    waiting, due = await one_send_in_ten_minutes(api, project, pipeline, scheduler)
    await set_email(api, project, "ada", enabled=False)

    # When its time comes, delivery skips it (nothing reaches the provider)
    clock.now_ms = int(due.timestamp() * 1000) + 1_000
    await scheduler.run_until_idle()
    await delivery.run_until_idle()
    assert only_recipient(await show(api, project, waiting))["status"] == "skipped"

    # Then, as a canceled send, it leaves her window: once she turns e-mail on again, a send
    # due now (within the hour of the skipped one) still fits and reaches the provider
    await set_email(api, project, "ada", enabled=True)
    await assert_a_send_now_fits(api, project, pipeline, delivery, sim)


async def one_send_in_ten_minutes(api: Api, project: Project, pipeline: list[Any],
                                  scheduler: SchedulerService) -> tuple[str, datetime]:
    """ada, and a send of hers due in ten minutes, waiting in its shard."""
    await add_user(api, project, "ada")
    due = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=10)
    event_id = await send(api, project, "ada", sendAt=rfc3339(due))
    await drain(*pipeline)
    await scheduler.ingest_until_idle()
    return event_id, due


async def assert_a_send_now_fits(api: Api, project: Project, pipeline: list[Any],
                                 delivery: DeliveryService, sim: SimulatorServer) -> None:
    event_id = await send(api, project, "ada")
    await drain(*pipeline, delivery)
    recipient = only_recipient(await show(api, project, event_id))
    assert recipient["status"] == "sent", recipient
    assert await delivered_tasks(sim) == {recipient["taskId"]}


async def set_email(api: Api, project: Project, user_id: str, *, enabled: bool) -> None:
    reply = await api.call("PUT", f"/v1/users/{user_id}/preferences", key=project.full,
                           json={"channels": {"email": enabled}})
    assert reply.status == 200, reply.body
