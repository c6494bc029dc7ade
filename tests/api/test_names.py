"""Free-text names (event names, a campaign id, topics, segments, project and key names, the
topics of a user's preferences) hold no C0 or C1 control character: they are written to logs,
sent to providers and shown in UIs. Each such value is a 400 naming its field; the same name
without it is accepted."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from notifkit.text import escape_control_chars
from tests.api.conftest import Api, Project, Reply

# NUL is refused earlier, as PostgreSQL cannot store it; these reach the field checks.
CONTROLS = ["\x01", "\t", "\n", "\r", "\x1b", "\x7f", "\x80", "\x85", "\x9f"]
# Spaces, punctuation and other scripts are a name's own.
GOOD = "Black Friday — «Grüße» 2026 ✓"

Send = Callable[[Api, Project, str], Awaitable[Reply]]


async def _event(api: Api, project: Project, name: str) -> Reply:
    return await api.call("POST", "/v1/events", key=project.send,
                          json={"name": name, "userId": "u1"})


async def _wait_for_event(api: Api, project: Project, name: str) -> Reply:
    return await api.call("PUT", "/v1/workflows/w", key=project.full, json={"steps": [
        {"type": "waitForEvent", "event": name, "timeoutSeconds": 60}]})


def _notification(field: str) -> Send:
    async def send(api: Api, project: Project, name: str) -> Reply:
        await api.call("PUT", "/v1/templates/t", key=project.full,
                       json={"channels": {"sms": {"text": "hi"}}})
        body: dict[str, Any] = {"to": "u1", "template": "t"}
        if field == "campaignId":
            body["campaignId"] = name
        else:
            body["to"] = {"segment": name}
        return await api.call("POST", "/v1/notifications", key=project.send, json=body)
    return send


async def _topic(api: Api, project: Project, name: str) -> Reply:
    return await api.call("PUT", "/v1/templates/t", key=project.full,
                          json={"topic": name, "channels": {"sms": {"text": "hi"}}})


async def _segment(api: Api, project: Project, name: str) -> Reply:
    return await api.call("PUT", "/v1/users/u1", key=project.full,
                          json={"segments": ["beta", name]})


async def _preference_topic(api: Api, project: Project, name: str) -> Reply:
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    return await api.call("PUT", "/v1/users/u1/preferences", key=project.full,
                          json={"topics": {"billing": True, name: False}})


async def _project_name(api: Api, project: Project, name: str) -> Reply:
    return await api.admin("POST", "/v1/projects", json={"name": name})


async def _key_name(api: Api, project: Project, name: str) -> Reply:
    return await api.admin("POST", f"/v1/projects/{project.id}/keys",
                           json={"role": "send", "name": name})


FIELDS: list[tuple[str, Send, str, tuple[int, ...]]] = [
    ("event name", _event, "name", (202,)),
    ("waitForEvent event", _wait_for_event, "steps[0].event", (200, 201)),
    ("campaignId", _notification("campaignId"), "campaignId", (202,)),
    ("send to a segment", _notification("segment"), "to.segment", (202,)),
    ("template topic", _topic, "topic", (200, 201)),
    ("user segment", _segment, "segments[1]", (200, 201)),
    # A key names its field as any key does: the object's path, a dot, the key itself.
    ("preference topic", _preference_topic, "topics.{name}", (200,)),
    ("project name", _project_name, "name", (201,)),
    ("key name", _key_name, "name", (201,)),
]


@pytest.mark.parametrize(("label", "send", "field", "ok"), FIELDS,
                         ids=[f[0] for f in FIELDS])
async def test_a_name_with_a_control_character_is_a_400_naming_its_field(
    api: Api, project: Project, label: str, send: Send, field: str, ok: tuple[int, ...]
) -> None:
    for control in CONTROLS:
        for name in (f"promo{control}", f"{control}promo", f"pro{control}mo"):
            reply = await send(api, project, name)
            assert reply.status == 400, (label, name, reply.body)
            assert reply.error["details"] == [
                # The name as sent, its control character escaped (no raw one in an answer).
                {"field": field.replace("{name}", escape_control_chars(name)),
                 "message": "must not contain control characters"}
            ], (label, name)
    reply = await send(api, project, GOOD)
    assert reply.status in ok, (label, reply.body)
