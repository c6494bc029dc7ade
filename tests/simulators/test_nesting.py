"""JSON nested to any depth never reaches a step that recurses too deep.

Python's parser refuses JSON nested past about 1,000 levels, but a body just inside that
limit used to parse and then overflow the stack in whatever walked it next (the completion
hash, storing the message, the surrogate check), a 500. Every JSON body is now refused
past MAX_JSON_DEPTH levels at parse time with the provider's own 400, and the test walks
every depth from 1 to 1,100 so no band of depths can slip through.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest

from simulators import SimulatorServer
from simulators.jsondepth import MAX_JSON_DEPTH

DEPTHS = range(1, 1101)
BEARER = {"Authorization": "Bearer k_1"}


def brackets(depth: int) -> str:
    """A value ``depth`` levels deep (a plain string at 0)."""
    return "[" * depth + '"x"' + "]" * depth


def objects(depth: int) -> str:
    return '{"a":' * depth + '"x"' + "}" * depth


# (path, body at total depth d). The nested value sits where each provider later walks it.
Body = Callable[[int], str]
PROVIDERS: dict[str, tuple[str, Body]] = {
    "openai": (
        "/v1/chat/completions",
        # body (1) > messages (2) > message (3) > content
        lambda d: '{"model":"gpt-4o","messages":[{"role":"user","content":'
        + brackets(max(d - 3, 0)) + "}]}",
    ),
    "resend": (
        "/emails",
        # body (1) > template (2) > variables (3) > a variable, free JSON
        lambda d: '{"from":"a@example.com","to":"b@example.com","subject":"s",'
        '"template":{"id":"t","variables":{"v":' + brackets(max(d - 3, 0)) + "}}}",
    ),
    "resend_batch": (
        "/emails/batch",
        # A field the batch ignores: parsed, fingerprinted for the Idempotency-Key, not stored.
        lambda d: '[{"from":"a@example.com","to":"b@example.com","subject":"s","text":"t",'
        '"note":' + brackets(max(d - 2, 0)) + "}]",
    ),
    "sendgrid": (
        "/v3/mail/send",
        # body (1) > personalizations (2) > personalization (3) > dynamic_template_data
        lambda d: '{"personalizations":[{"to":[{"email":"b@example.com"}],'
        '"dynamic_template_data":' + brackets(max(d - 3, 0)) + '}],'
        '"from":{"email":"a@example.com"},"subject":"s",'
        '"content":[{"type":"text/plain","value":"v"}]}',
    ),
    "fcm": (
        "/v1/projects/p/messages:send",
        # body (1) > message (2) > apns (3) > payload, free JSON (a google.protobuf.Struct)
        lambda d: '{"message":{"token":"t","apns":{"payload":' + objects(max(d - 3, 0))
        + "}}}",
    ),
}
CONTROL: dict[str, tuple[str, Body]] = {
    "faults": ("/_sim/faults",
               lambda d: '{"provider":"resend","kind":"error","to":' + brackets(d - 1) + "}"),
    "limits": ("/_sim/limits", lambda d: '{"provider":' + brackets(d - 1) + "}"),
    "receipts": ("/_sim/receipts",
                 lambda d: '{"url":"http://127.0.0.1:9/h","secret":' + brackets(d - 1) + "}"),
    "reset": ("/_sim/reset", lambda d: '{"seed":' + brackets(d - 1) + "}"),
}


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


ENDPOINTS = {**{name: (path, body, BEARER) for name, (path, body) in PROVIDERS.items()},
             **{f"control-{name}": (path, body, {}) for name, (path, body) in CONTROL.items()}}


@pytest.mark.slow
@pytest.mark.parametrize("endpoint", sorted(ENDPOINTS))
async def test_bodies_nested_to_any_depth_never_answer_5xx(
    http: aiohttp.ClientSession, sim: SimulatorServer, endpoint: str
) -> None:
    path, body, headers = ENDPOINTS[endpoint]
    for depth in DEPTHS:
        # A fresh Idempotency-Key each time, so Resend fingerprints every body it is given.
        sent = {**headers, "Idempotency-Key": f"nesting-{depth}"}
        async with http.post(sim.base_url + path, data=body(depth).encode(),
                             headers=sent) as response:
            text = await response.text()
            assert response.status < 500, (depth, text)
            if depth > MAX_JSON_DEPTH:
                # Refused as the provider refuses a bad body, whatever the depth.
                assert response.status == 400, (depth, text)
                assert "nested too deeply" in text or not path.startswith("/_sim/"), text
    # Only bodies within the limit were recorded, and listing them still works.
    for message in await sim.messages():
        assert message["provider"] == endpoint.removesuffix("_batch")


async def test_a_body_at_the_limit_is_accepted(
    http: aiohttp.ClientSession, sim: SimulatorServer
) -> None:
    for provider, (path, body) in PROVIDERS.items():
        async with http.post(sim.base_url + path, data=body(MAX_JSON_DEPTH).encode(),
                             headers=BEARER) as response:
            assert response.status < 300, (provider, await response.text())
