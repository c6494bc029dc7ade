"""``nox -s scenarios``: the suite, unless the arguments after ``--`` name scenarios; ``nox -s
dev``: a Ctrl-C while it installs stops it."""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Any

import pytest

from noxfile import dev, noting_interrupts, scenario_arguments


@pytest.mark.parametrize(
    ("posargs", "expected"),
    [
        ([], ["run", "all"]),
        (["--seed", "7"], ["run", "all", "--seed", "7"]),
        (["--set", "messages=5", "--json", "out/r.json"],
         ["run", "all", "--set", "messages=5", "--json", "out/r.json"]),
        # Names after -- used to follow 'all', which the runner refuses beside names.
        (["malformed"], ["run", "malformed"]),
        (["malformed", "duplicate_send", "--seed", "3"],
         ["run", "malformed", "duplicate_send", "--seed", "3"]),
        (["--seed=3", "--set", "users=4", "malformed"],
         ["run", "--seed=3", "--set", "users=4", "malformed"]),
        (["all", "--seed", "2"], ["run", "all", "--seed", "2"]),
        (["list"], ["list"]),
    ],
)
def test_scenario_names_after_the_double_dash_replace_all(posargs: list[str],
                                                          expected: list[str]) -> None:
    assert scenario_arguments(posargs) == expected


class InstallingSession:
    """A nox session whose install meets a Ctrl-C and, as nox does when the interrupted
    command still exits 0, carries on."""

    def __init__(self) -> None:
        self.posargs: list[str] = []
        self.ran: list[tuple[Any, ...]] = []
        self.logged: list[str] = []

    def install(self, *args: str) -> None:
        with contextlib.suppress(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)

    def run(self, *args: Any) -> None:
        self.ran.append(args)

    def log(self, message: str) -> None:
        self.logged.append(message)


def test_a_ctrl_c_while_dev_installs_stops_it_before_notifkit_starts() -> None:
    before = signal.getsignal(signal.SIGINT)
    session = InstallingSession()

    dev.func(session)  # type: ignore[attr-defined]

    assert session.ran == []
    assert session.logged == ["Interrupted while installing: notifkit was not started."]
    assert signal.getsignal(signal.SIGINT) is before


def test_interrupts_outside_the_block_are_not_noted() -> None:
    with noting_interrupts() as interrupted:
        pass
    assert interrupted == []
