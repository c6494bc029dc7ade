"""Provider-side rate limits: one token bucket per (provider, API key).

The "API key" is whatever the provider meters: Resend, SendGrid and OpenAI the key; Twilio
the account in the path, whichever of its API keys signs; SMTP the login; FCM the project
(its access tokens come and go hourly).

A real provider meters each account separately, so two notifkit deployments with different
keys do not share a budget. A limit applies to every key of its provider; each key's bucket
is created full on first use.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypedDict

from simulators.kinds import ANY_PROVIDER, Provider
from simulators.validation import (
    get_int,
    get_number,
    reject_unknown,
    require_choice,
    require_object,
)

MAX_RATE_PER_S = 1_000_000.0
MIN_RATE_PER_S = 0.001  # one request per ~17 minutes; slower is no longer a rate
MAX_RETRY_AFTER_S = 86_400
MAX_BUCKETS_PER_PROVIDER = 10_000  # keys are client-chosen; bound the map


class LimitItem(TypedDict):
    provider: str
    ratePerSecond: float
    burst: int


@dataclass(frozen=True)
class Limit:
    rate_per_s: float
    burst: int

    @property
    def per_minute(self) -> int:
        """The rate as the providers that count by the minute state it (at least 1)."""
        return max(1, round(self.rate_per_s * 60))


@dataclass
class TokenBucket:
    limit: Limit
    tokens: float
    updated_s: float

    def take(self, now_s: float) -> float | None:
        """Take one token; None if granted, otherwise seconds until one is available."""
        elapsed = max(now_s - self.updated_s, 0.0)
        self.tokens = min(self.limit.burst, self.tokens + elapsed * self.limit.rate_per_s)
        self.updated_s = now_s
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return None
        return (1.0 - self.tokens) / self.limit.rate_per_s


@dataclass
class RateLimits:
    clock: Callable[[], float] = time.monotonic
    _limits: dict[Provider, Limit] = field(default_factory=dict)
    _buckets: dict[tuple[Provider, str], TokenBucket] = field(default_factory=dict)

    def set(self, payload: object) -> list[LimitItem]:
        """Apply a `POST /_sim/limits` body; provider `*` sets the same limit on all."""
        body = require_object(payload, "limit")
        reject_unknown(body, ("provider", "ratePerSecond", "burst"), "limit")
        choices = [ANY_PROVIDER, *(p.value for p in Provider)]
        name = require_choice(body, "provider", choices)
        rate = get_number(
            body, "ratePerSecond", minimum=MIN_RATE_PER_S, maximum=MAX_RATE_PER_S, required=True
        )
        assert rate is not None
        burst = get_int(body, "burst", minimum=1, maximum=1_000_000)
        limit = Limit(
            rate_per_s=rate, burst=burst if burst is not None else max(1, math.ceil(rate))
        )
        providers = list(Provider) if name == ANY_PROVIDER else [Provider(name)]
        for provider in providers:
            self._limits[provider] = limit
            # A new limit starts every key with a full bucket of the new size.
            for key in [k for k in self._buckets if k[0] is provider]:
                del self._buckets[key]
        return [self._item(provider) for provider in providers]

    def remove(self, provider: Provider) -> None:
        self._limits.pop(provider, None)
        for key in [k for k in self._buckets if k[0] is provider]:
            del self._buckets[key]

    def clear(self) -> None:
        self._limits.clear()
        self._buckets.clear()

    def limit_of(self, provider: Provider) -> Limit | None:
        return self._limits.get(provider)

    def items(self) -> list[LimitItem]:
        return [self._item(provider) for provider in self._limits]

    def check(self, provider: Provider, api_key: str) -> float | None:
        """Spend one request of `api_key`'s budget; None if allowed, else retry-after seconds."""
        limit = self._limits.get(provider)
        if limit is None:
            return None
        now_s = self.clock()
        bucket = self._buckets.get((provider, api_key))
        if bucket is None:
            if sum(1 for k in self._buckets if k[0] is provider) >= MAX_BUCKETS_PER_PROVIDER:
                self.remove_oldest(provider)
            bucket = TokenBucket(limit=limit, tokens=float(limit.burst), updated_s=now_s)
            self._buckets[(provider, api_key)] = bucket
        return bucket.take(now_s)

    def quota(self, provider: Provider, api_key: str) -> tuple[Limit, int, float] | None:
        """After `check`: the limit metering `api_key`, the requests its bucket still holds
        and the seconds until the bucket is full again; None when no limit is set."""
        bucket = self._buckets.get((provider, api_key))
        if bucket is None:
            return None
        refill_s = (bucket.limit.burst - bucket.tokens) / bucket.limit.rate_per_s
        return bucket.limit, math.floor(bucket.tokens), refill_s

    def remove_oldest(self, provider: Provider) -> None:
        for key in self._buckets:
            if key[0] is provider:
                del self._buckets[key]
                return

    def _item(self, provider: Provider) -> LimitItem:
        limit = self._limits[provider]
        return {"provider": provider.value, "ratePerSecond": limit.rate_per_s, "burst": limit.burst}


def retry_after_header(seconds: float) -> str:
    """Retry-After carries whole seconds; round up so a client that obeys it is not refused.

    Only an explicit `retryAfter: 0` gives 0: a bucket's wait is always above zero.
    """
    if not math.isfinite(seconds) or seconds >= MAX_RETRY_AFTER_S:
        return str(MAX_RETRY_AFTER_S)
    return str(max(0, math.ceil(seconds)))
