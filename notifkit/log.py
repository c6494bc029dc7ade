"""Structured logging: one JSON object a line in production, readable lines in development.

Pass ids as ``extra={"event_id": ..., "task_id": ..., "stage": ...}``; every extra field ends up
in the JSON object (or after the message in text mode). A JSON record that names no
``service`` gets one, so every record can be selected by that field: a service's own logger's
(``notifkit.delivery``, ``notifkit.api.pubsub``, ...), else that of the service whose task wrote
it (``service_context``: a shared logger such as ``notifkit.worker`` or a library's, like
``asyncpg.pool``), else the process's (``set_process_service``: the services it runs, or the
command, for the records of starting, stopping and migrating).

A warning or error identical to one written less than ``REPEAT_WINDOW_S`` ago (same logger,
level, text and fields) is left out; the next copy written after the window carries
``repeated``: how many were left out since the last one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

from notifkit.config import SERVICES

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}

# A loop that retries an unreachable Redis or PostgreSQL every half second wrote the same
# warning each time: a 10 s Redis outage gave 160 such lines from one process. Once per
# window still says the condition goes on, and "repeated" says how often it was met.
REPEAT_WINDOW_S = 30.0
# Distinct warnings remembered at once; past it, those older than the window are forgotten.
_MAX_REMEMBERED = 1024


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


# The service whose task is running: tasks inherit it from the one that created them.
_CURRENT_SERVICE: ContextVar[str | None] = ContextVar("notifkit_service", default=None)
# What a record written outside any service names: set once the process knows what it runs.
_process_service: str | None = None


@contextlib.contextmanager
def service_context(name: str) -> Iterator[None]:
    """Records written meanwhile, and by every task created meanwhile, name ``name``."""
    token = _CURRENT_SERVICE.set(name)
    try:
        yield
    finally:
        _CURRENT_SERVICE.reset(token)


def set_process_service(name: str | None) -> None:
    """What records written outside any service's tasks name as their ``service``."""
    global _process_service
    _process_service = name


def process_service_name(services: tuple[str, ...]) -> str:
    """``all``, or the services a process runs, comma-separated: ``api,delivery``."""
    return "all" if set(services) == set(SERVICES) else ",".join(services)


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
        service = _service_of(record.name) or _CURRENT_SERVICE.get() or _process_service
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


class RepeatFilter(logging.Filter):
    """Leaves out a warning or error identical to one written within ``window_s``."""

    def __init__(self, window_s: float = REPEAT_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.window_s = window_s
        self.clock = clock
        # identity -> [when it was last written, copies left out since]
        self._seen: dict[tuple[Any, ...], list[Any]] = {}
        # Records also arrive from worker threads (asyncio.to_thread).
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = _identity(record)
        now = self.clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None and now - seen[0] < self.window_s:
                seen[1] += 1
                return False
            if seen is not None and seen[1]:
                record.repeated = seen[1]
            self._seen[key] = [now, 0]
            if len(self._seen) > _MAX_REMEMBERED:
                self._forget(now)
        return True

    def _forget(self, now: float) -> None:
        self._seen = {k: v for k, v in self._seen.items() if now - v[0] < self.window_s}
        if len(self._seen) > _MAX_REMEMBERED:  # that many distinct ones within one window
            self._seen.clear()


def _identity(record: logging.LogRecord) -> tuple[Any, ...]:
    fields = tuple(sorted((k, repr(v)) for k, v in _extras(record).items()))
    exc = record.exc_info[1] if record.exc_info else None
    return (record.name, record.levelno, record.getMessage(), fields,
            None if exc is None else (type(exc), str(exc)))


def setup_logging(fmt: str = "json", level: str = "INFO",
                  repeats: RepeatFilter | None = None) -> None:
    """Every record to stderr, one a line; ``repeats`` carries what was written across a
    second set-up (a fresh filter otherwise)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(repeats or RepeatFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp's access log is one line per request: too loud for a pipeline's logs.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # Python warnings (a library's DeprecationWarning, platformdirs' RuntimeDirWarning under
    # the dev command) went to stderr as two raw lines, breaking one-JSON-object-a-line:
    # route them through the 'py.warnings' logger, so they come out formatted like the rest.
    logging.captureWarnings(True)
    if fmt == "json":
        # An exception nothing caught, in the main thread or another, printed a raw traceback
        # of many lines: it becomes one record too, its traceback in the record's "exc".
        sys.excepthook = _log_uncaught
        threading.excepthook = _log_uncaught_in_thread


def _log_uncaught(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, exc, tb)
        return
    logging.getLogger("notifkit").critical("notifkit stopped on an unexpected error: %s: %s",
                                           kind.__name__, exc, exc_info=(kind, exc, tb))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is None or issubclass(args.exc_type, SystemExit):
        return
    logging.getLogger("notifkit").error(
        "A thread (%s) stopped on an unexpected error: %s: %s",
        args.thread.name if args.thread else "?", args.exc_type.__name__, args.exc_value,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback))
