"""Per-provider counters behind `GET /_sim/stats`."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TypedDict

from simulators.kinds import FaultKind, Provider


class ProviderStatsItem(TypedDict):
    requests: int
    accepted: int
    duplicates: int
    faults: dict[str, int]
    rateLimited: int
    rejected: int
    replays: int


@dataclass
class ProviderStats:
    requests: int = 0  # every send request that reached the provider, whatever its answer
    accepted: int = 0  # messages recorded (lost responses and malformed answers included)
    duplicates: int = 0  # acceptances of a task the provider had already accepted
    faults: Counter[FaultKind] = field(default_factory=Counter)
    rate_limited: int = 0  # 429s from the provider-side token bucket (not from fault rules)
    rejected: int = 0  # 4xx answers to bad credentials or invalid requests
    replays: int = 0  # idempotent replays answered from the cache, not accepted again

    def to_item(self) -> ProviderStatsItem:
        return {
            "requests": self.requests,
            "accepted": self.accepted,
            "duplicates": self.duplicates,
            # Every kind, 0 included: the spec's shape is fixed, and a reader needs no default
            # for a kind that has not fired yet.
            "faults": {kind.value: self.faults[kind] for kind in FaultKind},
            "rateLimited": self.rate_limited,
            "rejected": self.rejected,
            "replays": self.replays,
        }


class Stats:
    def __init__(self) -> None:
        self._by_provider = {provider: ProviderStats() for provider in Provider}

    def __getitem__(self, provider: Provider) -> ProviderStats:
        return self._by_provider[provider]

    def to_items(self) -> dict[str, ProviderStatsItem]:
        return {provider.value: stats.to_item() for provider, stats in self._by_provider.items()}

    def clear(self) -> None:
        self._by_provider = {provider: ProviderStats() for provider in Provider}
