"""The README's configuration tables name every variable Settings.from_env reads, and nothing
it does not: a setting added, renamed or dropped in notifkit/config.py shows up here."""

from __future__ import annotations

import re
from pathlib import Path

from notifkit.config import VARIABLES

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"`([A-Z][A-Z0-9_]*)`")
CELL_BORDER = re.compile(r"(?<!\\)\|")


def documented() -> set[str]:
    """The variables of the first column of the settings table and of the "variables" column of
    the transports table, both under "## Configuration"."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in section.splitlines():
        # A cell may hold an escaped pipe (`resend` \| `sendgrid`).
        cells = [cell.strip() for cell in CELL_BORDER.split(line.strip().strip("|"))]
        if not line.startswith("|") or len(cells) < 2 or set(cells[0]) <= {"-"}:
            continue
        if cells[0] in ("variable", "channel"):  # the tables' headers
            continue
        # Settings rows name their variables first; transport rows after the channel.
        column = cells[0] if cells[0].startswith("`") else cells[1]
        names.update(NAME.findall(column))
    return names


def test_the_configuration_tables_name_exactly_the_variables_notifkit_reads() -> None:
    names = documented()
    assert not VARIABLES - names, f"read but not documented: {sorted(VARIABLES - names)}"
    assert not names - VARIABLES, f"documented but not read: {sorted(names - VARIABLES)}"
