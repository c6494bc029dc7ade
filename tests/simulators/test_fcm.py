"""FCM HTTP v1 on the wire: OAuth token from the stand-in token endpoint, `messages:send`,
and Google-format errors with the FcmError detail codes clients branch on."""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import firebase_admin
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from firebase_admin import credentials, messaging

from simulators import SimulatorServer
from tests.support.service_account import jwt_grant

PROJECT = "notifkit-test"
FCM_ERROR = "type.googleapis.com/google.firebase.fcm.v1.FcmError"


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def access_token(http: aiohttp.ClientSession, sim: SimulatorServer) -> str:
    # What google-auth does with a service account whose token_uri is the simulator.
    async with http.post(f"{sim.base_url}/token", data=jwt_grant()) as response:
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


SHORT_LIVED = ("Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable "
               "timeframe. Check your iat and exp values in the JWT claim.")
NOT_A_JWT = "Invalid JWT: the assertion is not a signed JWT (base64url header.claims.signature)"
GRANT = jwt_grant()


@pytest.mark.parametrize(("form", "error", "description"), [
    ({}, "invalid_request", "Missing required parameter: grant_type"),
    ({"grant_type": "bogus"}, "unsupported_grant_type", "Invalid grant_type: bogus"),
    ({"grant_type": GRANT["grant_type"]}, "invalid_request",
     "Missing required parameter: assertion"),
    ({**GRANT, "assertion": "a.b.c"}, "invalid_grant", NOT_A_JWT),
    ({**GRANT, "assertion": GRANT["assertion"].rsplit(".", 1)[0]}, "invalid_grant", NOT_A_JWT),
    (jwt_grant(lifetime_s=7200), "invalid_grant", SHORT_LIVED),
    (jwt_grant(now_s=datetime.datetime(2020, 1, 1).timestamp()), "invalid_grant", SHORT_LIVED),
    (jwt_grant(iat="now"), "invalid_grant", SHORT_LIVED),
    (jwt_grant(exp=float("nan")), "invalid_grant", SHORT_LIVED),
    (jwt_grant(iat=10**400), "invalid_grant", SHORT_LIVED),
    ({**GRANT, "assertion": "e30." + base64.urlsafe_b64encode(b"[" * 5000).decode() + ".c2ln"},
     "invalid_grant", NOT_A_JWT),
    ({"grant_type": "refresh_token"}, "invalid_request",
     "Missing required parameter: refresh_token"),
], ids=["no-grant", "other-grant", "no-assertion", "not-json", "no-signature", "two-hours",
        "expired", "iat-not-a-number", "exp-nan", "iat-beyond-a-float", "claims-nested-deep",
        "refresh-without-token"])
async def test_the_token_endpoint_refuses_what_google_refuses(
    http: aiohttp.ClientSession, sim: SimulatorServer, form: dict[str, Any], error: str,
    description: str,
) -> None:
    """A client that could not get a token from Google gets none here either: 400 with
    RFC 6749's error body."""
    async with http.post(f"{sim.base_url}/token", data=form) as response:
        assert response.status == 400
        assert await response.json() == {"error": error, "error_description": description}


async def test_a_refresh_token_grant_gets_a_token(
    http: aiohttp.ClientSession, sim: SimulatorServer
) -> None:
    """What google-auth's user credentials post (gcloud's application-default login)."""
    form = {"grant_type": "refresh_token", "refresh_token": "1//r", "client_id": "c",
            "client_secret": "s"}
    async with http.post(f"{sim.base_url}/token", data=form) as response:
        assert response.status == 200
        assert (await response.json())["access_token"].startswith("ya29.sim-")


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


@pytest.mark.parametrize("topic", ["/topics/news", "news sport", "news/sport", "nèws"])
async def test_a_topic_name_fcm_refuses_is_invalid_argument(
    http: aiohttp.ClientSession, sim: SimulatorServer, topic: str
) -> None:
    # FCM HTTP v1 takes the bare name; the /topics/ prefix was the legacy API's.
    status, body = await push(http, sim, {"topic": topic})
    assert (status, body["error"]["status"], error_code(body)) == (
        400, "INVALID_ARGUMENT", "INVALID_ARGUMENT")
    [violation] = [d for d in body["error"]["details"] if "fieldViolations" in d]
    assert violation["fieldViolations"][0]["field"] == "message.topic"
    assert await sim.messages("fcm") == []
    status, _ = await push(http, sim, {"topic": "news-1_a.b~c%20"})
    assert status == 200
    [record] = await sim.messages("fcm")
    assert record["to"] == "/topics/news-1_a.b~c%20"


