"""Versioned SQL migrations.

Migrations are the files ``migrations/NNNN_name.sql``, applied in version order, each in its
own transaction together with its row in ``schema_migrations(version, name, checksum,
applied_at)``. Every statement uses unqualified names: the runner sets ``search_path`` to
``DB_SCHEMA``, so the same files build notifkit in ``public`` or in a schema of its own.

Several processes may start at once (every service migrates at start unless
``auto_migrate=False``): the runner holds a session-level ``pg_advisory_lock`` whose key is
derived from the schema name while it creates the schema, reads what is applied and applies
the rest. Whoever waits finds nothing left to do.

A schema that records a migration this release does not have was migrated by a newer release:
the runner (and a start with ``AUTO_MIGRATE=false``) refuses it rather than serve on tables
whose meaning it cannot know.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from notifkit.config import Settings
from notifkit.db.pool import connect

__all__ = [
    "MIGRATIONS_DIR",
    "Migration",
    "MigrationError",
    "applied_versions",
    "load_migrations",
    "migrate",
    "migrate_connection",
    "migration_lock_key",
    "refuse_newer",
    "unapplied",
]

log = logging.getLogger("notifkit.db.migrate")

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
_FILE_RE = re.compile(r"^(?P<version>\d{4})_(?P<slug>[a-z0-9_]+)\.sql$")

Progress = Callable[[str], None]

# How often a migration still running says so: an index built on a large table takes minutes,
# and a process silent for that long looks hung (and may be killed as such).
PROGRESS_INTERVAL_S = 30.0


class MigrationError(RuntimeError):
    """The migration files are inconsistent, or one of them failed to apply."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str  # file name without ".sql", e.g. "0001_initial"
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def load_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """Every migration file in version order; a misnamed file or a repeated version is an error."""
    migrations: dict[int, Migration] = {}
    for path in sorted(directory.glob("*.sql")):
        match = _FILE_RE.match(path.name)
        if match is None:
            raise MigrationError(f"{path.name}: migration files are named NNNN_name.sql")
        version = int(match["version"])
        if version in migrations:
            raise MigrationError(
                f"{path.name}: version {version} is also {migrations[version].name}.sql"
            )
        migrations[version] = Migration(version, path.stem, path.read_text(encoding="utf-8"))
    return [migrations[v] for v in sorted(migrations)]


