"""No input crashes the simulator: control API and provider endpoints, fuzzed with Hypothesis.

Teams run the simulators in shared staging, where anything may be sent to them; a 500 or a
dead process there would look like a notifkit bug. Each property sends arbitrary input and
requires an answer below 500 (and in JSON for the control API), then checks the simulator
still works.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulators import SimulatorServer

FUZZ = settings(
    max_examples=120,
    deadline=None,
    # One simulator serves every example on purpose: state left by one input must not
    # break the next one either.
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
PROVIDERS = ["resend", "sendgrid", "smtp", "twilio", "fcm", "openai", "*"]
KINDS = ["timeout", "error", "rate_limit", "invalid_token", "lost_response", "latency", "malformed"]

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
fault_rules = st.fixed_dictionaries(
    {},
    optional={
        "provider": st.sampled_from(PROVIDERS) | json_values,
        "kind": st.sampled_from(KINDS) | json_values,
        "to": st.text(max_size=20) | json_values,
        "probability": st.floats(-1, 2) | json_values,
        "times": st.integers(-2, 5) | json_values,
        "status": st.integers(0, 700) | json_values,
        "retryAfter": st.floats(-5, 1e6) | json_values,
        "delayMs": st.integers(-5, 10**8)
        | st.lists(st.integers(-5, 10**7), max_size=3)
        | json_values,
    },
)
limit_bodies = st.fixed_dictionaries(
    {},
    optional={
        "provider": st.sampled_from(PROVIDERS) | json_values,
        "ratePerSecond": st.floats(-1, 1e7) | json_values,
        "burst": st.integers(-1, 10**7) | json_values,
    },
)
receipt_bodies = st.fixed_dictionaries(
    {},
    optional={
        "url": st.sampled_from(["http://127.0.0.1:9/h", "https://x", "ftp://y", ""]) | json_values,
        "secret": st.text(max_size=10) | json_values,
        "delayMs": st.integers(-1, 10**8) | json_values,
        "delivered": st.floats(-1, 2) | json_values,
        "bounced": json_values,
    },
)
control_paths = st.sampled_from(
    [
        "/_sim/faults",
        "/_sim/faults/f_1",
        "/_sim/messages",
        "/_sim/stats",
        "/_sim/limits",
        "/_sim/receipts",
        "/_sim/reset",
        "/_sim/health",
        "/_sim/",
        "/_sim/nothing",
    ]
)
bodies = (
    json_values.map(lambda v: json.dumps(v).encode())
    | fault_rules.map(lambda v: json.dumps(v).encode())
    | limit_bodies.map(lambda v: json.dumps(v).encode())
    | receipt_bodies.map(lambda v: json.dumps(v).encode())
    | st.binary(max_size=64)
)
queries = st.dictionaries(
    st.sampled_from(["provider", "to", "taskId", "limit", "x", ""]),
    st.text(max_size=12) | st.integers(-5, 10**6).map(str),
    max_size=4,
)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def assert_still_works(http: aiohttp.ClientSession, sim: SimulatorServer) -> None:
    await sim.reset()
    body = {"from": "a@example.com", "to": "b@example.com", "subject": "s", "text": "t"}
    async with http.post(
        sim.base_url + "/emails", json=body, headers={"Authorization": "Bearer re_1"}
    ) as response:
        assert response.status == 200


@pytest.mark.slow
@FUZZ
@given(
    method=st.sampled_from(["GET", "POST", "DELETE", "PUT"]),
    path=control_paths,
    body=bodies,
    query=queries,
)
async def test_control_api_never_fails(
    http: aiohttp.ClientSession,
    sim: SimulatorServer,
    method: str,
    path: str,
    body: bytes,
    query: dict[str, str],
) -> None:
    async with http.request(method, sim.base_url + path, data=body, params=query) as response:
        assert response.status < 500, await response.text()
        if response.status >= 400:
            error = await response.json()
            assert isinstance(error["error"], str)
            assert error["error"]
    await sim.clear_faults()  # rules the fuzzer managed to add must not stall the check
    await sim.disable_receipts()


@pytest.mark.slow
@FUZZ
@given(
    route=st.sampled_from(
        [
            "/emails",
            "/v3/mail/send",
            "/2010-04-01/Accounts/AC1/Messages.json",
            "/v1/projects/p/messages:send",
            "/v1/chat/completions",
            "/token",
        ]
    ),
    body=bodies
    | st.dictionaries(
        st.sampled_from(["To", "From", "Body", "StatusCallback"]), st.text(max_size=20)
    ).map(
        lambda form: "&".join(f"{k}={v}" for k, v in form.items()).encode("utf-8", "surrogatepass")
    ),
    auth=st.sampled_from(["Bearer k", "Basic QUMxOnRvaw==", "", "Bearer ", "Basic !!"]),
    headers=st.dictionaries(
        st.sampled_from(["Idempotency-Key", "X-Notifkit-Task-Id", "Content-Type"]),
        st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=300),
        max_size=3,
    ),
)
async def test_provider_endpoints_never_fail(
    http: aiohttp.ClientSession,
    sim: SimulatorServer,
    route: str,
    body: bytes,
    auth: str,
    headers: dict[str, Any],
) -> None:
    all_headers = {**headers, "Authorization": auth} if auth else headers
    async with http.post(sim.base_url + route, data=body, headers=all_headers) as response:
        assert response.status < 500, await response.text()


async def test_fuzzed_simulator_still_works(
    http: aiohttp.ClientSession, sim: SimulatorServer
) -> None:
    """After hostile input of every kind the same simulator still accepts mail."""
    for raw in (b"\xff\xfe", b"[" * 5000 + b"]" * 5000, b'{"kind": NaN}', b"null", b"1e999"):
        async with http.post(sim.base_url + "/_sim/faults", data=raw) as response:
            assert response.status == 400
        async with http.post(
            sim.base_url + "/emails", data=raw, headers={"Authorization": "Bearer k"}
        ) as response:
            assert response.status < 500
    await assert_still_works(http, sim)
