"""The API's shutdown ends even when its pub/sub hub swallows a cancellation (its read under
a timeout can turn a cancel into a TimeoutError and loop on): before, ``runner.cleanup()``
awaited the hub forever, so a SIGTERMed API, or one whose port was taken, never exited."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from aiohttp import web

from notifkit.config import Settings
from notifkit.services.api import app as app_module
from notifkit.services.api.pubsub import Hub


async def test_cleanup_ends_although_the_hub_swallows_a_cancellation(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a hub whose loop loses the first cancellation, as a racing read timeout makes it
    started = asyncio.Event()
    test_over = asyncio.Event()

    async def run(self: Hub) -> None:
        started.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)
        await test_over.wait()

    monkeypatch.setattr(Hub, "run", run)
    runner = web.AppRunner(app_module.create_app(settings))
    await runner.setup()
    await asyncio.wait_for(started.wait(), timeout=5)
    # When the API shuts down
    cleanup = asyncio.create_task(runner.cleanup())
    await asyncio.wait({cleanup}, timeout=5)  # asyncio.wait: a timeout cancels nothing
    finished = cleanup.done()
    test_over.set()
    await cleanup
    # Then it finished promptly
    assert finished, "the API's cleanup waited on its pub/sub hub for good"
