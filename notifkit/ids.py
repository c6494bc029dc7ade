"""UUIDv7 identifiers (RFC 9562): time-ordered, so ids sort by creation time."""

from __future__ import annotations

import hashlib
import os
import re
import time
import uuid

# The canonical text form, which is all notifkit writes: checked without building a UUID
# object (a quarter of the cost; stages check several ids per entry).
_CANONICAL = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\Z").match


def uuid7(now_ms: int | None = None) -> str:
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    return _layout(ms, int.from_bytes(os.urandom(10), "big"))


def uuid7_ms(value: str) -> int | None:
    """The Unix time in milliseconds a UUIDv7 carries; None for what is no UUID."""
    try:
        return uuid.UUID(value).int >> 80
    except ValueError:
        return None


def derived_uuid7(anchor: str, *parts: str) -> str:
    """A UUIDv7 that is a pure function of ``anchor`` (a UUIDv7, whose time it keeps) and
    ``parts``. Task ids are derived this way from (event, recipient, channel), so a stage that
    runs twice produces the same task id and every later stage deduplicates on it."""
    ms = uuid7_ms(anchor) or 0
    digest = hashlib.sha256("\x1f".join((anchor, *parts)).encode()).digest()
    return _layout(ms, int.from_bytes(digest[:10], "big"))


def untasked_row_id(event_id: str, user_id: str | None) -> str:
    """The timeline's task id for work that has no task: a recipient's before its channels
    were chosen (the engine's entry), else the whole notification's (the event id)."""
    return derived_uuid7(event_id, user_id, "") if user_id else event_id


def _layout(ms: int, rand: int) -> str:
    """RFC 9562 UUIDv7 bits: 48-bit ms time, version 7, 74 bits from ``rand``, variant 10."""
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= ((rand >> 68) & 0xFFF) << 64
    value |= 0b10 << 62
    value |= rand & ((1 << 62) - 1)
    digits = f"{value:032x}"
    return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"


def is_uuid(value: str) -> bool:
    if isinstance(value, str) and _CANONICAL(value):
        return True
    try:
        uuid.UUID(value)
    except (ValueError, AttributeError, TypeError):
        return False
    return True
