"""Provider webhooks (signature-checked, to events:inbound) and signed unsubscribe links."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlencode

import asyncpg
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from redis.asyncio import Redis

from notifkit.clock import utc_now_iso
from notifkit.config import Settings, WebhookSecrets
from notifkit.keys import Keys
from notifkit.streams import decode
from notifkit.unsubscribe import make_token
from simulators.kinds import Provider
from simulators.receipts import ReceiptConfig, build_delivery
from simulators.records import MessageRecord
from simulators.signing import svix_headers, twilio_sign
from tests.api.conftest import Api, Project, running_api
from tests.support.streams import xrange

RESEND_SECRET = "whsec_" + base64.b64encode(b"resend-webhook-key-0123456789").decode()
SHARED_SECRET = "sim-shared-webhook-secret"
TWILIO_TOKEN = "twilio-auth-token-0123456789"


@pytest.fixture
async def hooks(api_settings: Settings) -> AsyncIterator[Api]:
    settings = api_settings.replace(webhooks=WebhookSecrets(
        resend=RESEND_SECRET, sendgrid=SHARED_SECRET, fcm=SHARED_SECRET, smtp=SHARED_SECRET,
        twilio_auth_token=TWILIO_TOKEN))
    async with running_api(settings) as api:
        yield api


async def receipts(redis: Redis, api: Api) -> list[dict[str, Any]]:
    entries = await xrange(redis, Keys(api.settings.namespace).events_inbound)
    return [decode(fields) for _id, fields in entries]


RESEND_BOUNCE = {"type": "email.bounced", "created_at": "2030-01-01T00:00:00.000Z",
                 "data": {"email_id": "re_123", "to": ["ada@example.com"],
                          "tags": [{"name": "task_id", "value": "task-1"}]}}


async def test_a_signed_resend_receipt_goes_to_the_events_stream(
    hooks: Api, redis: Redis
) -> None:
    project = await hooks.project()
    body = json.dumps(RESEND_BOUNCE)
    reply = await hooks.call("POST", f"/v1/webhooks/resend/{project.id}", data=body,
                             headers={"Content-Type": "application/json",
                                      **svix_headers(RESEND_SECRET, body)})
    assert reply.status == 200
    assert reply.body == {"received": 1, "ignored": 0}
    [receipt] = await receipts(redis, hooks)
    assert receipt == {
        "type": "receipt", "projectId": project.id, "provider": "resend", "channel": "email",
        "providerMessageId": "re_123", "kind": "bounced", "at": "2030-01-01T00:00:00.000Z",
        "raw": RESEND_BOUNCE, "taskId": "task-1", "to": "ada@example.com",
        "webhookId": receipt["webhookId"]}


async def test_svixs_unbranded_header_names_are_taken_too(hooks: Api, redis: Redis) -> None:
    """Svix sends Standard Webhooks' names (webhook-id, ...) to some accounts, and its own
    verifiers take either: the same signature under those names is the same receipt."""
    project = await hooks.project()
    body = json.dumps(RESEND_BOUNCE)
    unbranded = {name.replace("svix-", "webhook-"): value
                 for name, value in svix_headers(RESEND_SECRET, body).items()}
    reply = await hooks.call("POST", f"/v1/webhooks/resend/{project.id}", data=body,
                             headers={"Content-Type": "application/json", **unbranded})
    assert (reply.status, reply.body) == (200, {"received": 1, "ignored": 0})
    [receipt] = await receipts(redis, hooks)
    assert receipt["webhookId"] == f"resend:{unbranded['webhook-id']}:0"
    # ... and a bad one under those names is refused as under Svix's
    unbranded["webhook-signature"] = "v1,AAAA"
    refused = await hooks.call("POST", f"/v1/webhooks/resend/{project.id}", data=body,
                               headers={"Content-Type": "application/json", **unbranded})
    assert refused.status == 401


@pytest.mark.parametrize("headers", [
    {},
    {"svix-id": "msg_1", "svix-timestamp": str(int(time.time())), "svix-signature": "v1,AAAA"},
    svix_headers("another-secret", json.dumps(RESEND_BOUNCE)),
    svix_headers(RESEND_SECRET, json.dumps(RESEND_BOUNCE), timestamp=int(time.time()) - 600),
    svix_headers(RESEND_SECRET, json.dumps({**RESEND_BOUNCE, "type": "email.delivered"})),
    # a good signature under a scheme other than v1: only v1 is HMAC-SHA256
    {k: v.replace("v1,", "v2,") for k, v in
     svix_headers(RESEND_SECRET, json.dumps(RESEND_BOUNCE)).items()},
])
async def test_a_bad_signature_is_401_and_records_nothing(
    hooks: Api, redis: Redis, headers: dict[str, str]
) -> None:
    project = await hooks.project()
    reply = await hooks.call("POST", f"/v1/webhooks/resend/{project.id}",
                             data=json.dumps(RESEND_BOUNCE),
                             headers={"Content-Type": "application/json", **headers})
    assert reply.status == 401
    assert reply.error["code"] in ("invalid_signature",)
    assert await receipts(redis, hooks) == []



async def test_a_signature_covers_the_body_as_sent_white_space_included(
    hooks: Api, redis: Redis
) -> None:
    """Svix signs the raw body: one ending in a newline verifies as sent, and the same
    signature does not hold for the body without it."""
    project = await hooks.project()
    url = f"/v1/webhooks/resend/{project.id}"
    body = json.dumps(RESEND_BOUNCE) + "\n"
    headers = {"Content-Type": "application/json", **svix_headers(RESEND_SECRET, body)}
    assert (await hooks.call("POST", url, data=body.strip(), headers=headers)).status == 401
    assert (await hooks.call("POST", url, data=body, headers=headers)).status == 200
    assert [r["kind"] for r in await receipts(redis, hooks)] == ["bounced"]


async def test_svix_signatures_follow_svix_on_rotation_and_clock_skew(
    hooks: Api, redis: Redis
) -> None:
    """During a secret rotation Svix sends a signature per secret, any of which may match; a
    timestamp more than 5 minutes ahead is refused like one 5 minutes old."""
    project = await hooks.project()
    body = json.dumps(RESEND_BOUNCE)
    good = svix_headers(RESEND_SECRET, body)
    rotated = {**good, "svix-signature": "v1,c29tZXRoaW5nIGVsc2U= " + good["svix-signature"]}
    future = svix_headers(RESEND_SECRET, body, timestamp=int(time.time()) + 600)
    url = f"/v1/webhooks/resend/{project.id}"
    json_type = {"Content-Type": "application/json"}
    assert (await hooks.call("POST", url, data=body, headers={**json_type, **future})
            ).status == 401
    assert await receipts(redis, hooks) == []
    assert (await hooks.call("POST", url, data=body, headers={**json_type, **rotated})
            ).status == 200
    assert [r["kind"] for r in await receipts(redis, hooks)] == ["bounced"]

def _signed_with(key: bytes, body: str) -> dict[str, str]:
    msg_id, timestamp = "msg_one_reading", str(int(time.time()))
    digest = hmac.new(key, f"{msg_id}.{timestamp}.{body}".encode(), hashlib.sha256).digest()
    return {"Content-Type": "application/json", "svix-id": msg_id, "svix-timestamp": timestamp,
            "svix-signature": "v1," + base64.b64encode(digest).decode()}


async def test_a_secret_without_the_prefix_takes_a_signature_of_either_reading(
    api_settings: Settings, redis: Redis
) -> None:
    """A sender signing with the official svix library base64-decodes a secret whether or not
    it starts with whsec_; one signing with the secret's bytes does not. Both are taken."""
    secret = base64.b64encode(b"an-unprefixed-svix-key").decode()
    settings = api_settings.replace(webhooks=WebhookSecrets(fcm=secret))
    async with running_api(settings) as api:
        project = await api.project()
        url = f"/v1/webhooks/fcm/{project.id}"
        for n, key in enumerate((secret.encode(), base64.b64decode(secret), b"wrong-key")):
            body = json.dumps({"type": "push.opened", "created_at": "2030-01-01T00:00:00Z",
                               "data": {"provider": "fcm", "message_id": f"m{n}", "to": "x",
                                        "task_id": f"t{n}"}})
            reply = await api.call("POST", url, data=body, headers=_signed_with(key, body))
            assert reply.status == (401 if key == b"wrong-key" else 200)
        assert [r["taskId"] for r in await receipts(redis, api)] == ["t0", "t1"]


