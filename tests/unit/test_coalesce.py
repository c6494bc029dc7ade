"""The coalescer behind the API's shared round trips: one call per batch, one answer per
caller, failures kept to whom they belong."""

from __future__ import annotations

import asyncio

import pytest

from notifkit.coalesce import Coalescer


class Recorder:
    """A batch function that records each batch and holds it until released."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.release = asyncio.Event()
        self.release.set()

    async def __call__(self, items: list[int]) -> list[int | BaseException]:
        self.batches.append(list(items))
        await self.release.wait()
        return [ValueError(f"odd {i}") if i % 2 else i * 10 for i in items]


async def test_callers_arriving_during_a_call_share_the_next_one() -> None:
    run = Recorder()
    run.release.clear()
    coalescer: Coalescer[int, int] = Coalescer(run)
    first = asyncio.create_task(coalescer.submit(0))
    await asyncio.sleep(0)  # the first call is out, holding item 0
    rest = [asyncio.create_task(coalescer.submit(i)) for i in (2, 4, 6)]
    await asyncio.sleep(0)
    run.release.set()

    assert await first == 0
    assert await asyncio.gather(*rest) == [20, 40, 60]
    assert run.batches == [[0], [2, 4, 6]]


async def test_an_item_that_fails_fails_only_its_own_caller() -> None:
    coalescer: Coalescer[int, int] = Coalescer(Recorder())
    results = await asyncio.gather(*(coalescer.submit(i) for i in range(4)),
                                   return_exceptions=True)
    assert results[0] == 0
    assert results[2] == 20
    assert isinstance(results[1], ValueError)
    assert str(results[3]) == "odd 3"


async def test_a_failed_batch_fails_its_callers_and_the_next_batch_still_runs() -> None:
    calls: list[list[str]] = []

    async def run(items: list[str]) -> list[str]:
        calls.append(items)
        if "boom" in items:
            raise ConnectionError("store unreachable")
        return [i.upper() for i in items]

    coalescer: Coalescer[str, str] = Coalescer(run)
    failed = await asyncio.gather(coalescer.submit("boom"), coalescer.submit("a"),
                                  return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in failed)
    assert await coalescer.submit("b") == "B"
    assert calls == [["boom", "a"], ["b"]]


async def test_batches_are_cut_at_max_items() -> None:
    run = Recorder()
    coalescer: Coalescer[int, int] = Coalescer(run, max_items=3)
    await asyncio.gather(*(coalescer.submit(i * 2) for i in range(7)))
    assert [len(b) for b in run.batches] == [3, 3, 1]


async def test_a_cancelled_caller_does_not_cancel_the_shared_call() -> None:
    run = Recorder()
    run.release.clear()
    coalescer: Coalescer[int, int] = Coalescer(run)
    leaving = asyncio.create_task(coalescer.submit(8))
    staying = asyncio.create_task(coalescer.submit(4))
    await asyncio.sleep(0)
    leaving.cancel()
    await asyncio.sleep(0)
    run.release.set()
    assert await staying == 40
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert run.batches == [[8, 4]]


async def test_a_batch_function_answering_the_wrong_count_is_an_error_for_its_callers() -> None:
    async def run(items: list[int]) -> list[int]:
        return items[:-1]

    coalescer: Coalescer[int, int] = Coalescer(run)
    results = await asyncio.gather(coalescer.submit(1), coalescer.submit(2),
                                   return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results)


def test_max_items_must_be_positive() -> None:
    async def run(items: list[int]) -> list[int]:
        return items

    with pytest.raises(ValueError, match="max_items"):
        Coalescer(run, max_items=0)
