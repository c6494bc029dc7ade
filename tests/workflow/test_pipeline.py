"""Workflows and AI content through the whole send path, counted at the provider simulator:
workflow -> enricher -> engine -> (ai) -> delivery -> Resend simulator."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import pytest

from notifkit.config import Settings
from notifkit.services.ai import AiService
from notifkit.services.base import Service
from notifkit.services.delivery import DeliveryService
from notifkit.services.engine import EngineService
from notifkit.services.enricher import EnricherService
from simulators import SimulatorServer

from .pipeline import add_template, add_user, drain, simulated

if TYPE_CHECKING:
    from .conftest import FakeClock, Flow, ServiceFactory


@pytest.fixture
async def send_path(settings: Settings, sim: SimulatorServer) -> AsyncIterator[list[Service]]:
    chosen = simulated(settings, sim)
    stages: list[Service] = [EnricherService(chosen), EngineService(chosen),
                             AiService(chosen), DeliveryService(chosen)]
    yield stages
    for stage in stages:
        await stage.stop()


async def test_a_digest_reaches_the_provider_as_one_email_listing_every_item(
    flow: Flow, make_service: ServiceFactory, clock: FakeClock, send_path: list[Service],
    sim: SimulatorServer,
) -> None:
    await add_user(flow.db, flow.project_id, "ada", "ada@example.com")
    await add_template(flow.db, flow.project_id, "comments", {"email": {
        "subject": "{{ items | length }} new comments",
        "text": "{% for item in items %}{{ item.data.by }};{% endfor %}",
    }})
    await flow.define("comments", [
        {"type": "digest", "windowSeconds": 600, "template": "comments"},
    ])
    workflow = make_service()
    n = 5
    for i in range(n):
        await flow.trigger("comments", "ada", {"by": f"user-{i}"})
    await drain(workflow, *send_path)
    assert await sim.messages("resend") == []
    clock.advance(600)
    await drain(workflow, *send_path)
    [email] = await sim.messages("resend")
    assert email["to"] == "ada@example.com"
    assert email["content"]["subject"] == f"{n} new comments"
    assert sorted(email["content"]["text"].rstrip(";").split(";")) == [
        f"user-{i}" for i in range(n)
    ]


async def test_ai_written_content_reaches_the_provider(
    flow: Flow, make_service: ServiceFactory, send_path: list[Service], sim: SimulatorServer,
) -> None:
    await add_user(flow.db, flow.project_id, "ada", "ada@example.com", {"name": "Ada"})
    await add_template(
        flow.db, flow.project_id, "paid",
        {"email": {"subject": "Invoice paid", "text": "fallback"}},
        ai={"model": "gpt-4o-mini", "channels": ["email"],
            "prompt": "Thank {{ user.attributes.name }} for paying {{ data.amount }}."},
    )
    await flow.define("billing", [{"type": "send", "template": "paid"}])
    await flow.trigger("billing", "ada", {"amount": "12.00"})
    await drain(make_service(), *send_path)
    [completion] = await sim.messages("openai")
    [email] = await sim.messages("resend")
    assert email["content"]["text"] == completion["content"]["completion"]
    assert email["content"]["subject"] == "Invoice paid"
    prompts = [m["content"] for m in completion["content"]["messages"] if m["role"] == "user"]
    assert prompts == ["Thank Ada for paying 12.00."]