async def test_simulator_style_receipts_for_other_providers(hooks: Api, redis: Redis) -> None:
    project = await hooks.project()
    for provider, event in (("fcm", "push.opened"), ("sendgrid", "email.complained"),
                            ("smtp", "email.sent")):
        body = json.dumps({"type": event, "created_at": "2030-01-01T00:00:00Z", "data": {
            "provider": provider, "message_id": f"{provider}-1", "to": "x", "task_id": "t9"}})
        reply = await hooks.call("POST", f"/v1/webhooks/{provider}/{project.id}", data=body,
                                 headers={"Content-Type": "application/json",
                                          **svix_headers(SHARED_SECRET, body)})
        assert reply.status == 200
    kinds = [(r["provider"], r["channel"], r["kind"], r["taskId"])
             for r in await receipts(redis, hooks)]
    assert kinds == [("fcm", "push", "opened", "t9"), ("sendgrid", "email", "complained", "t9")]


async def test_sendgrid_event_lists(hooks: Api, redis: Redis) -> None:
    project = await hooks.project()
    body = json.dumps([
        {"event": "delivered", "sg_message_id": "abc.filter0001", "email": "a@b.co",
         "timestamp": 1900000000},
        {"event": "processed", "sg_message_id": "abc.filter0001"},
        {"event": "click", "sg_message_id": "abc.filter0001", "url": "https://x"}])
    reply = await hooks.call("POST", f"/v1/webhooks/sendgrid/{project.id}", data=body,
                             headers={"Content-Type": "application/json",
                                      **svix_headers(SHARED_SECRET, body)})
    assert reply.body == {"received": 2, "ignored": 1}
    assert [(r["kind"], r["providerMessageId"]) for r in await receipts(redis, hooks)] == [
        ("delivered", "abc"), ("clicked", "abc")]


