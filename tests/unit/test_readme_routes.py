"""The README's route table ("Every route", under "## The HTTP API") names exactly the routes the
API mounts: a route added, renamed or dropped in notifkit/services/api/routes/ shows up here."""

from __future__ import annotations

import re
from pathlib import Path

from notifkit.services.api.app import operations

ROOT = Path(__file__).resolve().parents[2]
TABLE_LEAD = "Every route ("
# `PUT`, `GET`, `DELETE /v1/users/{userId}`: methods standing alone share the next path.
ITEM = re.compile(r"`(GET|POST|PUT|DELETE|PATCH)(?: (/[^`\s]*))?`")


def documented() -> set[tuple[str, str]]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## The HTTP API\n", 1)[1].split("\n## ", 1)[0]
    lines = section.split(TABLE_LEAD, 1)[1].splitlines()[1:]
    rows: list[str] = []
    for line in lines:
        if rows and not line.startswith("|"):
            break
        if line.startswith("|"):
            rows.append(line)
    routes: set[tuple[str, str]] = set()
    for row in rows[2:]:  # past the header and its rule
        waiting: list[str] = []
        for method, path in ITEM.findall(row.split("|")[1]):
            waiting.append(method)
            if path:
                routes.update((each, path) for each in waiting)
                waiting = []
        assert not waiting, f"a method without a path in the README's route table: {row}"
    return routes


def test_the_route_table_names_exactly_the_routes_the_api_serves() -> None:
    served = {(op.method, op.path) for op in operations()}
    names = documented()
    assert not served - names, f"served but not in the README: {sorted(served - names)}"
    assert not names - served, f"in the README but not served: {sorted(names - served)}"
