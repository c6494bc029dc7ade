"""Inbox tokens: one user's read access to their in-app inbox, for a browser or an app.

A browser's ``EventSource`` cannot send an ``Authorization`` header, and a project key must
never reach an end user's device. So the customer's backend asks
``POST /v1/users/{userId}/inbox/token`` for a token, hands it to the user's page, and the page
opens ``GET /v1/users/{userId}/inbox/stream?token=...`` (the list and mark-read routes take it
too). A token (notifkit/signed_token.py) signs ``{"p": projectId, "u": userId, "exp": unix
seconds, "c": the user's creation time in unix microseconds}`` with HMAC-SHA256(NOTIFKIT_SECRET,
"notifkit inbox token") as its key. ``c`` ties the token to that user: once the user id is
deleted and given to a new user, the token opens nothing (tokens made before ``c`` was signed
have none, and are taken as they were).

The key is derived for this use alone, so no other token this deployment signs (an
unsubscribe link's) is ever taken as an inbox token, nor the other way round. A token cannot
be revoked before it expires, except by changing ``NOTIFKIT_SECRET`` (which ends every one,
and every unsubscribe link with them): keep their lives short.
"""

from __future__ import annotations

from dataclasses import dataclass

from notifkit.signed_token import BadToken, open_token, purpose_key, seal

__all__ = ["QUERY_PARAM", "InboxGrant", "InvalidInboxToken", "make_inbox_token",
           "verify_inbox_token"]

MAX_TOKEN_CHARS = 2048
QUERY_PARAM = "token"  # where an inbox route takes it
_PURPOSE = b"notifkit inbox token"


class InvalidInboxToken(BadToken):
    """Not made by this deployment, altered, or expired."""


@dataclass(frozen=True, slots=True)
class InboxGrant:
    project_id: str
    user_id: str
    expires_at_s: int
    user_created_us: int | None = None  # None: a token made before it was signed


def make_inbox_token(secret: str, project_id: str, user_id: str, expires_at_s: int,
                     user_created_us: int | None) -> str:
    """None for ``user_created_us`` makes a token as they were before it was signed."""
    claims: dict[str, object] = {"p": project_id, "u": user_id, "exp": expires_at_s}
    if user_created_us is not None:
        claims["c"] = user_created_us
    return seal(purpose_key(secret, _PURPOSE), claims)


def verify_inbox_token(secret: str, token: str, now_s: float) -> InboxGrant:
    """What a token this deployment signed grants; :class:`InvalidInboxToken` otherwise."""
    try:
        claims = open_token(purpose_key(secret, _PURPOSE), token, MAX_TOKEN_CHARS)
    except BadToken as exc:
        raise InvalidInboxToken(str(exc)) from None
    project, user, expires = claims.get("p"), claims.get("u"), claims.get("exp")
    created = claims.get("c")
    if not (isinstance(project, str) and isinstance(user, str) and isinstance(expires, int)
            and (created is None or isinstance(created, int))):
        raise InvalidInboxToken("incomplete claims")
    if expires <= now_s:
        raise InvalidInboxToken("expired")
    return InboxGrant(project, user, expires, created)
