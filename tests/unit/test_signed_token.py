"""The signed-token envelope that unsubscribe links and inbox tokens share."""

from __future__ import annotations

import re

import pytest

from notifkit.inbox_token import (
    MAX_TOKEN_CHARS,
    InvalidInboxToken,
    make_inbox_token,
    verify_inbox_token,
)
from notifkit.signed_token import BadToken, b64, open_token, purpose_key, seal, signature
from notifkit.unsubscribe import MAX_TOKEN_CHARS as UNSUBSCRIBE_MAX_CHARS
from notifkit.unsubscribe import TOKEN_PATTERN, InvalidToken, make_token, verify_token

KEY = b"signed-token-test-key-0123456789"
SECRET = "signed-token-test-secret-0123"


def signed(key: bytes, raw: bytes) -> str:
    """A token over any payload bytes, correctly signed with ``key``."""
    payload = b64(raw)
    return f"{payload}.{signature(key, payload)}"


def test_a_token_as_long_as_the_limit_opens_and_one_past_it_is_malformed() -> None:
    token = seal(KEY, {"x": "a" * 50})
    assert open_token(KEY, token, len(token)) == {"x": "a" * 50}
    with pytest.raises(BadToken, match="malformed"):
        open_token(KEY, token, len(token) - 1)


def test_a_token_is_base64url_without_padding_as_the_routes_take_it() -> None:
    # The unsubscribe route refuses any other character ('=' included) before verifying.
    for size in range(4):  # each remainder of the payload's length mod 3
        token = seal(KEY, {"x": "a" * size})
        assert re.fullmatch(TOKEN_PATTERN, token), token
        assert open_token(KEY, token, 4096) == {"x": "a" * size}


@pytest.mark.parametrize("raw", [b"not json", b"\xff\xfe", b"[1, 2]", b'"text"', b"7"])
def test_a_signed_payload_that_is_no_json_object_is_a_bad_token(raw: bytes) -> None:
    # Only a holder of the key can make one; it is refused as a token all the same, never
    # read as claims (a list has no .get) nor raised as another error.
    with pytest.raises(BadToken, match="unreadable payload"):
        open_token(KEY, signed(KEY, raw), 4096)


def test_a_token_signed_with_the_secret_itself_is_no_inbox_token() -> None:
    """Inbox tokens sign with a key derived for them alone: an unsubscribe link (signed
    with NOTIFKIT_SECRET itself) whose claims also read as an inbox token's opens no inbox."""
    both = seal(SECRET.encode(), {"p": "p1", "u": "u1", "c": "email", "t": None,
                                  "exp": 2_000_000_000})
    assert verify_token(SECRET, both).user_id == "u1"
    with pytest.raises(InvalidInboxToken, match="bad signature"):
        verify_inbox_token(SECRET, both, 1_000)
    inbox = make_inbox_token(SECRET, "p1", "u1", 2_000_000_000, 1_700_000_000_000_000)
    with pytest.raises(InvalidToken, match="bad signature"):
        verify_token(SECRET, inbox)


@pytest.mark.parametrize("claims", [
    {"p": None, "u": "u1", "exp": 2_000_000_000},
    {"p": "p1", "u": 7, "exp": 2_000_000_000},
    {"p": "p1", "u": "u1", "exp": "2000000000"},
    {"p": "p1", "u": "u1", "exp": 2e9},
    {"p": "p1", "u": "u1"},
    {"p": "p1", "u": "u1", "exp": 2_000_000_000, "c": "2024-01-01"},
])
def test_inbox_claims_of_the_wrong_shape_are_incomplete(claims: dict[str, object]) -> None:
    token = seal(purpose_key(SECRET, b"notifkit inbox token"), claims)
    with pytest.raises(InvalidInboxToken, match="incomplete claims"):
        verify_inbox_token(SECRET, token, 1_000)


def test_an_inbox_token_past_its_length_limit_is_malformed() -> None:
    long_user = "u" * MAX_TOKEN_CHARS
    token = make_inbox_token(SECRET, "p1", long_user, 2_000_000_000, 1_700_000_000_000_000)
    with pytest.raises(InvalidInboxToken, match="malformed"):
        verify_inbox_token(SECRET, token, 1_000)
    fits = make_inbox_token(SECRET, "p1", "u" * (MAX_TOKEN_CHARS // 2 - 100), 2_000_000_000,
                            1_700_000_000_000_000)
    assert len(fits) <= MAX_TOKEN_CHARS
    assert verify_inbox_token(SECRET, fits, 1_000).user_id == "u" * (MAX_TOKEN_CHARS // 2 - 100)


@pytest.mark.parametrize(("claims", "why"), [
    ({"p": "p1", "u": "u", "c": "fax", "t": None}, "incomplete claims"),
    ({"p": "p1", "u": "u", "c": None, "t": None}, "incomplete claims"),
    ({"p": "p1", "u": "u", "c": "email", "t": 5}, "bad topic"),
    ({"p": "p1", "u": "u", "c": "email", "t": None, "target": ["a@b.co"]}, "bad target"),
    ({"p": "p1", "u": "u", "c": "email", "t": None, "preview": "yes"}, "bad preview"),
])
def test_unsubscribe_claims_of_the_wrong_shape_are_refused(
    claims: dict[str, object], why: str
) -> None:
    # Refused as an invalid token (400), never a failed check on them later (500).
    with pytest.raises(InvalidToken, match=why):
        verify_token(SECRET, seal(SECRET.encode(), claims))


def test_an_unsubscribe_token_past_its_length_limit_is_malformed() -> None:
    token = make_token(SECRET, "p1", "u" * UNSUBSCRIBE_MAX_CHARS, "email", None)
    with pytest.raises(InvalidToken, match="malformed"):
        verify_token(SECRET, token)
