"""Timestamps as the streams and the API write them."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)

# (millisecond, its text): stages stamp several entries in the same millisecond.
_last_stamp: tuple[int, str] = (-1, "")


def utc_now_iso() -> str:
    """Now in UTC as ``2026-01-02T03:04:05.678Z``."""
    global _last_stamp
    ms = time.time_ns() // 1_000_000
    if ms != _last_stamp[0]:
        seconds, millis = divmod(ms, 1000)
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"
        _last_stamp = (ms, text)
    return _last_stamp[1]


def now_ms() -> int:
    """The wall clock in whole milliseconds, as due times and stream ids count it."""
    return time.time_ns() // 1_000_000


def iso(moment: datetime) -> str:
    """RFC 3339 in UTC with milliseconds and a Z, the way every API time is written."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# In whole milliseconds, not through a float of seconds: 9999-12-31T23:59:59.999 as a float
# is ...59.99899, a millisecond early.
def from_ms(ms: int) -> datetime:
    return EPOCH + ms * _MS


def to_ms(when: datetime) -> int:
    return (when - EPOCH) // _MS


def iso_from_ms(ms: int) -> str:
    """As every API time is written: UTC, milliseconds, Z."""
    return from_ms(ms).isoformat(timespec="milliseconds").replace("+00:00", "Z")
