"""The workflow service's log records carry the ids an operator looks a notification up by."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

import pytest

from notifkit.log import JsonFormatter
from notifkit.streams import as_str

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from notifkit.keys import Keys

    from .conftest import Flow, ServiceFactory


def records(caplog: pytest.LogCaptureFixture, start: str) -> list[dict[str, object]]:
    return [json.loads(JsonFormatter().format(r)) for r in caplog.records
            if r.name == "notifkit.workflow" and r.getMessage().startswith(start)]


async def test_a_send_and_a_resolving_event_name_their_project_event_and_user(
    flow: Flow, make_service: ServiceFactory, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="notifkit.workflow")
    await flow.define("onboarding", [
        {"type": "send", "template": "welcome"},
        {"type": "waitForEvent", "event": "clicked", "timeoutSeconds": 3600},
    ])
    service = make_service()
    await flow.trigger("onboarding", "u1")
    await service.run_until_idle()
    event_id = await flow.event("clicked", "u1")
    await service.run_until_idle()

    [sent] = records(caplog, "Workflow step 0 sent notification")
    assert sent["project_id"] == flow.project_id
    assert sent["service"] == "workflow"
    assert sent["event_id"]
    [woke] = records(caplog, "Event 'clicked' resolved 1")
    assert (woke["event_id"], woke["user_id"], woke["project_id"]) == (
        event_id, "u1", flow.project_id)


async def test_an_entry_it_cannot_use_is_reported_with_its_stream_and_entry(
    redis: Redis, keys: Keys, make_service: ServiceFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    service = make_service()
    entry_id = await redis.xadd(keys.workflow_inbound, {"data": '{"type": "bogus"}'})
    await service.run_until_idle()

    [report] = records(caplog, "Acked a workflow entry it cannot use")
    assert report["stream"] == keys.workflow_inbound
    assert report["entry_id"] == as_str(entry_id)
    assert report["service"] == "workflow"
