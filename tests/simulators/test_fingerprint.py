"""Idempotency fingerprints: the same request in any key order is the same request."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from simulators.idempotency import fingerprint

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(st.dictionaries(st.text(), _JSON, max_size=6))
def test_key_order_does_not_change_the_fingerprint(payload: dict[str, object]) -> None:
    reordered = dict(reversed(list(payload.items())))
    assert fingerprint(reordered) == fingerprint(payload)


def test_different_requests_differ_even_beyond_64_bit_integers() -> None:
    assert fingerprint({"to": ["a@example.com"]}) != fingerprint({"to": ["b@example.com"]})
    assert fingerprint({"n": 2**70}) != fingerprint({"n": 2**70 + 1})
    assert fingerprint({"n": 2**70}) == fingerprint({"n": 2**70})
