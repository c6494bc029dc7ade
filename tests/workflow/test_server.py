"""The workflow and ai services start and stop inside NotifkitServer like every other."""

from __future__ import annotations

from typing import TYPE_CHECKING

from notifkit.config import Settings
from notifkit.server import NotifkitServer
from notifkit.services.ai import AiService
from notifkit.services.workflow import WorkflowService

if TYPE_CHECKING:
    from .conftest import Flow


async def test_the_server_runs_a_workflow_with_real_time(settings: Settings, flow: Flow) -> None:
    await flow.define("hello", [{"type": "send", "template": "hello"},
                                {"type": "wait", "seconds": 0.001},
                                {"type": "send", "template": "again"}])
    instance_id = await flow.trigger("hello", "u1")
    async with NotifkitServer(services=["workflow", "ai"], settings=settings) as server:
        assert isinstance(server.service("workflow"), WorkflowService)
        assert isinstance(server.service("ai"), AiService)
        for _ in range(50):  # the wait is a millisecond of real time: a few drains at most
            await server.run_until_idle()
            if (await flow.instance(instance_id))["status"] == "completed":
                break
    assert [m["template"] for m in await flow.sent()] == ["hello", "again"]
