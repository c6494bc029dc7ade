"""What the engine (and delivery) read to route a read batch: templates, suppressions and
project settings, for the whole batch at once."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from notifkit.db.recipients import Executor


@dataclass(frozen=True)
class Template:
    id: str
    topic: str | None
    content: dict[str, Any]  # channel -> content, as PUT /v1/templates gives it
    fallback: list[str]
    ai: dict[str, Any] | None


async def project_settings(db: Executor, project_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """project id -> its settings object (throttle and rate-limit overrides)."""
    ids = list(dict.fromkeys(project_ids))
    if not ids:
        return {}
    rows = await db.fetch(
        "SELECT id::text AS id, settings FROM projects WHERE id = ANY($1::uuid[])", ids
    )
    return {row["id"]: row["settings"] for row in rows}


@dataclass
class Routing:
    templates: dict[tuple[str, str], Template]
    suppressed: dict[tuple[str, str, str], str]  # (project, channel, target) -> reason
    settings: dict[str, dict[str, Any]]
    # (project id, event id) of the asked notifications canceled since they were accepted
    canceled: set[tuple[str, str]] = field(default_factory=set)


# The three lookups as one statement: one round trip and one transaction a batch instead of
# three, which at low load (a batch of one) is most of what routing costs PostgreSQL.
# Rows are tagged by kind, in columns wide enough for each: t = template, s = suppression,
# p = project settings (a suppression's reason travels as a JSON string in j1), c = a canceled
# notification (its id in a).
_ROUTING = """
SELECT 't' AS kind, t.project_id::text AS project_id, t.id AS a, t.topic AS b,
       t.content AS j1, t.fallback AS j2, t.ai AS j3
  FROM unnest($1::uuid[], $2::text[]) AS w(project_id, id)
  JOIN templates t ON t.project_id = w.project_id AND t.id = w.id
UNION ALL
SELECT 's', s.project_id::text, s.channel, s.target, to_jsonb(s.reason), NULL, NULL
  FROM unnest($3::uuid[], $4::text[], $5::text[]) AS c(project_id, channel, target)
  JOIN suppressions s ON s.project_id = c.project_id AND s.channel = c.channel
   AND s.target = c.target
UNION ALL
SELECT 'p', p.id::text, NULL, NULL, p.settings, NULL, NULL
  FROM projects p WHERE p.id = ANY($6::uuid[])
UNION ALL
SELECT 'c', n.project_id::text, n.id::text, NULL, NULL, NULL, NULL
  FROM notifications n WHERE n.id = ANY($7::uuid[]) AND n.canceled_at IS NOT NULL
"""


async def load_routing(
    db: Executor, templates: Iterable[tuple[str, str]],
    candidates: Iterable[tuple[str, str, str]], project_ids: Iterable[str],
    event_ids: Iterable[str] = (),
) -> Routing:
    """The templates that exist among (project id, template id) pairs, the suppressed
    (project id, channel, target) triples among ``candidates`` with the reason of each
    (bounce, complaint, unsubscribe), each project's settings (throttle and rate-limit
    overrides), and which of the notifications ``event_ids`` (UUIDs) were canceled."""
    pairs = list(dict.fromkeys(templates))
    triples = list(dict.fromkeys(candidates))
    ids = list(dict.fromkeys(project_ids))
    events = list(dict.fromkeys(event_ids))
    routing = Routing({}, {}, {})
    if not (pairs or triples or ids or events):
        return routing
    rows = await db.fetch(
        _ROUTING,
        [p for p, _ in pairs], [t for _, t in pairs],
        [t[0] for t in triples], [t[1] for t in triples], [t[2] for t in triples],
        ids, events,
    )
    for row in rows:
        kind, project_id = row["kind"], row["project_id"]
        if kind == "t":
            routing.templates[(project_id, row["a"])] = Template(
                id=row["a"], topic=row["b"], content=row["j1"],
                fallback=[c for c in (row["j2"] or []) if isinstance(c, str)], ai=row["j3"],
            )
        elif kind == "s":
            routing.suppressed[(project_id, row["a"], row["b"])] = row["j1"]
        elif kind == "c":
            routing.canceled.add((project_id, row["a"]))
        else:
            routing.settings[project_id] = row["j1"]
    return routing


QUIET_HOURS_SQL = (
    "SELECT q.project_id::text AS project_id, q.user_id, q.start_time, q.end_time, "
    "u.timezone FROM unnest($1::uuid[], $2::text[]) AS i(project_id, user_id) "
    "JOIN quiet_hours q ON q.project_id = i.project_id AND q.user_id = i.user_id "
    "JOIN users u ON u.project_id = q.project_id AND u.id = q.user_id")


async def quiet_hours_of(
    db: Executor, users: Iterable[tuple[str, str]]
) -> dict[tuple[str, str], tuple[dict[str, Any], str | None]]:
    """(project id, user id) -> the user's quiet hours as ``{"start", "end"}`` (``time``
    values) and timezone, for the users who have quiet hours now; one query."""
    pairs = sorted(set(users))
    if not pairs:
        return {}
    rows = await db.fetch(QUIET_HOURS_SQL, [p for p, _u in pairs], [u for _p, u in pairs])
    return {(r["project_id"], r["user_id"]): ({"start": r["start_time"], "end": r["end_time"]},
                                              r["timezone"])
            for r in rows}
