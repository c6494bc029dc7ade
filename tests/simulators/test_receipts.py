"""Receipts arrive at the configured webhook signed as the real provider signs them, and
verify with the providers' own SDK verifiers and with simulators.signing."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qsl

import aiohttp
import pytest
import resend
from twilio.request_validator import RequestValidator

from simulators import ControlError, SimulatorServer
from simulators.signing import svix_verify, twilio_verify

SECRET = "whsec_" + base64.b64encode(b"notifkit-receipts-secret").decode()
TWILIO_SID = "AC" + "1" * 32
TWILIO_TOKEN = "auth-token-for-receipts"
# `receiver` (conftest.py) is a tiny aiohttp webhook endpoint that records every post.


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def send_resend(
    http: aiohttp.ClientSession, sim: SimulatorServer, to: str = "ada@example.com"
) -> str:
    body = {
        "from": "noreply@example.com",
        "to": [to],
        "subject": "Receipt test",
        "text": "hello",
        "tags": [{"name": "notifkit_task_id", "value": "task-r"}],
    }
    headers = {"Authorization": "Bearer re_k"}
    async with http.post(f"{sim.base_url}/emails", json=body, headers=headers) as response:
        assert response.status == 200
        return str((await response.json())["id"])


def verify_svix(received: Any) -> dict[str, Any]:
    assert svix_verify(SECRET, received.headers, received.body)
    return json.loads(received.body)  # type: ignore[no-any-return]


async def test_resend_delivery_receipt_is_svix_signed(
    http: aiohttp.ClientSession, sim: SimulatorServer, receiver: Any
) -> None:
    await sim.set_receipts(receiver.url, SECRET)

    email_id = await send_resend(http, sim)

    [received] = await receiver.wait_for(1)
    event = verify_svix(received)
    assert event["type"] == "email.delivered"
    assert event["data"]["email_id"] == email_id
    assert event["data"]["to"] == ["ada@example.com"]
    assert event["data"]["tags"] == {"notifkit_task_id": "task-r"}
    # The Resend SDK's own verifier accepts it too.
    resend.Webhooks.verify(
        {
            "payload": received.body.decode(),
            "headers": {
                "id": received.headers["svix-id"],
                "timestamp": received.headers["svix-timestamp"],
                "signature": received.headers["svix-signature"],
            },
            "webhook_secret": SECRET,
        }
    )


async def test_resend_test_addresses_decide_the_outcome(
    http: aiohttp.ClientSession, sim: SimulatorServer, receiver: Any
) -> None:
    await sim.set_receipts(receiver.url, SECRET)

    await send_resend(http, sim, to="bounced@resend.dev")
    await send_resend(http, sim, to="complained@resend.dev")
    await sim.drain_receipts()

    types = sorted(verify_svix(r)["type"] for r in await receiver.wait_for(3))
    assert types == ["email.bounced", "email.complained", "email.delivered"]
    bounce = next(verify_svix(r) for r in receiver.requests if b"bounced" in r.body)
    assert bounce["data"]["bounce"]["type"] == "Permanent"


async def test_engagement_events_follow_delivery(
    http: aiohttp.ClientSession, sim: SimulatorServer, receiver: Any
) -> None:
    await sim.set_receipts(receiver.url, SECRET, opened=1, clicked=1)
    await send_resend(http, sim)
    types = [verify_svix(r)["type"] for r in await receiver.wait_for(3)]
    assert types == ["email.delivered", "email.opened", "email.clicked"]


async def test_twilio_status_callback_is_signed_with_the_auth_token(
    http: aiohttp.ClientSession, sim: SimulatorServer, receiver: Any
) -> None:
    await sim.set_receipts("http://127.0.0.1:9/unused", SECRET, bounced=1)
    callback = receiver.url + "?notifkit_task_id=task-t"
    form = {"To": "+15558675310", "From": "+15017122661", "Body": "hi", "StatusCallback": callback}
    url = f"{sim.base_url}/2010-04-01/Accounts/{TWILIO_SID}/Messages.json"
    credentials = base64.b64encode(f"{TWILIO_SID}:{TWILIO_TOKEN}".encode()).decode()
    headers = {"Authorization": f"Basic {credentials}"}
    async with http.post(url, data=form, headers=headers) as response:
        assert response.status == 201
        sid = (await response.json())["sid"]

    [received] = await receiver.wait_for(1)
    params = dict(parse_qsl(received.body.decode()))
    assert params["MessageSid"] == sid
    assert params["MessageStatus"] == "undelivered"
    assert params["ErrorCode"] == "30003"
    signature = received.headers["X-Twilio-Signature"]
    assert twilio_verify(TWILIO_TOKEN, callback, params, signature)
    assert RequestValidator(TWILIO_TOKEN).validate(callback, params, signature)


async def test_fcm_posts_generic_signed_events(
    http: aiohttp.ClientSession, sim: SimulatorServer, receiver: Any
) -> None:
    await sim.set_receipts(receiver.url, SECRET)
    headers = {"Authorization": "Bearer key", "X-Notifkit-Task-Id": "task-g"}
    url = f"{sim.base_url}/v1/projects/p/messages:send"
    body = {"message": {"token": "device-1", "notification": {"title": "t"}}}
    async with http.post(url, json=body, headers=headers) as response:
        assert response.status < 300

    [received] = await receiver.wait_for(1)
    event = verify_svix(received)
    [record] = await sim.messages("fcm")
    assert event["type"] == "push.delivered"
    assert event["data"] == {
        "provider": "fcm",
        "message_id": record["id"],
        "to": record["to"],
        "task_id": "task-g",
    }


async def test_sendgrid_posts_its_event_webhooks_list(
    http: aiohttp.ClientSession, sim: SimulatorServer, receiver: Any
) -> None:
    """SendGrid's Event Webhook body: a list of events naming the message as
    ``{X-Message-Id}.filter…``, the send's custom_args echoed as fields of their own."""
    await sim.set_receipts(receiver.url, SECRET, bounced=0.0, opened=1.0)
    body = {
        "personalizations": [{"to": [{"email": "ada@example.com"}]}],
        "from": {"email": "noreply@example.com"}, "subject": "s",
        "content": [{"type": "text/plain", "value": "v"}],
        "custom_args": {"notifkit_task_id": "task-g"},
    }
    async with http.post(f"{sim.base_url}/v3/mail/send", json=body,
                         headers={"Authorization": "Bearer key"}) as response:
        assert response.status == 202
        message_id = response.headers["X-Message-Id"]

    received = await receiver.wait_for(2)
    for r in received:
        assert svix_verify(SECRET, r.headers, r.body)
    events: list[dict[str, Any]] = [item for r in received for item in json.loads(r.body)]
    assert [e["event"] for e in events] == ["delivered", "open"]
    for event in events:
        assert event["email"] == "ada@example.com"
        assert event["sg_message_id"].split(".", 1)[0] == message_id
        assert event["notifkit_task_id"] == "task-g"
        assert isinstance(event["timestamp"], int)
    assert len({e["sg_event_id"] for e in events}) == 2


