"""Requests aiohttp's HTTP parser refuses before any handler or middleware sees them (a bad
request line, a malformed header, a line over the size limit, a broken chunked body).

aiohttp answers these itself with a text/plain 400 echoing the offending bytes, and logs them
as an ERROR with a traceback. A server built on :class:`RefusingRunner` answers them with a
function of its own instead (the API in its error envelope, the simulators in the addressed
provider's format), and :func:`quiet_refusals` turns the log record into one WARNING line.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler, RequestPayloadError
from aiohttp.web_request import BaseRequest


@dataclass(frozen=True)
class Refusal:
    """What was refused: the status aiohttp chose, the parser's reason (its first line, the
    rest repeats the request's bytes), the part of the request that reason names, and the
    request target when the connection's request line was readable (``None`` otherwise)."""

    status: int
    said: str
    part: str
    target: str | None = None


Answer = Callable[[Refusal], web.StreamResponse]

# Words of aiohttp's parser messages, and the part of the request each names (first match).
_PARTS = (
    ("url path", "path"), ("url query", "query"), ("url", "url"), ("method", "method"),
    ("version", "version"), ("content-length", "Content-Length"),
    ("transfer-encoding", "Transfer-Encoding"), ("chunk", "body"), ("header", "headers"),
    ("line", "request line"),
)


_ECHO = re.compile(r":? (?:bytearray\()?b['\"]")


def refusal(status: int, reason: str | None, target: str | None = None) -> Refusal:
    lines = (reason or "").strip().splitlines()
    # A line over the limit is named with its first bytes ("... when reading: b'aaa...'", or
    # "bytearray(b'aaa...')" for a request line), which the answer does not repeat.
    said = _ECHO.split(lines[0], maxsplit=1)[0].strip().rstrip(":") if lines else ""
    said = said or "unparseable"
    part = next((name for word, name in _PARTS if word in said.lower()), "request")
    return Refusal(status, said, part, target)


# The start of a request line: a method-like token, then the target. Only matched at the start
# of what a read returned, and bounded, so a body's bytes cost next to nothing.
_REQUEST_LINE = re.compile(rb"[!-~]{1,32} (/[^\s]{0,8190})")


class _RefusingHandler(RequestHandler):
    """aiohttp's connection handler, answering what it cannot parse through ``answer``."""

    def __init__(self, *args: Any, answer: Answer, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._answer = answer
        # The request target of the last request line this connection received: a request
        # the parser refuses arrives as aiohttp's placeholder, without its path.
        self._target: bytes | None = None

    def data_received(self, data: bytes) -> None:
        line = _REQUEST_LINE.match(data)
        if line is not None:
            self._target = line.group(1)
        super().data_received(data)

    def handle_error(self, request: BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        # aiohttp's own answer logs the refusal (see RefusalFilter) and raises when a response
        # has already begun; only its body is replaced.
        plain = super().handle_error(request, status, exc, message)
        target = self._target.decode("latin-1") if self._target is not None else None
        answer = self._answer(refusal(plain.status, message, target))
        answer.force_close()
        return answer


class _RefusingServer(web.Server):
    def __init__(self, *args: Any, answer: Answer, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._refusal_answer = answer

    def __call__(self) -> RequestHandler:
        return _RefusingHandler(self, loop=self._loop, answer=self._refusal_answer,
                                **self._kwargs)


class RefusingRunner(web.AppRunner):
    """An AppRunner whose connections answer unparseable requests with ``answer``."""

    def __init__(self, app: web.Application, *, answer: Answer, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._refusal_answer = answer

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()
        return _RefusingServer(made.request_handler, request_factory=made.request_factory,
                               handler_cancellation=made.handler_cancellation,
                               answer=self._refusal_answer, **made._kwargs)


class RefusalFilter(logging.Filter):
    """aiohttp logs a request it cannot even parse (a NUL in a header, a request line over the
    limit) as an ERROR with a traceback, although it answers 400 and nothing failed on the
    server's side; so it logs a body it cannot read (chunked framing that breaks off) when it
    drains one a handler already refused. This filter turns each record into one WARNING line
    without the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, RequestPayloadError):
            exc = exc.__cause__ if isinstance(exc.__cause__, HttpProcessingError) else \
                HttpProcessingError(code=400, message="unreadable body")
        if isinstance(exc, HttpProcessingError):
            record.msg = ("Refused a malformed HTTP request with %s (%s); nothing was done, "
                          "the client has to fix the request.")
            record.args = (exc.code, refusal(exc.code, exc.message).said)
            # Demoted, never raised: aiohttp logs a first request in no known method (TLS or
            # other traffic on the port) at DEBUG.
            if record.levelno > logging.WARNING:
                record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info, record.exc_text = None, None
        return True


def quiet_refusals(logger: logging.Logger) -> logging.Logger:
    """``logger`` (an aiohttp server's) with :class:`RefusalFilter` installed (once)."""
    if not any(isinstance(f, RefusalFilter) for f in logger.filters):
        logger.addFilter(RefusalFilter())
    return logger