@pytest.mark.parametrize(("event", "kind"), [("delivered", "delivered"),
                                             ("bounced", "bounced"),
                                             ("complained", "complained"),
                                             ("opened", "opened"), ("clicked", "clicked")])
async def test_the_sendgrid_simulators_receipts_are_taken_as_sendgrids(
    hooks: Api, redis: Redis, event: str, kind: str
) -> None:
    project = await hooks.project()
    record = MessageRecord("sg-msg-1", Provider.SENDGRID, ["ada@example.com"], "task-9", None,
                           {"custom_args": {"notifkit_task_id": "task-9"}})
    delivery = build_delivery(ReceiptConfig("http://unused", SHARED_SECRET), record, event)
    reply = await hooks.call("POST", f"/v1/webhooks/sendgrid/{project.id}",
                             data=delivery.body, headers=delivery.headers)
    assert reply.body == {"received": 1, "ignored": 0}
    [receipt] = await receipts(redis, hooks)
    assert (receipt["kind"], receipt["providerMessageId"], receipt["taskId"], receipt["to"]) \
        == (kind, "sg-msg-1", "task-9", "ada@example.com")
    assert receipt["webhookId"].startswith("sendgrid:sg_event_id:")
    # Posted to the one URL every provider's simulated receipts go to, it is SendGrid's still
    again = await hooks.call("POST", f"/v1/webhooks/fcm/{project.id}", data=delivery.body,
                             headers=delivery.headers)
    assert again.body == {"received": 1, "ignored": 0}
    assert (await receipts(redis, hooks))[-1]["provider"] == "sendgrid"


def sendgrid_signed(key: ec.EllipticCurvePrivateKey, body: str,
                    at: int | None = None) -> dict[str, str]:
    timestamp = str(int(time.time()) if at is None else at)
    signature = key.sign(timestamp.encode() + body.encode(), ec.ECDSA(hashes.SHA256()))
    return {"Content-Type": "application/json",
            "X-Twilio-Email-Event-Webhook-Signature": base64.b64encode(signature).decode(),
            "X-Twilio-Email-Event-Webhook-Timestamp": timestamp}


async def test_sendgrids_own_ecdsa_signed_event_posts_are_verified(
    api_settings: Settings, redis: Redis
) -> None:
    """A SendGrid account posting to notifkit directly signs with its ECDSA key, not Svix's
    scheme: with SENDGRID_WEBHOOK_PUBLIC_KEY its events are taken in, forgeries refused."""
    key = ec.generate_private_key(ec.SECP256R1())
    public = base64.b64encode(key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)).decode()
    settings = api_settings.replace(webhooks=WebhookSecrets(sendgrid_public_key=public))
    body = json.dumps([{"event": "bounce", "sg_message_id": "abc.filter0001",
                        "email": "a@b.co", "timestamp": 1900000000, "sg_event_id": "e1"}])
    async with running_api(settings) as api:
        project = await api.project()
        url = f"/v1/webhooks/sendgrid/{project.id}"
        forged = await api.call("POST", url, data=body,
                                headers=sendgrid_signed(ec.generate_private_key(ec.SECP256R1()),
                                                        body))
        stale = await api.call("POST", url, data=body,
                               headers=sendgrid_signed(key, body, int(time.time()) - 301))
        altered = await api.call("POST", url, data=body.replace("bounce", "open"),
                                 headers=sendgrid_signed(key, body))
        assert [r.status for r in (forged, stale, altered)] == [401, 401, 401]
        assert await receipts(redis, api) == []
        reply = await api.call("POST", url, data=body, headers=sendgrid_signed(key, body))
        assert reply.body == {"received": 1, "ignored": 0}
        [receipt] = await receipts(redis, api)
        assert (receipt["kind"], receipt["providerMessageId"], receipt["webhookId"]) == (
            "bounced", "abc", "sendgrid:sg_event_id:e1")
        # Svix-signed posts (the simulators') still need the Svix secret, which is not set
        svix = await api.call("POST", url, data=body, headers={
            "Content-Type": "application/json", **svix_headers(SHARED_SECRET, body)})
        assert (svix.status, svix.error["code"]) == (401, "webhook_not_configured")


