"""The README's configuration tables name every variable Settings.from_env reads, and nothing
it does not, with the defaults it has: a setting added, renamed or dropped, or a default
changed, in notifkit/config.py shows up here."""

from __future__ import annotations

import re
from pathlib import Path

from notifkit.config import VARIABLES, Settings

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"`([A-Z][A-Z0-9_]*)`")
CELL_BORDER = re.compile(r"(?<!\\)\|")
FIRST_VALUE = re.compile(r"`([^`]*)`")
# The transports table gives defaults in brackets: `RESEND_BASE_URL` [`https://api.resend.com`].
BRACKETED = re.compile(r"`([A-Z][A-Z0-9_]*)` \[`([^`]*)`\]")


def configuration() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]


def rows() -> list[list[str]]:
    """The cells of every table row under "## Configuration", headers and rules left out."""
    found: list[list[str]] = []
    for line in configuration().splitlines():
        # A cell may hold an escaped pipe (`resend` \| `sendgrid`).
        cells = [cell.strip() for cell in CELL_BORDER.split(line.strip().strip("|"))]
        if not line.startswith("|") or len(cells) < 2 or set(cells[0]) <= {"-"}:
            continue
        if cells[0] in ("variable", "channel"):  # the tables' headers
            continue
        found.append(cells)
    return found


def documented_defaults() -> dict[str, str]:
    """Each variable whose default the README writes as a value: the settings table's default
    column (`MAX_ATTEMPTS` / `ENRICHER_MAX_ATTEMPTS` | `3` / `5`; "(unset)" and the like are
    not values) and the transports table's brackets."""
    defaults: dict[str, str] = {}
    for cells in rows():
        if cells[0].startswith("`"):
            names = NAME.findall(cells[0])
            values = [FIRST_VALUE.match(part.strip()) for part in cells[1].split(" / ")]
            if len(values) == len(names):
                defaults.update((name, value[1]) for name, value in zip(names, values,
                                                                         strict=True) if value)
        else:
            defaults.update(BRACKETED.findall(cells[1]))
    return defaults


def documented() -> set[str]:
    """The variables of the first column of the settings table and of the "variables" column of
    the transports table, both under "## Configuration"."""
    names: set[str] = set()
    for cells in rows():
        # Settings rows name their variables first; transport rows after the channel.
        column = cells[0] if cells[0].startswith("`") else cells[1]
        names.update(NAME.findall(column))
    return names


def test_the_configuration_tables_name_exactly_the_variables_notifkit_reads() -> None:
    names = documented()
    assert not VARIABLES - names, f"read but not documented: {sorted(VARIABLES - names)}"
    assert not names - VARIABLES, f"documented but not read: {sorted(names - VARIABLES)}"


def test_the_documented_defaults_are_the_defaults() -> None:
    """Setting a variable to the default the README gives it changes nothing."""
    defaults = documented_defaults()
    assert {"REDIS_URL", "WORKER_CONCURRENCY", "ENRICHER_MAX_ATTEMPTS", "LOG_LEVEL",
            "RESEND_BASE_URL", "OPENAI_MODEL"} <= defaults.keys()  # the parsing finds them
    unset = Settings.from_env({})
    differ = {name: value for name, value in defaults.items()
              if Settings.from_env({name: value}) != unset}
    assert not differ, f"documented defaults that are not the defaults: {differ}"
