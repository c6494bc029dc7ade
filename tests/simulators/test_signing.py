"""The signing helpers reproduce the providers' published examples and agree with the
providers' own SDK verifiers, so a receipt that verifies here verifies in production code."""

from __future__ import annotations

import base64
import time
from typing import Any

import resend
from twilio.request_validator import RequestValidator

from simulators.signing import svix_headers, svix_sign, svix_verify, twilio_sign, twilio_verify

# Svix's documented example.
SVIX_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SVIX_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SVIX_TIMESTAMP = 1614265330
SVIX_BODY = '{"test": 2432232314}'
SVIX_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="

# Twilio's documented example.
TWILIO_TOKEN = "12345"
TWILIO_URL = "https://mycompany.com/myapp.php?foo=1&bar=2"
TWILIO_PARAMS = {
    "CallSid": "CA1234567890ABCDE",
    "Caller": "+12349013030",
    "Digits": "1234",
    "From": "+12349013030",
    "To": "+18005551212",
}
TWILIO_SIGNATURE = "0/KCTR6DLpKmkAf8muzZqo1nDgQ="


def verify_with_resend_sdk(secret: str, headers: dict[str, str], body: str) -> Any:
    return resend.Webhooks.verify(
        {
            "payload": body,
            "headers": {
                "id": headers["svix-id"],
                "timestamp": headers["svix-timestamp"],
                "signature": headers["svix-signature"],
            },
            "webhook_secret": secret,
        }
    )


def test_svix_published_example() -> None:
    assert svix_sign(SVIX_SECRET, SVIX_ID, SVIX_TIMESTAMP, SVIX_BODY) == SVIX_SIGNATURE
    headers = {
        "svix-id": SVIX_ID,
        "svix-timestamp": str(SVIX_TIMESTAMP),
        "svix-signature": SVIX_SIGNATURE,
    }
    assert svix_verify(SVIX_SECRET, headers, SVIX_BODY, now_s=SVIX_TIMESTAMP + 10)


def test_svix_rejects_tampering_stale_and_missing() -> None:
    headers = {
        "svix-id": SVIX_ID,
        "svix-timestamp": str(SVIX_TIMESTAMP),
        "svix-signature": SVIX_SIGNATURE,
    }
    now = SVIX_TIMESTAMP + 10
    assert not svix_verify(SVIX_SECRET, headers, SVIX_BODY + " ", now_s=now)
    assert not svix_verify(
        "whsec_" + base64.b64encode(b"other").decode(), headers, SVIX_BODY, now_s=now
    )
    assert not svix_verify(SVIX_SECRET, headers, SVIX_BODY, now_s=SVIX_TIMESTAMP + 301)
    assert not svix_verify(SVIX_SECRET, {**headers, "svix-signature": ""}, SVIX_BODY, now_s=now)
    assert not svix_verify(SVIX_SECRET, {**headers, "svix-timestamp": "soon"}, SVIX_BODY, now_s=now)


def test_svix_accepts_any_of_several_signatures_and_any_header_case() -> None:
    headers = {
        "Svix-Id": SVIX_ID,
        "Svix-Timestamp": str(SVIX_TIMESTAMP),
        "Svix-Signature": f"v1,bm90LWl0 {SVIX_SIGNATURE}",
    }
    assert svix_verify(SVIX_SECRET, headers, SVIX_BODY.encode(), now_s=SVIX_TIMESTAMP)


def test_svix_headers_verify_with_the_resend_sdk() -> None:
    body = '{"type": "email.delivered"}'
    headers = svix_headers(SVIX_SECRET, body)
    assert svix_verify(SVIX_SECRET, headers, body)
    verified = verify_with_resend_sdk(SVIX_SECRET, headers, body)
    assert verified["type"] == "email.delivered"
    assert abs(int(headers["svix-timestamp"]) - time.time()) < 5


def test_plain_secret_is_used_as_raw_bytes() -> None:
    headers = svix_headers("not-base64!", "{}")
    assert svix_verify("not-base64!", headers, "{}")
    assert not svix_verify("not-base64?", headers, "{}")


def test_a_secret_without_the_prefix_verifies_with_either_reading() -> None:
    """The official SDKs base64-decode a secret with or without `whsec_`; notifkit (and many
    receivers) take an unprefixed secret as its bytes. Both readings find a signature."""
    secret = SVIX_SECRET.removeprefix("whsec_")
    body = '{"type": "email.delivered"}'
    headers = svix_headers(secret, body)
    assert len(headers["svix-signature"].split()) == 2
    assert svix_verify(secret, headers, body)
    verified = verify_with_resend_sdk(secret, headers, body)
    assert verified["type"] == "email.delivered"
    # Each signature alone, as a receiver of one reading sees it.
    own, decoded = headers["svix-signature"].split()
    assert svix_verify(secret, {**headers, "svix-signature": own}, body)
    assert svix_verify(secret, {**headers, "svix-signature": decoded}, body)
    assert not svix_verify("whsec_" + base64.b64encode(b"other").decode(), headers, body)


def test_twilio_published_example_and_sdk_validator() -> None:
    assert twilio_sign(TWILIO_TOKEN, TWILIO_URL, TWILIO_PARAMS) == TWILIO_SIGNATURE
    assert twilio_verify(TWILIO_TOKEN, TWILIO_URL, TWILIO_PARAMS, TWILIO_SIGNATURE)
    assert not twilio_verify("54321", TWILIO_URL, TWILIO_PARAMS, TWILIO_SIGNATURE)
    assert RequestValidator(TWILIO_TOKEN).validate(TWILIO_URL, TWILIO_PARAMS, TWILIO_SIGNATURE)
