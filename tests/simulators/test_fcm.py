"""FCM HTTP v1 on the wire: OAuth token from the stand-in token endpoint, `messages:send`,
and Google-format errors with the FcmError detail codes clients branch on."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from simulators import SimulatorServer

PROJECT = "notifkit-test"
FCM_ERROR = "type.googleapis.com/google.firebase.fcm.v1.FcmError"


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def access_token(http: aiohttp.ClientSession, sim: SimulatorServer) -> str:
    # What google-auth does with a service account whose token_uri is the simulator.
    form = {"grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer", "assertion": "a.b.c"}
    async with http.post(f"{sim.base_url}/token", data=form) as response:
        assert response.status == 200
        body = await response.json()
    assert body["token_type"] == "Bearer"
    assert body["expires_in"] > 0
    return str(body["access_token"])


async def push(
    http: aiohttp.ClientSession,
    sim: SimulatorServer,
    message: dict[str, Any] | None = None,
    *,
    token: str | None = "ya29.test",
    **body: Any,
) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    payload = {
        "message": message
        or {
            "token": "device-token-1",
            "notification": {"title": "Hi", "body": "You have mail"},
            "data": {"notifkit_task_id": "task-p"},
        },
        **body,
    }
    url = f"{sim.base_url}/v1/projects/{PROJECT}/messages:send"
    async with http.post(url, json=payload, headers=headers) as response:
        return response.status, await response.json()


def error_code(body: dict[str, Any]) -> str | None:
    for detail in body["error"].get("details", []):
        if detail["@type"] == FCM_ERROR:
            return str(detail["errorCode"])
    return None


async def test_send_with_token_from_token_endpoint(
    http: aiohttp.ClientSession, sim: SimulatorServer
) -> None:
    token = await access_token(http, sim)

    status, body = await push(http, sim, token=token)

    assert status == 200
    [record] = await sim.messages("fcm")
    assert body["name"] == f"projects/{PROJECT}/messages/{record['id']}"
    assert record["taskId"] == "task-p"
    assert record["to"] == "device-token-1"
    assert record["content"]["notification"]["title"] == "Hi"


async def test_message_names_replay_with_the_seed(http: aiohttp.ClientSession) -> None:
    """Like every provider's ids, FCM's are drawn from the seed: not from the clock."""
    names = []
    for _ in range(2):
        async with SimulatorServer(seed=5, smtp_port=None) as sim:
            status, body = await push(http, sim)
            assert status == 200
            names.append(body["name"])
    assert names[0] == names[1]
    assert re.fullmatch(rf"projects/{PROJECT}/messages/0:\d{{16}}%[0-9a-f]{{16}}", names[0])


async def test_validate_only_sends_nothing(
    http: aiohttp.ClientSession, sim: SimulatorServer
) -> None:
    status, body = await push(http, sim, validate_only=True)
    assert status == 200
    assert body["name"].endswith("/messages/fake_message_id")
    assert await sim.messages("fcm") == []


async def test_no_token_is_401_unauthenticated(
    http: aiohttp.ClientSession, sim: SimulatorServer
) -> None:
    status, body = await push(http, sim, token=None)
    assert status == 401
    assert body["error"]["status"] == "UNAUTHENTICATED"


async def test_non_string_data_is_invalid_argument(
    http: aiohttp.ClientSession, sim: SimulatorServer
) -> None:
    status, body = await push(http, sim, {"token": "t", "data": {"count": 12}})
    assert status == 400
    assert body["error"]["status"] == "INVALID_ARGUMENT"
    assert body["error"]["message"] == "Invalid value at 'message.data[0].value' (TYPE_STRING), 12"
    assert error_code(body) == "INVALID_ARGUMENT"


@pytest.mark.parametrize("key", ["from", "message_type", "google.sent_time", "gcm.n.e"])
async def test_reserved_data_keys_are_invalid_argument(
    http: aiohttp.ClientSession, sim: SimulatorServer, key: str
) -> None:
    # FCM refuses the whole message, so a template using one must fail before production.
    status, body = await push(http, sim, {"token": "t", "data": {"order": "1", key: "x"}})
    assert status == 400
    assert body["error"]["message"] == f"Invalid data payload key: {key}"
    assert error_code(body) == "INVALID_ARGUMENT"
    assert await sim.messages("fcm") == []


async def test_two_targets_are_invalid(http: aiohttp.ClientSession, sim: SimulatorServer) -> None:
    status, _ = await push(http, sim, {"token": "t", "topic": "news"})
    assert status == 400


@pytest.mark.parametrize(
    ("message", "body", "field"),
    [
        ({"token": "t", "notificaton": {"title": "x"}}, {}, "message"),
        ({"token": "t"}, {"validateonly": True}, None),
        ({"token": "t", "notification": {"title": 5}}, {}, "message.notification.title"),
        ({"token": "t", "notification": {"subtitle": "x"}}, {}, "message.notification"),
        ({"token": "t"}, {"validate_only": "yes"}, "validate_only"),
        ({"token": "t", "android": "high"}, {}, "message.android"),
        ({"token": "t", "apns": []}, {}, "message.apns"),
    ],
)
async def test_unknown_or_mistyped_fields_are_invalid_argument(
    http: aiohttp.ClientSession,
    sim: SimulatorServer,
    message: dict[str, Any],
    body: dict[str, Any],
    field: str | None,
) -> None:
    """FCM parses the request into its proto types: a misspelt field or a number where a
    string belongs is 400 INVALID_ARGUMENT with a BadRequest field violation, not a send."""
    status, answer = await push(http, sim, message, **body)

    assert status == 400
    assert answer["error"]["status"] == "INVALID_ARGUMENT"
    [violation] = [
        d["fieldViolations"][0]
        for d in answer["error"]["details"]
        if d["@type"] == "type.googleapis.com/google.rpc.BadRequest"
    ]
    assert violation.get("field") == field
    assert await sim.messages("fcm") == []


async def test_camel_case_spellings_are_accepted(
    http: aiohttp.ClientSession, sim: SimulatorServer
) -> None:
    message = {"token": "t", "fcmOptions": {"analyticsLabel": "x"}}
    status, body = await push(http, sim, message, validateOnly=True)
    assert status == 200, body
    assert body["name"].endswith("/fake_message_id")


async def test_installation_id_is_a_target(
    http: aiohttp.ClientSession, sim: SimulatorServer
) -> None:
    """Current firebase-admin releases send `fid` (a Firebase Installation ID) instead of the
    deprecated `token`; FCM HTTP v1 accepts it as the message's one target."""
    status, body = await push(http, sim, {"fid": "fid-1", "data": {"notifkit_task_id": "t-f"}})

    assert status == 200, body
    [record] = await sim.messages("fcm")
    assert record["to"] == "fid-1"
    assert record["taskId"] == "t-f"
    assert record["content"]["fid"] == "fid-1"

    status, body = await push(http, sim, {"fid": "fid-1", "token": "t"})
    assert status == 400
    assert body["error"]["status"] == "INVALID_ARGUMENT"


