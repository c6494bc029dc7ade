"""``dev`` makes its demo through the HTTP API; an API that fails meanwhile ends dev with one
line naming the request, not a traceback."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from notifkit.dev import DemoError, ensure_demo


@pytest.fixture
async def failing_api() -> AsyncIterator[str]:
    async def projects(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "database unavailable"}}, status=503)

    app = web.Application()
    app.router.add_post("/v1/projects", projects)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_an_api_failure_while_making_the_demo_is_one_clear_error(
    failing_api: str, tmp_path: Path,
) -> None:
    with pytest.raises(DemoError) as caught:
        await ensure_demo(failing_api, "admin-key", tmp_path)
    message = str(caught.value)
    assert "POST /v1/projects answered 503" in message
    assert "database unavailable" in message
    assert not (tmp_path / "demo.json").exists()
