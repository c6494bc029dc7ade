"""Holding a synchronous check mid-run, to show the API answers other requests meanwhile
(the check runs beside the event loop, not on it)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class HeldCheck(Generic[T]):
    """Wraps ``check``: each call blocks whatever thread runs it until the test lets go."""

    def __init__(self, check: Callable[..., T]) -> None:
        self.check = check
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, *args: object) -> T:
        self.started.set()
        self.release.wait(10)
        return self.check(*args)

    async def answers_meanwhile(
        self, held: Awaitable[R], other: Callable[[], Awaitable[R]]
    ) -> tuple[R, R]:
        """Start ``held`` (a request that runs the check), make the ``other`` request while
        the check is held, then let go; returns both answers."""
        task = asyncio.ensure_future(held)
        try:
            await asyncio.to_thread(self.started.wait, 10)
            answered = await other()
            assert not task.done()  # answered while the check was still running
        finally:
            self.release.set()
        return answered, await task
