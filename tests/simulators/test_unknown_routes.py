"""A path under a provider's prefix that the simulator does not serve is answered in that
provider's own error format (404, or 405 naming the allowed methods), so the official clients
raise their own errors for it; paths outside every provider keep the simulator's JSON error."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import resend
from resend import exceptions
from twilio.base.exceptions import TwilioException
from twilio.http.http_client import TwilioHttpClient
from twilio.rest import Client

from simulators import SimulatorServer


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def call(
    http: aiohttp.ClientSession, sim: SimulatorServer, method: str, path: str
) -> tuple[int, Any, str | None]:
    async with http.request(method, sim.base_url + path) as response:
        return response.status, await response.json(), response.headers.get("Allow")


@pytest.mark.parametrize(
    ("method", "path", "status", "expected"),
    [
        ("GET", "/emails/x/y", 404, {"statusCode": 404, "name": "not_found"}),
        ("DELETE", "/emails", 405, {"statusCode": 405, "name": "method_not_allowed"}),
        ("GET", "/v3/templates", 404, {"errors": [{"message": "Not Found", "field": None,
                                                   "help": None}]}),
        ("GET", "/2010-04-01/Accounts/AC1/Calls.json", 404, {"code": 20404, "status": 404}),
        ("DELETE", "/2010-04-01/Accounts/AC1/Messages.json", 405,
         {"code": 20004, "status": 405}),
        ("GET", "/v1/embeddings", 404, {"error": {"message": "Invalid URL (GET /v1/embeddings)",
                                                  "type": "invalid_request_error",
                                                  "param": None, "code": None}}),
    ],
)
async def test_unknown_provider_path_answers_in_provider_format(
    http: aiohttp.ClientSession,
    sim: SimulatorServer,
    method: str,
    path: str,
    status: int,
    expected: dict[str, Any],
) -> None:
    got_status, body, allow = await call(http, sim, method, path)

    assert got_status == status
    assert {key: body[key] for key in expected} == expected
    assert (allow is not None) == (status == 405)


async def test_unknown_fcm_path_is_not_read_as_unregistered(
    http: aiohttp.ClientSession, sim: SimulatorServer
) -> None:
    # UNREGISTERED tells a client to forget the device token; a wrong URL must not say it.
    status, body, _ = await call(http, sim, "POST", "/v1/projects/p/messages:batchSend")

    assert status == 404
    assert body["error"]["status"] == "NOT_FOUND"
    assert "details" not in body["error"]


async def test_other_paths_keep_the_simulator_error(
    http: aiohttp.ClientSession, sim: SimulatorServer
) -> None:
    assert await call(http, sim, "GET", "/emailsx") == (
        404, {"error": "no route for GET /emailsx"}, None
    )


async def test_resend_sdk_gets_resend_error_for_an_unserved_call(
    sim: SimulatorServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resend, "api_url", sim.base_url)
    monkeypatch.setattr(resend, "api_key", "re_test_key")

    with pytest.raises(exceptions.ResendError) as caught:
        await asyncio.to_thread(resend.Emails.cancel, "4ef9a417-02e9-4d39-ad75-9611e0fcc33c")

    assert caught.value.code == 404
    assert caught.value.error_type == "not_found"


async def test_twilio_sdk_gets_twilio_error_for_an_unserved_call(sim: SimulatorServer) -> None:
    twilio = Client("AC" + "0" * 32, "token", http_client=TwilioHttpClient(timeout=5))
    twilio.api.base_url = sim.base_url

    with pytest.raises(TwilioException) as caught:
        await asyncio.to_thread(twilio.calls.list, limit=1)

    assert '"code": 20404' in str(caught.value)
