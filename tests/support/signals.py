"""Stopping a command the way an impatient person or a supervisor does: a signal, then the
same or another one again and again until the process is gone."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from typing import Any


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


def start_then_stop_insistently(args: list[str], ready: str, again: signal.Signals,
                                **popen: Any) -> tuple[int, str]:
    """Start ``args``, wait for the stderr line holding ``ready``, then press Ctrl-C and send
    ``again`` until the process has exited; its exit status and the rest of its stderr."""
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, **popen)
    try:
        assert process.stderr is not None
        for line in process.stderr:
            if ready in line:
                break
        stderr = stop_insistently(process, signal.SIGINT, again)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, stderr
