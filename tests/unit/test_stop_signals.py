"""A stop signal's repeats are ignored with no instant in which their default action (which
kills the process) is back: the end-to-end tests send a repeat every millisecond, these look at
every disposition set on the way."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from notifkit.stop_signals import STOP_SIGNALS, repeat_caught_in_switch, stop_on_signals


@pytest.fixture
def dispositions(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, Any]]]:
    """Every (signal, handler) set through ``signal.signal`` while the test runs; the
    handlers the test process had are put back afterwards."""
    saved = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    seen: list[tuple[int, Any]] = []
    real = signal.signal

    def recording(signum: int, handler: Any) -> Any:
        seen.append((signum, handler))
        return real(signum, handler)

    monkeypatch.setattr(signal, "signal", recording)
    yield seen
    for signum, handler in saved.items():
        real(signum, handler)


def _run_until_stopped(signals_sent: list[signal.Signals]) -> None:
    async def main() -> None:
        stop = asyncio.Event()
        stop_on_signals(stop)
        for signum in signals_sent:
            os.kill(os.getpid(), signum)
        await asyncio.wait_for(stop.wait(), 5)

    asyncio.run(main())


@pytest.mark.parametrize("first", STOP_SIGNALS, ids=lambda s: s.name)
def test_after_the_first_signal_both_are_ignored_and_the_default_never_returns(
    dispositions: list[tuple[int, Any]], first: signal.Signals
) -> None:
    _run_until_stopped([first, first, signal.SIGTERM, signal.SIGINT])

    stop_dispositions = [(s, h) for s, h in dispositions if s in STOP_SIGNALS]
    assert all(h is not signal.SIG_DFL and h is not signal.default_int_handler
               for _, h in stop_dispositions), stop_dispositions
    for signum in STOP_SIGNALS:
        assert signal.getsignal(signum) is signal.SIG_IGN


@pytest.mark.parametrize(("error", "dropped"), [
    (OSError("Signal 15 ignored due to race condition"), True),
    (OSError("Signal 2 ignored due to race condition"), True),
    (OSError("Signal 10 ignored due to race condition"), False),
    (OSError("Signal 15 ignored due to race condition, and more"), False),
    (ValueError("Signal 15 ignored due to race condition"), False),
    (None, False),
])
def test_only_a_stop_signal_caught_in_the_switch_to_ignore_goes_unreported(
    error: BaseException | None, dropped: bool
) -> None:
    assert repeat_caught_in_switch(error) is dropped


def test_the_unraisable_hook_passes_on_everything_else(
    monkeypatch: pytest.MonkeyPatch, dispositions: list[tuple[int, Any]]
) -> None:
    reported: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda raised: reported.append(raised.exc_value))
    _run_until_stopped([signal.SIGTERM])
    caught = OSError("Signal 15 ignored due to race condition")
    other = OSError("something else")
    for error in (caught, other):
        sys.unraisablehook(SimpleNamespace(exc_value=error))  # type: ignore[arg-type]
    assert reported == [other]


def test_a_signal_another_thread_takes_still_wakes_asyncio_s_own_loop(
    dispositions: list[tuple[int, Any]],
) -> None:
    """The kernel hands a process's signal to any thread that does not block it; the Python
    handler then waits for the main thread, asleep in the loop until its next timer."""

    async def main() -> bool:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        stop_on_signals(stop)
        timer_first: list[bool] = []
        # The loop's only timer: without a wake-up, the handler would run only after it.
        loop.call_later(10, lambda: timer_first.append(not stop.is_set()))
        asleep = loop.create_future()

        def take() -> None:
            while not asleep.done():  # until the main thread waits in the loop
                time.sleep(0.01)
            time.sleep(0.2)
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

        taker = threading.Thread(target=take)
        taker.start()
        asleep.set_result(None)
        await stop.wait()
        taker.join()
        return not timer_first

    assert asyncio.run(main()), "the stop waited for the loop's next timer"
