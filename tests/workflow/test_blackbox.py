"""Workflows and AI content through the public API with every service running in-process,
against real Redis and PostgreSQL and the provider simulators: what a caller of
``/v1/workflows``, ``/v1/events`` and ``/v1/usage/ai`` sees."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.keys import Keys
from notifkit.services.ai import AiService
from notifkit.services.base import Service
from notifkit.services.delivery import DeliveryService
from notifkit.services.engine import EngineService
from notifkit.services.enricher import EnricherService
from notifkit.services.events import EventsService
from notifkit.services.workflow import WorkflowService
from simulators import SimulatorServer
from tests.api.conftest import Api, Project, Reply, running_api

from .conftest import FakeClock
from .pipeline import drain, simulated


@dataclass
class System:
    api: Api
    project: Project
    clock: FakeClock
    sim: SimulatorServer
    services: list[Service]

    async def call(self, method: str, path: str, **kwargs: Any) -> Reply:
        kwargs.setdefault("key", self.project.full)
        return await self.api.call(method, path, **kwargs)

    async def run(self) -> None:
        await drain(*self.services)

    async def user(self, user_id: str, **attributes: Any) -> None:
        reply = await self.call("PUT", f"/v1/users/{user_id}", json={
            "attributes": attributes,
            "contacts": [{"channel": "email", "target": f"{user_id}@example.com"}],
        })
        assert reply.status in (200, 201), reply.body

    async def template(self, template_id: str, body: dict[str, Any] | None = None) -> None:
        body = body or {"channels": {"email": {"subject": template_id, "text": template_id}}}
        reply = await self.call("PUT", f"/v1/templates/{template_id}", json=body)
        assert reply.status in (200, 201), reply.body

    async def workflow(self, workflow_id: str, steps: list[dict[str, Any]]) -> None:
        reply = await self.call("PUT", f"/v1/workflows/{workflow_id}", json={"steps": steps})
        assert reply.status in (200, 201), reply.body

    async def trigger(self, workflow_id: str, user_id: str, data: Any = None,
                      **kwargs: Any) -> str:
        body: dict[str, Any] = {"userId": user_id}
        if data is not None:
            body["data"] = data
        reply = await self.call("POST", f"/v1/workflows/{workflow_id}/trigger", json=body,
                                **kwargs)
        assert reply.status == 202, reply.body
        instance_id: str = reply.body["instanceId"]
        return instance_id

    async def event(self, name: str, user_id: str, data: Any = None,
                    key: str | None = None) -> str:
        body: dict[str, Any] = {"name": name, "userId": user_id}
        if data is not None:
            body["data"] = data
        reply = await self.call("POST", "/v1/events", json=body,
                                key=key or self.project.send)
        assert reply.status == 202, reply.body
        event_id: str = reply.body["id"]
        return event_id

    async def instance(self, instance_id: str) -> dict[str, Any]:
        reply = await self.call("GET", f"/v1/workflow-instances/{instance_id}")
        assert reply.status == 200, reply.body
        body: dict[str, Any] = reply.body
        return body

    async def emails(self, user_id: str | None = None) -> list[str]:
        """Subjects the e-mail provider received (for ``user_id``), oldest first."""
        messages = await self.sim.messages("resend")
        return [m["content"]["subject"] for m in reversed(messages)
                if user_id is None or m["to"] == f"{user_id}@example.com"]


@pytest.fixture
async def system(settings: Settings, sim: SimulatorServer) -> AsyncIterator[System]:
    chosen = simulated(settings, sim).replace(
        api_rate_per_second=10_000.0, api_rate_burst=10_000, public_url="http://127.0.0.1:8080",
    )
    # The workflow service's clock starts now, so the API's event times and its own agree,
    # and moves only when a test moves it.
    clock = FakeClock(time.time())
    services: list[Service] = [
        EventsService(chosen), WorkflowService(chosen, clock=clock), EnricherService(chosen),
        EngineService(chosen), AiService(chosen), DeliveryService(chosen),
    ]
    async with running_api(chosen) as api:
        project = await api.project("workflow black box")
        yield System(api, project, clock, sim, services)
    for service in services:
        await service.stop()


def outputs(instance: dict[str, Any]) -> dict[str, Any]:
    return {step["path"]: step["output"] for step in instance["steps"]}


# ---------------------------------------------------------------------------------------------
# send, wait


async def test_send_wait_send_runs_in_order_and_persists_each_steps_output(
    system: System,
) -> None:
    await system.user("ada")
    await system.template("welcome")
    await system.template("tips")
    await system.workflow("onboard", [
        {"type": "send", "template": "welcome"},
        {"type": "wait", "seconds": 3600},
        {"type": "send", "template": "tips"},
    ])
    instance_id = await system.trigger("onboard", "ada", {"plan": "pro"})
    await system.run()
    waiting = await system.instance(instance_id)
    assert waiting["status"] == "waiting"
    assert waiting["currentStep"] == 1
    assert await system.emails("ada") == ["welcome"]
    system.clock.advance(3599)
    await system.run()
    assert (await system.instance(instance_id))["status"] == "waiting"
    system.clock.advance(1)
    await system.run()
    done = await system.instance(instance_id)
    assert done["status"] == "completed"
    assert [(s["index"], s["path"], s["type"], s["status"]) for s in done["steps"]] == [
        (0, "0", "send", "completed"), (1, "1", "wait", "completed"),
        (2, "2", "send", "completed"),
    ]
    assert set(done["steps"][0]["output"]) == {"eventId"}
    assert await system.emails("ada") == ["welcome", "tips"]
    # the step's notification is visible as any other
    sent = await system.call("GET", f"/v1/notifications/{done['steps'][0]['output']['eventId']}")
    assert sent.status == 200, sent.body
    assert sent.body["template"] == "welcome"


# ---------------------------------------------------------------------------------------------
# waitForEvent


async def wait_flow(system: System, on_timeout: str = "continue") -> None:
    await system.template("welcome")
    await system.template("thanks")
    await system.template("reminder")
    await system.workflow("w", [
        {"type": "send", "template": "welcome"},
        {"type": "waitForEvent", "event": "clicked.cta", "timeoutSeconds": 600,
         "onTimeout": on_timeout},
        {"type": "branch", "if": "steps[1] is not none",
         "then": [{"type": "send", "template": "thanks"}],
         "else": [{"type": "send", "template": "reminder"}]},
    ])


async def test_an_event_before_the_timeout_wakes_the_instance_with_the_event(
    system: System,
) -> None:
    await system.user("ada")
    await wait_flow(system)
    instance_id = await system.trigger("w", "ada")
    await system.run()
    assert (await system.instance(instance_id))["status"] == "waiting"
    event_id = await system.event("clicked.cta", "ada", {"button": "go"})
    await system.run()
    done = await system.instance(instance_id)
    assert done["status"] == "completed", done
    event = outputs(done)["1"]
    assert event["name"] == "clicked.cta"
    assert event["data"] == {"button": "go"}
    assert event["id"] == event_id
    assert outputs(done)["2"] == {"result": True, "branch": "then"}
    assert await system.emails("ada") == ["welcome", "thanks"]


async def test_no_event_times_out_to_null_and_a_late_event_changes_nothing(
    system: System,
) -> None:
    await system.user("ada")
    await wait_flow(system)
    instance_id = await system.trigger("w", "ada")
    await system.run()
    system.clock.advance(600)
    await system.run()
    done = await system.instance(instance_id)
    assert done["status"] == "completed"
    assert outputs(done)["1"] is None
    assert outputs(done)["2"] == {"result": False, "branch": "else"}
    await system.event("clicked.cta", "ada")
    await system.run()
    assert (await system.instance(instance_id))["steps"] == done["steps"]
    assert await system.emails("ada") == ["welcome", "reminder"]


async def test_a_timeout_with_on_timeout_stop_stops_the_instance(system: System) -> None:
    await system.user("ada")
    await wait_flow(system, "stop")
    instance_id = await system.trigger("w", "ada")
    await system.run()
    system.clock.advance(601)
    await system.run()
    done = await system.instance(instance_id)
    assert done["status"] == "stopped"
    assert [s["path"] for s in done["steps"]] == ["0", "1"]
    assert await system.emails("ada") == ["welcome"]


async def test_events_for_another_user_or_project_or_name_wake_nothing(
    system: System,
) -> None:
    await system.user("ada")
    await system.user("bob")
    await wait_flow(system)
    instance_id = await system.trigger("w", "ada")
    await system.run()
    other = await system.api.project("other")
    await system.event("clicked.cta", "bob")
    await system.event("clicked.CTA", "ada")
    await system.event("clicked", "ada")
    await system.event("clicked.cta", "ada", key=other.send)
    await system.run()
    assert (await system.instance(instance_id))["status"] == "waiting"
    # the other project cannot even see the instance
    hidden = await system.api.call("GET", f"/v1/workflow-instances/{instance_id}",
                                   key=other.full)
    assert hidden.status == 404


async def later_flow(system: System) -> str:
    """A user's instance that sleeps 60 s, then waits 600 s for ``paid``."""
    await system.user("ada")
    await system.template("thanks")
    await system.workflow("later", [
        {"type": "wait", "seconds": 60},
        {"type": "waitForEvent", "event": "paid", "timeoutSeconds": 600},
        {"type": "send", "template": "thanks"},
    ])
    instance_id = await system.trigger("later", "ada")
    await system.run()
    return instance_id


