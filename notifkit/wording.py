"""Numbers in the sentences operators read: timelines, DLQ errors, logs."""

from __future__ import annotations


def counted(n: int, noun: str) -> str:
    """``1 attempt``, ``3 attempts``: a noun that takes an ``s`` for its plural."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
