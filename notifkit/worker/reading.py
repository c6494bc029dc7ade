"""XREADGROUP replies, and the error Redis gives when a group is gone."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from redis.exceptions import ResponseError

from notifkit.streams import as_str


def entries_of(reply: Any) -> list[tuple[str, str, Mapping[bytes, bytes] | None]]:
    """The (stream, entry id, fields) of an XREADGROUP reply, in order."""
    out: list[tuple[str, str, Mapping[bytes, bytes] | None]] = []
    # A map under RESP3, pairs under RESP2 (and from a script).
    pairs = reply.items() if isinstance(reply, dict) else reply or []
    for stream, entries in pairs:
        name = as_str(stream)
        for entry_id, fields in entries:
            # Raw reply: fields come as [name, value, ...]; an entry deleted while pending
            # comes back with none (false from a script).
            out.append((name, as_str(entry_id),
                        dict(zip(fields[::2], fields[1::2], strict=True))
                        if fields else None))
    return out


def is_nogroup(exc: ResponseError) -> bool:
    """Redis's answer when the stream or its consumer group does not exist: NOGROUP, or
    UNBLOCKED for a blocking read whose stream or group went away while it waited."""
    return str(exc).startswith(("NOGROUP", "UNBLOCKED"))