async def assert_times_out(system: System, instance_id: str) -> None:
    waiting = await system.instance(instance_id)
    assert (waiting["status"], waiting["currentStep"]) == ("waiting", 1), waiting
    system.clock.advance(600)
    await system.run()
    done = await system.instance(instance_id)
    assert done["status"] == "completed"
    assert outputs(done)["1"] is None


async def test_an_event_sent_before_the_wait_began_does_not_count(system: System) -> None:
    instance_id = await later_flow(system)
    await system.event("paid", "ada")
    await system.run()
    system.clock.advance(60)
    await system.run()
    await assert_times_out(system, instance_id)


async def test_an_event_that_happened_before_the_wait_began_does_not_count_when_read_late(
    system: System,
) -> None:
    # The event is posted while the instance still sleeps in its first step, but the events
    # service forwards it only after the instance has begun waiting (a backlog): it happened
    # before the wait began, so it does not count, however late it is read.
    instance_id = await later_flow(system)
    await system.event("paid", "ada")
    system.clock.advance(60)
    [_events, workflow, *_rest] = system.services
    await drain(workflow)
    assert (await system.instance(instance_id))["currentStep"] == 1
    await system.run()
    await assert_times_out(system, instance_id)


async def test_one_event_wakes_every_instance_of_the_user_waiting_for_it(
    system: System,
) -> None:
    await system.user("ada")
    await wait_flow(system)
    first = await system.trigger("w", "ada")
    second = await system.trigger("w", "ada")
    await system.run()
    await system.event("clicked.cta", "ada")
    await system.run()
    for instance_id in (first, second):
        done = await system.instance(instance_id)
        assert done["status"] == "completed"
        assert outputs(done)["2"]["branch"] == "then"
    assert sorted(await system.emails("ada")) == ["thanks", "thanks", "welcome", "welcome"]


