"""Canceling a workflow instance: POST /v1/workflow-instances/{instanceId}/cancel ends an
instance that has not finished, wherever it is (pending, running, sleeping in a wait, a
waitForEvent or a digest window), and nothing of it runs afterwards."""

from __future__ import annotations

from typing import TYPE_CHECKING

import asyncpg
import pytest
from redis.asyncio import Redis

from notifkit.db import workflows as db_workflows
from notifkit.keys import Keys
from notifkit.services.workflow import WorkflowService
from tests.api.conftest import Api, Project

from .conftest import Flow, templates_of

if TYPE_CHECKING:
    from .conftest import FakeClock, ServiceFactory


@pytest.fixture
def sends(db: asyncpg.Pool, redis: Redis, keys: Keys, project: Project,
          clock: FakeClock) -> Flow:
    return Flow(db, redis, keys, project.id, clock)


async def _start(api: Api, project: Project, steps: list[dict[str, object]],
                 user_id: str = "u1") -> str:
    put = await api.call("PUT", "/v1/workflows/w", key=project.full, json={"steps": steps})
    assert put.status in (200, 201), put.body
    trigger = await api.call("POST", "/v1/workflows/w/trigger", key=project.send,
                             json={"userId": user_id, "data": {}})
    assert trigger.status == 202, trigger.body
    instance_id: str = trigger.body["instanceId"]
    return instance_id


async def _run_canceled_under_a_stale_load(
    api: Api, project: Project, service: WorkflowService, db: asyncpg.Pool, instance_id: str,
) -> None:
    """Load the instance, cancel it through the API, then run what was loaded under its
    lock: a runner that held the instance as the cancel landed."""
    await service.open()
    loaded = await db_workflows.get_instance(db, instance_id, project.id)
    assert loaded is not None
    canceled = await api.call("POST", f"/v1/workflow-instances/{instance_id}/cancel",
                              key=project.full)
    assert canceled.status == 200, canceled.body
    lock = await service.locks.acquire(service.keys.workflow_lock(instance_id))
    assert lock is not None
    try:
        await service.runner.run(loaded, lock)
    finally:
        await lock.release()


async def _a_later_trigger_gets_its_own_digest(
    api: Api, project: Project, service: WorkflowService, clock: FakeClock, sends: Flow,
) -> None:
    """A trigger after the cancel opens a window of its own, and its digest is sent."""
    later = await api.call("POST", "/v1/workflows/w/trigger", key=project.send,
                           json={"userId": "u1", "data": {"n": 2}})
    await service.run_until_idle()
    clock.advance(61)
    await service.run_until_idle()
    shown = await api.call("GET", f"/v1/workflow-instances/{later.body['instanceId']}",
                           key=project.full)
    assert shown.body["status"] == "completed", shown.body
    assert shown.body["steps"][0]["output"]["items"] == 1
    assert templates_of(await sends.sent(), "u1") == ["digest"]


async def test_a_waiting_instance_is_canceled_and_neither_its_event_nor_timeout_runs_it_on(
    api: Api, project: Project, make_service: ServiceFactory, clock: FakeClock, sends: Flow,
) -> None:
    instance_id = await _start(api, project, [
        {"type": "send", "template": "hello"},
        {"type": "waitForEvent", "event": "clicked", "timeoutSeconds": 60},
        {"type": "send", "template": "bye"},
    ])
    service = make_service()
    await service.run_until_idle()

    canceled = await api.call("POST", f"/v1/workflow-instances/{instance_id}/cancel",
                              key=project.full)
    assert canceled.status == 200, canceled.body
    assert canceled.body["status"] == "canceled"
    assert [(s["path"], s["status"]) for s in canceled.body["steps"]] == [
        ("0", "completed"), ("1", "canceled")]
    again = await api.call("POST", f"/v1/workflow-instances/{instance_id}/cancel",
                           key=project.full)
    assert (again.status, again.body) == (200, canceled.body)

    posted = await api.call("POST", "/v1/events", key=project.send,
                            json={"name": "clicked", "userId": "u1"})
    assert posted.status == 202
    await sends.event("clicked", "u1")
    clock.advance(120)
    await service.run_until_idle()

    shown = await api.call("GET", f"/v1/workflow-instances/{instance_id}", key=project.full)
    assert shown.body["status"] == "canceled"
    assert [(s["path"], s["status"]) for s in shown.body["steps"]] == [
        ("0", "completed"), ("1", "canceled")]
    assert templates_of(await sends.sent(), "u1") == ["hello"]


