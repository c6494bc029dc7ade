"""Signed unsubscribe tokens: what delivery links to and the unsubscribe route verifies."""

from __future__ import annotations

import json
from urllib.parse import parse_qs, urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from notifkit.config import Settings
from notifkit.signed_token import b64, signature
from notifkit.unsubscribe import (
    InvalidToken,
    Unsubscribe,
    make_token,
    unsubscribe_url,
    verify_token,
)

SECRET = "unsubscribe-test-secret-0123"


def test_a_token_round_trips_its_claims() -> None:
    token = make_token(SECRET, "p1", "user-1", "email", "marketing", "ada@example.com")
    assert verify_token(SECRET, token) == Unsubscribe("p1", "user-1", "email", "marketing",
                                                      "ada@example.com")
    assert verify_token(SECRET, make_token(SECRET, "p1", "u", "sms", None)).topic is None
    sent = make_token(SECRET, "p1", "u", "email", None, sent_ms=1_764_921_600_000)
    assert verify_token(SECRET, sent).sent_ms == 1_764_921_600_000


def test_another_secret_or_an_altered_payload_is_rejected() -> None:
    token = make_token(SECRET, "p1", "user-1", "email", "marketing")
    with pytest.raises(InvalidToken):
        verify_token("another-secret-0123456789", token)
    _payload, signature = token.split(".")
    forged = make_token("another-secret-0123456789", "p2", "user-1", "email", None)
    with pytest.raises(InvalidToken):
        verify_token(SECRET, forged.split(".")[0] + "." + signature)


@pytest.mark.parametrize("claims", [
    {"p": "p1", "u": "user\u0000", "c": "email", "t": None},
    {"p": "p1", "u": "u", "c": "email", "t": "news\u0000"},
    {"p": "p1", "u": "u", "c": "email", "t": None, "target": "a\u0000@b.co"},
    {"p": "p1", "u": "\ud800", "c": "email", "t": None},
    {"p": "p1", "u": "u", "c": "email", "t": None, "s": "yesterday"},
    {"p": "p1", "u": "u", "c": "email", "t": None, "s": True},
])
def test_claims_no_text_column_can_hold_are_rejected(claims: dict[str, object]) -> None:
    """Correctly signed, but naming what PostgreSQL cannot store (or a send time that is no
    number): an invalid token (400), not a failed query (500)."""
    payload = b64(json.dumps(claims).encode())
    with pytest.raises(InvalidToken):
        verify_token(SECRET, f"{payload}.{signature(SECRET.encode(), payload)}")


@given(st.text(max_size=300))
def test_arbitrary_strings_never_verify(token: str) -> None:
    with pytest.raises(InvalidToken):
        verify_token(SECRET, token)


@given(st.integers(min_value=0, max_value=200), st.characters(codec="ascii"))
def test_changing_any_character_invalidates_the_token(position: int, char: str) -> None:
    token = make_token(SECRET, "p1", "user-1", "email", "news")
    index = position % len(token)
    altered = token[:index] + char + token[index + 1:]
    if altered != token:
        with pytest.raises(InvalidToken):
            verify_token(SECRET, altered)


def test_the_url_points_at_the_public_api() -> None:
    settings = Settings(public_url="https://notify.example.com/", secret=SECRET)
    url = unsubscribe_url(settings, "p1", "u 1", "email", None, "a@b.co")
    parts = urlsplit(url)
    assert f"{parts.scheme}://{parts.netloc}{parts.path}" == \
        "https://notify.example.com/v1/unsubscribe"
    token = parse_qs(parts.query)["token"][0]
    assert verify_token(SECRET, token).user_id == "u 1"