# ---------------------------------------------------------------------------------------------
# branch


BRANCH_CASES: list[tuple[str, dict[str, Any], bool]] = [
    ("data.plan == 'pro'", {"plan": "pro"}, True),
    ("data.plan == 'pro'", {"plan": "free"}, False),
    ("data.plan != 'pro'", {}, True),
    ("data.n > 3", {"n": 4}, True),
    ("data.n >= 4 and data.n < 5", {"n": 4}, True),
    ("data.n <= 3 or data.m", {"n": 4, "m": True}, True),
    ("not data.flag", {}, True),
    ("'a' in data.tags", {"tags": ["a", "b"]}, True),
    ("'z' in data.tags", {"tags": ["a"]}, False),
    ("data.missing.deeper == 1", {}, False),
    ("data.missing >= 18", {}, False),
    ("data.age >= 18", {"age": None}, False),
    ("data.age < 18", {"age": None}, False),
    ("data.missing | int > 0", {}, False),
    ("data.missing is none", {}, True),
    ("data.x is defined", {"x": 0}, True),
    ("data.n | int > 3", {"n": "7"}, True),
    ("data.items | length > 1", {"items": [1, 2]}, True),
    ("user.attributes.age >= 18", {}, True),
    ("user.attributes.city == 'Paris'", {}, False),
    ("steps[0].eventId is string", {}, True),
    ("steps[5] is none", {}, True),
    ("steps['9.then.0'] is none", {}, True),
    ("{{ data.plan == 'pro' }}", {"plan": "pro"}, True),
    ("{{ data.plan == 'pro' }}", {"plan": "x"}, False),
    ("data.n == 1.0", {"n": 1}, True),
    ("data.s ~ '' == 'ab'", {"s": "ab"}, True),
]


@pytest.mark.parametrize(("expression", "data", "expected"), BRANCH_CASES)
async def test_a_branch_picks_the_arm_its_expression_chooses(
    system: System, expression: str, data: dict[str, Any], expected: bool,
) -> None:
    await system.user("ada", age=30)
    await system.template("first")
    await system.template("yes")
    await system.template("no")
    await system.workflow("b", [
        {"type": "send", "template": "first"},
        {"type": "branch", "if": expression,
         "then": [{"type": "send", "template": "yes"}],
         "else": [{"type": "send", "template": "no"}]},
    ])
    instance_id = await system.trigger("b", "ada", data)
    await system.run()
    done = await system.instance(instance_id)
    assert done["status"] == "completed", done
    arm = "then" if expected else "else"
    assert outputs(done)["1"] == {"result": expected, "branch": arm}
    assert [s["path"] for s in done["steps"]] == ["0", "1", f"1.{arm}.0"]


async def test_a_type_mismatch_in_a_branch_fails_the_instance_with_the_reason(
    system: System,
) -> None:
    await system.user("ada")
    await system.template("yes")
    await system.workflow("b", [
        {"type": "branch", "if": "data.n > 3", "then": [{"type": "send", "template": "yes"}]},
    ])
    instance_id = await system.trigger("b", "ada", {"n": "seven"})
    await system.run()
    done = await system.instance(instance_id)
    assert done["status"] == "failed"
    assert "error" in outputs(done)["0"]
    assert await system.emails("ada") == []


