"""notifkit: reliable multi-channel notifications on Redis Streams and PostgreSQL."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from notifkit.server import NotifkitServer

__version__ = "0.1.0"
__all__ = ["NotifkitServer", "__version__"]


def __getattr__(name: str) -> Any:
    # Loaded on first use: `import notifkit` (the CLI's `--help`, a child process reading
    # its settings) should not pay for every service's imports.
    if name == "NotifkitServer":
        from notifkit.server import NotifkitServer

        return NotifkitServer
    raise AttributeError(f"module 'notifkit' has no attribute {name!r}")
