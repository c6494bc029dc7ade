"""UUIDv7 ids: the layout RFC 9562 gives, and an id check that agrees with ``uuid.UUID``."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from notifkit.ids import derived_uuid7, is_uuid, uuid7


def _parses(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


@given(st.integers(min_value=0, max_value=(1 << 48) - 1))
def test_a_uuid7_keeps_its_millisecond_and_says_version_7(ms: int) -> None:
    text = uuid7(ms)
    parsed = uuid.UUID(text)
    assert str(parsed) == text  # canonical: lower case, hyphens where uuid puts them
    assert parsed.version == 7
    assert parsed.variant == uuid.RFC_4122
    assert parsed.int >> 80 == ms


def test_derived_ids_are_a_function_of_their_parts_and_keep_the_anchors_time() -> None:
    anchor = uuid7(1_700_000_000_000)
    first = derived_uuid7(anchor, "user-1", "email")
    assert first == derived_uuid7(anchor, "user-1", "email")
    assert first != derived_uuid7(anchor, "user-1", "sms")
    assert uuid.UUID(first).int >> 80 == 1_700_000_000_000


@given(st.one_of(
    st.uuids().map(str),
    st.uuids().map(lambda u: str(u).upper()),
    st.uuids().map(lambda u: u.hex),
    st.uuids().map(lambda u: "{" + str(u) + "}"),
    st.uuids().map(lambda u: "urn:uuid:" + str(u)),
    st.uuids().map(lambda u: str(u) + "\n"),
    st.uuids().map(lambda u: str(u)[:-1] + "g"),
    st.text(max_size=40),
))
def test_the_id_check_agrees_with_the_uuid_parser(value: str) -> None:
    """Stages refuse entries whose ids PostgreSQL's uuid type would refuse; the quick check
    of the canonical form must not let through what the parser rejects, nor the reverse."""
    assert is_uuid(value) == _parses(value)


def test_a_value_that_is_not_text_is_not_an_id() -> None:
    assert not is_uuid(None)  # type: ignore[arg-type]
    assert not is_uuid(12)  # type: ignore[arg-type]
