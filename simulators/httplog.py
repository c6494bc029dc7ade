"""aiohttp's server logs a request it cannot parse (a header or URL over 8 KB, a NUL in a
header) as an ERROR with a traceback, although it has already answered 400 and the simulator
did nothing wrong. So it logs a body it cannot read (chunked framing that breaks off): the
handler has answered 400, then aiohttp reads the rest of the body to keep the connection and
meets the same error again. Here each becomes one WARNING line naming the problem, so a
fuzzing CI job or a staging load does not fill the simulator's log with tracebacks. (Content
codings are the simulator's own to decode, see bodies.py, and it logs their failures itself.)

The simulators' HTTP server logs through a logger of its own (:data:`SERVER_LOG`), so the
filter leaves alone any other aiohttp server in the same process (a test's, an application's).
"""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError


class _UnparseableRequest(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            _warn(record, "Answered %s to a request that could not be parsed: %s",
                  error.code, _first_line(error.message))
        elif isinstance(error, RequestPayloadError):
            cause = error.__cause__
            problem = cause.message if isinstance(cause, HttpProcessingError) else str(error)
            _warn(record, "A request body could not be read (%s); the connection was closed.",
                  _first_line(problem))
        return True


def _first_line(message: str | None) -> str:
    return (message or "unparseable").strip().split("\n", 1)[0].rstrip(":")


def _warn(record: logging.LogRecord, message: str, *args: object) -> None:
    record.msg, record.args = message, args
    record.levelno, record.levelname = logging.WARNING, "WARNING"
    record.exc_info = record.exc_text = None


SERVER_LOG = logging.getLogger("simulators.http")


def quiet_unparseable_requests() -> logging.Logger:
    """:data:`SERVER_LOG` with the filter installed (once), for the server to log through."""
    if not any(isinstance(f, _UnparseableRequest) for f in SERVER_LOG.filters):
        SERVER_LOG.addFilter(_UnparseableRequest())
    return SERVER_LOG