async def test_nested_branches_and_empty_arms_continue_after_the_branch(
    system: System,
) -> None:
    await system.user("ada")
    for name in ("a", "b", "end"):
        await system.template(name)
    await system.workflow("n", [
        {"type": "branch", "if": "data.x", "then": [
            {"type": "branch", "if": "data.y", "then": [], "else": [
                {"type": "send", "template": "a"}]},
            {"type": "send", "template": "b"},
        ]},
        {"type": "branch", "if": "steps['0.then.0'].branch == 'else'",
         "then": [{"type": "send", "template": "end"}]},
    ])
    instance_id = await system.trigger("n", "ada", {"x": 1})
    await system.run()
    done = await system.instance(instance_id)
    assert done["status"] == "completed", done
    assert [s["path"] for s in done["steps"]] == [
        "0", "0.then.0", "0.then.0.else.0", "0.then.1", "1", "1.then.0"]
    assert await system.emails("ada") == ["a", "b", "end"]


# ---------------------------------------------------------------------------------------------
# digest


async def test_a_digest_collects_every_trigger_in_its_window_into_one_send(
    system: System,
) -> None:
    await system.user("ada")
    await system.template("digest", {"channels": {"email": {
        "subject": "{{ items | length }} items",
        "text": "{% for i in items %}{{ i.data.n }},{% endfor %}"}}})
    await system.workflow("d", [{"type": "digest", "windowSeconds": 300, "template": "digest"}])
    n = 60
    ids = [await system.trigger("d", "ada", {"n": i}) for i in range(n)]
    await system.run()
    assert await system.emails("ada") == []
    # whichever trigger ran first owns the window; every other one joined it
    states = {i: await system.instance(i) for i in ids}
    [owner] = [i for i, state in states.items() if state["status"] == "waiting"]
    for instance_id, state in states.items():
        if instance_id != owner:
            assert state["status"] == "digested"
            assert outputs(state)["0"]["digestedInto"] == owner
    system.clock.advance(300)
    await system.run()
    done = await system.instance(owner)
    assert done["status"] == "completed"
    assert outputs(done)["0"]["items"] == n
    assert await system.emails("ada") == [f"{n} items"]
    [email] = await system.sim.messages("resend")
    assert email["content"]["text"] == "".join(f"{i}," for i in range(n))
    # a trigger after the window closed opens a new one
    later = await system.trigger("d", "ada", {"n": 99})
    await system.run()
    assert (await system.instance(later))["status"] == "waiting", await system.instance(later)
    system.clock.advance(300)
    await system.run()
    assert await system.emails("ada") == [f"{n} items", "1 items"]


async def test_digests_are_per_user(system: System) -> None:
    await system.user("ada")
    await system.user("bob")
    await system.template("digest", {"channels": {"email": {
        "subject": "{{ items | length }} items", "text": "x"}}})
    await system.workflow("d", [{"type": "digest", "windowSeconds": 300, "template": "digest"}])
    for user in ("ada", "bob", "ada"):
        await system.trigger("d", user, {})
    await system.run()
    system.clock.advance(300)
    await system.run()
    assert await system.emails("ada") == ["2 items"]
    assert await system.emails("bob") == ["1 items"]


# ---------------------------------------------------------------------------------------------
# triggers, definitions changing under running instances


async def test_a_trigger_key_starts_one_instance(system: System) -> None:
    await system.user("ada")
    await system.template("welcome")
    await system.workflow("w1", [{"type": "send", "template": "welcome"}])
    headers = {"x-idempotency-key": "signup-ada"}
    first = await system.trigger("w1", "ada", headers=headers)
    again = await system.call("POST", "/v1/workflows/w1/trigger", json={"userId": "ada"},
                              headers=headers)
    assert again.status == 202
    assert again.body == {"instanceId": first}
    assert again.headers.get("x-idempotent-replay") == "true"
    await system.run()
    assert await system.emails("ada") == ["welcome"]


async def test_replacing_or_deleting_a_definition_leaves_running_instances_alone(
    system: System,
) -> None:
    await system.user("ada")
    for name in ("one", "two", "other"):
        await system.template(name)
    await system.workflow("w", [
        {"type": "send", "template": "one"}, {"type": "wait", "seconds": 10},
        {"type": "send", "template": "two"},
    ])
    first = await system.trigger("w", "ada")
    await system.run()
    await system.workflow("w", [{"type": "send", "template": "other"}])
    second = await system.trigger("w", "ada")
    await system.run()
    assert (await system.call("DELETE", "/v1/workflows/w")).status == 204
    assert (await system.call("GET", "/v1/workflows/w")).status == 404
    gone = await system.call("POST", "/v1/workflows/w/trigger", json={"userId": "ada"})
    assert gone.status == 404
    system.clock.advance(10)
    await system.run()
    assert (await system.instance(first))["status"] == "completed"
    assert (await system.instance(second))["status"] == "completed"
    assert sorted(await system.emails("ada")) == ["one", "other", "two"]


async def test_a_template_deleted_under_a_running_instance_fails_its_step(
    system: System,
) -> None:
    await system.user("ada")
    await system.template("one")
    await system.template("two")
    await system.workflow("w", [
        {"type": "send", "template": "one"}, {"type": "wait", "seconds": 10},
        {"type": "send", "template": "two"},
    ])
    instance_id = await system.trigger("w", "ada")
    await system.run()
    assert (await system.call("DELETE", "/v1/templates/two")).status == 204
    system.clock.advance(10)
    await system.run()
    done = await system.instance(instance_id)
    assert done["status"] == "failed"
    assert outputs(done)["2"] == {
        "error": "template 'two' no longer exists in this project"}
    assert await system.emails("ada") == ["one"]


