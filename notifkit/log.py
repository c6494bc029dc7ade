"""Structured logging: one JSON object a line in production, readable lines in development.

Pass ids as ``extra={"event_id": ..., "task_id": ..., "stage": ...}``; every extra field ends up
in the JSON object (or after the message in text mode). A JSON record from a service's own
logger (``notifkit.delivery``, ``notifkit.api.pubsub``, ...) that names no ``service`` gets its
name, so every record of a service can be selected by that one field.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from notifkit.config import SERVICES

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


def _service_of(logger: str) -> str | None:
    parts = logger.split(".")
    if len(parts) > 1 and parts[0] == "notifkit" and parts[1] in SERVICES:
        return parts[1]
    return None


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        service = _service_of(record.name)
        if service is not None:
            entry["service"] = service
        entry.update(_extras(record))
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        # U+2028 and U+2029 are valid in JSON text, but line splitters (Python's splitlines,
        # JavaScript) take them for line ends: escaped, one record stays one line for all.
        return (json.dumps(entry, default=str, ensure_ascii=False)
                .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        fields = " ".join(f"{k}={v}" for k, v in _extras(record).items())
        line = f"{stamp} {record.levelname:<7} {record.name}: {record.getMessage()}"
        if fields:
            line += f"  [{fields}]"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup_logging(fmt: str = "json", level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp's access log is one line per request: too loud for a pipeline's logs.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # Python warnings (a library's DeprecationWarning, platformdirs' RuntimeDirWarning under
    # the dev command) went to stderr as two raw lines, breaking one-JSON-object-a-line:
    # route them through the 'py.warnings' logger, so they come out formatted like the rest.
    logging.captureWarnings(True)
