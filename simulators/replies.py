"""Provider answers as plain values.

A `Reply` is built once and can be turned into a fresh `web.Response` any number of times,
which is what an idempotent replay needs: the original answer, byte for byte, again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from simulators.limits import retry_after_header

JSON = "application/json"
EVENT_STREAM = "text/event-stream"
# Built once: json.dumps with any keyword builds a new encoder per call.
_ENCODER = json.JSONEncoder(ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes = b""
    content_type: str | None = JSON
    headers: dict[str, str] = field(default_factory=dict)

    def response(self) -> web.Response:
        headers = dict(self.headers)
        if self.content_type is not None:
            headers["Content-Type"] = self.content_type
        return web.Response(status=self.status, body=self.body, headers=headers)


def json_reply(
    status: int,
    payload: Any,
    *,
    headers: dict[str, str] | None = None,
    retry_after_s: float | None = None,
    content_type: str = JSON,
) -> Reply:
    """A JSON answer; `retry_after_s` adds the Retry-After header every provider sends on 429."""
    all_headers = dict(headers or {})
    if retry_after_s is not None:
        all_headers["Retry-After"] = retry_after_header(retry_after_s)
    body = _ENCODER.encode(payload).encode()
    return Reply(status=status, body=body, content_type=content_type, headers=all_headers)


def malformed_reply(status: int = 200, *, event_stream: bool = False) -> Reply:
    """Announced as JSON, cut off mid-object: no JSON parser accepts it. In place of an
    event stream, a stream of one such event: a client reading events skips a body that is
    not one, and would take the answer for an empty success."""
    if event_stream:
        return Reply(status=status, body=b'data: {"id": "sim-malformed\n\n',
                     content_type=EVENT_STREAM)
    return Reply(status=status, body=b'{"id": "sim-malformed', content_type=JSON)