def migration_lock_key(schema: str) -> int:
    """The advisory-lock key (a signed 64-bit int) that serialises migrations of ``schema``."""
    digest = hashlib.sha256(f"notifkit:migrate:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


# What notifkit's schema_migrations holds; another tool's table of that name lacks some.
_LEDGER_COLUMNS = {"version": "integer", "name": "text", "checksum": "text"}


async def applied_versions(conn: asyncpg.Connection) -> dict[int, str]:
    """Applied version -> checksum, read from ``schema_migrations`` on the search path.
    A table of that name that is not notifkit's (another tool's, in a shared schema) is a
    :class:`MigrationError`."""
    table = await conn.fetchval("SELECT to_regclass('schema_migrations')::oid")
    if table is None:
        return {}
    columns = dict(await conn.fetch(
        "SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped", table))
    if any(columns.get(name) != kind for name, kind in _LEDGER_COLUMNS.items()):
        schema = await conn.fetchval("SELECT current_schema()")
        held = ", ".join(f"{name} {kind}" for name, kind in columns.items())
        raise MigrationError(
            f"schema {schema!r} holds a schema_migrations table that is not notifkit's "
            f"({held}): another tool keeps its migrations there; point DB_SCHEMA at a "
            "schema of notifkit's own (it is created if missing)")
    rows = await conn.fetch("SELECT version, checksum FROM schema_migrations")
    return {row["version"]: row["checksum"] for row in rows}


async def refuse_newer(
    conn: asyncpg.Connection, schema: str, applied: dict[int, str], available: list[Migration]
) -> None:
    """A :class:`MigrationError` when ``schema`` records migrations this release does not have:
    a newer release migrated it, and this one cannot know what its tables now mean."""
    known = {m.version for m in available}
    newer = sorted(v for v in applied if v not in known)
    if not newer:
        return
    names = {row["version"]: row["name"] for row in await conn.fetch(
        "SELECT version, name FROM schema_migrations WHERE version = ANY($1::int[])", newer)}
    listed = ", ".join(names.get(v) or f"{v:04d}" for v in newer)
    newest = available[-1].name if available else "none"
    raise MigrationError(
        f"schema {schema!r} was migrated by a newer notifkit: it has {listed}, which this "
        f"release does not know (its newest migration is {newest}); run the release that "
        "migrated it, or point DB_SCHEMA at another schema")


async def unapplied(settings: Settings) -> list[str]:
    """The migrations ``settings.db_schema`` lacks, by name (every one, for a new schema).
    A schema a newer release migrated is a :class:`MigrationError` (:func:`refuse_newer`)."""
    available = load_migrations()
    conn = await connect(settings, application_name="notifkit-check")
    try:  # the connection's search_path is the schema already
        applied = await applied_versions(conn)
        await refuse_newer(conn, settings.db_schema, applied, available)
    finally:
        await conn.close()
    return [m.name for m in available if m.version not in applied]


async def migrate(settings: Settings, *, progress: Progress | None = None) -> list[str]:
    """Bring ``settings.db_schema`` up to date; returns the names of the migrations applied."""
    conn = await connect(settings, application_name="notifkit-migrate")
    try:
        return await migrate_connection(conn, settings.db_schema, progress=progress)
    finally:
        await conn.close()


async def migrate_connection(
    conn: asyncpg.Connection,
    schema: str,
    *,
    progress: Progress | None = None,
    migrations: list[Migration] | None = None,
) -> list[str]:
    """:func:`migrate` on a connection the caller owns; leaves its search_path on ``schema``."""
    available = load_migrations() if migrations is None else migrations

    def say(message: str) -> None:
        log.info(message)
        if progress is not None:
            progress(message)

    key = migration_lock_key(schema)
    if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", key):
        say(f"Waiting for another process that is migrating schema {schema!r}.")
        await conn.execute("SELECT pg_advisory_lock($1)", key)
    try:
        # Checked first: CREATE SCHEMA IF NOT EXISTS needs the CREATE privilege on the database
        # even when the schema exists, and a deployment may own only its schema.
        if not await conn.fetchval("SELECT 1 FROM pg_namespace WHERE nspname = $1", schema):
            say(f"Creating schema {schema!r}.")
            await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {_quote_ident(schema)}")
        await conn.execute("SELECT set_config('search_path', $1, false)", _quote_ident(schema))
        await conn.execute(
            """
            CREATE TABLE IF NOT EXISTS schema_migrations (
                version     integer     PRIMARY KEY,
                name        text        NOT NULL,
                checksum    text        NOT NULL,
                applied_at  timestamptz NOT NULL DEFAULT now()
            )
            """
        )
        applied = await applied_versions(conn)
        await refuse_newer(conn, schema, applied, available)
        for migration in available:
            recorded = applied.get(migration.version)
            if recorded is not None and recorded != migration.checksum:
                log.warning(
                    "Migration %s was changed after it was applied to schema %r; the change is "
                    "not applied. Add a new migration instead.", migration.name, schema,
                )
        todo = [m for m in available if m.version not in applied]
        if not todo:
            say(f"Schema {schema!r} is up to date ({len(applied)} migrations applied).")
            return []
        done: list[str] = []
        newest_applied = max(applied, default=0)
        for number, migration in enumerate(todo, 1):
            # Said before it runs too: a migration that rewrites a large table can take
            # minutes, and nothing else would show that the process is at work.
            say(f"Applying migration {migration.name} ({number} of {len(todo)}) to schema "
                f"{schema!r}.")
            if migration.version < newest_applied:
                log.warning(
                    "Applying migration %s to schema %r after version %04d: it was added out "
                    "of order.", migration.name, schema, newest_applied,
                )
            started = time.perf_counter()
            ticker = asyncio.get_running_loop().create_task(
                _still_applying(say, migration.name, schema, started),
                name="migration-progress")
            try:
                async with conn.transaction():
                    await conn.execute(migration.sql)
                    await conn.execute(
                        "INSERT INTO schema_migrations (version, name, checksum) "
                        "VALUES ($1, $2, $3)",
                        migration.version, migration.name, migration.checksum,
                    )
            except asyncpg.PostgresError as exc:
                raise MigrationError(
                    f"migration {migration.name} failed in schema {schema!r} and was rolled "
                    f"back: {exc}"
                ) from exc
            finally:
                ticker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await ticker
            elapsed_ms = (time.perf_counter() - started) * 1000
            say(f"Applied migration {migration.name} to schema {schema!r} in {elapsed_ms:.0f} ms.")
            done.append(migration.name)
        return done
    finally:
        if not conn.is_closed():  # a closed session has released its lock already
            await conn.execute("SELECT pg_advisory_unlock($1)", key)


async def _still_applying(say: Progress, name: str, schema: str, started: float) -> None:
    while True:
        await asyncio.sleep(PROGRESS_INTERVAL_S)
        say(f"Still applying migration {name} to schema {schema!r} "
            f"({time.perf_counter() - started:.0f} s so far).")
