"""What the engine (and delivery) read to route a read batch: templates, suppressions and
project settings, each in one query for the whole batch."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from notifkit.db.recipients import Executor


@dataclass(frozen=True)
class Template:
    id: str
    topic: str | None
    content: dict[str, Any]  # channel -> content, as PUT /v1/templates gives it
    fallback: list[str]
    ai: dict[str, Any] | None


async def load_templates(
    db: Executor, wanted: Iterable[tuple[str, str]]
) -> dict[tuple[str, str], Template]:
    """(project id, template id) -> template, for those that exist."""
    pairs = list(dict.fromkeys(wanted))
    if not pairs:
        return {}
    rows = await db.fetch(
        "SELECT t.project_id::text AS project_id, t.id, t.topic, t.content, t.fallback, t.ai "
        "FROM unnest($1::uuid[], $2::text[]) AS w(project_id, id) "
        "JOIN templates t ON t.project_id = w.project_id AND t.id = w.id",
        [p for p, _ in pairs], [t for _, t in pairs],
    )
    return {
        (row["project_id"], row["id"]): Template(
            id=row["id"], topic=row["topic"], content=row["content"],
            fallback=[c for c in (row["fallback"] or []) if isinstance(c, str)],
            ai=row["ai"],
        )
        for row in rows
    }


async def load_suppressed(
    db: Executor, candidates: Iterable[tuple[str, str, str]]
) -> set[tuple[str, str, str]]:
    """The (project id, channel, target) triples among ``candidates`` that are suppressed."""
    triples = list(dict.fromkeys(candidates))
    if not triples:
        return set()
    rows = await db.fetch(
        "SELECT s.project_id::text AS project_id, s.channel, s.target "
        "FROM unnest($1::uuid[], $2::text[], $3::text[]) AS c(project_id, channel, target) "
        "JOIN suppressions s ON s.project_id = c.project_id AND s.channel = c.channel "
        "AND s.target = c.target",
        [t[0] for t in triples], [t[1] for t in triples], [t[2] for t in triples],
    )
    return {(row["project_id"], row["channel"], row["target"]) for row in rows}


async def project_settings(db: Executor, project_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """project id -> its settings object (throttle and rate-limit overrides)."""
    ids = list(dict.fromkeys(project_ids))
    if not ids:
        return {}
    rows = await db.fetch(
        "SELECT id::text AS id, settings FROM projects WHERE id = ANY($1::uuid[])", ids
    )
    return {row["id"]: row["settings"] for row in rows}