async def test_invalid_registration_token_names_the_token_field(
    http: aiohttp.ClientSession, sim: SimulatorServer
) -> None:
    """FCM's 400 for a malformed registration token carries a BadRequest violation on
    message.token beside the FcmError code, as clients that report the field expect."""
    await sim.add_fault("invalid_token", "fcm", status=400)

    status, body = await push(http, sim)

    assert status == 400
    assert error_code(body) == "INVALID_ARGUMENT"
    [violation] = [
        d["fieldViolations"][0]
        for d in body["error"]["details"]
        if d["@type"] == "type.googleapis.com/google.rpc.BadRequest"
    ]
    assert violation["field"] == "message.token"
    assert "registration token" in violation["description"]


@pytest.mark.parametrize(
    ("kind", "status", "expected_status", "google_status", "fcm_code"),
    [
        ("invalid_token", None, 404, "NOT_FOUND", "UNREGISTERED"),
        ("invalid_token", 400, 400, "INVALID_ARGUMENT", "INVALID_ARGUMENT"),
        ("rate_limit", None, 429, "RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED"),
        # FCM's answer when it cannot serve: the spec's 503 UNAVAILABLE, with Retry-After.
        ("error", None, 503, "UNAVAILABLE", "UNAVAILABLE"),
        ("error", 503, 503, "UNAVAILABLE", "UNAVAILABLE"),
        ("error", 500, 500, "INTERNAL", "INTERNAL"),
    ],
)
async def test_faults_use_google_error_format(
    http: aiohttp.ClientSession,
    sim: SimulatorServer,
    kind: str,
    status: int | None,
    expected_status: int,
    google_status: str,
    fcm_code: str,
) -> None:
    await sim.add_fault(kind, "fcm", status=status)

    answered, body = await push(http, sim)

    assert answered == expected_status
    assert body["error"]["code"] == expected_status
    assert body["error"]["status"] == google_status
    assert error_code(body) == fcm_code
    assert await sim.messages("fcm") == []


async def test_topic_recipient_pattern(http: aiohttp.ClientSession, sim: SimulatorServer) -> None:
    await sim.add_fault("invalid_token", "fcm", to="/topics/*")
    status, _ = await push(http, sim, {"topic": "news"})
    assert status == 404
    status, _ = await push(http, sim)
    assert status == 200


async def test_quota_429_has_retry_after(http: aiohttp.ClientSession, sim: SimulatorServer) -> None:
    await sim.set_limit("fcm", 1, burst=1)
    url = f"{sim.base_url}/v1/projects/{PROJECT}/messages:send"
    headers = {"Authorization": "Bearer ya29.test"}
    body = {"message": {"token": "t"}}
    async with http.post(url, json=body, headers=headers) as first:
        assert first.status == 200
    async with http.post(url, json=body, headers=headers) as second:
        assert second.status == 429
        assert int(second.headers["Retry-After"]) >= 1
        assert error_code(await second.json()) == "QUOTA_EXCEEDED"


async def test_the_size_limit_counts_utf8_bytes(
    http: aiohttp.ClientSession, sim: SimulatorServer,
) -> None:
    # 1,000 CJK characters are 3,000 UTF-8 bytes: within FCM's 4 KB, though escaped ASCII
    # would make them 6,000
    fits = {"token": "t", "data": {"k": "日" * 1000}}
    assert (await push(http, sim, fits))[0] == 200
    too_big = {"token": "t", "data": {"k": "日" * 1400}}
    status, body = await push(http, sim, too_big)
    assert status == 400
    assert body["error"]["message"] == "Message is too big"


async def test_rate_limit_is_per_project_not_per_access_token(
    http: aiohttp.ClientSession, sim: SimulatorServer
) -> None:
    """FCM meters a project: a refreshed access token does not bring a fresh budget."""
    await sim.set_limit("fcm", 0.01, burst=1)

    first, _ = await push(http, sim, token="ya29.first")
    second, body = await push(http, sim, token="ya29.refreshed")

    assert first == 200
    assert second == 429
    assert error_code(body) == "QUOTA_EXCEEDED"
