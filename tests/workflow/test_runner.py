"""Workflow execution against real Redis and PostgreSQL, with the clock in the test's hands:
sends, waits, waiting for events with a timeout, branches and digests."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from notifkit.config import Settings
from notifkit.db import workflows as workflows_db
from notifkit.keys import Keys
from notifkit.services.workflow import WorkflowService
from notifkit.services.workflow.runner import Runner
from notifkit.streams import xadd

from .conftest import templates_of

if TYPE_CHECKING:
    import asyncpg
    from redis.asyncio import Redis

    from .conftest import FakeClock, Flow, ServiceFactory

CLICK_OR_REMIND: list[dict[str, Any]] = [
    {"type": "send", "template": "welcome"},
    {"type": "waitForEvent", "event": "clicked", "timeoutSeconds": 3600},
    {"type": "branch", "if": "steps[1] is not none",
     "then": [{"type": "send", "template": "thanks", "channels": ["email"]}],
     "else": [{"type": "send", "template": "reminder"}]},
]


async def test_users_who_send_the_event_take_one_path_the_rest_time_out_into_the_other(
    flow: Flow, make_service: ServiceFactory, clock: FakeClock,
) -> None:
    # Given four users in a workflow that waits an hour for "clicked"
    await flow.define("onboarding", CLICK_OR_REMIND)
    service = make_service()
    users = ["u1", "u2", "u3", "u4"]
    instances = {u: await flow.trigger("onboarding", u, {"plan": "pro"}) for u in users}
    await service.run_until_idle()
    assert sorted(m["to"]["userId"] for m in await flow.sent()) == users
    for instance_id in instances.values():
        assert (await flow.instance(instance_id))["status"] == "waiting"

    # When u1 and u3 click within the hour (u2 sends some other event)
    clock.advance(600)
    await flow.event("clicked", "u1", {"link": "a"})
    await flow.event("clicked", "u3", {"link": "b"})
    await flow.event("opened", "u2")
    await service.run_until_idle()

    # Then they take the "then" path at once, and nobody else moves
    sent = await flow.sent()
    assert templates_of(sent, "u1") == ["welcome", "thanks"]
    assert templates_of(sent, "u3") == ["welcome", "thanks"]
    assert templates_of(sent, "u2") == ["welcome"]
    assert templates_of(sent, "u4") == ["welcome"]
    steps = await flow.steps(instances["u1"])
    assert [(s["path"], s["type"], s["status"]) for s in steps] == [
        ("0", "send", "completed"), ("1", "waitForEvent", "completed"),
        ("2", "branch", "completed"), ("2.then.0", "send", "completed"),
    ]
    assert steps[1]["output"]["name"] == "clicked"
    assert steps[1]["output"]["data"] == {"link": "a"}
    assert steps[2]["output"] == {"result": True, "branch": "then"}
    assert [s["step_index"] for s in steps] == [0, 1, 2, 3]

    # When the hour is over
    clock.advance(3000)
    await service.run_until_idle()
    # Then the others time out into the "else" path, with a null output
    sent = await flow.sent()
    assert templates_of(sent, "u2") == ["welcome", "reminder"]
    assert templates_of(sent, "u4") == ["welcome", "reminder"]
    assert templates_of(sent, "u1") == ["welcome", "thanks"]
    steps = await flow.steps(instances["u2"])
    assert steps[1]["output"] is None
    assert steps[2]["output"] == {"result": False, "branch": "else"}
    assert steps[3]["path"] == "2.else.0"
    for instance_id in instances.values():
        assert (await flow.instance(instance_id))["status"] == "completed"

    # And an event after the timeout wakes nobody
    await flow.event("clicked", "u2")
    await service.run_until_idle()
    assert len(await flow.sent()) == 8


async def test_on_timeout_stop_ends_the_instance(
    flow: Flow, make_service: ServiceFactory, clock: FakeClock,
) -> None:
    await flow.define("nudge", [
        {"type": "waitForEvent", "event": "paid", "timeoutSeconds": 60, "onTimeout": "stop"},
        {"type": "send", "template": "receipt"},
    ])
    service = make_service()
    paid = await flow.trigger("nudge", "payer")
    idle = await flow.trigger("nudge", "idler")
    await service.run_until_idle()
    await flow.event("paid", "payer", {"amount": 12})
    await service.run_until_idle()
    clock.advance(61)
    await flow.event("paid", "idler")  # too late: the waiter has expired
    await service.run_until_idle()
    assert templates_of(await flow.sent(), "payer") == ["receipt"]
    assert templates_of(await flow.sent(), "idler") == []
    assert (await flow.instance(paid))["status"] == "completed"
    stopped = await flow.instance(idle)
    assert (stopped["status"], stopped["cursor"]) == ("stopped", "0")


async def test_an_event_sent_before_the_timeout_wins_even_when_read_after_it(
    flow: Flow, make_service: ServiceFactory, clock: FakeClock,
) -> None:
    """What counts is when the event happened, not when the workflow service got to it: an
    event posted within the wait, read only after the deadline (a backlog, a paused or
    restarted workflow process), lost to the timeout read with it."""
    await flow.define("onboarding", CLICK_OR_REMIND)
    service = make_service()
    instance_id = await flow.trigger("onboarding", "u1")
    await service.run_until_idle()
    clock.advance(3000)
    await flow.event("clicked", "u1", {"link": "a"})  # 10 minutes before the deadline
    clock.advance(1200)  # the service reads it only now, with the timeout's wake-up
    await service.run_until_idle()
    assert templates_of(await flow.sent(), "u1") == ["welcome", "thanks"]
    steps = await flow.steps(instance_id)
    assert steps[1]["output"]["data"] == {"link": "a"}


class ProcessDied(Exception):
    """Stands for the workflow process dying at this point."""


class DiesAsAWaitBegins(Runner):
    """A runner whose process dies once a ``waitForEvent`` step has been started, before the
    step itself runs."""

    async def _wait_for_event(self, run: Any, step: dict[str, Any], path: Any,
                              row: Any) -> Any:
        raise ProcessDied(f"died after starting step {row.path}")


class DyingService(WorkflowService):
    def make_runner(self) -> Runner:
        return DiesAsAWaitBegins(pool=self.pool, redis=self.redis, settings=self.settings,
                                 timers=self.timers, clock=self.clock)


async def trigger_and_die_as_the_wait_begins(
    flow: Flow, settings: Settings, clock: FakeClock
) -> str:
    """Trigger CLICK_OR_REMIND for u1 in a process that dies as its wait begins."""
    await flow.define("onboarding", CLICK_OR_REMIND)
    instance_id = await flow.trigger("onboarding", "u1")
    dying = DyingService(settings, clock=clock)
    try:
        await dying.run_until_idle()
    finally:
        await dying.stop()
    return instance_id


async def redo(flow: Flow, instance_id: str) -> None:
    """As the worker retries the dead process's entry (after its idle time)."""
    await xadd(flow.redis, flow.keys.workflow_inbound, {
        "type": "wake", "instanceId": instance_id, "projectId": flow.project_id,
        "reason": "retry"}, 10_000)