async def test_an_ecdsa_signed_post_without_the_public_key_names_the_setting(
    hooks: Api
) -> None:
    project = await hooks.project()
    body = "[]"
    reply = await hooks.call("POST", f"/v1/webhooks/sendgrid/{project.id}", data=body,
                             headers=sendgrid_signed(ec.generate_private_key(ec.SECP256R1()),
                                                     body))
    assert (reply.status, reply.error["code"]) == (401, "webhook_not_configured")
    assert "SENDGRID_WEBHOOK_PUBLIC_KEY" in reply.error["message"]


@pytest.mark.parametrize("timestamp", [True, False, "1900000000", 10**15])
async def test_a_sendgrid_timestamp_that_is_no_epoch_number_reads_as_received_now(
    hooks: Api, redis: Redis, timestamp: object
) -> None:
    """JSON's true and false are no times (though Python's bool is an int): like a string or
    an out-of-range number, they leave the receipt timed when it arrived, not in 1970."""
    project = await hooks.project()
    body = json.dumps([{"event": "delivered", "sg_message_id": "abc.filter0001",
                        "email": "a@b.co", "timestamp": timestamp}])
    before = utc_now_iso()
    reply = await hooks.call("POST", f"/v1/webhooks/sendgrid/{project.id}", data=body,
                             headers={"Content-Type": "application/json",
                                      **svix_headers(SHARED_SECRET, body)})
    after = utc_now_iso()
    assert reply.body == {"received": 1, "ignored": 0}
    [receipt] = await receipts(redis, hooks)
    assert before <= receipt["at"] <= after, receipt["at"]


async def test_sendgrid_events_carry_the_task_id_echoed_from_custom_args(
    hooks: Api, redis: Redis,
) -> None:
    """The SendGrid transport sends custom_args.notifkit_task_id; SendGrid puts custom args at
    the top level of each event, and the receipt passes the task id on to the events
    service."""
    project = await hooks.project()
    body = json.dumps([{"event": "bounce", "sg_message_id": "abc.filter0001",
                        "email": "a@b.co", "notifkit_task_id": "task-7"}])
    reply = await hooks.call("POST", f"/v1/webhooks/sendgrid/{project.id}", data=body,
                             headers={"Content-Type": "application/json",
                                      **svix_headers(SHARED_SECRET, body)})
    assert reply.body == {"received": 1, "ignored": 0}
    assert [r.get("taskId") for r in await receipts(redis, hooks)] == ["task-7"]


async def test_a_large_sendgrid_batch_is_queued_whole(hooks: Api, redis: Redis) -> None:
    """SendGrid batches events up to about 768 KB, well over a thousand; the 200 tells it the
    whole batch arrived, so none may be left out."""
    project = await hooks.project()
    body = json.dumps([{"event": "bounce", "sg_message_id": f"m{i}.filter0001",
                        "email": f"user{i}@example.com", "timestamp": 1900000000}
                       for i in range(1500)])
    reply = await hooks.call("POST", f"/v1/webhooks/sendgrid/{project.id}", data=body,
                             headers={"Content-Type": "application/json",
                                      **svix_headers(SHARED_SECRET, body)})
    assert reply.body == {"received": 1500, "ignored": 0}
    queued = await receipts(redis, hooks)
    assert [r["providerMessageId"] for r in queued] == [f"m{i}" for i in range(1500)]


