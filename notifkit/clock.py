"""Timestamps as the streams and the API write them."""

from __future__ import annotations

import time

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
