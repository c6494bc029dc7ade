"""cancel_and_wait: a background task that swallows a cancellation still stops.

The API's pub/sub hub reads under a timeout; a cancel landing as the timeout fired was turned
into a TimeoutError, the loop went on, and the API's shutdown awaited it forever."""

from __future__ import annotations

import asyncio
import contextlib

from notifkit.tasks import cancel_and_wait


async def _swallows_first_cancel(started: asyncio.Event) -> None:
    started.set()
    with contextlib.suppress(asyncio.CancelledError):  # as a read timeout racing it does
        await asyncio.sleep(3600)
    await asyncio.sleep(3600)


async def test_a_task_that_swallows_one_cancellation_is_stopped() -> None:
    # Given a task that loses the first cancel
    started = asyncio.Event()
    task = asyncio.create_task(_swallows_first_cancel(started))
    await started.wait()
    # When it is stopped
    ended = await asyncio.wait_for(cancel_and_wait(task, timeout_s=2.0), timeout=5.0)
    # Then it ended, cancelled
    assert ended
    assert task.cancelled()


async def test_a_task_that_will_not_end_is_left_after_the_deadline() -> None:
    give_up = asyncio.Event()

    async def stubborn() -> None:
        while not give_up.is_set():
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    assert not await cancel_and_wait(task, timeout_s=0.3)
    give_up.set()
    task.cancel()
    await asyncio.wait({task})


async def test_an_ended_task_is_fine() -> None:
    async def quick() -> None:
        return None

    task = asyncio.create_task(quick())
    await task
    assert await cancel_and_wait(task)
