"""AI usage: tokens (and the content they bought) per AI-written task, and totals per project."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeAlias

import asyncpg

Conn: TypeAlias = asyncpg.Connection | asyncpg.Pool


@dataclass(frozen=True)
class Usage:
    task_id: str
    project_id: str
    event_id: str
    user_id: str
    channel: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    content: dict[str, Any]
    # What the generated row adds after the tokens (the template's own content for the
    # channel did not render, say), each a clause of its own.
    notes: tuple[str, ...] = ()


async def written(conn: Conn, task_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Content already written for these tasks (a retry re-uses it rather than re-billing)."""
    if not task_ids:
        return {}
    rows = await conn.fetch(
        "SELECT task_id, content FROM ai_usage WHERE task_id = ANY($1) AND content IS NOT NULL",
        list(task_ids),
    )
    return {r[0]: r[1] for r in rows}


async def record(conn: Conn, usages: Sequence[Usage], now: datetime) -> None:
    """ai_usage rows plus one ``generated`` timeline row each, tokens in its metadata."""
    if not usages:
        return
    await conn.executemany(
        """INSERT INTO ai_usage (task_id, project_id, event_id, user_id, channel, model,
                                 prompt_tokens, completion_tokens, content, created_at)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
           ON CONFLICT (task_id) DO NOTHING""",
        [(u.task_id, u.project_id, u.event_id, u.user_id, u.channel, u.model, u.prompt_tokens,
          u.completion_tokens, u.content, now) for u in usages],
    )
    await conn.executemany(
        """INSERT INTO message_logs (project_id, event_id, task_id, user_id, channel, attempt,
                                     kind, status, detail, provider, metadata, created_at)
           VALUES ($1, $2, $3, $4, $5, 0, 'generated', 'processing', $6, 'openai', $7, $8)
           ON CONFLICT (task_id, channel, attempt, kind) DO NOTHING""",
        [(u.project_id, u.event_id, u.task_id, u.user_id, u.channel,
          f"content written by {u.model} ({u.prompt_tokens + u.completion_tokens} tokens)"
          + "".join(f"; {note}" for note in u.notes),
          {"ai": {"model": u.model, "promptTokens": u.prompt_tokens,
                  "completionTokens": u.completion_tokens,
                  "totalTokens": u.prompt_tokens + u.completion_tokens}}, now)
         for u in usages],
    )


async def totals(
    conn: Conn, project_id: str, since: datetime | None = None, until: datetime | None = None,
) -> dict[str, Any]:
    """Tokens used by a project, overall and per model, optionally within [since, until)."""
    rows = await conn.fetch(
        """SELECT model, count(*) AS requests, COALESCE(sum(prompt_tokens), 0) AS prompt,
                  COALESCE(sum(completion_tokens), 0) AS completion
             FROM ai_usage
            WHERE project_id = $1
              AND ($2::timestamptz IS NULL OR created_at >= $2)
              AND ($3::timestamptz IS NULL OR created_at < $3)
            GROUP BY model ORDER BY model""",
        project_id, since, until,
    )
    models = [{"model": r["model"], "requests": r["requests"], "promptTokens": r["prompt"],
               "completionTokens": r["completion"], "totalTokens": r["prompt"] + r["completion"]}
              for r in rows]
    return {
        "requests": sum(m["requests"] for m in models),
        "promptTokens": sum(m["promptTokens"] for m in models),
        "completionTokens": sum(m["completionTokens"] for m in models),
        "totalTokens": sum(m["totalTokens"] for m in models),
        "models": models,
    }