async def test_failed_webhook_is_retried_then_counted(
    http: aiohttp.ClientSession, sim: SimulatorServer, receiver: Any
) -> None:
    receiver.status = 500
    await sim.set_receipts(receiver.url, SECRET)
    await send_resend(http, sim)
    await sim.drain_receipts()
    assert len(receiver.requests) == 3
    assert (await sim.receipts())["failed"] == 1


async def test_no_receipts_when_delivery_probability_is_zero(
    http: aiohttp.ClientSession, sim: SimulatorServer, receiver: Any
) -> None:
    await sim.set_receipts(receiver.url, SECRET, delivered=0)
    await send_resend(http, sim)
    await sim.drain_receipts()
    assert receiver.requests == []


async def test_reset_drops_receipts_of_the_messages_it_forgets(
    http: aiohttp.ClientSession, sim: SimulatorServer, receiver: Any
) -> None:
    # A suite that resets between tests must not get the previous test's receipts.
    await sim.set_receipts(receiver.url, SECRET, delay_ms=300)
    await send_resend(http, sim)
    assert (await sim.receipts())["pending"] == 1

    await sim.reset()

    assert (await sim.receipts())["pending"] == 0
    await asyncio.sleep(0.6)
    assert receiver.requests == []
    assert (await sim.receipts())["sent"] == 0
    # The configuration stays: a message sent after the reset gets its receipt.
    await send_resend(http, sim)
    [received] = await receiver.wait_for(1)
    assert verify_svix(received)["type"] == "email.delivered"