async def test_a_provider_refusing_the_send_does_not_stop_the_workflow(
    system: System,
) -> None:
    await system.user("ada")
    await system.template("one")
    await system.template("two")
    await system.workflow("w", [
        {"type": "send", "template": "one"}, {"type": "send", "template": "two"},
    ])
    await system.sim.add_fault("error", "resend", status=422, times=1)
    instance_id = await system.trigger("w", "ada")
    await system.run()
    done = await system.instance(instance_id)
    assert done["status"] == "completed"
    assert await system.emails("ada") == ["two"]
    refused = await system.call(
        "GET", f"/v1/notifications/{outputs(done)['0']['eventId']}")
    assert refused.body["recipients"][0]["status"] in ("failed", "dead_lettered"), refused.body


# ---------------------------------------------------------------------------------------------
# AI


AI_TEMPLATE: dict[str, Any] = {
    "channels": {"email": {"subject": "Paid {{ data.n }}", "text": "template text"}},
    "ai": {"model": "gpt-4o-mini", "prompt": "Say thanks for invoice {{ data.n }}.",
           "channels": ["email"]},
}


async def test_a_workflow_send_of_an_ai_template_sends_model_text_and_records_usage(
    system: System,
) -> None:
    await system.user("ada")
    await system.template("paid", AI_TEMPLATE)
    await system.workflow("w", [{"type": "send", "template": "paid"}])
    await system.trigger("w", "ada", {"n": 7})
    await system.run()
    [completion] = await system.sim.messages("openai")
    [email] = await system.sim.messages("resend")
    assert email["content"]["subject"] == "Paid 7"
    assert email["content"]["text"] == completion["content"]["completion"]
    usage = await system.call("GET", "/v1/usage/ai")
    assert usage.status == 200
    assert usage.body["requests"] == 1
    assert usage.body["totalTokens"] > 0
    assert [m["model"] for m in usage.body["models"]] == ["gpt-4o-mini"]


@pytest.mark.parametrize(("fault", "options", "requests"), [
    ("error", {"status": 503}, 3),
    ("timeout", {}, 3),
    ("malformed", {}, 3),
])
async def test_a_model_failing_every_time_is_retried_then_dead_lettered(
    system: System, fault: str, options: dict[str, Any], requests: int,
) -> None:
    await system.user("ada")
    await system.template("paid", AI_TEMPLATE)
    await system.sim.add_fault(fault, "openai", **options)
    sent = await system.call("POST", "/v1/notifications",
                             json={"to": "ada", "template": "paid", "data": {"n": 1}})
    await system.run()
    stats = await system.sim.stats()
    assert stats["openai"]["requests"] == requests
    assert await system.emails() == []
    dlq = await system.call("GET", "/v1/dlq")
    assert len(dlq.body["items"]) == 1
    shown = await system.call("GET", f"/v1/notifications/{sent.body['id']}")
    assert shown.body["recipients"][0]["status"] == "dead_lettered"
    usage = await system.call("GET", "/v1/usage/ai")
    assert usage.body["requests"] == 0


async def test_a_model_failing_once_is_retried_and_the_send_goes_out(system: System) -> None:
    await system.user("ada")
    await system.template("paid", AI_TEMPLATE)
    await system.sim.add_fault("error", "openai", status=500, times=1)
    await system.call("POST", "/v1/notifications",
                      json={"to": "ada", "template": "paid", "data": {"n": 1}})
    await system.run()
    assert await system.emails() == ["Paid 1"]
    assert (await system.sim.stats())["openai"]["requests"] == 2
    [completion] = await system.sim.messages("openai")
    [email] = await system.sim.messages("resend")
    assert email["content"]["text"] == completion["content"]["completion"]
    assert (await system.call("GET", "/v1/usage/ai")).body["requests"] == 1


async def test_a_model_rejecting_the_request_is_dead_lettered_after_one_request(
    system: System,
) -> None:
    await system.user("ada")
    await system.template("paid", AI_TEMPLATE)
    await system.sim.add_fault("error", "openai", status=400)
    await system.call("POST", "/v1/notifications",
                      json={"to": "ada", "template": "paid", "data": {"n": 1}})
    await system.run()
    assert (await system.sim.stats())["openai"]["requests"] == 1
    assert len((await system.call("GET", "/v1/dlq")).body["items"]) == 1


async def test_a_prompt_that_does_not_render_sends_the_template_content(
    system: System,
) -> None:
    await system.user("ada")
    template = {**AI_TEMPLATE, "ai": {**AI_TEMPLATE["ai"],
                                      "prompt": "{{ data.n.missing.deeper() }}"}}
    await system.template("paid", template)
    await system.call("POST", "/v1/notifications",
                      json={"to": "ada", "template": "paid", "data": {"n": 1}})
    await system.run()
    [email] = await system.sim.messages("resend")
    assert email["content"]["text"] == "template text"
    stats: dict[str, Any] = await system.sim.stats()
    assert stats.get("openai", {}).get("requests", 0) == 0


