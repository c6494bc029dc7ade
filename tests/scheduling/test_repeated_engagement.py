"""Engagement a provider reports more than once, through the webhook route, the events service
and the workflow service. Each distinct webhook delivery (the user opening or clicking the
same message again) is a new event and wakes a workflow that began waiting after the first;
the provider retrying one delivery (the same delivery id) is the same event and changes
nothing twice. For every provider the route accepts, each told apart its own way."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import asyncpg
import pytest
from redis.asyncio import Redis

from notifkit.config import Settings, WebhookSecrets
from notifkit.ids import uuid7
from notifkit.keys import Keys
from notifkit.services.events import EventsService
from notifkit.services.workflow import WorkflowService
from notifkit.streams import xadd
from simulators.signing import svix_headers, twilio_sign
from tests.api.conftest import ApiClient, start_api

from .pipeline import drain

SECRET = "engagement-webhook-secret"
TWILIO_TOKEN = "twilio-auth-token-engagement"
USER = "user-1"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# One webhook delivery of a click on message ``mid``, as each provider posts it: (body, headers).
# ``delivery`` is what tells the provider's deliveries apart; posting the same one again is
# the provider retrying it.
Post = Callable[[str, str, str], tuple[str, dict[str, str]]]


def _svix(body: dict[str, Any] | list[Any], delivery: str | None) -> tuple[str, dict[str, str]]:
    text = json.dumps(body)
    return text, {"Content-Type": "application/json",
                  **svix_headers(SECRET, text, msg_id=delivery)}


def resend_click(mid: str, task: str, delivery: str) -> tuple[str, dict[str, str]]:
    return _svix({"type": "email.clicked", "created_at": now_iso(), "data": {
        "email_id": mid, "to": ["ada@example.com"],
        "tags": [{"name": "task_id", "value": task}],
        "click": {"link": "https://example.com/offer", "timestamp": now_iso()}}}, delivery)


def simulator_click(provider: str, channel: str) -> Post:
    """The simulators' receipts for SendGrid, SMTP and FCM (Svix-signed)."""

    def post(mid: str, task: str, delivery: str) -> tuple[str, dict[str, str]]:
        return _svix({"type": f"{channel}.clicked", "created_at": now_iso(), "data": {
            "provider": provider, "message_id": mid, "to": "ada@example.com",
            "task_id": task}}, delivery)

    return post


def sendgrid_event_click(mid: str, task: str, delivery: str) -> tuple[str, dict[str, str]]:
    """SendGrid's own event list: each event carries its sg_event_id, the same in every batch
    that repeats it, while the batch around it (and its Svix id here) may differ."""
    return _svix([{"event": "click", "sg_message_id": f"{mid}.filter0001",
                   "sg_event_id": delivery, "email": "ada@example.com",
                   "timestamp": int(datetime.now(UTC).timestamp()),
                   "url": "https://example.com/offer", "notifkit_task_id": task}], None)


@dataclass(frozen=True)
class Case:
    name: str
    provider: str
    channel: str
    post: Post


CASES = [
    Case("resend", "resend", "email", resend_click),
    Case("sendgrid-simulated", "sendgrid", "email", simulator_click("sendgrid", "email")),
    Case("sendgrid-events", "sendgrid", "email", sendgrid_event_click),
    Case("smtp", "smtp", "email", simulator_click("smtp", "email")),
    Case("fcm", "fcm", "push", simulator_click("fcm", "push")),
]


@dataclass
class Rig:
    """The api (for the webhook route), the events and the workflow services."""

    http: ApiClient
    events: EventsService
    workflow: WorkflowService
    db: asyncpg.Pool
    redis: Redis
    keys: Keys
    project_id: str
    public_url: str

    async def post(self, provider: str, body: str, headers: dict[str, str]) -> None:
        path = f"/v1/webhooks/{provider}/{self.project_id}"
        async with self.http.post(path, data=body, headers=headers) as reply:
            assert reply.status == 200, await reply.text()
            assert (await reply.json())["received"] == 1
        await drain(self.events, self.workflow)

    async def sent(self, task_id: str, provider: str, channel: str, message_id: str) -> None:
        """What delivery leaves behind once the provider accepted a message to the user."""
        await self.db.execute(
            "INSERT INTO delivery_outbox (task_id, channel, destination, project_id, provider, "
            "provider_message_id, status) VALUES ($1, $2, 'ada@example.com', $3, $4, $5, "
            "'sent')", task_id, channel, self.project_id, provider, message_id)
        await xadd(self.redis, self.keys.events_inbound, {
            "type": "notification:sent", "projectId": self.project_id, "eventId": uuid7(),
            "taskId": task_id, "userId": USER, "channel": channel, "provider": provider,
            "providerMessageId": message_id, "attempt": 1, "at": now_iso()}, maxlen=10_000)

    async def start(self, event: str, waits: int) -> str:
        """An instance of a workflow that waits for ``event`` ``waits`` times in a row."""
        steps = [{"type": "waitForEvent", "event": event, "timeoutSeconds": 3600}] * waits
        await self.db.execute(
            "INSERT INTO workflow_definitions (project_id, id, steps) VALUES ($1, 'w', $2)",
            self.project_id, steps)
        instance_id = uuid7()
        await self.db.execute(
            "INSERT INTO workflow_instances (id, project_id, workflow_id, user_id, status, "
            "steps) VALUES ($1, $2, 'w', $3, 'pending', $4)",
            instance_id, self.project_id, USER, steps)
        await xadd(self.redis, self.keys.workflow_inbound, {
            "type": "trigger", "projectId": self.project_id, "workflowId": "w",
            "instanceId": instance_id, "userId": USER, "data": {}}, 10_000)
        await drain(self.events, self.workflow)
        return instance_id

    async def waits_resolved(self, instance_id: str) -> list[str | None]:
        """The id of the event each of the instance's waits took so far (None: still open)."""
        rows = await self.db.fetch(
            "SELECT status, output FROM workflow_steps WHERE instance_id = $1 "
            "ORDER BY step_index", instance_id)
        return [r["output"]["id"] if r["status"] == "completed" else None for r in rows]

    async def timeline(self, task_id: str) -> list[str]:
        rows = await self.db.fetch("SELECT kind FROM message_logs WHERE task_id = $1 "
                                   "ORDER BY id", task_id)
        return [r["kind"] for r in rows]


