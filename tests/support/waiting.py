"""Waiting in tests for something another task or process makes true."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def until(condition: Callable[[], object], timeout_s: float = 10.0) -> None:
    """Return once ``condition()`` is true; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


async def until_async(condition: Callable[[], Awaitable[object]],
                      timeout_s: float = 10.0) -> None:
    """``until`` for a condition that has to ask over the network (a simulator's stats)."""
    deadline = time.monotonic() + timeout_s
    while not await condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)
