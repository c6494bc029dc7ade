"""notifkit: reliable multi-channel notifications on Redis Streams and PostgreSQL."""

from __future__ import annotations

__version__ = "0.1.0"
