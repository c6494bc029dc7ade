"""JSON in and out of streams and pub/sub: orjson when installed, else the standard library."""

from __future__ import annotations

import json
from typing import Any

try:  # pragma: no cover - depends on the optional "fast" extra
    import orjson

    def dumps(value: Any) -> bytes:
        return orjson.dumps(value)

    def loads(raw: bytes | str) -> Any:
        return orjson.loads(raw)

except ImportError:  # pragma: no cover

    def dumps(value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()

    def loads(raw: bytes | str) -> Any:
        return json.loads(raw)


def json_text(value: Any) -> str | None:
    """``value`` as JSON text for a ``text`` parameter cast to jsonb in SQL; ``None`` stays SQL
    NULL (as it does for a jsonb parameter)."""
    return None if value is None else dumps(value).decode()
