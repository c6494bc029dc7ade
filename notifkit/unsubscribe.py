"""Signed unsubscribe links (``GET``/``POST /v1/unsubscribe?token=...``, RFC 8058 one-click).

A token (notifkit/signed_token.py) signs with NOTIFKIT_SECRET itself the claims
``{"p": projectId, "u": userId, "c": channel, "t": topic | null, "target"?: address,
"s"?: sentMs, "preview"?: true}``; ``s`` is when the notification was accepted (Unix ms).

The token names what to turn off: the topic when there is one, else the channel. When it names
the address (``target``), unsubscribing also records a suppression for that address. Tokens do
not expire: an unsubscribe link must keep working for as long as the e-mail is kept. A
template preview's link is marked ``preview``: it shows what a recipient's would be, and
following it changes nothing. A link followed once its user id was deleted and given to a
new user (created more than an hour after the send) turns nothing off for that new user; the
address's suppression still applies.

Delivery puts ``unsubscribe_url(...)`` in the List-Unsubscribe header of every e-mail (with
``List-Unsubscribe-Post: List-Unsubscribe=One-Click``) and templates see it as
``unsubscribeUrl``.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from notifkit.config import Settings
from notifkit.signed_token import BadToken, open_token, seal

__all__ = ["InvalidToken", "Unsubscribe", "make_token", "unsubscribe_url", "verify_token"]

MAX_TOKEN_CHARS = 4096
TOKEN_PATTERN = r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$"
_CHANNELS = ("email", "sms", "push", "inapp", "webhook")


class InvalidToken(BadToken):
    """The token was not made by this deployment, or was altered."""


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    project_id: str
    user_id: str
    channel: str
    topic: str | None
    target: str | None = None
    preview: bool = False
    sent_ms: int | None = None


def make_token(
    secret: str, project_id: str, user_id: str, channel: str, topic: str | None,
    target: str | None = None, *, preview: bool = False, sent_ms: int | None = None,
) -> str:
    claims: dict[str, str | bool | int | None] = {"p": project_id, "u": user_id, "c": channel,
                                                  "t": topic}
    if target is not None:
        claims["target"] = target
    if sent_ms is not None:
        claims["s"] = sent_ms
    if preview:
        claims["preview"] = True
    return seal(secret.encode(), claims)


def verify_token(secret: str, token: str) -> Unsubscribe:
    """The claims of a token this deployment signed; :class:`InvalidToken` otherwise."""
    try:
        claims = open_token(secret.encode(), token, MAX_TOKEN_CHARS)
    except BadToken as exc:
        raise InvalidToken(str(exc)) from None
    project, user, channel = claims.get("p"), claims.get("u"), claims.get("c")
    topic, target = claims.get("t"), claims.get("target")
    if not (isinstance(project, str) and isinstance(user, str) and channel in _CHANNELS):
        raise InvalidToken("incomplete claims")
    if topic is not None and not isinstance(topic, str):
        raise InvalidToken("bad topic")
    if target is not None and not isinstance(target, str):
        raise InvalidToken("bad target")
    preview = claims.get("preview", False)
    if not isinstance(preview, bool):
        raise InvalidToken("bad preview")
    sent_ms = claims.get("s")
    if sent_ms is not None and (isinstance(sent_ms, bool) or not isinstance(sent_ms, int)):
        raise InvalidToken("bad send time")
    if not all(_storable(v) for v in (project, user, topic, target)):
        raise InvalidToken("claims PostgreSQL cannot store")
    assert isinstance(channel, str)
    return Unsubscribe(project, user, channel, topic, target, preview, sent_ms)


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
    target: str | None = None, *, preview: bool = False, sent_ms: int | None = None,
) -> str:
    """The one-click unsubscribe link for one recipient (GET to open, POST per RFC 8058)."""
    token = make_token(settings.secret, project_id, user_id, channel, topic, target,
                       preview=preview, sent_ms=sent_ms)
    return f"{settings.public_url.rstrip('/')}/v1/unsubscribe?token={quote(token, safe='')}"
