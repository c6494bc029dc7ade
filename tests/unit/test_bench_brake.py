"""The saturation phase's brake: it holds the senders while the backlog is too long, and a
failed reading neither kills it nor lets go of (or grabs) the senders."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from benchmarks.phases import Brake
from benchmarks.stats import Progress
from notifkit.tasks import cancel_all


class Readings:
    """A backlog whose every reading the test hands over (a number or an exception)."""

    def __init__(self) -> None:
        self.next: asyncio.Queue[int | BaseException] = asyncio.Queue()
        self.calls = 0
        self.called = asyncio.Condition()

    async def __call__(self) -> int:
        async with self.called:
            self.calls += 1
            self.called.notify_all()
        value = await self.next.get()
        if isinstance(value, BaseException):
            raise value
        return value

    async def give(self, value: int | BaseException) -> None:
        """Hand over one reading and wait until the brake has acted on it: it asks for the
        next one only then."""
        async with self.called:
            await self.called.wait_for(lambda: self.calls > 0)
            wanted = self.calls + 1
        await self.next.put(value)
        async with self.called:
            await self.called.wait_for(lambda: self.calls >= wanted)


async def test_the_brake_holds_over_the_limit_and_survives_a_lost_connection() -> None:
    readings = Readings()
    brake = Brake(readings, Progress(quiet=True), limit=100, interval_s=0)
    task = asyncio.create_task(brake.run())

    await readings.give(101)
    assert brake.paused.is_set()
    await readings.give(RedisConnectionError("Connection lost"))
    assert brake.paused.is_set()  # still held: the reading said nothing
    assert not task.done()
    await readings.give(OSError("connection reset"))
    await readings.give(100)
    assert not brake.paused.is_set()
    await readings.give(RedisConnectionError("Connection lost"))
    assert not brake.paused.is_set()  # still free
    assert brake.failed_readings == 3

    await readings.give(5000)
    assert brake.paused.is_set()
    await brake.stop(task)
    assert task.cancelled()
    assert not brake.paused.is_set()  # the senders go when the phase ends


async def test_a_failure_that_is_no_connection_problem_still_ends_the_brake() -> None:
    readings = Readings()
    brake = Brake(readings, Progress(quiet=True), limit=100, interval_s=0)
    task = asyncio.create_task(brake.run())
    await readings.next.put(ValueError("a bug"))
    with pytest.raises(ValueError, match="a bug"):
        await task


async def test_a_reading_that_swallows_the_cancellation_does_not_keep_the_brake_going() -> None:
    """On Python 3.11, redis-py's calls go through ``asyncio.wait_for``, which swallows a
    cancellation that lands as the call completes: the brake read on for good, and the
    saturation phase waited for it (a benchmark run held still for 15 minutes)."""
    swallowed = asyncio.Event()

    async def reading() -> int:
        if not swallowed.is_set():
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                swallowed.set()  # as wait_for does when its call has just completed
        return 0

    brake = Brake(reading, Progress(quiet=True), limit=100, interval_s=0)
    task = asyncio.create_task(brake.run())
    await asyncio.sleep(0)
    stopping = asyncio.create_task(brake.stop(task))
    # Waited for without cancelling it (a cancellation would end the brake by itself): the
    # bound only keeps a hang from hanging the suite, it measures nothing.
    await asyncio.wait({stopping}, timeout=30)
    try:
        assert stopping.done()
        assert swallowed.is_set()
        assert task.done()
    finally:
        await cancel_all([stopping, task])