# ---------------------------------------------------------------------------------------------
# definitions with bad input: a 400 naming the field, never a 500


def nested(depth: int) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = [{"type": "send", "template": "t"}]
    for _ in range(depth):
        steps = [{"type": "branch", "if": "data.x", "then": steps}]
    return steps


BAD_DEFINITIONS: list[tuple[Any, set[str]]] = [
    ([], {"steps"}),
    ("send", {"steps"}),
    ({"0": {"type": "send"}}, {"steps"}),
    (None, {"steps"}),
    ([None], {"steps[0]"}),
    ([1], {"steps[0]"}),
    ([[]], {"steps[0]"}),
    ([{}], {"steps[0].type"}),
    ([{"type": "email"}], {"steps[0].type"}),
    ([{"type": ["send"]}], {"steps[0].type"}),
    ([{"type": {"send": 1}}], {"steps[0].type"}),
    ([{"type": None}], {"steps[0].type"}),
    ([{"type": "send"}], {"steps[0].template"}),
    ([{"type": "send", "template": 5}], {"steps[0].template"}),
    ([{"type": "send", "template": ["t"]}], {"steps[0].template"}),
    ([{"type": "send", "template": {"id": "t"}}], {"steps[0].template"}),
    ([{"type": "send", "template": "  "}], {"steps[0].template"}),
    ([{"type": "send", "template": "nope"}], {"steps[0].template"}),
    ([{"type": "send", "template": "x" * 5000}], {"steps[0].template"}),
    ([{"type": "send", "template": "t", "channels": "email"}], {"steps[0].channels"}),
    ([{"type": "send", "template": "t", "channels": []}], {"steps[0].channels"}),
    ([{"type": "send", "template": "t", "channels": ["fax"]}], {"steps[0].channels"}),
    ([{"type": "send", "template": "t", "channels": [["email"]]}], {"steps[0].channels"}),
    ([{"type": "send", "template": "t", "channels": [{"c": 1}]}], {"steps[0].channels"}),
    ([{"type": "send", "template": "t", "channels": ["email", "email"]}],
     {"steps[0].channels"}),
    ([{"type": "send", "template": "t", "priority": "urgent"}], {"steps[0].priority"}),
    ([{"type": "send", "template": "t", "priority": ["low"]}], {"steps[0].priority"}),
    ([{"type": "send", "template": "t", "priority": {}}], {"steps[0].priority"}),
    ([{"type": "send", "template": "t", "seconds": 5}], {"steps[0].seconds"}),
    ([{"type": "wait"}], {"steps[0].seconds"}),
    ([{"type": "wait", "seconds": "10"}], {"steps[0].seconds"}),
    ([{"type": "wait", "seconds": True}], {"steps[0].seconds"}),
    ([{"type": "wait", "seconds": 0}], {"steps[0].seconds"}),
    ([{"type": "wait", "seconds": -1}], {"steps[0].seconds"}),
    ([{"type": "wait", "seconds": 10**300}], {"steps[0].seconds"}),
    ([{"type": "wait", "seconds": 1e308}], {"steps[0].seconds"}),
    ([{"type": "wait", "seconds": [1]}], {"steps[0].seconds"}),
    ([{"type": "waitForEvent", "timeoutSeconds": 5}], {"steps[0].event"}),
    ([{"type": "waitForEvent", "event": 5, "timeoutSeconds": 5}], {"steps[0].event"}),
    ([{"type": "waitForEvent", "event": "e"}], {"steps[0].timeoutSeconds"}),
    ([{"type": "waitForEvent", "event": "e", "timeoutSeconds": None}],
     {"steps[0].timeoutSeconds"}),
    ([{"type": "waitForEvent", "event": "e", "timeoutSeconds": 5, "onTimeout": "fail"}],
     {"steps[0].onTimeout"}),
    ([{"type": "waitForEvent", "event": "e", "timeoutSeconds": 5, "onTimeout": ["stop"]}],
     {"steps[0].onTimeout"}),
    ([{"type": "waitForEvent", "event": "e" * 201, "timeoutSeconds": 5}], {"steps[0].event"}),
    ([{"type": "branch"}], {"steps[0].if"}),
    ([{"type": "branch", "if": 1}], {"steps[0].if"}),
    ([{"type": "branch", "if": True}], {"steps[0].if"}),
    ([{"type": "branch", "if": "data.x ==", "then": []}], {"steps[0].if"}),
    ([{"type": "branch", "if": "{{ data.x", "then": []}], {"steps[0].if"}),
    ([{"type": "branch", "if": "x" * 3000}], {"steps[0].if"}),
    ([{"type": "branch", "if": "data.x", "then": "send"}], {"steps[0].then"}),
    ([{"type": "branch", "if": "data.x", "then": {"type": "send"}}], {"steps[0].then"}),
    ([{"type": "branch", "if": "data.x", "else": [None]}], {"steps[0].else[0]"}),
    ([{"type": "branch", "if": "data.x", "then": [{"type": "wait", "seconds": "1"}]}],
     {"steps[0].then[0].seconds"}),
    ([{"type": "branch", "if": "data.x", "then": [{"type": "send", "template": "nope"}]}],
     {"steps[0].then[0].template"}),
    ([{"type": "branch", "if": "data.x", "otherwise": []}], {"steps[0].otherwise"}),
    ([{"type": "digest", "template": "t"}], {"steps[0].windowSeconds"}),
    ([{"type": "digest", "windowSeconds": 60}], {"steps[0].template"}),
    ([{"type": "digest", "windowSeconds": "60", "template": "t"}],
     {"steps[0].windowSeconds"}),
    ([{"type": "send", "template": "t"}] * 101, {"steps"}),
    ([{"type": "branch", "if": "data.x", "then": [{"type": "send", "template": "t"}] * 100}]
     * 100, {"steps"}),
    (nested(9), {"steps[0].then[0].then[0].then[0].then[0].then[0].then[0].then[0].then[0]"}),
    ([{"type": "send", "template": "t"}, {"type": "wait", "seconds": "x"},
      {"type": "bogus"}], {"steps[1].seconds", "steps[2].type"}),
    ([{"type": "send", "template": "t\u0000"}], {"steps[0].template"}),
    ([{"type": "waitForEvent", "event": "e\u0000", "timeoutSeconds": 5}], {"steps[0].event"}),
]