async def test_an_event_in_the_gap_after_a_crash_as_the_wait_began_still_wakes_it(
    flow: Flow, make_service: ServiceFactory, clock: FakeClock, settings: Settings,
) -> None:
    """The process dies once the waitForEvent step has started; the user's event is
    processed before the step is redone (by another process, or this one restarted). The
    event happened within the wait, so it wakes the instance, as it would have without the
    crash, instead of being lost and the wait running to its timeout."""
    instance_id = await trigger_and_die_as_the_wait_begins(flow, settings, clock)
    assert [(s["path"], s["status"]) for s in await flow.steps(instance_id)] == [
        ("0", "completed"), ("1", "running")]

    clock.advance(60)
    await flow.event("clicked", "u1", {"link": "a"})
    service = make_service()
    await service.run_until_idle()
    await redo(flow, instance_id)
    await service.run_until_idle()

    assert templates_of(await flow.sent(), "u1") == ["welcome", "thanks"]
    steps = await flow.steps(instance_id)
    assert steps[1]["output"]["data"] == {"link": "a"}
    assert (await flow.instance(instance_id))["status"] == "completed"


async def test_a_wait_begun_without_its_waiter_opens_it_when_redone(
    flow: Flow, make_service: ServiceFactory, clock: FakeClock, settings: Settings,
    db: asyncpg.Pool,
) -> None:
    """A step started before waiters opened with their step, and not yet run: redone, it
    opens its waiter, which catches a later event."""
    instance_id = await trigger_and_die_as_the_wait_begins(flow, settings, clock)
    assert await db.execute("DELETE FROM workflow_waiters WHERE instance_id = $1",
                            instance_id) == "DELETE 1"
    service = make_service()
    await redo(flow, instance_id)
    await service.run_until_idle()
    assert (await flow.instance(instance_id))["status"] == "waiting"
    clock.advance(60)
    await flow.event("clicked", "u1", {"link": "a"})
    await service.run_until_idle()
    assert templates_of(await flow.sent(), "u1") == ["welcome", "thanks"]


