"""POST /v1/notifications/{eventId}/cancel at the API: who may cancel what, and the answers.

What a cancel does to tasks in the scheduler is in tests/scheduling/test_cancel.py; here no
pipeline runs, so a send with a future sendAt is still on its way to the scheduler.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.api.conftest import Api, Project


@pytest.fixture
async def template(api: Api, project: Project) -> str:
    reply = await api.call("PUT", "/v1/templates/invoice", key=project.full, json={
        "channels": {"email": {"subject": "s", "text": "t"}}})
    assert reply.status == 201, reply.body
    return "invoice"


def in_an_hour() -> str:
    return (datetime.now(UTC) + timedelta(hours=1)).isoformat().replace("+00:00", "Z")


async def send(api: Api, project: Project, template: str, **fields: Any) -> str:
    reply = await api.call("POST", "/v1/notifications", key=project.send,
                           json={"to": "u1", "template": template, **fields})
    assert reply.status == 202, reply.body
    event_id: str = reply.body["id"]
    return event_id


async def test_a_scheduled_send_is_canceled_and_shows_it_as_get_does(
    api: Api, project: Project, template: str
) -> None:
    event_id = await send(api, project, template, sendAt=in_an_hour())

    reply = await api.call("POST", f"/v1/notifications/{event_id}/cancel", key=project.full)

    assert reply.status == 200, reply.body
    shown = await api.call("GET", f"/v1/notifications/{event_id}", key=project.full)
    assert reply.body == shown.body
    assert reply.body["id"] == event_id
    assert reply.body["status"] == "skipped"
    [canceled] = [row for row in reply.body["timeline"] if row["kind"] == "canceled"]
    assert canceled["status"] == "skipped"
    assert "canceled by the API caller" in canceled["detail"]


async def test_canceling_again_answers_200_with_the_same_notification(
    api: Api, project: Project, template: str
) -> None:
    event_id = await send(api, project, template, sendAt=in_an_hour())
    first = await api.call("POST", f"/v1/notifications/{event_id}/cancel", key=project.full)
    again = await api.call("POST", f"/v1/notifications/{event_id}/cancel", key=project.full)
    assert (first.status, again.status) == (200, 200), (first.body, again.body)
    assert first.body == again.body
    assert [row["kind"] for row in again.body["timeline"]].count("canceled") == 1


async def test_a_send_key_may_not_cancel(
    api: Api, project: Project, template: str
) -> None:
    """API.md's send role covers three routes only (send, events, workflow triggers)."""
    event_id = await send(api, project, template, sendAt=in_an_hour())
    reply = await api.call("POST", f"/v1/notifications/{event_id}/cancel", key=project.send)
    assert reply.status == 403, reply.body
    shown = await api.call("GET", f"/v1/notifications/{event_id}", key=project.full)
    assert "canceled" not in [row["kind"] for row in shown.body["timeline"]]


async def test_a_send_without_send_at_has_nothing_to_cancel(
    api: Api, project: Project, template: str
) -> None:
    event_id = await send(api, project, template)
    reply = await api.call("POST", f"/v1/notifications/{event_id}/cancel", key=project.full)
    assert reply.status == 409, reply.body
    assert reply.error["code"] == "nothing_to_cancel"
    assert "nothing" in reply.error["message"].lower()
    # ... and it is not recorded as canceled
    shown = await api.call("GET", f"/v1/notifications/{event_id}", key=project.full)
    assert "canceled" not in [row["kind"] for row in shown.body["timeline"]]


async def test_a_send_at_in_the_past_has_nothing_to_cancel(
    api: Api, project: Project, template: str
) -> None:
    event_id = await send(api, project, template, sendAt="2020-01-01T00:00:00Z")
    reply = await api.call("POST", f"/v1/notifications/{event_id}/cancel", key=project.full)
    assert reply.status == 409, reply.body
    assert reply.error["code"] == "nothing_to_cancel"


@pytest.mark.parametrize("event_id", ["0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", "not-a-uuid"])
async def test_an_unknown_notification_is_404(
    api: Api, project: Project, event_id: str
) -> None:
    reply = await api.call("POST", f"/v1/notifications/{event_id}/cancel", key=project.full)
    assert reply.status == 404, reply.body
    assert reply.error["code"] == "notification_not_found"


async def test_another_projects_notification_is_404_and_stays_scheduled(
    api: Api, project: Project, template: str
) -> None:
    event_id = await send(api, project, template, sendAt=in_an_hour())
    other = await api.project("other")

    reply = await api.call("POST", f"/v1/notifications/{event_id}/cancel", key=other.full)
    assert reply.status == 404, reply.body
    assert reply.error["code"] == "notification_not_found"
    as_admin = await api.admin("POST", f"/v1/notifications/{event_id}/cancel",
                               project=other.id)
    assert as_admin.status == 404, as_admin.body

    shown = await api.call("GET", f"/v1/notifications/{event_id}", key=project.full)
    assert "canceled" not in [row["kind"] for row in shown.body["timeline"]]


async def test_the_admin_key_cancels_for_the_project_it_names(
    api: Api, project: Project, template: str
) -> None:
    event_id = await send(api, project, template, sendAt=in_an_hour())
    unnamed = await api.admin("POST", f"/v1/notifications/{event_id}/cancel")
    assert unnamed.status == 400, unnamed.body
    named = await api.admin("POST", f"/v1/notifications/{event_id}/cancel", project=project.id)
    assert named.status == 200, named.body


async def test_cancel_needs_a_key(api: Api, project: Project, template: str) -> None:
    event_id = await send(api, project, template, sendAt=in_an_hour())
    reply = await api.call("POST", f"/v1/notifications/{event_id}/cancel")
    assert reply.status == 401, reply.body


async def test_the_openapi_document_declares_the_route(api: Api) -> None:
    reply = await api.call("GET", "/openapi.json")
    assert reply.status == 200
    cancel = reply.body["paths"]["/v1/notifications/{eventId}/cancel"]["post"]
    assert cancel["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Notification"}
    assert "nothing_to_cancel" in cancel["responses"]["409"]["description"]
    assert {"404", "401", "403"} <= set(cancel["responses"])
