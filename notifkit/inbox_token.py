"""Inbox tokens: one user's read access to their in-app inbox, for a browser or an app.

A browser's ``EventSource`` cannot send an ``Authorization`` header, and a project key must
never reach an end user's device. So the customer's backend asks
``POST /v1/users/{userId}/inbox/token`` for a token, hands it to the user's page, and the page
opens ``GET /v1/users/{userId}/inbox/stream?token=...`` (the list and mark-read routes take it
too). A token is ``<payload>.<signature>``, both base64url without padding:

    payload   = base64url(JSON {"p": projectId, "u": userId, "exp": unix seconds})
    signature = base64url(HMAC-SHA256(key, payload)), key = HMAC-SHA256(NOTIFKIT_SECRET,
                                                                       "notifkit inbox token")

The key is derived for this use alone, so no other token this deployment signs (an
unsubscribe link's) is ever taken as an inbox token, nor the other way round. A token cannot
be revoked before it expires, except by changing ``NOTIFKIT_SECRET`` (which ends every one,
and every unsubscribe link with them): keep their lives short.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass

from notifkit import codec

__all__ = ["QUERY_PARAM", "InboxGrant", "InvalidInboxToken", "make_inbox_token",
           "verify_inbox_token"]

MAX_TOKEN_CHARS = 2048
QUERY_PARAM = "token"  # where an inbox route takes it
_PURPOSE = b"notifkit inbox token"


class InvalidInboxToken(ValueError):
    """Not made by this deployment, altered, or expired."""


@dataclass(frozen=True, slots=True)
class InboxGrant:
    project_id: str
    user_id: str
    expires_at_s: int


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _sign(secret: str, payload: str) -> str:
    key = hmac.new(secret.encode(), _PURPOSE, hashlib.sha256).digest()
    return _b64(hmac.new(key, payload.encode(), hashlib.sha256).digest())


def make_inbox_token(secret: str, project_id: str, user_id: str, expires_at_s: int) -> str:
    payload = _b64(codec.dumps({"p": project_id, "u": user_id, "exp": expires_at_s}))
    return f"{payload}.{_sign(secret, payload)}"


def verify_inbox_token(secret: str, token: str, now_s: float) -> InboxGrant:
    """What a token this deployment signed grants; :class:`InvalidInboxToken` otherwise."""
    if not token or len(token) > MAX_TOKEN_CHARS or token.count(".") != 1:
        raise InvalidInboxToken("malformed token")
    payload, signature = token.split(".")
    if not hmac.compare_digest(_sign(secret, payload).encode(),
                               signature.encode("utf-8", "replace")):
        raise InvalidInboxToken("bad signature")
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (ValueError, binascii.Error):
        raise InvalidInboxToken("unreadable payload") from None
    if not isinstance(claims, dict):
        raise InvalidInboxToken("unreadable payload")
    project, user, expires = claims.get("p"), claims.get("u"), claims.get("exp")
    if not (isinstance(project, str) and isinstance(user, str) and isinstance(expires, int)):
        raise InvalidInboxToken("incomplete claims")
    if expires <= now_s:
        raise InvalidInboxToken("expired")
    return InboxGrant(project, user, expires)
