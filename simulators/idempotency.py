"""Idempotency keys, Resend-style.

A key remembers the fingerprint of the request that first used it and the answer it got:
the same key with the same body gets that answer again and sends nothing; the same key with
another body is a conflict. Only accepted requests are remembered, so a request that failed
can be retried under its key. Keys expire after 24 hours, as at Resend, and the cache is
bounded, oldest key dropped first.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from simulators.kinds import Provider
from simulators.replies import Reply

KEY_TTL_S = 24 * 3600
MAX_KEYS = 50_000


def fingerprint(payload: Any) -> str:
    """Key order and whitespace do not make a different request."""
    return hashlib.sha256(_canonical(payload)).hexdigest()


def _canonical_json(payload: Any) -> bytes:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode()


try:  # orjson (notifkit's "fast" extra) when installed: a fifth of a busy simulator's CPU
    import orjson

    def _canonical(payload: Any) -> bytes:
        try:
            return orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)
        except TypeError:  # what orjson cannot write (integers beyond 64 bits, say)
            return _canonical_json(payload)

except ImportError:  # pragma: no cover - depends on the optional extra
    _canonical = _canonical_json


class Lookup(StrEnum):
    NEW = "new"
    REPLAY = "replay"
    MISMATCH = "mismatch"
    IN_FLIGHT = "in_flight"


@dataclass(slots=True)  # one object per key for the collector, not two
class _Entry:
    fingerprint: str
    stored_s: float
    reply: Reply | None  # None while the first request is still being processed


class IdempotencyCache:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # Keyed by the provider's name, not the enum: a tuple of strings is one the collector
        # stops tracking.
        self._entries: OrderedDict[tuple[str, str, str], _Entry] = OrderedDict()

    def begin(
        self, provider: Provider, api_key: str, key: str, print_: str
    ) -> tuple[Lookup, Reply | None]:
        """Claim `key` for a request, or say why it cannot be processed as new."""
        self._expire()
        entry = self._entries.get((provider.value, api_key, key))
        if entry is None:
            self._entries[(provider.value, api_key, key)] = _Entry(print_, self._clock(), None)
            while len(self._entries) > MAX_KEYS:
                self._entries.popitem(last=False)
            return Lookup.NEW, None
        if entry.fingerprint != print_:
            return Lookup.MISMATCH, None
        if entry.reply is None:
            return Lookup.IN_FLIGHT, None
        return Lookup.REPLAY, entry.reply

    def complete(self, provider: Provider, api_key: str, key: str, reply: Reply) -> None:
        entry = self._entries.get((provider.value, api_key, key))
        if entry is not None:
            entry.reply = reply

    def abandon(self, provider: Provider, api_key: str, key: str) -> None:
        """Forget a claim whose request was not accepted, so a retry is processed afresh."""
        entry = self._entries.get((provider.value, api_key, key))
        if entry is not None and entry.reply is None:
            del self._entries[(provider.value, api_key, key)]

    def clear(self) -> None:
        self._entries.clear()

    def _expire(self) -> None:
        cutoff = self._clock() - KEY_TTL_S
        while self._entries:
            oldest = next(iter(self._entries.values()))
            if oldest.stored_s >= cutoff:
                break
            self._entries.popitem(last=False)