@pytest.fixture
async def rig(settings: Settings, db: asyncpg.Pool, redis: Redis, keys: Keys,
              project_id: str) -> AsyncIterator[Rig]:
    s = settings.replace(webhooks=WebhookSecrets(
        resend=SECRET, sendgrid=SECRET, fcm=SECRET, smtp=SECRET,
        twilio_auth_token=TWILIO_TOKEN))
    _server, client = await start_api(s)
    events = EventsService(s, consumer="events-test")
    workflow = WorkflowService(s)
    try:
        yield Rig(client, events, workflow, db, redis, keys, project_id, s.public_url)
    finally:
        await workflow.close()
        await events.close()
        await client.close()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
async def test_a_second_click_wakes_a_wait_begun_after_the_first_and_retries_change_nothing(
    rig: Rig, case: Case,
) -> None:
    await rig.sent("task-1", case.provider, case.channel, "msg-1")
    instance_id = await rig.start("clicked", waits=3)
    assert await rig.waits_resolved(instance_id) == [None]
    # The user clicks: the first wait takes the click and the instance waits again.
    await rig.post(case.provider, *case.post("msg-1", "task-1", "delivery-a"))
    [first, second] = await rig.waits_resolved(instance_id)
    assert first is not None
    assert second is None
    # A second click, a delivery of its own, is a new event: the second wait takes it.
    await rig.post(case.provider, *case.post("msg-1", "task-1", "delivery-b"))
    [first_again, second, third] = await rig.waits_resolved(instance_id)
    assert (first_again, third) == (first, None)
    assert second is not None
    assert second != first
    # The provider retrying both deliveries changes nothing: the third wait stays open.
    await rig.post(case.provider, *case.post("msg-1", "task-1", "delivery-a"))
    await rig.post(case.provider, *case.post("msg-1", "task-1", "delivery-b"))
    assert await rig.waits_resolved(instance_id) == [first, second, None]
    # A third click wakes it.
    await rig.post(case.provider, *case.post("msg-1", "task-1", "delivery-c"))
    resolved = await rig.waits_resolved(instance_id)
    assert resolved[:2] == [first, second]
    assert resolved[2] not in (None, first, second)
    status = await rig.db.fetchval("SELECT status FROM workflow_instances WHERE id = $1",
                                   instance_id)
    assert status == "completed"
    # The timeline keeps one row per kind of engagement (its key is task, channel, attempt
    # and kind), so the clicks show once.
    assert await rig.timeline("task-1") == ["sent", "clicked"]


async def test_a_twilio_status_reported_again_is_the_same_event(rig: Rig) -> None:
    """Twilio reports each status of a message once; a callback repeating it (a retry, however
    its request is marked) is that report again and wakes no second wait."""
    await rig.sent("task-1", "twilio", "sms", "SM1")
    instance_id = await rig.start("delivered", waits=2)
    path = f"/v1/webhooks/twilio/{rig.project_id}"
    params = {"MessageSid": "SM1", "MessageStatus": "delivered", "To": "+14155550100"}
    signed_url = rig.public_url + path
    for token in ("idem-1", "idem-2"):
        await rig.post("twilio", urlencode(params), {
            "Content-Type": "application/x-www-form-urlencoded",
            "X-Twilio-Signature": twilio_sign(TWILIO_TOKEN, signed_url, params),
            "I-Twilio-Idempotency-Token": token})
    [delivered, still_open] = await rig.waits_resolved(instance_id)
    assert delivered is not None
    assert still_open is None
    assert await rig.timeline("task-1") == ["sent", "delivered"]