@pytest.mark.parametrize(("steps", "fields"), BAD_DEFINITIONS,
                         ids=[str(i) for i in range(len(BAD_DEFINITIONS))])
async def test_a_bad_definition_is_a_400_naming_the_field(
    system: System, steps: Any, fields: set[str],
) -> None:
    await system.template("t")
    reply = await system.call("PUT", "/v1/workflows/w", json={"steps": steps})
    assert reply.status == 400, reply.body
    assert set(reply.fields) == fields, reply.body
    assert (await system.call("GET", "/v1/workflows/w")).status == 404


@pytest.mark.parametrize(("body", "fields"), [
    ({}, {"steps"}),
    ({"steps": [{"type": "send", "template": "t"}], "name": "x"}, {"name"}),
    ([{"type": "send", "template": "t"}], {"body"}),
    ({"steps": [{"type": "branch", "if": "data.x == '\u0000'"}]}, {"steps[0].if"}),
])
async def test_a_bad_workflow_body_is_a_400(
    system: System, body: Any, fields: set[str],
) -> None:
    await system.template("t")
    reply = await system.call("PUT", "/v1/workflows/w", json=body)
    assert reply.status == 400, reply.body
    assert set(reply.fields) <= fields | {"body", "steps"}, reply.body


async def test_bad_triggers_events_and_instance_ids_are_4xx(system: System) -> None:
    await system.template("t")
    await system.workflow("w", [{"type": "send", "template": "t"}])
    for body in ({}, {"userId": 5}, {"userId": "a", "data": []}, {"userId": "a", "data": 5},
                 {"userId": "a", "extra": 1}, {"userId": "a\u0000"},
                 {"userId": "a", "data": {"k": "\u0000"}}, {"userId": "a", "data": {"\u0000": 1}}):
        reply = await system.call("POST", "/v1/workflows/w/trigger", json=body)
        assert reply.status == 400, (body, reply.status, reply.body)
    for body in ({"name": "e", "userId": "a", "data": {"k": "\u0000"}},
                 {"name": "e\u0000", "userId": "a"}, {"name": "e", "userId": "a", "data": []}):
        reply = await system.call("POST", "/v1/events", json=body)
        assert reply.status == 400, (body, reply.status, reply.body)
    for instance_id in ("nope", "1" * 300, "00000000-0000-0000-0000-000000000000"):
        reply = await system.call("GET", f"/v1/workflow-instances/{instance_id}")
        assert reply.status == 404, (instance_id, reply.status, reply.body)
    for workflow_id in ("x" * 300, "a%00b"):
        for method in ("GET", "DELETE", "PUT"):
            reply = await system.call(method, f"/v1/workflows/{workflow_id}",
                                      json={"steps": [{"type": "send", "template": "t"}]})
            assert reply.status in (400, 404), (method, workflow_id, reply.status, reply.body)
    reply = await system.call("POST", "/v1/workflows/x%00/trigger", json={"userId": "a"})
    assert reply.status in (400, 404), reply.body


async def test_a_large_definition_within_the_limits_is_stored_and_runs(system: System) -> None:
    await system.user("ada")
    await system.template("t")
    steps = [{"type": "send", "template": "t"}] + [
        {"type": "branch", "if": f"data.n == {i}", "then": nested(7)} for i in range(99)]
    await system.workflow("big", steps)
    instance_id = await system.trigger("big", "ada", {"n": 98, "x": True})
    await system.run()
    done = await system.instance(instance_id)
    assert done["status"] == "completed", done
    assert len(done["steps"]) == 1 + 99 + 7 + 1
    assert await system.emails("ada") == ["t", "t"]