async def test_signed_event_lists_are_checked_like_any_body(hooks: Api, redis: Redis) -> None:
    """A list of events must hold only what a stream and jsonb can: a signed but malformed
    list is a 400 naming the field, and nothing is queued."""
    project = await hooks.project()
    deep: object = 1
    for _ in range(300):
        deep = [deep]
    for events, field in (
        ([{"event": "delivered", "sg_message_id": "m5", "x": deep}], "body[0].x"),
        ([{"event": "delivered", "sg_message_id": "m5", "email": "a\u0000@b.co"}],
         "body[0].email"),
    ):
        body = json.dumps(events)
        reply = await hooks.call("POST", f"/v1/webhooks/sendgrid/{project.id}", data=body,
                                 headers={"Content-Type": "application/json",
                                          **svix_headers(SHARED_SECRET, body)})
        assert reply.status == 400, reply.body
        assert reply.fields
        assert reply.fields[0].startswith(field)
    assert await receipts(redis, hooks) == []


async def test_each_receipt_is_named_as_its_provider_tells_deliveries_apart(
    hooks: Api, redis: Redis
) -> None:
    """Svix retries a delivery under its svix-id, SendGrid repeats an event under its
    sg_event_id in whatever batch, and Twilio reports each status of a message once."""
    project = await hooks.project()
    json_type = {"Content-Type": "application/json"}
    click = json.dumps({"type": "email.clicked", "data": {"email_id": "re_1"}})
    for svix_id in ("msg_a", "msg_b", "msg_a"):
        await hooks.call("POST", f"/v1/webhooks/resend/{project.id}", data=click, headers={
            **json_type, **svix_headers(RESEND_SECRET, click, msg_id=svix_id)})
    for batch in (["ev1"], ["ev2", "ev1"]):
        body = json.dumps([{"event": "open", "sg_message_id": "abc.filter0001",
                            "sg_event_id": event_id} for event_id in batch])
        await hooks.call("POST", f"/v1/webhooks/sendgrid/{project.id}", data=body,
                         headers={**json_type, **svix_headers(SHARED_SECRET, body)})
    path = f"/v1/webhooks/twilio/{project.id}"
    for status in ("delivered", "delivered", "failed"):
        params = {"MessageSid": "SM1", "MessageStatus": status}
        await hooks.call("POST", path, data=urlencode(params), headers={
            "Content-Type": "application/x-www-form-urlencoded",
            "X-Twilio-Signature": twilio_sign(TWILIO_TOKEN, hooks.settings.public_url + path,
                                              params)})
    assert [r["webhookId"] for r in await receipts(redis, hooks)] == [
        "resend:msg_a:0", "resend:msg_b:0", "resend:msg_a:0",
        "sendgrid:sg_event_id:ev1", "sendgrid:sg_event_id:ev2", "sendgrid:sg_event_id:ev1",
        "twilio:SM1:delivered", "twilio:SM1:delivered", "twilio:SM1:failed"]


async def test_twilio_status_callbacks_are_verified_against_the_public_url(
    hooks: Api, redis: Redis
) -> None:
    project = await hooks.project()
    path = f"/v1/webhooks/twilio/{project.id}"
    params = {"MessageSid": "SM1", "MessageStatus": "undelivered", "ErrorCode": "30003",
              "To": "+14155550100"}
    signature = twilio_sign(TWILIO_TOKEN, hooks.settings.public_url + path, params)
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    forged = await hooks.call("POST", path, data=urlencode(params),
                              headers={**form, "X-Twilio-Signature": "bm9wZQ=="})
    assert forged.status == 401
    reply = await hooks.call("POST", path, data=urlencode(params),
                             headers={**form, "X-Twilio-Signature": signature})
    assert reply.status == 200
    [receipt] = await receipts(redis, hooks)
    assert (receipt["provider"], receipt["kind"], receipt["providerMessageId"]) == (
        "twilio", "bounced", "SM1")


async def test_a_twilio_read_receipt_is_an_open(hooks: Api, redis: Redis) -> None:
    # Where the channel reports it (WhatsApp, RCS), Twilio's last status callback of a
    # message is "read": the recipient opened it, the engagement a waitForEvent "opened"
    # waits for. Statuses on the way (queued, sending, sent) are acknowledged and ignored.
    project = await hooks.project()
    path = f"/v1/webhooks/twilio/{project.id}"
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    answers = []
    for status in ("sent", "delivered", "read"):
        params = {"MessageSid": "SM7", "MessageStatus": status, "To": "+14155550100"}
        signature = twilio_sign(TWILIO_TOKEN, hooks.settings.public_url + path, params)
        reply = await hooks.call("POST", path, data=urlencode(params),
                                 headers={**form, "X-Twilio-Signature": signature})
        answers.append((reply.status, reply.body))
    assert answers == [(200, {"received": 0, "ignored": 1}),
                       (200, {"received": 1, "ignored": 0}),
                       (200, {"received": 1, "ignored": 0})]
    assert [(r["kind"], r["webhookId"]) for r in await receipts(redis, hooks)] == [
        ("delivered", "twilio:SM7:delivered"), ("opened", "twilio:SM7:read")]


