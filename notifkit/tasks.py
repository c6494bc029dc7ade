"""Stopping background tasks that may swallow a cancellation.

A coroutine that awaits a read under a timeout (redis-py's ``get_message(timeout=...)``, for
one) can lose a ``cancel()`` that lands as its timeout fires: the timeout turns the
cancellation into a ``TimeoutError``, the loop around it carries on, and ``await task`` then
waits forever. :func:`cancel_and_wait` cancels again until the task ends, up to a deadline.
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger("notifkit.tasks")

RECANCEL_EVERY_S = 0.1


async def cancel_and_wait(task: asyncio.Task[None], *, timeout_s: float = 5.0) -> bool:
    """Cancel ``task`` (again and again if it swallows the cancellation) until it ends or
    ``timeout_s`` passes; returns whether it ended. Never raises what the task raised."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not task.done():
        task.cancel()
        remaining = deadline - loop.time()
        if remaining <= 0:
            log.warning("The background task %s did not stop within %.1f s; leaving it.",
                        task.get_name(), timeout_s)
            return False
        await asyncio.wait({task}, timeout=min(RECANCEL_EVERY_S, remaining))
    if not task.cancelled():
        task.exception()  # retrieved, so asyncio does not log it as never retrieved
    return True


async def cancel_all(tasks: list[asyncio.Task[None]], *, timeout_s: float = 5.0) -> None:
    """:func:`cancel_and_wait` for each of ``tasks``, together."""
    await asyncio.gather(*(cancel_and_wait(task, timeout_s=timeout_s) for task in tasks))
