"""Numbers and reasons in the sentences operators read: timelines, DLQ errors, logs."""

from __future__ import annotations

import os
import socket


def counted(n: int, noun: str) -> str:
    """``1 attempt``, ``3 attempts``: a noun that takes an ``s`` for its plural."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def host_port(host: str, port: int) -> str:
    """``host:port`` as a URL writes it: an IPv6 address in brackets (``[::1]:8080``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind_reason(exc: OSError) -> str:
    """Why a port could not be bound, as the system says it (``Address already in use``).
    asyncio's server wraps the error in its own sentence, repeating the address the caller's
    message names already; a name lookup's error has only its own text."""
    if exc.errno is not None and exc.errno > 0 and not isinstance(exc, socket.gaierror):
        return os.strerror(exc.errno)
    return str(exc.strerror or exc)
