"""Log output: with LOG_FORMAT=json every line on stderr is one JSON object, whatever wrote it."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

import notifkit.log
from notifkit.log import JsonFormatter

EMIT = """
import logging, warnings
from notifkit.log import setup_logging
setup_logging({fmt!r}, "INFO")
logging.getLogger("notifkit.test").info("before")
warnings.warn("XDG_RUNTIME_DIR is not set, falling back to /tmp/runtime-0", RuntimeWarning)
logging.getLogger("notifkit.test").info("after")
"""


def emitted(fmt: str) -> list[str]:
    result = subprocess.run([sys.executable, "-c", EMIT.format(fmt=fmt)], capture_output=True,
                            text=True, timeout=60, check=True)
    return result.stderr.splitlines()


def test_a_python_warning_is_one_json_object_like_every_other_line() -> None:
    # Given a library that raises a Python warning while notifkit logs JSON
    lines = emitted("json")

    # Then every line is a JSON object, the warning one under the py.warnings logger
    records = [json.loads(line) for line in lines]
    assert [r["msg"] for r in records if r["logger"] == "notifkit.test"] == ["before", "after"]
    [warning] = [r for r in records if r["logger"] == "py.warnings"]
    assert warning["level"] == "warning"
    assert "XDG_RUNTIME_DIR is not set" in warning["msg"]


UNCAUGHT = """
import threading
from notifkit.log import setup_logging
setup_logging("json", "INFO")
def fails():
    raise ValueError("in a thread")
