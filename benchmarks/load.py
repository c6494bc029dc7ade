"""Load generators: closed-loop (saturation) and paced open-loop (fixed offered rate).

Both share one lean client (:mod:`benchmarks.rawhttp`) with kept-alive connections and send
pre-encoded bodies, so the generator spends as little as it can of the two cores it shares with
the system under test. No idempotency key is sent: the API's idempotency path is a separate
feature, not the send path.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from yarl import URL

from benchmarks.rawhttp import HttpError, RawHttpClient
from benchmarks.system import TEMPLATE, user_id
from notifkit import codec

# Requests the open-loop generator lets wait for an answer before it counts a send as missed:
# past this the system (or the generator) is not keeping up with the offered rate.
MAX_OUTSTANDING = 512


@dataclass
class LoadResult:
    offered_per_s: float | None
    started_at: float  # wall clock, seconds
    duration_s: float
    accepted: list[tuple[str, str, float]] = field(default_factory=list)  # event, user, t
    rejected: int = 0
    errors: int = 0
    missed: int = 0  # open loop: sends skipped because MAX_OUTSTANDING were waiting
    max_lag_ms: float = 0.0  # open loop: how late the generator fired its latest send

    @property
    def achieved_per_s(self) -> float:
        return len(self.accepted) / self.duration_s if self.duration_s else 0.0


class LoadGenerator:
    def __init__(self, api_url: str, api_key: str, users: int, recipients: int = 1) -> None:
        """``recipients`` > 1: each request names that many users (``to`` as a list)."""
        url = URL(api_url)
        assert url.host is not None
        assert url.port is not None
        self.recipients = recipients
        self.users = users
        self._seq = 0
        self._client = RawHttpClient(
            url.host, url.port, "/v1/notifications",
            {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"})

    async def __aenter__(self) -> LoadGenerator:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._client.close()

    def _next(self) -> tuple[str, bytes]:
        self._seq += 1
        if self.recipients > 1:
            first = self._seq * self.recipients
            to: str | list[str] = [user_id((first + i) % self.users)
                                   for i in range(self.recipients)]
            user = ",".join(to)
        else:
            to = user = user_id(self._seq % self.users)
        body = codec.dumps({"to": to, "template": TEMPLATE, "data": {"n": self._seq}})
        return user, body

    async def _post(self, result: LoadResult) -> None:
        user, body = self._next()
        try:
            status, raw = await self._client.post(body)
        except (HttpError, OSError):
            result.errors += 1
            return
        if status == 202:
            result.accepted.append((codec.loads(raw)["id"], user, time.time()))
        else:
            result.rejected += 1

    async def closed_loop(self, duration_s: float, concurrency: int,
                          tick: Callable[[LoadResult], None] | None = None,
                          paused: asyncio.Event | None = None) -> LoadResult:
        """``concurrency`` senders, each sending as soon as its last request was answered
        (and ``paused`` is not set: the caller's brake on a growing backlog)."""
        result = LoadResult(None, time.time(), duration_s)
        deadline = time.monotonic() + duration_s

        async def sender() -> None:
            while time.monotonic() < deadline:
                if paused is not None and paused.is_set():
                    await asyncio.sleep(0.01)
                    continue
                await self._post(result)

        async def ticker() -> None:
            while tick is not None:
                await asyncio.sleep(1.0)
                tick(result)

        ticking = asyncio.create_task(ticker())
        try:
            await asyncio.gather(*(sender() for _ in range(concurrency)))
        finally:
            ticking.cancel()
        return result

    async def open_loop(self, rate_per_s: float, duration_s: float,
                        tick: Callable[[LoadResult], None] | None = None) -> LoadResult:
        """Send i at ``start + i / rate`` whatever happened to the earlier ones (no coordinated
        omission); a send that would exceed MAX_OUTSTANDING waiting requests is counted as
        missed instead."""
        result = LoadResult(rate_per_s, time.time(), duration_s)
        loop = asyncio.get_running_loop()
        start = loop.time()
        total = int(rate_per_s * duration_s)
        fired = 0
        outstanding: set[asyncio.Task[None]] = set()
        next_tick = start + 1.0
        while fired < total:
            now = loop.time()
            due = min(total, int((now - start) * rate_per_s) + 1)
            if due > fired:
                result.max_lag_ms = max(result.max_lag_ms,
                                        (now - (start + (due - 1) / rate_per_s)) * 1000)
            while fired < due:
                fired += 1
                if len(outstanding) >= MAX_OUTSTANDING:
                    result.missed += 1
                    continue
                task = asyncio.create_task(self._post(result))
                outstanding.add(task)
                task.add_done_callback(outstanding.discard)
            if tick is not None and now >= next_tick:
                tick(result)
                next_tick += 1.0
            await asyncio.sleep(max(0.0, start + fired / rate_per_s - loop.time()))
        if outstanding:
            await asyncio.wait(outstanding, timeout=60)
        return result
