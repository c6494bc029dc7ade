"""SendGrid's Signed Event Webhook check, against the vector SendGrid's own libraries test."""

from __future__ import annotations

import json

import pytest

from notifkit.config import ConfigError, Settings
from notifkit.sendgrid_signature import load_public_key, verify

# From SendGrid's event-webhook helpers: a key, and its signature over timestamp + payload.
PUBLIC_KEY = ("MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEEDr2LjtURuePQzplybdC+u4CwrqDqBaWjcMMsTbhdbcw"
              "HBcepxo7yAQGhHPTnlvFYPAZFceEu/1FwCM/QmGUhA==")
SIGNATURE = ("MEUCIQCtIHJeH93Y+qpYeWrySphQgpNGNr/U+UyUlBkU6n7RAwIgJTz2C+8a8xonZGi6BpSzoQsbVRa"
             "mr2nlxFDWYNH2j/0=")
TIMESTAMP = "1588788367"
PAYLOAD = json.dumps({"category": "example_payload", "event": "test_event",
                      "message_id": "message_id"}, separators=(",", ":")).encode()


def test_sendgrids_own_signature_verifies() -> None:
    assert verify(load_public_key(PUBLIC_KEY), SIGNATURE, TIMESTAMP, PAYLOAD)


@pytest.mark.parametrize(("signature", "timestamp", "payload"), [
    (SIGNATURE, "1588788368", PAYLOAD),  # another time
    (SIGNATURE, TIMESTAMP, PAYLOAD + b" "),  # another body
    ("not base64!", TIMESTAMP, PAYLOAD),
    ("AAAA", TIMESTAMP, PAYLOAD),  # base64, no DER signature
])
def test_anything_else_does_not(signature: str, timestamp: str, payload: bytes) -> None:
    assert not verify(load_public_key(PUBLIC_KEY), signature, timestamp, payload)


def test_the_key_may_come_as_pem() -> None:
    pem = f"-----BEGIN PUBLIC KEY-----\n{PUBLIC_KEY[:64]}\n{PUBLIC_KEY[64:]}\n" \
          "-----END PUBLIC KEY-----\n"
    assert verify(load_public_key(pem), SIGNATURE, TIMESTAMP, PAYLOAD)


@pytest.mark.parametrize("value", ["not base64!", "AAAA",
                                   # Ed25519: a public key, not the kind SendGrid signs with
                                   "MCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE="])
def test_a_key_that_cannot_verify_is_refused_at_start_naming_the_setting(value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"SENDGRID_WEBHOOK_PUBLIC_KEY": value})
    assert caught.value.variable == "SENDGRID_WEBHOOK_PUBLIC_KEY"
