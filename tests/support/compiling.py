"""Watching where templates compile: services compile a template new to their process in a
thread (templates.warm) before they render it on their event loop."""

from __future__ import annotations

import threading

import pytest

from notifkit import templates


def watch_compiles(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """From now on, every source templates.warm compiles, with whether it ran on the main
    thread (the event loop's)."""
    compiled: list[tuple[str, bool]] = []
    warm = templates.warm

    def watched(fields: list[tuple[str, bool]]) -> None:
        fields = list(fields)
        compiled.extend((source, threading.current_thread() is threading.main_thread())
                        for source, _html in fields)
        warm(fields)

    monkeypatch.setattr(templates, "warm", watched)
    return compiled