async def test_wait_sleeps_until_its_time_and_sends_carry_deterministic_keys(
    flow: Flow, make_service: ServiceFactory, clock: FakeClock, redis: Redis, keys: Keys,
) -> None:
    await flow.define("drip", [
        {"type": "send", "template": "day0", "priority": "critical"},
        {"type": "wait", "seconds": 86400},
        {"type": "send", "template": "day1"},
    ])
    service = make_service()
    instance_id = await flow.trigger("drip", "u1", {"name": "Ada"})
    await service.run_until_idle()
    first = await flow.sent()
    assert [m["template"] for m in first] == ["day0"]
    assert first[0]["priority"] == "critical"
    assert first[0]["idempotencyKey"] == f"wf:{instance_id}:0"
    assert first[0]["workflowInstanceId"] == instance_id
    assert first[0]["workflowStep"] == 0
    assert first[0]["data"] == {"name": "Ada"}
    assert await redis.zscore(keys.workflow_timers, f"{instance_id}:1") is not None

    clock.advance(86399)
    await service.run_until_idle()
    assert len(await flow.sent()) == 1

    clock.advance(1)
    await service.run_until_idle()
    sent = await flow.sent()
    assert [m["template"] for m in sent] == ["day0", "day1"]
    assert sent[1]["idempotencyKey"] == f"wf:{instance_id}:2"
    assert (await flow.instance(instance_id))["status"] == "completed"
    assert await redis.zcard(keys.workflow_timers) == 0
    # The notification rows exist for GET /v1/notifications/{id}
    step_outputs = [s["output"] for s in await flow.steps(instance_id)]
    assert step_outputs[0]["eventId"] == sent[0]["eventId"]
    assert step_outputs[2]["eventId"] == sent[1]["eventId"]


async def test_digest_turns_n_triggers_within_the_window_into_one_message_listing_n_items(
    flow: Flow, make_service: ServiceFactory, clock: FakeClock,
) -> None:
    # Given a workflow that digests a user's triggers over ten minutes
    await flow.define("comments", [
        {"type": "digest", "windowSeconds": 600, "template": "comment-digest"},
    ])
    service = make_service()
    n = 7
    # When N triggers for one user (and two for another) arrive within the window
    ada = [await flow.trigger("comments", "ada", {"comment": i}) for i in range(n)]
    await service.run_until_idle()
    clock.advance(300)
    bob = [await flow.trigger("comments", "bob", {"comment": i}) for i in range(2)]
    await service.run_until_idle()
    assert await flow.sent() == []

    # Then nothing goes out before a window ends, and one message per user after
    clock.advance(301)
    await service.run_until_idle()
    assert [m["to"]["userId"] for m in await flow.sent()] == ["ada"]  # bob's opened later
    clock.advance(300)
    await service.run_until_idle()
    sent = await flow.sent()
    assert [(m["to"]["userId"], m["template"]) for m in sent] == [
        ("ada", "comment-digest"), ("bob", "comment-digest"),
    ]
    ada_items = sent[0]["digestItems"]
    assert sorted(item["data"]["comment"] for item in ada_items) == list(range(n))
    assert all(set(item) == {"data", "at"} for item in ada_items)
    assert len(sent[1]["digestItems"]) == 2

    statuses = [(await flow.instance(i))["status"] for i in ada]
    assert statuses.count("completed") == 1
    assert statuses.count("digested") == n - 1
    assert sorted([(await flow.instance(i))["status"] for i in bob]) == ["completed", "digested"]

    # And a trigger after the window closed opens a new one
    later = await flow.trigger("comments", "ada", {"comment": "late"})
    await service.run_until_idle()
    assert (await flow.instance(later))["status"] == "waiting"
    clock.advance(601)
    await service.run_until_idle()
    sent = await flow.sent()
    assert len(sent) == 3
    assert [i["data"] for i in sent[2]["digestItems"]] == [{"comment": "late"}]


