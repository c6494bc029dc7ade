"""A request without credentials and one whose key the provider rejects (an `error` rule
with status 401) get different answers, as at each real provider: the missing-key answer
for the first, the invalid-key one for the second."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from simulators import SimulatorServer

EMAIL = {"from": "a@example.com", "to": "b@example.com", "subject": "s", "text": "t"}
SENDGRID = {
    "personalizations": [{"to": [{"email": "b@example.com"}]}],
    "from": {"email": "a@example.com"},
    "subject": "s",
    "content": [{"type": "text/plain", "value": "t"}],
}
FCM = {"message": {"token": "device-1", "notification": {"title": "t"}}}
OPENAI = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}

# provider, path, body, then the missing-key and the invalid-key answers, each as a path into
# the body and the value found there
CASES: list[tuple[str, str, dict[str, Any], tuple[Any, Any], tuple[Any, Any]]] = [
    ("resend", "/emails", EMAIL,
     (("name",), "missing_api_key"), (("name",), "validation_error")),
    ("resend", "/emails", EMAIL,
     (("message",), "Missing API key in the authorization header. Include the following "
      "header Authorization: Bearer YOUR_API_KEY in the request."),
     (("message",), "API key is invalid")),
    ("sendgrid", "/v3/mail/send", SENDGRID,
     (("errors", 0, "message"), "authorization required"),
     (("errors", 0, "message"),
      "The provided authorization grant is invalid, expired, or revoked")),
    ("fcm", "/v1/projects/p1/messages:send", FCM,
     (("error", "message"), "Request is missing required authentication credential. Expected "
      "OAuth 2 access token, login cookie or other valid authentication credential. See "
      "https://developers.google.com/identity/sign-in/web/devconsole-project."),
     (("error", "message"), "Request had invalid authentication credentials. Expected OAuth 2 "
      "access token, login cookie or other valid authentication credential. See "
      "https://developers.google.com/identity/sign-in/web/devconsole-project.")),
    ("openai", "/v1/chat/completions", OPENAI,
     (("error", "code"), None), (("error", "code"), "invalid_api_key")),
]


def _at(body: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        body = body[step]
    return body


@pytest.mark.parametrize(("provider", "path", "body", "missing", "invalid"), CASES,
                         ids=[f"{case[0]}-{case[3][0][-1]}" for case in CASES])
async def test_a_missing_key_and_a_rejected_key_get_the_providers_own_answers(
    sim: SimulatorServer, provider: str, path: str, body: dict[str, Any],
    missing: tuple[Any, Any], invalid: tuple[Any, Any],
) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(sim.base_url + path, json=body) as reply:
            assert reply.status == 401
            where, expected = missing
            assert _at(await reply.json(), where) == expected

        await sim.add_fault("error", provider, status=401, times=1)
        headers = {"Authorization": "Bearer some-key"}
        async with http.post(sim.base_url + path, json=body, headers=headers) as reply:
            assert reply.status == 401
            where, expected = invalid
            assert _at(await reply.json(), where) == expected


async def test_openai_names_a_rejected_key_as_the_sdk_shows_it(sim: SimulatorServer) -> None:
    await sim.add_fault("error", "openai", status=401, times=1)
    async with (
        aiohttp.ClientSession() as http,
        http.post(sim.base_url + "/v1/chat/completions", json=OPENAI,
                  headers={"Authorization": "Bearer sk-wrong"}) as reply,
    ):
        error = (await reply.json())["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("Incorrect API key provided")


async def test_resend_states_its_rate_limit_on_every_answer(sim: SimulatorServer) -> None:
    """Resend sends ratelimit-limit, -remaining and -reset with every response, and its SDK
    hands them over as `http_headers`: a client pacing itself by them finds them on a 200."""
    headers = {"Authorization": "Bearer re_key"}
    async with aiohttp.ClientSession() as http:
        async with http.post(sim.base_url + "/emails", json=EMAIL, headers=headers) as reply:
            assert reply.status == 200
            assert (reply.headers["ratelimit-limit"], reply.headers["ratelimit-remaining"]) == (
                "2", "2")
        await sim.set_limit("resend", rate_per_s=0.001, burst=3)
        seen = []
        for _ in range(3):
            async with http.post(sim.base_url + "/emails", json=EMAIL, headers=headers) as reply:
                assert reply.status == 200
                seen.append((reply.headers["ratelimit-limit"],
                             reply.headers["ratelimit-remaining"]))
                assert int(reply.headers["ratelimit-reset"]) >= 1
        assert seen == [("3", "2"), ("3", "1"), ("3", "0")]
        async with http.post(sim.base_url + "/emails", json={}, headers=headers) as reply:
            assert reply.status == 429
            assert reply.headers["ratelimit-remaining"] == "0"
