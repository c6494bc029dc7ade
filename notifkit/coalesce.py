"""Coalescing: many concurrent callers, one round trip.

A busy API process has dozens of requests each wanting the same kind of query or Redis call at
the same moment. :class:`Coalescer` gives each caller its own answer while issuing one call for
everything submitted since the previous call began: the first caller on an idle coalescer runs
at once (no added latency), and under load the batch grows by itself to whatever arrived while
the last round trip was out.

The batch function returns one result per item, in order; an item's result may be an exception,
which is raised to that caller alone. If the batch function itself raises, every caller of that
batch gets the exception.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

BatchFunction = Callable[[list[T]], Awaitable[Sequence[R | BaseException]]]


class Coalescer(Generic[T, R]):
    """Runs ``run(items)`` for the items submitted while the previous run was in flight."""

    def __init__(self, run: BatchFunction[T, R], *, max_items: int = 256) -> None:
        if max_items < 1:
            raise ValueError("max_items must be at least 1")
        self._run = run
        self.max_items = max_items
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._runner: asyncio.Task[None] | None = None

    async def submit(self, item: T) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._drain())
        # A cancelled caller cancels only its own future: the batch is shared, and work once
        # handed to it (an accepted send, say) is better finished than left half done.
        return await future

    async def _drain(self) -> None:
        while self._pending:
            batch = self._pending[: self.max_items]
            del self._pending[: self.max_items]
            try:
                results = await self._run([item for item, _f in batch])
                if len(results) != len(batch):
                    raise RuntimeError(
                        f"a batch of {len(batch)} items returned {len(results)} results")
            except asyncio.CancelledError:
                for _item, future in batch + self._pending:
                    future.cancel()
                self._pending = []
                raise
            except Exception as exc:
                for _item, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_item, future), result in zip(batch, results, strict=True):
                if future.done():
                    continue
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)
