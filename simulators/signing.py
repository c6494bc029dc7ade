"""Webhook signatures, exactly as the providers compute them.

Svix (Resend's webhooks, and the simulators' receipts for the other providers):
    signed content  = f"{svix-id}.{svix-timestamp}.{raw body}"
    key             = base64-decode(secret without "whsec_") if the secret starts with
                      "whsec_", else the secret's UTF-8 bytes
    svix-signature  = "v1," + base64(HMAC-SHA256(key, signed content)); the header may carry
                      several space-separated signatures (key rotation), any one may match.
    A secret without "whsec_" is signed twice, with its UTF-8 bytes and with what base64
    makes of it, since the official svix libraries base64-decode a secret whether or not it
    has the prefix: a receiver checking with either rule finds its signature.

Twilio status callbacks:
    X-Twilio-Signature = base64(HMAC-SHA1(auth token, url + key1 + value1 + key2 + value2...))
    over the full callback URL and the form parameters sorted by name.

These are pure functions so notifkit's tests can verify receipts with them; notifkit's own
webhook endpoint implements the same algorithms independently.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import time
from collections.abc import Iterable, Mapping

SVIX_SECRET_PREFIX = "whsec_"
SVIX_TOLERANCE_S = 300


def svix_key(secret: str) -> bytes:
    if secret.startswith(SVIX_SECRET_PREFIX):
        return base64.b64decode(secret[len(SVIX_SECRET_PREFIX) :], validate=True)
    return secret.encode()


def svix_keys(secret: str) -> list[bytes]:
    """Every key a receiver may hold for `secret`: its own, and for a secret without
    "whsec_" also its base64 reading, decoded leniently as the svix libraries do."""
    keys = [svix_key(secret)]
    if not secret.startswith(SVIX_SECRET_PREFIX):
        try:
            decoded = base64.b64decode(secret)
        except (binascii.Error, ValueError):
            decoded = b""
        if decoded and decoded != keys[0]:
            keys.append(decoded)
    return keys


def svix_sign(secret: str, msg_id: str, timestamp: int | str, body: bytes | str) -> str:
    """The `svix-signature` header value for one delivery: one `v1,` signature a key of
    `svix_keys`, separated by spaces."""
    payload = body.encode() if isinstance(body, str) else body
    signed = f"{msg_id}.{timestamp}.".encode() + payload
    return " ".join(
        "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        for key in svix_keys(secret)
    )


def svix_headers(
    secret: str, body: bytes | str, *, msg_id: str | None = None, timestamp: int | None = None
) -> dict[str, str]:
    """The three headers of a Svix delivery; id and timestamp are fresh unless given."""
    msg_id = msg_id or "msg_" + secrets.token_urlsafe(18)
    timestamp = int(time.time()) if timestamp is None else timestamp
    return {
        "svix-id": msg_id,
        "svix-timestamp": str(timestamp),
        "svix-signature": svix_sign(secret, msg_id, timestamp, body),
    }


def svix_verify(
    secret: str,
    headers: Mapping[str, str],
    body: bytes | str,
    *,
    tolerance_s: int = SVIX_TOLERANCE_S,
    now_s: float | None = None,
) -> bool:
    """True if `headers` (svix-id, svix-timestamp, svix-signature) sign `body` with `secret`.

    The timestamp must be within `tolerance_s` of now, which stops replays of old deliveries.
    Header names are matched case-insensitively.
    """
    lowered = {name.lower(): value for name, value in headers.items()}
    msg_id = lowered.get("svix-id")
    timestamp = lowered.get("svix-timestamp")
    signatures = lowered.get("svix-signature")
    if not msg_id or not timestamp or not signatures:
        return False
    try:
        sent_s = int(timestamp)
        expected = svix_sign(secret, msg_id, sent_s, body)
    except (ValueError, binascii.Error):
        return False
    now = time.time() if now_s is None else now_s
    if abs(now - sent_s) > tolerance_s:
        return False
    return any(
        hmac.compare_digest(mine.encode(), candidate.encode(errors="replace"))
        for mine in expected.split()
        for candidate in signatures.split()
    )


def twilio_sign(
    auth_token: str, url: str, params: Mapping[str, str] | Iterable[tuple[str, str]]
) -> str:
    """The `X-Twilio-Signature` header value for a form-encoded callback to `url`."""
    pairs = list(params.items()) if isinstance(params, Mapping) else list(params)
    signed = url + "".join(name + value for name, value in sorted(pairs))
    digest = hmac.new(auth_token.encode(), signed.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


def twilio_verify(
    auth_token: str,
    url: str,
    params: Mapping[str, str] | Iterable[tuple[str, str]],
    signature: str,
) -> bool:
    expected = twilio_sign(auth_token, url, params)
    return hmac.compare_digest(expected.encode(), signature.encode(errors="replace"))