async def test_twilio_callbacks_may_be_signed_over_the_url_they_were_posted_to(
    hooks: Api, redis: Redis
) -> None:
    """A status callback URL set by hand in Twilio's console is the address Twilio posts to,
    which need not spell NOTIFKIT_PUBLIC_URL (localhost for 127.0.0.1, another port)."""
    project = await hooks.project()
    path = f"/v1/webhooks/twilio/{project.id}"
    params = {"MessageSid": "SM2", "MessageStatus": "delivered", "To": "+14155550100"}
    posted_to = str(hooks.client.make_url(path))
    assert not posted_to.startswith(hooks.settings.public_url)
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    reply = await hooks.call("POST", path, data=urlencode(params), headers={
        **form, "X-Twilio-Signature": twilio_sign(TWILIO_TOKEN, posted_to, params)})
    assert reply.status == 200, reply.body
    elsewhere = twilio_sign(TWILIO_TOKEN, "https://elsewhere.example" + path, params)
    forged = await hooks.call("POST", path, data=urlencode(params),
                              headers={**form, "X-Twilio-Signature": elsewhere})
    assert forged.status == 401
    [receipt] = await receipts(redis, hooks)
    assert (receipt["kind"], receipt["providerMessageId"]) == ("delivered", "SM2")



async def test_a_twilio_callback_url_with_a_query_is_signed_with_it(
    hooks: Api, redis: Redis
) -> None:
    """Twilio signs the whole URL it posts to, query string included."""
    project = await hooks.project()
    path = f"/v1/webhooks/twilio/{project.id}?source=console&x=a%20b"
    params = {"MessageSid": "SM3", "MessageStatus": "delivered", "To": "+14155550100"}
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    without = twilio_sign(TWILIO_TOKEN, hooks.settings.public_url + path.split("?")[0], params)
    forged = await hooks.call("POST", path, data=urlencode(params),
                              headers={**form, "X-Twilio-Signature": without})
    assert forged.status == 401
    signature = twilio_sign(TWILIO_TOKEN, hooks.settings.public_url + path, params)
    reply = await hooks.call("POST", path, data=urlencode(params),
                             headers={**form, "X-Twilio-Signature": signature})
    assert reply.status == 200, reply.body
    assert [r["providerMessageId"] for r in await receipts(redis, hooks)] == ["SM3"]

async def test_a_twilio_callback_that_is_not_a_form_is_a_bad_signature(
    hooks: Api, redis: Redis
) -> None:
    project = await hooks.project()
    reply = await hooks.call("POST", f"/v1/webhooks/twilio/{project.id}", data=b"\xff=\xfe",
                             headers={"Content-Type": "application/x-www-form-urlencoded",
                                      "X-Twilio-Signature": "bm9wZQ=="})
    assert reply.status == 401
    assert reply.error["code"] == "invalid_signature"
    assert await receipts(redis, hooks) == []


async def test_a_signed_twilio_form_is_checked_like_any_body(hooks: Api, redis: Redis) -> None:
    """A NUL in a signed status callback cannot go into jsonb: a 400 naming the field, and
    nothing is queued for the events service to fail on."""
    project = await hooks.project()
    path = f"/v1/webhooks/twilio/{project.id}"
    params = {"MessageSid": "SM1", "MessageStatus": "delivered", "To": "+14155550100",
              "ErrorMessage": "a\u0000b"}
    signature = twilio_sign(TWILIO_TOKEN, hooks.settings.public_url + path, params)
    reply = await hooks.call("POST", path, data=urlencode(params),
                             headers={"Content-Type": "application/x-www-form-urlencoded",
                                      "X-Twilio-Signature": signature})
    assert reply.status == 400, reply.body
    assert reply.fields == ["body.ErrorMessage"]
    assert await receipts(redis, hooks) == []


