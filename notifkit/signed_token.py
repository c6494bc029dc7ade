"""Tokens notifkit hands out and later reads back (unsubscribe links, inbox tokens).

A token is ``<payload>.<signature>``, both base64url without padding:

    payload   = base64url(JSON claims)
    signature = base64url(HMAC-SHA256(key, payload))

Each kind of token says which key it signs with and what its claims must hold; this module
only makes and opens the envelope.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

from notifkit import codec

__all__ = ["BadToken", "b64", "open_token", "purpose_key", "seal", "signature"]


class BadToken(ValueError):
    """Malformed, not signed with the key, or not a JSON object inside."""


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def signature(key: bytes, payload: str) -> str:
    return b64(hmac.new(key, payload.encode(), hashlib.sha256).digest())


def purpose_key(secret: str, purpose: bytes) -> bytes:
    """A key derived from ``secret`` for one kind of token alone, so that no token of one
    kind is ever taken for another."""
    return hmac.new(secret.encode(), purpose, hashlib.sha256).digest()


def seal(key: bytes, claims: Mapping[str, Any]) -> str:
    payload = b64(codec.dumps(dict(claims)))
    return f"{payload}.{signature(key, payload)}"


def open_token(key: bytes, token: str, max_chars: int) -> dict[str, Any]:
    """The claims of a token signed with ``key``; :class:`BadToken` saying why not."""
    if not token or len(token) > max_chars or token.count(".") != 1:
        raise BadToken("malformed token")
    payload, sent = token.split(".")
    if not hmac.compare_digest(signature(key, payload).encode(),
                               sent.encode("utf-8", "replace")):
        raise BadToken("bad signature")
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (ValueError, binascii.Error) as exc:
        raise BadToken(f"unreadable payload: {exc}") from None
    if not isinstance(claims, dict):
        raise BadToken("unreadable payload")
    return claims
