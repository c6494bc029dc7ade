"""Reading the plan PostgreSQL keeps for a statement a pooled connection prepared."""

from __future__ import annotations

import asyncpg


async def plan_of_cached_statement(conn: asyncpg.Connection, prefix: str, args_sql: str) -> str:
    """The plan of the newest statement starting ``prefix`` prepared on ``conn`` (asyncpg's
    statement cache), executed with ``args_sql`` (SQL literals)."""
    name = await conn.fetchval(
        "SELECT name FROM pg_prepared_statements WHERE statement LIKE $1 "
        "ORDER BY prepare_time DESC LIMIT 1", prefix + "%")
    assert name, f"no prepared statement starting {prefix!r} on this connection"
    rows = await conn.fetch(f'EXPLAIN (COSTS OFF) EXECUTE "{name}"({args_sql})')
    return "\n".join(r[0] for r in rows)