async def test_unknown_providers_and_projects_are_404(hooks: Api) -> None:
    project = await hooks.project()
    assert (await hooks.call("POST", f"/v1/webhooks/mailgun/{project.id}", json={})
            ).status == 404
    body = json.dumps(RESEND_BOUNCE)
    signed = {"Content-Type": "application/json", **svix_headers(RESEND_SECRET, body)}
    for project_id in ("00000000-0000-4000-8000-000000000000", "x"):
        reply = await hooks.call("POST", f"/v1/webhooks/resend/{project_id}", data=body,
                                 headers=signed)
        assert reply.status == 404


async def test_webhooks_without_a_configured_secret_are_refused(api: Api,
                                                                project: Project) -> None:
    body = json.dumps(RESEND_BOUNCE)
    reply = await api.call("POST", f"/v1/webhooks/resend/{project.id}", data=body,
                           headers={"Content-Type": "application/json",
                                    **svix_headers(RESEND_SECRET, body)})
    assert reply.status == 401
    assert reply.error["code"] == "webhook_not_configured"


# ---------------------------------------------------------------------------------------------


async def preferences(api: Api, project: Project) -> dict[str, Any]:
    user = await api.call("GET", "/v1/users/u1", key=project.full)
    prefs: dict[str, Any] = user.body["preferences"]
    return prefs


async def test_get_turns_the_topic_off(api: Api, project: Project, db: asyncpg.Pool) -> None:
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    token = make_token(api.settings.secret, project.id, "u1", "email", "marketing")
    reply = await api.call("GET", "/v1/unsubscribe", params={"token": token})
    assert reply.status == 200
    assert reply.body == {"unsubscribed": True, "channel": "email", "topic": "marketing",
                          "suppressed": False}
    assert (await preferences(api, project))["topics"] == {"marketing": False}
    assert await db.fetchval("SELECT count(*) FROM suppressions") == 0
    again = await api.call("GET", "/v1/unsubscribe", params={"token": token})
    assert again.status == 200


async def test_a_link_of_a_user_whose_id_was_given_anew_spares_the_new_user(
    api: Api, project: Project, db: asyncpg.Pool
) -> None:
    """A link sent to a user since erased, whose id a new user was given more than an hour
    after the send, turns nothing off for the new user; the address is suppressed all the
    same. A link sent after the user was created (or one minted before links carried their
    send time) turns the channel off as ever."""
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    now_ms = int(time.time() * 1000)
    for sent_ms, turned_off in ((now_ms - 7_200_000, False), (now_ms - 600_000, True),
                                (None, True)):
        await api.call("PUT", "/v1/users/u1/preferences", key=project.full,
                       json={"channels": {"email": True}})
        token = make_token(api.settings.secret, project.id, "u1", "email", None,
                           "ada@example.com", sent_ms=sent_ms)
        reply = await api.call("GET", "/v1/unsubscribe", params={"token": token})
        assert (reply.status, reply.body["suppressed"]) == (200, True), reply.body
        assert (await preferences(api, project))["channels"] == {"email": not turned_off}, \
            sent_ms
    assert await db.fetchval("SELECT count(*) FROM suppressions") == 1


async def test_head_on_the_link_changes_nothing(
    api: Api, project: Project, db: asyncpg.Pool
) -> None:
    # Given a link that would turn e-mail off and suppress the address
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    token = make_token(api.settings.secret, project.id, "u1", "email", None, "ada@example.com")
    # When a link checker sends HEAD (aiohttp serves it with the GET route)
    checked = await api.call("HEAD", "/v1/unsubscribe", params={"token": token})
    forged = await api.call("HEAD", "/v1/unsubscribe", params={"token": "garbage"})
    # Then it learns whether the link works, and nothing is turned off or suppressed
    assert (checked.status, forged.status) == (200, 400)
    assert (await preferences(api, project))["channels"] == {}
    assert await db.fetchval("SELECT count(*) FROM suppressions") == 0
    # While GET still unsubscribes
    assert (await api.call("GET", "/v1/unsubscribe", params={"token": token})).status == 200
    assert (await preferences(api, project))["channels"] == {"email": False}


