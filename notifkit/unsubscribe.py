"""Signed unsubscribe links (``GET``/``POST /v1/unsubscribe?token=...``, RFC 8058 one-click).

A token is ``<payload>.<signature>``, both base64url without padding:

    payload   = base64url(JSON {"p": projectId, "u": userId, "c": channel, "t": topic | null,
                                "target"?: address})
    signature = base64url(HMAC-SHA256(NOTIFKIT_SECRET, payload))

The token names what to turn off: the topic when there is one, else the channel. When it names
the address (``target``), unsubscribing also records a suppression for that address. Tokens do
not expire: an unsubscribe link must keep working for as long as the e-mail is kept.

Delivery puts ``unsubscribe_url(...)`` in the List-Unsubscribe header of every e-mail (with
``List-Unsubscribe-Post: List-Unsubscribe=One-Click``) and templates see it as
``unsubscribeUrl``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass
from urllib.parse import quote

from notifkit import codec
from notifkit.config import Settings

__all__ = ["InvalidToken", "Unsubscribe", "make_token", "unsubscribe_url", "verify_token"]

MAX_TOKEN_CHARS = 4096
TOKEN_PATTERN = r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$"
_CHANNELS = ("email", "sms", "push", "inapp", "webhook")


class InvalidToken(ValueError):
    """The token was not made by this deployment, or was altered."""


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    project_id: str
    user_id: str
    channel: str
    topic: str | None
    target: str | None = None


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _sign(secret: str, payload: str) -> str:
    return _b64(hmac.new(secret.encode(), payload.encode(), hashlib.sha256).digest())


def make_token(
    secret: str, project_id: str, user_id: str, channel: str, topic: str | None,
    target: str | None = None,
) -> str:
    claims: dict[str, str | None] = {"p": project_id, "u": user_id, "c": channel, "t": topic}
    if target is not None:
        claims["target"] = target
    payload = _b64(codec.dumps(claims))
    return f"{payload}.{_sign(secret, payload)}"


def verify_token(secret: str, token: str) -> Unsubscribe:
    """The claims of a token this deployment signed; :class:`InvalidToken` otherwise."""
    if not token or len(token) > MAX_TOKEN_CHARS or token.count(".") != 1:
        raise InvalidToken("malformed token")
    payload, signature = token.split(".")
    if not hmac.compare_digest(_sign(secret, payload).encode(), signature.encode("utf-8",
                                                                                "replace")):
        raise InvalidToken("bad signature")
    try:
        claims = json.loads(_unb64(payload))
    except (ValueError, binascii.Error) as exc:
        raise InvalidToken(f"unreadable payload: {exc}") from None
    if not isinstance(claims, dict):
        raise InvalidToken("unreadable payload")
    project, user, channel = claims.get("p"), claims.get("u"), claims.get("c")
    topic, target = claims.get("t"), claims.get("target")
    if not (isinstance(project, str) and isinstance(user, str) and channel in _CHANNELS):
        raise InvalidToken("incomplete claims")
    if topic is not None and not isinstance(topic, str):
        raise InvalidToken("bad topic")
    if target is not None and not isinstance(target, str):
        raise InvalidToken("bad target")
    if not all(_storable(v) for v in (project, user, topic, target)):
        raise InvalidToken("claims PostgreSQL cannot store")
    assert isinstance(channel, str)
    return Unsubscribe(project, user, channel, topic, target)


def _storable(value: str | None) -> bool:
    # A claim is compared with and written to text columns, which hold no NUL and no lone
    # surrogate; such a claim was never minted by unsubscribe_url.
    if value is None:
        return True
    if "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def unsubscribe_url(
    settings: Settings, project_id: str, user_id: str, channel: str, topic: str | None,
    target: str | None = None,
) -> str:
    """The one-click unsubscribe link for one recipient (GET to open, POST per RFC 8058)."""
    token = make_token(settings.secret, project_id, user_id, channel, topic, target)
    return f"{settings.public_url.rstrip('/')}/v1/unsubscribe?token={quote(token, safe='')}"
