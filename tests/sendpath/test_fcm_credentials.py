"""FCM with a service-account file: a signed JWT is exchanged for an access token, which is
reused until it nears expiry."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from aiohttp import web
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding

from notifkit.transports.base import Message, Outcome
from notifkit.transports.fcm import FCM_SCOPE, FcmTransport
from simulators import SimulatorServer
from tests.support.service_account import CLIENT_EMAIL, write_service_account


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


async def test_a_service_account_token_is_fetched_once_and_used(
    tmp_path: Path, sim: SimulatorServer
) -> None:
    exchanges: list[dict[str, Any]] = []

    async def token(request: web.Request) -> web.Response:
        form = await request.post()
        header, claims, signature = str(form["assertion"]).split(".")
        key.public_key().verify(_unb64(signature), f"{header}.{claims}".encode(),
                                padding.PKCS1v15(), hashes.SHA256())  # raises if forged
        exchanges.append(json.loads(_unb64(claims)))
        return web.json_response({"access_token": "ya29.from-jwt", "expires_in": 3600})

    app = web.Application()
    app.router.add_post("/token", token)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    credentials = tmp_path / "service-account.json"
    key = write_service_account(credentials, f"http://127.0.0.1:{port}/token")
    transport = FcmTransport(project_id="p1", credentials_file=str(credentials),
                             base_url=sim.base_url)
    await transport.open(None)  # type: ignore[arg-type]
    try:
        for n in range(2):
            result = await transport.send(Message(
                task_id=f"t{n}", event_id="e", project_id="p", user_id="u", channel="push",
                to="device-1", content={"title": "Hi", "body": "there"}))
            assert result.outcome is Outcome.SENT, result.detail
    finally:
        await transport.close()
        await runner.cleanup()

    [claims] = exchanges  # one exchange for both sends
    assert claims["iss"] == CLIENT_EMAIL
    assert claims["scope"] == FCM_SCOPE
    assert claims["aud"] == f"http://127.0.0.1:{port}/token"
    assert len(await sim.messages("fcm")) == 2