async def test_one_click_post_turns_the_channel_off_and_suppresses_the_address(
    api: Api, project: Project, db: asyncpg.Pool
) -> None:
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    token = make_token(api.settings.secret, project.id, "u1", "email", None, "ada@example.com")
    reply = await api.call("POST", "/v1/unsubscribe", params={"token": token},
                           data="List-Unsubscribe=One-Click",
                           headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert reply.status == 200
    assert reply.body["suppressed"] is True
    assert (await preferences(api, project))["channels"] == {"email": False}
    row = await db.fetchrow("SELECT channel, target, reason FROM suppressions")
    assert dict(row) == {"channel": "email", "target": "ada@example.com",
                         "reason": "unsubscribe"}


async def test_one_click_post_may_come_as_multipart_form_data(
    api: Api, project: Project, db: asyncpg.Pool
) -> None:
    # RFC 8058 asks mail clients to send the one-click POST as multipart/form-data (and lets
    # them use a URL-encoded form instead): both unsubscribe, and the document says so.
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    token = make_token(api.settings.secret, project.id, "u1", "email", None, "ada@example.com")
    body = ('--b0undary\r\nContent-Disposition: form-data; name="List-Unsubscribe"\r\n\r\n'
            "One-Click\r\n--b0undary--\r\n")
    reply = await api.call("POST", "/v1/unsubscribe", params={"token": token}, data=body,
                           headers={"Content-Type": "multipart/form-data; boundary=b0undary"})
    assert (reply.status, reply.body["suppressed"]) == (200, True)
    assert (await preferences(api, project))["channels"] == {"email": False}
    document = (await api.call("GET", "/openapi.json")).body
    accepted = document["paths"]["/v1/unsubscribe"]["post"]["requestBody"]["content"]
    assert set(accepted) == {"application/x-www-form-urlencoded", "multipart/form-data"}


async def test_a_forged_or_altered_token_is_400_and_changes_nothing(
    api: Api, project: Project, db: asyncpg.Pool
) -> None:
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    good = make_token(api.settings.secret, project.id, "u1", "email", None, "a@b.co")
    forged = make_token("not-the-secret-0123456789", project.id, "u1", "email", None, "a@b.co")
    altered = make_token(api.settings.secret, project.id, "u2", "email", None).split(".")[0] \
        + "." + good.split(".")[1]
    for token in (forged, altered, "garbage", ""):
        for method in ("GET", "POST"):
            reply = await api.call(method, "/v1/unsubscribe", params={"token": token})
            assert reply.status == 400, (method, token)
            assert reply.error["code"] == "invalid_token"
    assert (await api.call("GET", "/v1/unsubscribe")).status == 400
    assert (await preferences(api, project))["channels"] == {}
    assert await db.fetchval("SELECT count(*) FROM suppressions") == 0


async def test_a_link_of_a_project_that_is_gone_is_a_documented_404(api: Api) -> None:
    from notifkit.services.api.app import operations
    from notifkit.services.api.openapi import document

    gone = "00000000-0000-7000-8000-000000000000"
    paths = document(operations())["paths"]["/v1/unsubscribe"]
    for preview in (False, True):  # a template preview's link too
        token = make_token(api.settings.secret, gone, "u1", "email", None, "a@b.co",
                           preview=preview)
        for method in ("GET", "POST"):
            reply = await api.call(method, "/v1/unsubscribe", params={"token": token})
            assert reply.status == 404, (preview, reply.body)
            assert reply.error["code"] == "project_not_found"
            assert "404" in paths[method.lower()]["responses"]


async def test_a_token_given_twice_is_400_and_changes_nothing(
    api: Api, project: Project, db: asyncpg.Pool
) -> None:
    # Given two valid links, of different users
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    mine = make_token(api.settings.secret, project.id, "u1", "email", None, "a@b.co")
    theirs = make_token(api.settings.secret, project.id, "u2", "email", None, "c@d.co")
    form_type = {"Content-Type": "application/x-www-form-urlencoded"}
    # When a link names a token twice (which one counts depends on who reads it: a proxy or
    # a mail scanner may take the last), or a one-click POST carries a second one in its form
    for method, query in (("GET", f"token={mine}&token={theirs}"),
                          ("GET", f"token={mine}&token={mine}"),
                          ("POST", f"token={mine}&token={theirs}")):
        one_click = method == "POST"
        reply = await api.call(method, f"/v1/unsubscribe?{query}",
                               data="List-Unsubscribe=One-Click" if one_click else None,
                               headers=form_type if one_click else None)
        # Then it is a 400 naming the token, as any query parameter given twice
        assert reply.status == 400, (method, query)
        assert reply.error["code"] == "invalid_token"
        assert reply.error["details"][0]["field"] == "token"
    form = await api.call("POST", f"/v1/unsubscribe?token={mine}",
                          data=f"List-Unsubscribe=One-Click&token={theirs}", headers=form_type)
    assert form.status == 400
    # And nothing was turned off or suppressed
    assert (await preferences(api, project))["channels"] == {}
    assert await db.fetchval("SELECT count(*) FROM suppressions") == 0
