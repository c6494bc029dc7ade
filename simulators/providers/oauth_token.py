"""`POST /token`: a stand-in for Google's OAuth2 token endpoint, which a service account's
`token_uri` may point at (google-auth, firebase-admin and notifkit's own FCM transport sign a
JWT and trade it here for an access token the FCM simulator accepts).

It refuses what Google refuses before it could check a signature: a request with no
`grant_type` or no `assertion` (`invalid_request`), a grant other than the JWT bearer grant or a
refresh token (`unsupported_grant_type`), an assertion that is no JWT whose header and claims
decode as JSON objects, and one whose `iat` / `exp` do not make a token of at most an hour
that is valid now (`invalid_grant`, Google's words). The signature itself is not checked: the
simulator has no account's public key. Errors are RFC 6749 section 5.2's
`{"error", "error_description"}`, status 400.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import time
from typing import Any
from urllib.parse import parse_qs

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from simulators.bodies import (
    InflatedTooLarge,
    UndecodableBody,
    UnsupportedEncoding,
    read_body,
    unsupported_message,
)
from simulators.pipeline import UNREADABLE_BODY
from simulators.replies import json_reply
from simulators.state import STATE

TOKEN_LIFETIME_S = 3599
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
REFRESH = "refresh_token"
# Google's bound on a service account's JWT, and the slack it gives clocks.
MAX_JWT_LIFETIME_S = 3600
CLOCK_SLACK_S = 300
_SHORT_LIVED = (
    "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable "
    "timeframe. Check your iat and exp values in the JWT claim."
)


class GrantRefused(Exception):
    def __init__(self, error: str, description: str) -> None:
        super().__init__(description)
        self.error = error
        self.description = description


async def token_endpoint(request: web.Request) -> web.Response:
    state = request.app[STATE]
    try:
        body = await read_body(request, state.settings.max_body_bytes)
    except UnsupportedEncoding as exc:
        return _oauth_error(415, "invalid_request", unsupported_message(exc.coding))
    except (UndecodableBody, RequestPayloadError):
        return _oauth_error(400, "invalid_request", UNREADABLE_BODY)
    except InflatedTooLarge:
        return _oauth_error(413, "invalid_request", "The request body is too large.")
    try:
        check_grant(_form(body), now_s=time.time())
    except GrantRefused as refused:
        return _oauth_error(400, refused.error, refused.description)
    token = "ya29.sim-" + state.ids.token(48)
    body_out = {"access_token": token, "expires_in": TOKEN_LIFETIME_S, "token_type": "Bearer"}
    return json_reply(200, body_out).response()


def check_grant(form: dict[str, str], now_s: float) -> None:
    """Raises GrantRefused for a grant Google's endpoint would refuse (see the module)."""
    grant = form.get("grant_type")
    if not grant:
        raise GrantRefused("invalid_request", "Missing required parameter: grant_type")
    if grant == REFRESH:
        if not form.get("refresh_token"):
            raise GrantRefused("invalid_request", "Missing required parameter: refresh_token")
        return
    if grant != JWT_BEARER:
        raise GrantRefused("unsupported_grant_type", f"Invalid grant_type: {grant[:100]}")
    assertion = form.get("assertion")
    if not assertion:
        raise GrantRefused("invalid_request", "Missing required parameter: assertion")
    claims = _jwt_claims(assertion)
    issued, expires = _number(claims.get("iat")), _number(claims.get("exp"))
    if (
        issued is None
        or expires is None
        or expires <= issued
        or expires - issued > MAX_JWT_LIFETIME_S
        or issued > now_s + CLOCK_SLACK_S
        or expires < now_s - CLOCK_SLACK_S
    ):
        raise GrantRefused("invalid_grant", _SHORT_LIVED)


def _jwt_claims(assertion: str) -> dict[str, Any]:
    parts = assertion.split(".")
    decoded = [_json_object(part) for part in parts[:2]] if len(parts) == 3 else []
    if len(decoded) != 2 or None in decoded or not parts[2]:
        raise GrantRefused("invalid_grant", "Invalid JWT: the assertion is not a signed JWT "
                           "(base64url header.claims.signature)")
    claims = decoded[1]
    assert claims is not None
    return claims


def _json_object(segment: str) -> dict[str, Any] | None:
    try:
        value = json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))
    except (binascii.Error, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _number(value: object) -> float | None:
    """A JSON number's value, if finite (`NaN` compares with nothing)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)  # an integer of hundreds of digits is beyond a float
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _form(body: bytes) -> dict[str, str]:
    """The urlencoded form's first value of each field (undecodable bytes replaced: such a
    field is then simply wrong, not a crash)."""
    text = body.decode("utf-8", errors="replace")
    return {name: values[0] for name, values in parse_qs(text).items()}


def _oauth_error(status: int, error: str, description: str) -> web.Response:
    return json_reply(status, {"error": error, "error_description": description}).response()
