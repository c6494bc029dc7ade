"""Developer tasks: ``nox -s dev``, ``nox -s tests``, ``nox -s lint``, ``nox -s typecheck``,
``nox -s scenarios``, ``nox -s bench``. Extra arguments after ``--`` go to the underlying tool."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import nox

nox.options.sessions = ["tests", "lint"]
nox.options.reuse_existing_virtualenvs = True
nox.options.default_venv_backend = "venv"

PYPROJECT = nox.project.load_toml("pyproject.toml")
# The interpreter nox itself runs on (Python >= 3.11, as pyproject.toml requires): pinning one
# version skipped every session on a machine that has only another.
PYTHON: str | None = None


def install(session: nox.Session, *groups: str, extras: str = "fast") -> None:
    session.install("-e", f".[{extras}]" if extras else ".")
    for group in groups:
        session.install(*nox.project.dependency_groups(PYPROJECT, group))


@contextmanager
def noting_interrupts() -> Iterator[list[int]]:
    """The SIGINTs that arrive inside the block, raised as usual. nox forgets a Ctrl-C that
    comes while a command runs if the command still ends well (pip usually does), so a
    session that should stop at one must look for itself."""
    seen: list[int] = []
    previous = signal.getsignal(signal.SIGINT)

    def note(signum: int, frame: FrameType | None) -> None:
        seen.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, note)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, previous)


@nox.session(python=PYTHON, default=False)
def dev(session: nox.Session) -> None:
    """Run notifkit locally: every service, the simulators, embedded Redis and PostgreSQL."""
    with noting_interrupts() as interrupted:
        install(session, extras="fast,dev")
    if interrupted:
        session.log("Interrupted while installing: notifkit was not started.")
        return
    session.run("python", "-m", "notifkit", "dev", *session.posargs)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Unit, integration and property tests against real Redis and PostgreSQL."""
    install(session, "test", extras="fast,dev")
    session.run("pytest", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff over everything."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".", *session.posargs)


@nox.session(python=PYTHON, default=False)
def typecheck(session: nox.Session) -> None:
    """mypy, strict on everything: the code, simulators, scenarios, benchmarks and tests."""
    install(session, "dev", "bench", extras="fast,dev,fcm")
    session.run("mypy", *session.posargs)


# Options of ``python -m scenarios run`` that take the next word as their value.
SCENARIO_VALUE_OPTIONS = ("--seed", "--json", "--set")


def scenario_arguments(posargs: list[str]) -> list[str]:
    """``run all`` and the arguments after ``--``, unless they name scenarios (or ``list``):
    then those run instead of the suite, which the runner refuses to take beside names."""
    if posargs[:1] == ["list"]:
        return list(posargs)
    names = [word for before, word in zip(["", *posargs], posargs, strict=False)
             if not word.startswith("-") and before not in SCENARIO_VALUE_OPTIONS]
    return ["run", *posargs] if names else ["run", "all", *posargs]


@nox.session(python=PYTHON, default=False)
def scenarios(session: nox.Session) -> None:
    """Fault scenarios against the real system as OS processes (see scenarios/)."""
    install(session, "test")
    session.run("python", "-m", "scenarios", *scenario_arguments(session.posargs))


@nox.session(python=PYTHON, default=False)
def bench(session: nox.Session) -> None:
    """Throughput and latency benchmarks with baselines measured in the same run."""
    install(session, "bench")
    session.run("python", "-m", "benchmarks", *session.posargs)