worker = threading.Thread(target=fails, name="poller")
worker.start()
worker.join()
raise RuntimeError("nobody caught this")
"""


def test_an_uncaught_exception_is_one_json_record_not_a_raw_traceback() -> None:
    result = subprocess.run([sys.executable, "-c", UNCAUGHT], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 1
    records = [json.loads(line) for line in result.stderr.splitlines()]
    thread, main = records
    assert thread["level"] == "error"
    assert "A thread (poller) stopped" in thread["msg"]
    assert "ValueError: in a thread" in thread["exc"]
    assert main["level"] == "critical"
    assert main["msg"] == ("notifkit stopped on an unexpected error: RuntimeError: "
                           "nobody caught this")
    assert "Traceback" in main["exc"]


def test_a_python_warning_reads_like_a_log_line_in_text_mode() -> None:
    lines = emitted("text")
    assert any("WARNING py.warnings:" in line and "XDG_RUNTIME_DIR" in line for line in lines)


def test_a_message_with_unicode_line_separators_stays_one_json_line() -> None:
    record = logging.makeLogRecord({"name": "notifkit.test", "levelname": "INFO",
                                    "msg": "a\u2028b\u2029c\nd"})
    line = JsonFormatter().format(record)
    assert len(line.splitlines()) == 1
    assert json.loads(line)["msg"] == "a\u2028b\u2029c\nd"


def json_of(name: str, **fields: object) -> dict[str, object]:
    record = logging.makeLogRecord({"name": name, "levelname": "INFO", "levelno": logging.INFO,
                                    "msg": "m", **fields})
    parsed: dict[str, object] = json.loads(JsonFormatter().format(record))
    return parsed


def test_a_record_from_a_services_logger_names_the_service(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A server started in this process earlier in the run set the process's service name,
    # which records of shared loggers fall back to; here the process runs no service
    monkeypatch.setattr(notifkit.log, "_process_service", None)
    # An operator selects a service's records by one field, whichever logger wrote them
    assert json_of("notifkit.ai")["service"] == "ai"
    assert json_of("notifkit.api.pubsub")["service"] == "api"
    assert json_of("notifkit.workflow")["service"] == "workflow"
    # A logger several services share says nothing; the record's own field wins
    assert "service" not in json_of("notifkit.worker")
    assert json_of("notifkit.worker", service="delivery")["service"] == "delivery"
    assert json_of("notifkit.api", service="enricher")["service"] == "enricher"
    assert "service" not in json_of("notifkit.apiary")
    assert "service" not in json_of("aiohttp.server")


async def test_every_record_names_a_service_whoever_wrote_it() -> None:
    """Records of a shared logger (notifkit.worker), of a library (asyncpg.pool) and of the
    process itself (starting, stopping) named no service: selecting one service's records by
    its field missed them, its connection-pool warnings during an outage included."""
    import asyncio

    from notifkit.log import service_context, set_process_service

    def library_record() -> dict[str, object]:
        return json_of("asyncpg.pool")

    async def a_task_of_the_service() -> dict[str, object]:
        await asyncio.sleep(0)
        return library_record()

    set_process_service("api,delivery")
    try:
        with service_context("delivery"):
            assert library_record()["service"] == "delivery"
            assert json_of("notifkit.worker")["service"] == "delivery"
            # A task started by the service names it, after the service's start returned too
            task = asyncio.create_task(a_task_of_the_service())
        assert (await task)["service"] == "delivery"
        # Outside every service: the process's own records name what it runs
        assert library_record()["service"] == "api,delivery"
        assert json_of("notifkit.server")["service"] == "api,delivery"
        # A service's own logger and a record's own field still win
        assert json_of("notifkit.api")["service"] == "api"
        assert json_of("notifkit.worker", service="engine")["service"] == "engine"
    finally:
        set_process_service(None)


def warning(msg: str = "Reading enricher failed (%s); retrying in 1 s.",
            args: tuple[object, ...] = ("Connection refused",), level: int = logging.WARNING,
            **fields: object) -> logging.LogRecord:
    return logging.makeLogRecord({"name": "notifkit.worker", "levelno": level,
                                  "levelname": logging.getLevelName(level), "msg": msg,
                                  "args": args, **fields})


def test_a_warning_repeated_within_the_window_is_written_once_then_counted() -> None:
    from notifkit.log import RepeatFilter

    now = [0.0]
    repeats = RepeatFilter(window_s=30.0, clock=lambda: now[0])
    # Given a loop that retries an unreachable Redis every half second for 40 s
    written = []
    for step in range(80):
        now[0] = step * 0.5
        record = warning(service="enricher")
        if repeats.filter(record):
            written.append((now[0], getattr(record, "repeated", None)))

    # Then the warning is written when it starts and once more after the window, saying how
    # many copies were left out in between
    assert written == [(0.0, None), (30.0, 59)]


def test_distinct_warnings_and_info_records_are_all_written() -> None:
    from notifkit.log import RepeatFilter

    repeats = RepeatFilter(window_s=30.0, clock=lambda: 0.0)
    records = [
        # one per task: each is about another notification
        warning("Sent a task again after an earlier attempt's answer was lost.", (),
                task_id="a"),
        warning("Sent a task again after an earlier attempt's answer was lost.", (),
                task_id="b"),
        warning(service="enricher"),
        warning(service="engine"),
        warning(args=("Connection reset by peer",), service="enricher"),
        warning(level=logging.ERROR, service="enricher"),
    ]
    assert all(repeats.filter(r) for r in records)
    assert all(repeats.filter(warning("Reclaimed 1 idle entries.", (), level=logging.INFO))
               for _ in range(3))


OUTAGE = """
import logging
from notifkit.log import setup_logging
setup_logging("json", "INFO")
for _ in range(50):
    logging.getLogger("notifkit.scheduler").warning(
        "A scheduler poll failed (%s); polling again in 0.50 s.", "Connection refused",
        extra={"service": "scheduler"})
"""


def test_a_retry_loops_warning_is_one_line_not_one_per_retry() -> None:
    result = subprocess.run([sys.executable, "-c", OUTAGE], capture_output=True, text=True,
                            timeout=60, check=True)
    records = [json.loads(line) for line in result.stderr.splitlines()]
    assert [r["msg"] for r in records] == [
        "A scheduler poll failed (Connection refused); polling again in 0.50 s."]
