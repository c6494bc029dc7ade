"""SIGTERM and SIGINT for long-running commands: the first stops, repeats are ignored.

A supervisor or an impatient person repeats the signal (a second Ctrl-C, SIGTERM every
second). The stop under way is the answer to any repeat, and the process must still exit 0 once
it has stopped, so from the first signal on both are ignored by the kernel, never handled by
their default action (which kills the process) even for an instant.

The event loop's ``add_signal_handler`` cannot give that: taking its handler off puts the
default action back before anything else can be set, and closing the loop does the same, so a
repeat landing in that instant killed the process by the signal. Here a plain Python handler is
installed instead and replaced with SIG_IGN in one ``sigaction``; Python's own finalisation
leaves an ignored signal ignored. A Python handler runs on the main thread
once the loop wakes: uvloop listens on Python's signal wakeup fd for that, and for asyncio's own
loop (which does so only for ``add_signal_handler``) one is set up here, since a signal taken by
another thread (an executor's, a child watcher's) does not interrupt the main thread's wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import socket
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)

# CPython's report when a signal arrived in the instant between its last look at pending
# signals and the switch to SIG_IGN: the repeat it names is one we meant to ignore anyway.
_IGNORED_IN_SWITCH = re.compile(r"Signal (\d+) ignored due to race condition")


def stop_on_signals(stop: asyncio.Event) -> None:
    """Set ``stop`` at the first SIGTERM or SIGINT and ignore both from then on. Call from a
    coroutine running on the main thread's loop."""

    def first_signal() -> None:
        ignore_stop_signals()
        stop.set()

    on_stop_signals(first_signal)


def on_stop_signals(callback: Callable[[], None]) -> None:
    """Call ``callback`` on the running loop at every SIGTERM or SIGINT, until
    ``ignore_stop_signals``; once at once for a signal ``defer_stop_signals`` kept. Call from
    a coroutine running on the main thread's loop."""
    loop = asyncio.get_running_loop()

    def handler(signum: int, frame: FrameType | None) -> None:
        loop.call_soon_threadsafe(callback)

    _wake_on_signals(loop)
    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)
    if _DEFERRED:
        _DEFERRED.clear()
        loop.call_soon(callback)


# The stop signals that came while deferred (defer_stop_signals), in order.
_DEFERRED: list[int] = []


def defer_stop_signals() -> None:
    """Until ``on_stop_signals`` or ``resume_stop_signals``, a SIGTERM or SIGINT is only kept.
    A command takes a moment (its imports, its settings) before it handles them itself, and
    meanwhile SIGTERM's default action killed the process and a Ctrl-C ended it in a
    KeyboardInterrupt traceback from whatever was being imported."""

    def keep(signum: int, frame: FrameType | None) -> None:
        _DEFERRED.append(signum)

    for signum in STOP_SIGNALS:
        signal.signal(signum, keep)


def resume_stop_signals() -> None:
    """Back to Python's own handling of SIGTERM and SIGINT (for a command that handles neither
    itself), acting now on a signal ``defer_stop_signals`` kept: a Ctrl-C raises
    KeyboardInterrupt here, a SIGTERM ends the process as it would have."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    kept, _DEFERRED[:] = list(_DEFERRED), []
    if kept:  # the first one decides; a repeat would have met the stop under way
        signal.raise_signal(kept[0])


# The sockets the loop is woken through; never closed, as the wakeup fd outlives the loop.
_WAKEUP: list[socket.socket] = []


def _wake_on_signals(loop: asyncio.AbstractEventLoop) -> None:
    current = signal.set_wakeup_fd(-1)
    ours = _WAKEUP[1].fileno() if _WAKEUP else -1
    if current not in (-1, ours):  # uvloop's, or set by whoever runs this loop: it wakes it
        signal.set_wakeup_fd(current)
        return
    if not _WAKEUP:
        reader, writer = socket.socketpair()
        reader.setblocking(False)
        writer.setblocking(False)
        _WAKEUP.extend((reader, writer))
    reader, writer = _WAKEUP
    signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)

    def drain() -> None:
        # What was written only woke the loop; the handlers run as it goes back to Python.
        with contextlib.suppress(OSError):
            while reader.recv(4096):
                pass

    loop.add_reader(reader.fileno(), drain)


def ignore_stop_signals() -> None:
    """From now until the process exits, SIGTERM and SIGINT do nothing."""
    _quiet_switch_reports()
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def repeat_caught_in_switch(error: BaseException | None) -> bool:
    """Whether ``error`` is CPython's report of a stop signal that arrived between its last look
    at pending signals and the switch to SIG_IGN: a repeat, meant to be ignored anyway."""
    if not isinstance(error, OSError):
        return False
    match = _IGNORED_IN_SWITCH.fullmatch(str(error))
    return match is not None and int(match.group(1)) in STOP_SIGNALS


def _quiet_switch_reports() -> None:
    if getattr(sys.unraisablehook, "_notifkit_stop_signals", False):
        return
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if not repeat_caught_in_switch(unraisable.exc_value):
            previous(unraisable)

    hook._notifkit_stop_signals = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def cancel_requested() -> bool:
    """Whether the running task has been asked to cancel (its own cancellation, not that of a
    task it awaits), and so is running on regardless if it is still here.

    Python 3.11's ``asyncio.wait_for``, which redis-py's connect and socket writes use,
    returns its result and drops a cancel that lands as the awaited call completes; the call
    would then go on (a blocking read for its whole BLOCK time, holding up a shutdown). An
    await that can drop a cancel is followed by this check, which honours it.
    """
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
