"""Stopping a command the way an impatient person or a supervisor does: a signal, then the
same or another one again and again until the process is gone."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
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


def signal_while_importing(module_args: list[str], importing: str, signum: signal.Signals,
                           *, timeout_s: float = 60, **popen: Any) -> tuple[int, str]:
    """Run ``python -X importtime -m <module_args>`` and send ``signum`` once the import of
    ``importing`` has ended (``-X importtime`` writes a stderr line as each import ends), so
    the signal lands while the command is still loading, whatever the machine's speed; its
    exit status and the rest of its stderr."""
    process = subprocess.Popen([sys.executable, "-X", "importtime", "-m", *module_args],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               **popen)
    try:
        assert process.stderr is not None
        for line in process.stderr:
            if line.rstrip().split("|")[-1].strip() == importing:
                break
        process.send_signal(signum)
        stderr = process.stderr.read()
        return process.wait(timeout=timeout_s), stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