async def test_no_receipt_is_posted_once_receipts_are_turned_off(
    http: aiohttp.ClientSession, sim: SimulatorServer, receiver: Any
) -> None:
    await sim.set_receipts(receiver.url, SECRET, delay_ms=300)
    email_id = await send_resend(http, sim)

    await sim.disable_receipts()
    await sim.drain_receipts()

    assert receiver.requests == []
    assert (await sim.receipts())["sent"] == 0
    # The message still met its fate; only the webhook is not sent.
    async with http.get(f"{sim.base_url}/emails/{email_id}",
                        headers={"Authorization": "Bearer re_k"}) as response:
        assert (await response.json())["last_event"] == "delivered"


async def test_receipt_outcomes_replay_with_the_seed(receiver: Any) -> None:
    async def outcomes(seed: int) -> list[tuple[str, str]]:
        receiver.requests.clear()
        async with (
            SimulatorServer(seed=seed, smtp_port=None) as sim,
            aiohttp.ClientSession() as http,
        ):
            await sim.set_receipts(receiver.url, SECRET, bounced=0.5)
            for _ in range(12):
                await send_resend(http, sim)
            await sim.drain_receipts()
        return sorted(
            (verify_svix(r)["data"]["email_id"], verify_svix(r)["type"]) for r in receiver.requests
        )

    first, second = await outcomes(5), await outcomes(5)
    assert first == second
    assert {kind for _, kind in first} == {"email.delivered", "email.bounced"}


@pytest.mark.parametrize(
    "url",
    [
        "http://[::1/x",  # an unbalanced IPv6 bracket
        "http://a:99999/x",  # no such port: every receipt would fail
        "http://a:0/x",
        "http://a:-1/x",
        "http://a:http/x",
        "http://:8080/x",  # a port but no host
        "https:///x",
        "ftp://a/x",
        "a/x",
        # No URL holds raw whitespace or control characters; quoted on the way out, they
        # would post somewhere other than what was given (and break the log's lines).
        "http://a/x\r\nX-Injected: 1",
        "http://a/x y",
        "http://a/x?q=\x00",
        "http://a/x\t",
    ],
)
async def test_a_webhook_url_receipts_could_not_be_posted_to_is_400_naming_url(
    http: aiohttp.ClientSession, sim: SimulatorServer, url: str
) -> None:
    body = {"url": url, "secret": "s"}
    async with http.post(f"{sim.base_url}/_sim/receipts", json=body) as response:
        assert response.status == 400, await response.text()
        assert "'url'" in (await response.json())["error"]
    with pytest.raises(ControlError) as caught:
        await sim.set_receipts(url, "s")
    assert "'url'" in caught.value.message
    assert not (await sim.receipts())["enabled"]


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:65535/h", "https://[::1]:8443/h?x=1", "http://hooks.example/"]
)
async def test_a_webhook_url_with_a_host_and_a_usable_port_is_taken(
    sim: SimulatorServer, url: str
) -> None:
    assert (await sim.set_receipts(url, "s"))["url"] == url