async def test_a_sleeping_wait_is_canceled(
    api: Api, project: Project, make_service: ServiceFactory, clock: FakeClock, sends: Flow,
) -> None:
    instance_id = await _start(api, project, [
        {"type": "wait", "seconds": 30}, {"type": "send", "template": "bye"}])
    service = make_service()
    await service.run_until_idle()
    canceled = await api.call("POST", f"/v1/workflow-instances/{instance_id}/cancel",
                              key=project.full)
    assert (canceled.status, canceled.body["status"]) == (200, "canceled")
    clock.advance(60)
    await service.run_until_idle()
    assert templates_of(await sends.sent(), "u1") == []


async def test_a_pending_instance_is_canceled_before_it_runs(
    api: Api, project: Project, make_service: ServiceFactory, sends: Flow,
) -> None:
    instance_id = await _start(api, project, [{"type": "send", "template": "hello"}])
    canceled = await api.call("POST", f"/v1/workflow-instances/{instance_id}/cancel",
                              key=project.full)
    assert (canceled.status, canceled.body["status"], canceled.body["steps"]) == (
        200, "canceled", [])
    await make_service().run_until_idle()
    assert templates_of(await sends.sent(), "u1") == []


async def test_a_run_that_loaded_the_instance_before_the_cancel_stops_at_its_next_step(
    api: Api, project: Project, make_service: ServiceFactory, db: asyncpg.Pool, sends: Flow,
) -> None:
    # A runner holding the instance (loaded, locked) when the cancel lands: its next write
    # must neither bring the instance back to life nor send its next step.
    instance_id = await _start(api, project, [
        {"type": "send", "template": "hello"}, {"type": "send", "template": "bye"}])
    service = make_service()
    await _run_canceled_under_a_stale_load(api, project, service, db, instance_id)
    shown = await api.call("GET", f"/v1/workflow-instances/{instance_id}", key=project.full)
    assert shown.body["status"] == "canceled"
    assert templates_of(await sends.sent(), "u1") == []


async def test_canceling_a_digest_owner_closes_its_window_so_later_triggers_open_a_new_one(
    api: Api, project: Project, make_service: ServiceFactory, clock: FakeClock, sends: Flow,
) -> None:
    first = await _start(api, project, [
        {"type": "digest", "windowSeconds": 60, "template": "digest"}])
    service = make_service()
    await service.run_until_idle()
    canceled = await api.call("POST", f"/v1/workflow-instances/{first}/cancel",
                              key=project.full)
    assert (canceled.status, canceled.body["status"]) == (200, "canceled")

    await _a_later_trigger_gets_its_own_digest(api, project, service, clock, sends)


async def test_cancel_answers_409_once_finished_404_for_strangers_and_403_to_send_keys(
    api: Api, project: Project, make_service: ServiceFactory,
) -> None:
    instance_id = await _start(api, project, [{"type": "send", "template": "hello"}])
    assert (await api.call("POST", f"/v1/workflow-instances/{instance_id}/cancel",
                           key=project.send)).status == 403
    await make_service().run_until_idle()
    done = await api.call("POST", f"/v1/workflow-instances/{instance_id}/cancel",
                          key=project.full)
    assert (done.status, done.body["error"]["code"]) == (409, "nothing_to_cancel")
    other = await api.project("other")
    assert (await api.call("POST", f"/v1/workflow-instances/{instance_id}/cancel",
                           key=other.full)).status == 404
    assert (await api.call("POST", "/v1/workflow-instances/nope/cancel",
                           key=project.full)).status == 404
    shown = await api.call("GET", f"/v1/workflow-instances/{instance_id}", key=project.full)
    assert shown.body["status"] == "completed"


async def test_a_run_that_loaded_the_instance_before_the_cancel_opens_no_digest_window(
    api: Api, project: Project, make_service: ServiceFactory, db: asyncpg.Pool,
    clock: FakeClock, sends: Flow,
) -> None:
    # Opened by a canceled instance, a window would swallow every later trigger of the user
    # (each merged into it, and none ever sent).
    first = await _start(api, project, [
        {"type": "digest", "windowSeconds": 60, "template": "digest"}])
    service = make_service()
    # Where a run stands once it moved the instance to its digest step: the cancel lands
    # between that write and the step.
    await db.execute("UPDATE workflow_instances SET status = 'running', cursor = '0' "
                     "WHERE id = $1", first)
    await _run_canceled_under_a_stale_load(api, project, service, db, first)
    assert await db.fetchval("SELECT count(*) FROM workflow_digests WHERE project_id = $1 "
                             "AND closed_at IS NULL", project.id) == 0

    await _a_later_trigger_gets_its_own_digest(api, project, service, clock, sends)