async def test_a_digest_of_an_ai_template_gives_the_model_every_item(system: System) -> None:
    await system.user("ada")
    await system.template("weekly", {
        "channels": {"email": {"subject": "{{ items | length }} updates", "text": "x"}},
        "ai": {"model": "gpt-4o-mini", "channels": ["email"],
               "prompt": "Summarise: {% for i in items %}{{ i.data.what }};{% endfor %}"},
    })
    await system.workflow("d", [{"type": "digest", "windowSeconds": 60, "template": "weekly"}])
    for what in ("a", "b", "c"):
        await system.trigger("d", "ada", {"what": what})
    await system.run()
    system.clock.advance(60)
    await system.run()
    [completion] = await system.sim.messages("openai")
    prompts = [m["content"] for m in completion["content"]["messages"] if m["role"] == "user"]
    assert prompts == ["Summarise: a;b;c;"]
    [email] = await system.sim.messages("resend")
    assert email["content"]["subject"] == "3 updates"
    assert email["content"]["text"] == completion["content"]["completion"]


async def test_ai_usage_is_totalled_within_bounds_and_bad_bounds_are_400(
    system: System,
) -> None:
    await system.user("ada")
    await system.template("paid", AI_TEMPLATE)
    for n in range(3):
        await system.call("POST", "/v1/notifications",
                          json={"to": "ada", "template": "paid", "data": {"n": n}})
    await system.run()
    total = (await system.call("GET", "/v1/usage/ai")).body
    assert total["requests"] == 3
    assert total["totalTokens"] == total["promptTokens"] + total["completionTokens"]
    future = await system.call("GET", "/v1/usage/ai",
                               params={"since": "2999-01-01T00:00:00Z"})
    assert (future.status, future.body["requests"]) == (200, 0)
    past = await system.call("GET", "/v1/usage/ai", params={"until": "2000-01-01T00:00:00Z"})
    assert (past.status, past.body["requests"]) == (200, 0)
    other = await system.api.project("other")
    assert (await system.api.call("GET", "/v1/usage/ai", key=other.full)).body["requests"] == 0
    for params in ({"since": "yesterday"}, {"until": "2026-13-01T00:00:00Z"},
                   {"since": "2027-01-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"}):
        bad = await system.call("GET", "/v1/usage/ai", params=params)
        assert bad.status == 400, (params, bad.body)


async def test_a_new_workflow_process_after_redis_lost_its_timers_finishes_every_instance(
    system: System, settings: Settings, sim: SimulatorServer,
) -> None:
    await system.user("ada")
    await wait_flow(system)
    await system.template("digest", {"channels": {"email": {
        "subject": "{{ items | length }} items", "text": "x"}}})
    await system.workflow("d", [{"type": "digest", "windowSeconds": 300, "template": "digest"}])
    await system.workflow("s", [{"type": "wait", "seconds": 30},
                                {"type": "send", "template": "thanks"}])
    waiting = await system.trigger("w", "ada")
    digests = [await system.trigger("d", "ada", {}) for _ in range(3)]
    sleeping = await system.trigger("s", "ada")
    await system.run()
    # the workflow process goes away and Redis loses its data
    old = system.services[1]
    await old.stop()
    keys = Keys(settings.namespace)
    redis = Redis.from_url(settings.redis_url)
    await redis.delete(keys.workflow_timers, keys.workflow_timers_ready)
    await redis.aclose()
    system.services[1] = WorkflowService(simulated(settings, sim), clock=system.clock)
    system.clock.advance(600)
    await system.run()
    assert (await system.instance(waiting))["status"] == "completed"
    assert (await system.instance(sleeping))["status"] == "completed"
    statuses = sorted([(await system.instance(i))["status"] for i in digests])
    assert statuses == ["completed", "digested", "digested"]
    assert sorted(await system.emails("ada")) == [
        "3 items", "reminder", "thanks", "welcome"]


async def test_an_unknown_model_is_dead_lettered_after_one_request_and_bills_nothing(
    system: System,
) -> None:
    await system.user("ada")
    await system.template("paid", {**AI_TEMPLATE, "ai": {**AI_TEMPLATE["ai"],
                                                         "model": "no-such-model"}})
    await system.workflow("w", [{"type": "send", "template": "paid"}])
    instance_id = await system.trigger("w", "ada", {"n": 1})
    await system.run()
    stats = await system.sim.stats()
    assert stats["openai"]["requests"] == 1
    assert await system.emails() == []
    [entry] = (await system.call("GET", "/v1/dlq")).body["items"]
    assert "model" in entry["error"]
    assert (await system.call("GET", "/v1/usage/ai")).body["requests"] == 0
    # the workflow's send step is done: what became of the send is the notification's
    done = await system.instance(instance_id)
    assert done["status"] == "completed"
    shown = await system.call("GET", f"/v1/notifications/{outputs(done)['0']['eventId']}")
    assert shown.body["recipients"][0]["status"] == "dead_lettered"
