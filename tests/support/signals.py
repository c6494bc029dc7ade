"""Stopping a command the way an impatient person or a supervisor does: a signal, then the
same or another one again and again until the process is gone."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time


def stop_insistently(process: subprocess.Popen[str], first: signal.Signals,
                     again: signal.Signals) -> str:
    """Send ``first``, then ``again`` every millisecond until the process has exited, so a
    repeated signal lands at every stage of its stop, the last instants included; returns
    what the process wrote to stderr meanwhile."""
    assert process.stderr is not None
    process.send_signal(first)
    while process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(again)
        time.sleep(0.001)
    return process.stderr.read()