async def test_a_wake_before_the_digest_window_ends_sends_nothing(
    flow: Flow, make_service: ServiceFactory, clock: FakeClock, redis: Redis, keys: Keys,
) -> None:
    """A wake that comes early (a timer moved twice, a wake replayed from the DLQ) finds the
    window still open: it sleeps again, and the digest goes out once, when the window ends."""
    await flow.define("comments", [
        {"type": "digest", "windowSeconds": 600, "template": "comment-digest"},
    ])
    service = make_service()
    owner = await flow.trigger("comments", "ada", {"comment": 1})
    await service.run_until_idle()
    clock.advance(100)
    await flow.trigger("comments", "ada", {"comment": 2})
    await xadd(redis, keys.workflow_inbound, {"type": "wake", "timer": f"{owner}:0"}, 10_000)
    await service.run_until_idle()
    assert await flow.sent() == []
    assert (await flow.instance(owner))["status"] == "waiting"

    clock.advance(501)
    await service.run_until_idle()
    [digest] = await flow.sent()
    assert [item["data"]["comment"] for item in digest["digestItems"]] == [1, 2]


async def test_a_digest_join_slower_than_the_pools_query_limit_still_joins(
    flow: Flow, make_service: ServiceFactory, clock: FakeClock, db: asyncpg.Pool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A window's items grow with every trigger, and its joiners queue on its row: a join
    can rightly outlast the pool's query limit, and cut at it, a busy user's triggers failed
    until dead-lettered. Digest queries have a limit of their own (a lock makes the join wait
    here; the pool's limit is 0.3 s)."""
    monkeypatch.setattr(WorkflowService, "query_timeout_s", 0.3)
    await flow.define("comments", [
        {"type": "digest", "windowSeconds": 600, "template": "comment-digest"},
    ])
    service = make_service()
    first = await flow.trigger("comments", "ada", {"comment": 0})
    await service.run_until_idle()
    second = await flow.trigger("comments", "ada", {"comment": 1})
    async with db.acquire() as conn:
        async with conn.transaction():
            await conn.execute("SELECT 1 FROM workflow_digests FOR UPDATE")
            joining = asyncio.create_task(service.run_until_idle())
            await asyncio.sleep(1.0)
        await asyncio.wait_for(joining, 30)
    assert [(await flow.instance(i))["status"] for i in (first, second)] == [
        "waiting", "digested"]
    clock.advance(601)
    await service.run_until_idle()
    [digest] = await flow.sent()
    assert [item["data"] for item in digest["digestItems"]] == [{"comment": 0}, {"comment": 1}]


async def test_a_digest_lists_its_items_oldest_trigger_first_whatever_order_they_joined(
    flow: Flow, make_service: ServiceFactory, clock: FakeClock, db: asyncpg.Pool,
) -> None:
    await flow.define("comments", [
        {"type": "digest", "windowSeconds": 600, "template": "comment-digest"},
    ])
    service = make_service()
    joined = [await flow.trigger("comments", "ada", {"comment": i}) for i in range(4)]
    # The triggers happened in the opposite order to the one the workers ran them in.
    for age, instance_id in enumerate(joined):
        await db.execute("UPDATE workflow_instances SET created_at = now() - $2::interval "
                         "WHERE id = $1", instance_id, timedelta(seconds=age))
    await service.run_until_idle()
    clock.advance(601)
    await service.run_until_idle()
    [digest] = await flow.sent()
    items = digest["digestItems"]
    assert [item["data"]["comment"] for item in items] == [3, 2, 1, 0]
    assert [item["at"] for item in items] == sorted(item["at"] for item in items)


async def test_a_digest_lists_triggers_of_one_millisecond_in_the_order_they_happened(
    flow: Flow, make_service: ServiceFactory, clock: FakeClock, db: asyncpg.Pool,
) -> None:
    """A burst of triggers shares its millisecond (``at``), and the workers join them in
    whatever order they run: within the millisecond, the order they were made in still
    holds, whatever the order of their ids."""
    await flow.define("comments", [
        {"type": "digest", "windowSeconds": 600, "template": "comment-digest"},
    ])
    service = make_service()
    joined = [await flow.trigger("comments", "ada", {"comment": i}) for i in range(5)]
    # Made in the opposite order to their ids' (and so, likely, to the order they join in),
    # a microsecond apart within one millisecond.
    for rank, instance_id in enumerate(reversed(joined)):
        await db.execute(
            "UPDATE workflow_instances SET created_at = $2 WHERE id = $1", instance_id,
            datetime(2027, 1, 15, 12, 0, 0, 123_400 + rank, tzinfo=UTC),
        )
    await service.run_until_idle()
    clock.advance(601)
    await service.run_until_idle()
    [digest] = await flow.sent()
    items = digest["digestItems"]
    assert [item["data"]["comment"] for item in items] == [4, 3, 2, 1, 0]
    assert {item["at"] for item in items} == {"2027-01-15T12:00:00.123Z"}
    assert all(set(item) == {"data", "at"} for item in items)


async def test_a_retried_join_adds_nothing_even_if_its_item_was_stored_with_fewer_fields(
    flow: Flow, db: asyncpg.Pool, clock: FakeClock,
) -> None:
    """An instance that joined a window before a field was added to items, and redoes its
    join after (a crash in between), is still in the window once."""
    await flow.define("comments", [
        {"type": "digest", "windowSeconds": 600, "template": "comment-digest"},
    ])
    owner_id = await flow.trigger("comments", "ada", {"comment": 0})
    joiner_id = await flow.trigger("comments", "ada", {"comment": 1})
    owner = await workflows_db.get_instance(db, owner_id)
    joiner = await workflows_db.get_instance(db, joiner_id)
    assert owner is not None
    assert joiner is not None
    now = datetime.fromtimestamp(clock(), UTC)
    ends = now + timedelta(seconds=600)
    await workflows_db.join_digest(db, owner, "0", 0, {"instanceId": owner_id}, ends, now)
    old = {"data": {"comment": 1}, "at": "x", "instanceId": joiner_id}
    await workflows_db.join_digest(db, joiner, "0", 0, old, ends, now)
    window = await workflows_db.join_digest(db, joiner, "0", 0, {**old, "atMicros": 1},
                                            ends, now)
    assert [item["instanceId"] for item in window.items] == [owner_id, joiner_id]


async def test_a_trigger_without_an_instance_row_creates_it_from_the_definition(
    flow: Flow, make_service: ServiceFactory,
) -> None:
    await flow.define("one", [{"type": "send", "template": "hello"}])
    instance_id = await flow.trigger("one", "u1", create_row=False)
    unknown = await flow.trigger("missing", "u1", create_row=False)
    await make_service().run_until_idle()
    assert (await flow.instance(instance_id))["status"] == "completed"
    assert [m["template"] for m in await flow.sent()] == ["hello"]
    assert await flow.db.fetchval(
        "SELECT count(*) FROM workflow_instances WHERE id = $1", unknown) == 0


async def test_a_trigger_without_an_instance_row_takes_its_own_projects_definition(
    flow: Flow, make_service: ServiceFactory,
) -> None:
    # Given another project with a workflow of the same id, defined first
    other = await flow.db.fetchval(
        "INSERT INTO projects (name) VALUES ('other') RETURNING id::text")
    await flow.db.execute(
        "INSERT INTO workflow_definitions (project_id, id, steps) VALUES ($1, 'one', $2)",
        other, [{"type": "send", "template": "theirs"}])
    await flow.define("one", [{"type": "send", "template": "hello"}])

    # When this project's trigger reaches the workflow service before its instance row
    instance_id = await flow.trigger("one", "u1", create_row=False)
    await make_service().run_until_idle()

    # Then the instance is this project's, running this project's steps
    assert await flow.db.fetchval(
        "SELECT project_id::text FROM workflow_instances WHERE id = $1", instance_id
    ) == flow.project_id
    assert (await flow.instance(instance_id))["status"] == "completed"
    assert [(m["projectId"], m["template"]) for m in await flow.sent()] == [
        (flow.project_id, "hello")]


async def test_a_branch_sees_data_user_and_earlier_outputs(
    flow: Flow, make_service: ServiceFactory,
) -> None:
    await flow.db.execute(
        "INSERT INTO users (project_id, id, attributes) VALUES ($1, 'vip', $2)",
        flow.project_id, {"tier": "gold"},
    )
    await flow.define("tiers", [
        {"type": "send", "template": "hello"},
        {"type": "branch", "if": "user.attributes.tier == 'gold' and data.total > 10 "
                                 "and steps[0].eventId",
         "then": [{"type": "branch", "if": "data.total > 100",
                   "then": [{"type": "send", "template": "huge"}],
                   "else": [{"type": "send", "template": "gold"}]}],
         "else": []},
        {"type": "send", "template": "bye"},
    ])
    service = make_service()
    gold = await flow.trigger("tiers", "vip", {"total": 50})
    plain = await flow.trigger("tiers", "nobody", {"total": 50})
    await service.run_until_idle()
    sent = await flow.sent()
    assert templates_of(sent, "vip") == ["hello", "gold", "bye"]
    assert templates_of(sent, "nobody") == ["hello", "bye"]
    assert [s["path"] for s in await flow.steps(gold)] == ["0", "1", "1.then.0",
                                                           "1.then.0.else.0", "2"]
    assert [s["path"] for s in await flow.steps(plain)] == ["0", "1", "2"]


async def test_a_broken_expression_fails_the_instance_without_retrying(
    flow: Flow, make_service: ServiceFactory,
) -> None:
    await flow.define("broken", [
        {"type": "branch", "if": "1 // data.zero", "then": [], "else": []},
        {"type": "send", "template": "never"},
    ])
    instance_id = await flow.trigger("broken", "u1", {"zero": 0})
    await make_service().run_until_idle()
    assert (await flow.instance(instance_id))["status"] == "failed"
    steps = await flow.steps(instance_id)
    assert steps[0]["status"] == "failed"
    assert "ZeroDivisionError" in steps[0]["output"]["error"]
    assert await flow.sent() == []


async def test_a_send_step_whose_template_was_deleted_fails_its_instance_once(
    flow: Flow, make_service: ServiceFactory, db: asyncpg.Pool, redis: Redis, keys: Keys,
) -> None:
    """A template deleted after the workflow naming it was saved (DELETE /v1/templates/{id})
    fails the send step that reaches it, with the reason, instead of a send the engine would
    only record as failed while the step reads completed; nothing is retried or
    dead-lettered."""
    await flow.define("onboarding", [
        {"type": "send", "template": "welcome"},
        {"type": "wait", "seconds": 60},
        {"type": "send", "template": "gone"},
        {"type": "send", "template": "welcome"},
    ])
    await db.execute("DELETE FROM templates WHERE id = 'gone'")
    service = make_service()
    instance_id = await flow.trigger("onboarding", "u1")
    await service.run_until_idle()
    flow.clock.advance(61)
    await service.run_until_idle()

    assert templates_of(await flow.sent(), "u1") == ["welcome"]
    assert (await flow.instance(instance_id))["status"] == "failed"
    steps = await flow.steps(instance_id)
    assert [(s["path"], s["status"]) for s in steps] == [
        ("0", "completed"), ("1", "completed"), ("2", "failed")]
    assert steps[2]["output"] == {
        "error": "template 'gone' no longer exists in this project"}
    assert await db.fetchval("SELECT count(*) FROM notifications") == 1
    assert await service.run_until_idle() == 0
    assert await redis.xlen(keys.dlq) == 0


async def test_a_digest_whose_template_was_deleted_closes_its_window_and_fails(
    flow: Flow, make_service: ServiceFactory, clock: FakeClock, db: asyncpg.Pool,
    redis: Redis, keys: Keys,
) -> None:
    await flow.define("comments", [
        {"type": "digest", "windowSeconds": 600, "template": "comment-digest"},
    ])
    service = make_service()
    triggered = [await flow.trigger("comments", "ada", {"comment": n}) for n in (1, 2)]
    await service.run_until_idle()
    await db.execute("DELETE FROM templates WHERE id = 'comment-digest'")
    clock.advance(601)
    await service.run_until_idle()

    assert await flow.sent() == []
    # Both triggers run in one batch, so either may open the window (and own it).
    statuses = {i: (await flow.instance(i))["status"] for i in triggered}
    assert sorted(statuses.values()) == ["digested", "failed"]
    [owner] = [i for i, status in statuses.items() if status == "failed"]
    [step] = await flow.steps(owner)
    assert step["status"] == "failed"
    assert step["output"]["items"] == 2
    assert step["output"]["error"] == (
        "template 'comment-digest' no longer exists in this project")
    # The window is closed: a later trigger opens a new one rather than joining a dead one.
    assert await db.fetchval(
        "SELECT count(*) FROM workflow_digests WHERE closed_at IS NULL") == 0
    assert await service.run_until_idle() == 0
    assert await redis.xlen(keys.dlq) == 0


async def test_a_repeated_event_resolves_nothing_new_and_a_fresh_one_only_open_waiters(
    flow: Flow, make_service: ServiceFactory, redis: Redis, keys: Keys,
) -> None:
    await flow.define("two-waits", [
        {"type": "waitForEvent", "event": "ping", "timeoutSeconds": 60},
        {"type": "send", "template": "first"},
        {"type": "waitForEvent", "event": "ping", "timeoutSeconds": 60},
        {"type": "send", "template": "second"},
    ])
    service = make_service()
    instance_id = await flow.trigger("two-waits", "u1")
    await service.run_until_idle()
    event_id = await flow.event("ping", "u1", {"n": 1})
    await service.run_until_idle()
    # The same event forwarded again (a retried forward) must not pass the second wait
    await flow.event("ping", "u1", {"n": 1}, event_id=event_id)
    await service.run_until_idle()
    assert [m["template"] for m in await flow.sent()] == ["first"]
    steps = await flow.steps(instance_id)
    assert steps[0]["output"] == {"id": event_id, "name": "ping", "data": {"n": 1},
                                  "at": "2027-01-15T08:00:00.000Z"}
    assert steps[2]["status"] == "waiting"
    # the first wait's timeout timer went with it; the second's is set
    assert await redis.zscore(keys.workflow_timers, f"{instance_id}:0") is None
    assert await redis.zscore(keys.workflow_timers, f"{instance_id}:2") is not None
    await flow.event("ping", "u1", {"n": 2})
    await service.run_until_idle()
    assert [m["template"] for m in await flow.sent()] == ["first", "second"]


async def test_events_and_digests_never_cross_projects_sharing_workflow_and_user_ids(
    flow: Flow, make_service: ServiceFactory, clock: FakeClock, db: asyncpg.Pool,
    redis: Redis, keys: Keys,
) -> None:
    """Two tenants with the same workflow id and user id: an event of one wakes only its own
    waiter, and a digest window of one never takes the other's triggers."""
    from .conftest import Flow

    other = Flow(db, redis, keys, await db.fetchval(
        "INSERT INTO projects (name) VALUES ('other tenant') RETURNING id::text"), clock)
    steps: list[dict[str, Any]] = [
        {"type": "waitForEvent", "event": "clicked", "timeoutSeconds": 3600},
        {"type": "digest", "windowSeconds": 600, "template": "digest"},
    ]
    service = make_service()
    mine = {}
    for tenant in (flow, other):
        await tenant.define("onboarding", steps)
        mine[tenant.project_id] = [await tenant.trigger("onboarding", "ada", {"n": i})
                                   for i in range(2)]
    await service.run_until_idle()

    # When only the other tenant's user clicks
    await other.event("clicked", "ada")
    await service.run_until_idle()
    # Then only its instances move on (into its digest window); this tenant's still wait
    for instance in mine[flow.project_id]:
        assert (await flow.instance(instance))["status"] == "waiting"
        assert [s["type"] for s in await flow.steps(instance)] == ["waitForEvent"]
    clock.advance(601)
    await service.run_until_idle()
    [digest] = await flow.sent()
    assert digest["projectId"] == other.project_id
    assert sorted(item["data"]["n"] for item in digest["digestItems"]) == [0, 1]

    # And this tenant's click, later, digests its own two triggers, not the other's
    await flow.event("clicked", "ada")
    await service.run_until_idle()
    clock.advance(601)
    await service.run_until_idle()
    sent = await flow.sent()
    assert [m["projectId"] for m in sent] == [other.project_id, flow.project_id]
    assert sorted(item["data"]["n"] for item in sent[1]["digestItems"]) == [0, 1]
