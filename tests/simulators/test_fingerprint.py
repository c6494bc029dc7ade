"""Idempotency fingerprints: the same request in any key order is the same request."""

from __future__ import annotations

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulators import SimulatorServer
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


@pytest.mark.parametrize(("route", "auth"), [
    ("/emails", "Bearer re_1"),
    ("/v3/mail/send", "Bearer SG.k"),
    ("/v1/projects/p/messages:send", "Bearer t"),
    ("/v1/chat/completions", "Bearer sk-1"),
])
@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
async def test_a_body_with_a_non_json_number_is_refused_before_it_is_fingerprinted(
    sim: SimulatorServer, route: str, auth: str, constant: bytes,
) -> None:
    # Python's parser would take NaN, and NaN fingerprints like null: refusing it keeps an
    # Idempotency-Key replay from matching a different body. Real providers refuse it too.
    body = b'{"from": "a@example.com", "to": ["b@example.com"], "x": ' + constant + b"}"
    async with aiohttp.ClientSession() as http, http.post(
            sim.base_url + route, data=body,
            headers={"Authorization": auth, "Content-Type": "application/json"}) as response:
        assert response.status == 400, await response.text()
    assert await sim.messages() == []