async def test_firebase_admin_sends_to_a_topic_named_with_its_prefix(
    sim: SimulatorServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """firebase-admin accepts "/topics/news" and sends the bare name, which FCM takes."""
    message = messaging.Message(topic="/topics/news", data={"notifkit_task_id": "task-ft"})
    name = await firebase_admin_send(sim, monkeypatch, message)
    [record] = await sim.messages("fcm", task_id="task-ft")
    assert name == f"projects/{PROJECT}/messages/{record['id']}"
    assert (record["to"], record["content"]["topic"]) == ("/topics/news", "news")


@pytest.mark.parametrize("condition", [
    "'news' in topics",
    "\"news\" in topics && ('cats' in topics || 'dogs' in topics)",
    "('a' in topics||'b' in topics)&&('c' in topics||'d' in topics)&&'e' in topics",
])
async def test_a_condition_fcm_parses_is_sent(
    http: aiohttp.ClientSession, sim: SimulatorServer, condition: str
) -> None:
    status, body = await push(http, sim, {"condition": condition})
    assert status == 200, body
    [record] = await sim.messages("fcm")
    assert record["to"] == condition


@pytest.mark.parametrize("condition", [
    "'news' in topics &&",
    "news in topics",
    "'news' in topic",
    "!('news' in topics)",
    "('news' in topics",
    "'news' in topics 'cats' in topics",
    "'a/b' in topics",
    " || ".join(f"'t{i}' in topics" for i in range(6)),
])
async def test_a_condition_fcm_cannot_parse_is_invalid_argument(
    http: aiohttp.ClientSession, sim: SimulatorServer, condition: str
) -> None:
    """FCM's condition is topics joined by && and ||, in parentheses or not, five at most;
    anything else is its 400 on message.condition, and nothing is sent."""
    status, body = await push(http, sim, {"condition": condition})
    assert (status, error_code(body)) == (400, "INVALID_ARGUMENT")
    assert violation_of(body) == {"field": "message.condition",
                                  "description": "Invalid condition expression provided."}
    assert await sim.messages("fcm") == []


@pytest.mark.parametrize("token", [" ", "device-token-1\n", "device token", "tok\u0000en"])
async def test_a_token_with_white_space_or_a_control_character_is_invalid_argument(
    http: aiohttp.ClientSession, sim: SimulatorServer, token: str
) -> None:
    """No registration token holds one (a token read from a file with its line break, say):
    FCM's invalid-token 400 on message.token, and nothing is sent."""
    status, body = await push(http, sim, {"token": token})
    assert (status, error_code(body)) == (400, "INVALID_ARGUMENT")
    assert violation_of(body)["field"] == "message.token"
    assert "registration token" in body["error"]["message"]
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


def violation_of(body: dict[str, Any]) -> dict[str, Any]:
    [violation] = [
        d["fieldViolations"][0]
        for d in body["error"]["details"]
        if d["@type"] == "type.googleapis.com/google.rpc.BadRequest"
    ]
    return dict(violation)


# What firebase-admin (7.x) encodes for a Message using every Android, APNs and Webpush option
# it has, as its MessageEncoder writes it.
FIREBASE_ADMIN_MESSAGE: dict[str, Any] = {
    "fid": "fid-1",
    "data": {"a": "b"},
    "notification": {"title": "t", "body": "b", "image": "https://x/i.png"},
    "fcm_options": {"analytics_label": "l"},
    "android": {
        "collapse_key": "c", "priority": "high", "ttl": "3.500000000s",
        "restricted_package_name": "com.x", "data": {"k": "v"},
        "direct_boot_ok": True, "bandwidth_constrained_ok": True,
        "restricted_satellite_ok": True, "fcm_options": {"analytics_label": "al"},
        "notification": {
            "title": "t", "body": "b", "icon": "ic", "color": "#ff0000", "sound": "default",
            "tag": "tg", "click_action": "OPEN", "body_loc_key": "bk", "body_loc_args": ["a"],
            "title_loc_key": "tk", "title_loc_args": ["b"], "channel_id": "ch",
            "image": "https://x/i.png", "ticker": "tick", "sticky": True,
            "event_time": "2024-01-02T03:04:05.000000Z", "local_only": True,
            "notification_priority": "PRIORITY_HIGH", "vibrate_timings": [
                "0.100000000s", "0.200500000s"],
            "default_vibrate_timings": False, "default_sound": True,
            "default_light_settings": False, "visibility": "PUBLIC", "notification_count": 3,
            "proxy": "ALLOW",
            "light_settings": {
                "color": {"red": 0.06666666666666667, "green": 0.13333333333333333,
                          "blue": 0.2, "alpha": 1.0},
                "light_on_duration": "0.100000000s", "light_off_duration": "0.200000000s",
            },
        },
    },
    "apns": {
        "headers": {"apns-priority": "10"},
        "live_activity_token": "lat",
        "fcm_options": {"analytics_label": "al", "image": "https://x/i.png"},
        "payload": {
            "aps": {
                "alert": {"title": "t", "subtitle": "s", "body": "b", "loc-key": "lk",
                          "loc-args": ["x"], "title-loc-key": "tl", "title-loc-args": ["y"],
                          "action-loc-key": "al", "launch-image": "li", "z": 1},
                "badge": 3, "sound": {"critical": 1, "name": "default", "volume": 0.5},
                "content-available": 1, "mutable-content": 1, "category": "cat",
                "thread-id": "th", "q": "r",
            },
            "extra": "x",
        },
    },
    "webpush": {
        "headers": {"TTL": "300", "Urgency": "high"},
        "data": {"k": "v"},
        "fcm_options": {"link": "https://x"},
        "notification": {
            "title": "t", "body": "b", "icon": "i", "badge": "bd", "dir": "auto",
            "image": "im", "lang": "en", "renotify": True, "requireInteraction": True,
            "silent": False, "tag": "tg", "timestamp": 1000, "vibrate": [100, 200],
            "actions": [{"action": "a", "title": "t", "icon": "i"}], "data": {"x": 1},
            "cd": 1,
        },
    },
}


async def test_what_firebase_admin_encodes_is_accepted_and_recorded(
    http: aiohttp.ClientSession, sim: SimulatorServer
) -> None:
    status, body = await push(http, sim, FIREBASE_ADMIN_MESSAGE)

    assert status == 200, body
    [record] = await sim.messages("fcm")
    assert record["content"]["android"] == FIREBASE_ADMIN_MESSAGE["android"]
    assert record["content"]["apns"]["payload"]["aps"]["badge"] == 3
    assert record["content"]["webpush"]["headers"]["TTL"] == "300"


@pytest.mark.parametrize("message", [
    # The lowerCamelCase JSON names, as the REST reference spells them.
    {"android": {"collapseKey": "c", "restrictedPackageName": "com.x", "directBootOk": True,
                 "fcmOptions": {"analyticsLabel": "a"},
                 "notification": {"channelId": "ch", "clickAction": "OPEN",
                                  "notificationPriority": "PRIORITY_MAX",
                                  "bodyLocArgs": ["x"], "eventTime": "2024-01-02T03:04:05Z",
                                  "lightSettings": {"color": {"red": 1},
                                                    "lightOnDuration": "1s"}}},
     "apns": {"fcmOptions": {"analyticsLabel": "a"}, "liveActivityToken": "t"},
     "webpush": {"fcmOptions": {"link": "https://x", "analyticsLabel": "a"}}},
    # Enum names in any case, and enum numbers; Durations with 0 to 9 decimals.
    {"android": {"priority": "HIGH", "ttl": "0s"}},
    {"android": {"priority": "normal", "ttl": "2419200s"}},
    {"android": {"priority": 1, "ttl": "0.000000001s",
                 "notification": {"visibility": "private", "proxy": 3,
                                  "notificationCount": "7"}}},
    # null is an unset field.
    {"android": {"priority": None, "notification": None}, "apns": {"payload": None}},
], ids=["camel-case", "upper-enum", "lower-enum", "enum-numbers", "nulls"])
async def test_valid_platform_options_are_accepted(
    http: aiohttp.ClientSession, sim: SimulatorServer, message: dict[str, Any]
) -> None:
    status, body = await push(http, sim, {"token": "t", **message})
    assert status == 200, body


BOGUS_PRIORITY = ("Invalid value at 'message.android.priority' "
                  "(type.googleapis.com/google.firebase.fcm.v1.AndroidMessagePriority), \"bogus\"")


INVALID_OPTIONS: list[tuple[dict[str, Any], str, str | None]] = [
    ({"android": {"priority": "bogus"}}, "message.android.priority", BOGUS_PRIORITY),
    ({"android": {"priority": 2}}, "message.android.priority", None),
    ({"android": {"ttl": "3 days"}}, "message.android.ttl",
     "Invalid value at 'message.android.ttl' (type.googleapis.com/google.protobuf.Duration), "
     "\"3 days\""),
    ({"android": {"ttl": 3600}}, "message.android.ttl", None),
    ({"android": {"ttl": "3600"}}, "message.android.ttl", None),
    ({"android": {"ttl": "1.0000000001s"}}, "message.android.ttl", None),
    ({"android": {"data": {"a": "1", "count": 2}}}, "message.android.data[1].value",
     "Invalid value at 'message.android.data[1].value' (TYPE_STRING), 2"),
    ({"android": {"data": ["a"]}}, "message.android.data", None),
    ({"android": {"x": 1}}, "message.android",
     "Invalid JSON payload received. Unknown name \"x\" at 'message.android': Cannot find "
     "field."),
    ({"android": {"direct_boot_ok": "yes"}}, "message.android.direct_boot_ok",
     "Invalid value at 'message.android.direct_boot_ok' (TYPE_BOOL), \"yes\""),
    ({"android": {"collapse_key": 7}}, "message.android.collapse_key", None),
    ({"android": {"fcm_options": {"label": "x"}}}, "message.android.fcm_options", None),
    ({"android": {"notification": {"subtitle": "x"}}}, "message.android.notification", None),
    ({"android": {"notification": {"title": 5}}}, "message.android.notification.title", None),
    ({"android": {"notification": {"notification_priority": "PRIORITY_URGENT"}}},
     "message.android.notification.notification_priority", None),
    ({"android": {"notification": {"visibility": "everyone"}}},
     "message.android.notification.visibility", None),
    ({"android": {"notification": {"event_time": "yesterday"}}},
     "message.android.notification.event_time", None),
    ({"android": {"notification": {"event_time": "2024-13-45T00:00:00Z"}}},
     "message.android.notification.event_time", None),
    ({"android": {"notification": {"vibrate_timings": ["0.1s", 100]}}},
     "message.android.notification.vibrate_timings[1]", None),
    ({"android": {"notification": {"body_loc_args": ["a", 1]}}},
     "message.android.notification.body_loc_args[1]", None),
    ({"android": {"notification": {"notification_count": "many"}}},
     "message.android.notification.notification_count", None),
    ({"android": {"notification": {"light_settings": {"color": "#ffffff"}}}},
     "message.android.notification.light_settings.color", None),
    ({"android": {"notification": {"light_settings": {"light_on_duration": 100}}}},
     "message.android.notification.light_settings.light_on_duration", None),
    ({"apns": {"headers": {"apns-priority": 10}}}, "message.apns.headers[0].value",
     "Invalid value at 'message.apns.headers[0].value' (TYPE_STRING), 10"),
    ({"apns": {"payload": "aps"}}, "message.apns.payload", None),
    ({"apns": {"x": 1}}, "message.apns", None),
    ({"apns": {"fcm_options": {"image": 1}}}, "message.apns.fcm_options.image", None),
    ({"webpush": {"headers": {"TTL": 300}}}, "message.webpush.headers[0].value", None),
    ({"webpush": {"data": {"k": True}}}, "message.webpush.data[0].value", None),
    ({"webpush": {"notification": ["t"]}}, "message.webpush.notification", None),
    ({"webpush": {"fcm_options": {"link": 5}}}, "message.webpush.fcm_options.link", None),
    ({"webpush": {"x": 1}}, "message.webpush", None),
    ({"fcm_options": {"analytics_label": 5}}, "message.fcm_options.analytics_label", None),
]


@pytest.mark.parametrize(("message", "field", "description"), INVALID_OPTIONS,
                         ids=[json.dumps(case[0]) for case in INVALID_OPTIONS])
async def test_invalid_platform_options_are_invalid_argument(
    http: aiohttp.ClientSession, sim: SimulatorServer, message: dict[str, Any], field: str,
    description: str | None,
) -> None:
    """FCM parses android, apns and webpush into their proto types too: an unknown field, an
    enum name it lacks, a ttl that is not a Duration or a map value that is not a string is
    400 INVALID_ARGUMENT naming the field, and nothing is sent."""
    status, body = await push(http, sim, {"token": "t", **message})

    assert status == 400, body
    assert body["error"]["status"] == "INVALID_ARGUMENT"
    assert error_code(body) == "INVALID_ARGUMENT"
    violation = violation_of(body)
    assert violation["field"] == field
    assert field in body["error"]["message"]
    if description is not None:
        assert body["error"]["message"] == description
        assert violation["description"] == description
    assert await sim.messages("fcm") == []


async def firebase_admin_send(sim: SimulatorServer, monkeypatch: pytest.MonkeyPatch,
                              message: messaging.Message) -> str:
    """Send ``message`` with firebase-admin itself, its service account's token_uri and its
    FCM URL pointed at the simulator; the message's name."""
    # firebase-admin has no setting for its FCM endpoint; its class attribute is the one seam.
    monkeypatch.setattr(messaging._MessagingService, "FCM_URL",
                        f"{sim.base_url}/v1/projects/{{0}}/messages:send")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    account = credentials.Certificate({
        "type": "service_account",
        "project_id": PROJECT,
        "client_email": "notifkit@notifkit-test.iam.gserviceaccount.com",
        "private_key": key.private_bytes(serialization.Encoding.PEM,
                                         serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()).decode(),
        "token_uri": f"{sim.base_url}/token",
    })
    app = firebase_admin.initialize_app(account, {"projectId": PROJECT}, name="fcm-sim-test")
    try:
        return str(await asyncio.to_thread(messaging.send, message, app=app))
    finally:
        # Off the loop: deleting an app closes its async client with asyncio.run().
        await asyncio.to_thread(firebase_admin.delete_app, app)


@pytest.mark.filterwarnings("ignore:Message.token is deprecated")
async def test_firebase_admin_sends_platform_options_through_the_simulator(
    sim: SimulatorServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """firebase-admin sends a message with the common Android, APNs and Webpush options."""
    message = messaging.Message(
        token="device-token-1",
        data={"notifkit_task_id": "task-fa"},
        android=messaging.AndroidConfig(
            priority="high", ttl=datetime.timedelta(hours=1, milliseconds=500),
            notification=messaging.AndroidNotification(
                title="Hi", body="You have mail", icon="ic_mail", color="#336699",
                sound="default", click_action="OPEN_INBOX", channel_id="mail")),
        apns=messaging.APNSConfig(
            headers={"apns-priority": "10"},
            payload=messaging.APNSPayload(aps=messaging.Aps(
                alert=messaging.ApsAlert(title="Hi", body="You have mail"), badge=1,
                sound="default"))),
        webpush=messaging.WebpushConfig(
            headers={"TTL": "300", "Urgency": "high"},
            notification=messaging.WebpushNotification(title="Hi", body="You have mail",
                                                       icon="https://example.com/i.png")),
    )
    name = await firebase_admin_send(sim, monkeypatch, message)

    [record] = await sim.messages("fcm", task_id="task-fa")
    assert name == f"projects/{PROJECT}/messages/{record['id']}"
    android = record["content"]["android"]
    assert (android["priority"], android["ttl"]) == ("high", "3600.500000000s")
    assert android["notification"]["channel_id"] == "mail"
    assert record["content"]["apns"]["payload"]["aps"]["badge"] == 1


async def test_tokens_differing_only_in_case_are_different_devices(
    http: aiohttp.ClientSession, sim: SimulatorServer
) -> None:
    """FCM tokens are case-sensitive: a fault rule or a `to` filter names one device, never
    another whose token differs only in case (e-mail addresses alone ignore case)."""
    await sim.add_fault("invalid_token", "fcm", to="dTok:APA91bAbC")
    status, body = await push(http, sim, {"token": "dtok:apa91babc"})
    assert status == 200, body
    status, body = await push(http, sim, {"token": "dTok:APA91bAbC"})
    assert (status, error_code(body)) == (404, "UNREGISTERED")
    await sim.clear_faults()
    await push(http, sim, {"token": "dTok:APA91bAbC"})
    found = await sim.messages("fcm", to="dTok:APA91bAbC")
    assert [m["to"] for m in found] == ["dTok:APA91bAbC"]
