"""Stream reads typed for the tests' Redis client, which always replies in bytes.

redis-py types its replies for a client that may or may not decode them (``bytes | str``) and
types an XRANGE reply as possibly ``None``. The ``redis`` fixture never decodes, and XRANGE
and XREVRANGE always answer a list, so these wrappers state that once instead of at every call.

Writing fields read here back with ``redis.xadd`` needs ``# type: ignore[arg-type]``: redis-py
asks for a ``dict[FieldT, EncodableT]``, and as ``dict`` is invariant no ``dict[bytes, bytes]``
satisfies it, although any mapping of bytes to bytes is what XADD takes.
"""

from __future__ import annotations

from typing import cast

from redis.asyncio import Redis
from redis.typing import KeyT, StreamIdT

Fields = dict[bytes, bytes]
StreamEntry = tuple[bytes, Fields]


async def xrange(
    redis: Redis, name: KeyT, min: StreamIdT = "-", max: StreamIdT = "+",
    count: int | None = None,
) -> list[StreamEntry]:
    """``redis.xrange(...)``: ``(entry id, fields)`` pairs, oldest first."""
    return cast(list[StreamEntry], await redis.xrange(name, min=min, max=max, count=count))


async def xrevrange(
    redis: Redis, name: KeyT, max: StreamIdT = "+", min: StreamIdT = "-",
    count: int | None = None,
) -> list[StreamEntry]:
    """``redis.xrevrange(...)``: ``(entry id, fields)`` pairs, newest first."""
    return cast(list[StreamEntry], await redis.xrevrange(name, max=max, min=min, count=count))
