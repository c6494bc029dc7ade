"""The simulators' log lines: readable text by default, one JSON object a line with
``--log-format json`` (in staging, beside notifkit's own JSON logs, one collector reads both,
so the records are notifkit's own: same fields, same escaping)."""

from __future__ import annotations

import logging
import sys

from notifkit.log import JsonFormatter

LOG_FORMATS = ("text", "json")
# The text lines; the scenario harness reads the fault lines back from them.
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(fmt: str, level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
