"""Counters of every process, summed in Redis so any api's ``/metrics`` shows the whole system.

Only api processes serve HTTP, so a process running delivery alone (``--services delivery``)
has nobody to scrape its counters. Each process therefore adds what its counters and histograms
gained since its last flush to one Redis hash (``notif:metrics:counters``; ``HINCRBYFLOAT``, so
processes never overwrite each other), every ``FLUSH_INTERVAL_S`` and when it stops; ``/metrics``
flushes its own process first, then renders the hash. The totals outlive the processes that made
them, as a Prometheus counter should, so a restarted process does not make them go down.

The counters themselves stay process-global ``prometheus_client`` objects: code increments
them as before, and what one process has flushed is remembered once per process, so two servers
in one process (tests) never add the same increments twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from redis.asyncio import Redis
from redis.exceptions import RedisError

from notifkit import metrics
from notifkit.keys import Keys
from notifkit.tasks import cancel_and_wait

log = logging.getLogger("notifkit.metrics")

FLUSH_INTERVAL_S = 1.0

# The families summed across processes; the stream gauges are computed by /metrics itself.
SHARED = (metrics.PROCESSED, metrics.FAILED, metrics.DEAD_LETTERED, metrics.MALFORMED,
          metrics.RECLAIMED, metrics.DELIVERIES, metrics.PROVIDER_LATENCY)

# (family, sample name, sorted labels) -> the value already added to Redis by this process.
SampleKey = tuple[str, str, tuple[tuple[str, str], ...]]
_flushed: dict[SampleKey, float] = {}
_flushed_lock = threading.Lock()


def _families() -> Iterator[Metric]:
    for collector in SHARED:
        yield from collector.collect()


def _shared_names() -> set[str]:
    return {family.name for family in _families()}


def _field(key: SampleKey) -> str:
    family, sample, labels = key
    return json.dumps([family, sample, [list(pair) for pair in labels]], separators=(",", ":"))


def _parse_field(raw: str) -> SampleKey | None:
    try:
        family, sample, labels = json.loads(raw)
        return str(family), str(sample), tuple((str(k), str(v)) for k, v in labels)
    except (ValueError, TypeError):
        return None  # not written by this module: ignored rather than failing the scrape


def _take_deltas() -> dict[SampleKey, float]:
    """What this process's samples gained since they were last taken, marked as taken.

    A label set is taken whole (every bucket of a histogram, zeros included) when any of its
    samples moved, so the rendered histogram never lacks a bucket."""
    deltas: dict[SampleKey, float] = {}
    with _flushed_lock:
        for family in _families():
            groups: dict[tuple[tuple[str, str], ...], list[tuple[SampleKey, float]]] = {}
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue  # a per-process timestamp: meaningless summed
                labels = tuple(sorted(sample.labels.items()))
                series = tuple(pair for pair in labels if pair[0] != "le")
                groups.setdefault(series, []).append(
                    ((family.name, sample.name, labels), sample.value))
            for samples in groups.values():
                if all(value == _flushed.get(key, 0.0) for key, value in samples):
                    continue
                for key, value in samples:
                    deltas[key] = value - _flushed.get(key, 0.0)
                    _flushed[key] = value
    return deltas


def _give_back(deltas: dict[SampleKey, float]) -> None:
    """A flush Redis refused: the increments are taken again by the next one."""
    with _flushed_lock:
        for key, delta in deltas.items():
            _flushed[key] = _flushed.get(key, 0.0) - delta


async def flush(redis: Redis, keys: Keys) -> None:
    """Add this process's increments since the last flush to the shared totals."""
    deltas = _take_deltas()
    if not deltas:
        return
    pipe = redis.pipeline(transaction=True)  # all of a histogram's samples or none
    for key, delta in deltas.items():
        pipe.hincrbyfloat(keys.metrics_counters, _field(key), delta)
    try:
        await pipe.execute()
    except BaseException:
        _give_back(deltas)
        raise


async def run_flusher(redis: Redis, keys: Keys, interval_s: float = FLUSH_INTERVAL_S) -> None:
    """Flush every ``interval_s`` until cancelled; a Redis outage only delays the counts."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await flush(redis, keys)
        except (RedisError, OSError) as exc:
            log.debug("Could not flush the metrics to Redis (%s); retrying later.", exc)


async def stop_flusher(task: asyncio.Task[None], redis: Redis, keys: Keys) -> None:
    """Cancel the flusher, then flush what was counted since (work finished on shutdown)."""
    await cancel_and_wait(task)
    try:
        await asyncio.wait_for(flush(redis, keys), FLUSH_INTERVAL_S * 5)
    except (RedisError, OSError, TimeoutError) as exc:
        log.warning("Could not flush the last metrics to Redis (%s); they are lost.", exc)


class _Totals:
    """A collector yielding the shared families with the totals read from Redis."""

    def __init__(self, totals: dict[SampleKey, float]) -> None:
        self.totals = totals

    def collect(self) -> Iterable[Metric]:
        by_family: dict[str, list[tuple[SampleKey, float]]] = {}
        for key, value in self.totals.items():
            by_family.setdefault(key[0], []).append((key, value))
        for template in _families():
            family = Metric(template.name, template.documentation, template.type)
            for (_, sample, labels), value in sorted(by_family.get(template.name, []),
                                                     key=lambda item: _order(item[0])):
                family.add_sample(sample, dict(labels), value)
            yield family


def _order(key: SampleKey) -> tuple[Any, ...]:
    _, sample, labels = key
    series = tuple(pair for pair in labels if pair[0] != "le")
    le = dict(labels).get("le")
    bound = float(le) if le is not None else float("inf")
    # Buckets in ascending order, then _count and _sum, as prometheus_client writes them.
    return series, not sample.endswith("_bucket"), bound, sample


class _Local:
    """The default registry without the shared families (those come from Redis)."""

    def __init__(self, skip: set[str]) -> None:
        self.skip = skip

    def collect(self) -> Iterable[Metric]:
        for family in REGISTRY.collect():
            if family.name not in self.skip:
                yield family


async def read_totals(redis: Redis, keys: Keys) -> dict[SampleKey, float]:
    raw: dict[Any, Any] = await redis.hgetall(keys.metrics_counters)
    totals: dict[SampleKey, float] = {}
    for field, value in raw.items():
        key = _parse_field(field.decode() if isinstance(field, bytes) else str(field))
        if key is None:
            continue
        try:
            totals[key] = float(value)
        except (TypeError, ValueError):
            continue
    return totals


def render(totals: dict[SampleKey, float]) -> bytes:
    """Prometheus text of this process's registry, with the shared families' system-wide
    totals in place of its own counts."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Local(_shared_names()))  # type: ignore[arg-type]
    registry.register(_Totals(totals))  # type: ignore[arg-type]
    return generate_latest(registry)
