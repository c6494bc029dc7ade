"""An engagement receipt wakes a workflow, all the way round: the workflow sends, Resend
(simulated) reports the click on a signed webhook, the events service forwards it, and the
instance waiting for "clicked" takes its branch at once instead of timing out."""

from __future__ import annotations

from typing import Any

import aiohttp
import asyncpg

from notifkit.config import Settings
from notifkit.services.api.service import ApiService
from notifkit.services.delivery.service import DeliveryService
from notifkit.services.engine import EngineService
from notifkit.services.enricher import EnricherService
from notifkit.services.events import EventsService
from notifkit.services.workflow import WorkflowService
from simulators import SimulatorServer

from .pipeline import RESEND_WEBHOOK_SECRET, add_template, add_user, drain, simulated_resend

CLICK_OR_NOT = {"steps": [
    {"type": "send", "template": "welcome"},
    {"type": "waitForEvent", "event": "clicked", "timeoutSeconds": 3600},
    {"type": "branch", "if": "steps[1] is not none",
     "then": [{"type": "send", "template": "thanks"}], "else": []},
]}


async def test_a_click_reported_by_the_provider_wakes_the_workflow_waiting_for_it(
    settings: Settings, db: asyncpg.Pool, project_id: str, sim: SimulatorServer,
) -> None:
    s = simulated_resend(settings, sim.base_url)
    await add_user(db, project_id, "u1", contacts=[("email", "ada@example.com")])
    for template in ("welcome", "thanks"):
        await add_template(db, project_id, template,
                           {"email": {"subject": template, "text": "Hello"}})
    api = ApiService(s)
    await api.start()
    services = [EnricherService(s), EngineService(s), DeliveryService(s), EventsService(s),
                WorkflowService(s)]
    headers = {"Authorization": f"Bearer {s.admin_key}", "x-project-id": project_id}
    try:
        await sim.set_receipts(f"{api.base_url}/v1/webhooks/resend/{project_id}",
                               RESEND_WEBHOOK_SECRET, delivered=1.0, clicked=1.0)
        async with aiohttp.ClientSession(api.base_url, headers=headers) as http:

            async def call(method: str, path: str, body: Any = None) -> dict[str, Any]:
                async with http.request(method, path, json=body) as reply:
                    assert reply.status < 300, await reply.text()
                    result: dict[str, Any] = await reply.json()
                    return result

            await call("PUT", "/v1/workflows/onboarding", CLICK_OR_NOT)
            instance_id = (await call("POST", "/v1/workflows/onboarding/trigger",
                                      {"userId": "u1"}))["instanceId"]
            # Given the welcome sent (the instance then waits up to an hour for a click)
            await drain(*services)
            # When the provider reports that the user clicked it
            await sim.drain_receipts()
            await drain(*services)
            # Then the instance took its "then" branch at once, the click as the step's output
            instance = await call("GET", f"/v1/workflow-instances/{instance_id}")
            assert instance["status"] == "completed"
            waited = next(step for step in instance["steps"]
                          if step["type"] == "waitForEvent")
            assert waited["output"]["name"] == "clicked"
            assert waited["output"]["data"]["provider"] == "resend"
    finally:
        for service in services:
            await service.close()
        await api.stop()
    assert sorted(m["content"]["subject"] for m in await sim.messages("resend")) == [
        "thanks", "welcome"]


OPENED_OR_NOT = {"steps": [
    {"type": "send", "template": "welcome"},
    {"type": "waitForEvent", "event": "opened", "timeoutSeconds": 3600},
]}


async def test_reading_an_in_app_message_is_its_open_on_the_timeline_and_for_workflows(
    settings: Settings, db: asyncpg.Pool, project_id: str,
) -> None:
    """The inbox's read is the in-app channel's open, as a provider's open receipt is an
    e-mail's: it lands on the send's timeline (and campaign log) and wakes a workflow waiting
    for "opened". Reading it again is the same open, not a second one."""
    await add_user(db, project_id, "u1")
    await add_template(db, project_id, "welcome", {"inapp": {"text": "Welcome"}})
    api = ApiService(settings)
    await api.start()
    services = [EnricherService(settings), EngineService(settings), DeliveryService(settings),
                EventsService(settings), WorkflowService(settings)]
    headers = {"Authorization": f"Bearer {settings.admin_key}", "x-project-id": project_id}
    try:
        async with aiohttp.ClientSession(api.base_url, headers=headers) as http:

            async def call(method: str, path: str, body: Any = None) -> Any:
                async with http.request(method, path, json=body) as reply:
                    assert reply.status < 300, await reply.text()
                    return await reply.json() if reply.status != 204 else None

            await call("PUT", "/v1/workflows/onboarding", OPENED_OR_NOT)
            instance_id = (await call("POST", "/v1/workflows/onboarding/trigger",
                                      {"userId": "u1"}))["instanceId"]
            # Given the welcome stored in the user's inbox (the instance then waits)
            await drain(*services)
            [message] = (await call("GET", "/v1/users/u1/inbox"))["items"]
            # When the user reads it, twice
            for _ in range(2):
                await call("POST", f"/v1/users/u1/inbox/{message['id']}/read")
            await drain(*services)
            # Then the instance woke on the read, and the timeline shows one open
            instance = await call("GET", f"/v1/workflow-instances/{instance_id}")
            assert instance["status"] == "completed", instance
            waited = instance["steps"][1]["output"]
            assert waited["name"] == "opened"
            assert waited["data"]["channel"] == "inapp"
            assert waited["data"]["taskId"] == message["taskId"]
            sent = await call("GET", f"/v1/notifications/{message['eventId']}")
            [recipient] = sent["recipients"]
            assert [row["kind"] for row in recipient["timeline"]] == ["queued", "sent", "opened"]
            assert recipient["status"] == "delivered"
    finally:
        for service in services:
            await service.close()
        await api.stop()
