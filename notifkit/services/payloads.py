"""Parsing a read batch: entries whose payload has the wrong shape are logged, counted and
acked at once (CONTRACT §3.6), the way the worker treats entries that are not JSON at all."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from notifkit import metrics
from notifkit.errors import MalformedPayload
from notifkit.ids import is_uuid
from notifkit.worker import Entry

log = logging.getLogger("notifkit.services")

T = TypeVar("T")


def parse_one(payload: dict[str, Any], parser: Callable[[dict[str, Any]], T]) -> T | None:
    """The payload parsed as :func:`parse_each` parses it, or None where it would refuse it
    (quietly: parse_each reports it when the batch runs)."""
    try:
        for name in ("projectId", "eventId"):
            value = payload.get(name)
            if not isinstance(value, str) or not is_uuid(value):
                return None
        return parser(payload)
    except MalformedPayload:
        return None


def parse_each(
    service: str, batch: list[Entry], parser: Callable[[dict[str, Any]], T]
) -> list[tuple[Entry, T]]:
    """The entries that parse, with their payloads; the others are left to be acked as done."""
    parsed: list[tuple[Entry, T]] = []
    for entry in batch:
        try:
            for name in ("projectId", "eventId"):
                value = entry.payload.get(name)
                if not isinstance(value, str) or not is_uuid(value):
                    raise MalformedPayload(f"field {name!r} is not a UUID")
            parsed.append((entry, parser(entry.payload)))
        except MalformedPayload as exc:
            metrics.MALFORMED.labels(service, entry.stream).inc()
            log.error("Acked an entry whose payload has the wrong shape without processing it: "
                      "%s.", exc,
                      extra={"service": service, "stream": entry.stream, "entry_id": entry.id})
    return parsed
