"""Who is calling: bearer keys, roles, the admin key's project rule, and the key cache.

Project keys are stored only as the hex SHA-256 of the key. A looked-up key is cached for
``KEY_CACHE_TTL_S``; revoking one publishes on ``Keys.key_revocations`` and every API process's
:class:`~notifkit.services.api.pubsub.Hub` drops it from its cache at once. The cache is only
trusted while that subscription is live: a process that lost its subscription could miss a
revocation, so until it has resubscribed every request goes to PostgreSQL.

Deleting a project (in SQL) deletes its keys but publishes nothing. A route that writes to
PostgreSQL learns of it from the foreign key its write fails (a send, from the project check
its insert makes); one that writes nothing there
(``POST /v1/events``) asks whether the project still exists, at most once per
``PROJECT_CHECK_INTERVAL_S`` per project: :meth:`KeyCache.project_exists`.

A key PostgreSQL does not know is remembered as unknown for ``UNKNOWN_KEY_TTL_S``, so a client
retrying a revoked or mistyped key in a loop costs one query per interval, not one per request.
That needs no subscription: keys are random and a revoked one is never restored, so a key
unknown now can become known only by being created, and a created key is a new one.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import asyncpg

from notifkit.services.api.errors import ApiError, invalid_field
from notifkit.services.api.validation import parse_uuid

KEY_CACHE_TTL_S = 60.0
UNKNOWN_KEY_TTL_S = 5.0
# How long a project PostgreSQL just had is taken to exist, by routes that write nothing there.
PROJECT_CHECK_INTERVAL_S = 1.0
MAX_CHECKED_PROJECTS = 10_000
# Random keys are each new: past this many the remembered unknown keys start again from none.
MAX_UNKNOWN_KEYS = 10_000
KEY_PREFIX = "nk_"
MAX_KEY_LEN = 512

Role = Literal["admin", "full", "send"]
ROLES = ("full", "send")


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller. ``project_id`` is None only for the admin key naming no project."""

    role: Role
    project_id: str | None
    key_id: str | None = None
    # An inbox token's caller: that one user's inbox routes only (notifkit/inbox_token.py),
    # until the token expires (unix seconds).
    user_id: str | None = None
    expires_at_s: int | None = None
    user_created_us: int | None = None  # the token's user: created then (inbox_token.py)

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def project(self) -> str:
        if self.project_id is None:  # routes that need one never let this happen
            raise ApiError(400, "project_required", "This call needs a project.")
        return self.project_id


@dataclass(frozen=True, slots=True)
class KeyRecord:
    key_id: str
    project_id: str
    role: Role


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


class KeyCache:
    """Key hash -> key record for ``ttl_s``; revocations drop entries immediately."""

    def __init__(self, pool: asyncpg.Pool, ttl_s: float = KEY_CACHE_TTL_S, *,
                 unknown_ttl_s: float = UNKNOWN_KEY_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.pool = pool
        self.ttl_s = ttl_s
        self.unknown_ttl_s = unknown_ttl_s
        self.clock = clock
        self.live = False  # set by the Hub while its revocation subscription is up
        self._entries: dict[str, tuple[float, KeyRecord]] = {}
        self._unknown: dict[str, float] = {}  # key hash -> until when it is refused from memory
        self._projects: dict[str, float] = {}  # project id -> until when it is taken to exist
        self._revocations = 0  # bumped by every drop, so a racing lookup never re-caches

    async def lookup(self, key_hash: str) -> KeyRecord | None:
        now = self.clock()
        if self._unknown.get(key_hash, 0.0) > now:
            return None
        if self.live:
            cached = self._entries.get(key_hash)
            if cached is not None and cached[0] > now:
                return cached[1]
        seen = self._revocations
        row = await self.pool.fetchrow(
            "SELECT id, project_id, role FROM project_api_keys "
            "WHERE key_hash = $1 AND revoked_at IS NULL",
            key_hash,
        )
        if row is None:
            if len(self._unknown) >= MAX_UNKNOWN_KEYS:
                self._unknown.clear()
            self._unknown[key_hash] = now + self.unknown_ttl_s
            return None
        record = KeyRecord(str(row["id"]), str(row["project_id"]), row["role"])
        self._project_seen(record.project_id, now)  # its keys go with it
        if self.live and seen == self._revocations:
            self._entries[key_hash] = (now + self.ttl_s, record)
        return record

    async def project_exists(self, project_id: str) -> bool:
        """Whether the project still exists: PostgreSQL is asked at most once per
        ``PROJECT_CHECK_INTERVAL_S`` (a key just read from it counts), not at every request."""
        now = self.clock()
        if self._projects.get(project_id, 0.0) > now:
            return True
        if not await self.pool.fetchval("SELECT 1 FROM projects WHERE id = $1", project_id):
            return False
        self._project_seen(project_id, now)
        return True

    def _project_seen(self, project_id: str, now: float) -> None:
        if len(self._projects) >= MAX_CHECKED_PROJECTS and project_id not in self._projects:
            self._projects.clear()
        self._projects[project_id] = now + PROJECT_CHECK_INTERVAL_S

    def drop(self, key_hash: str) -> None:
        self._revocations += 1
        self._entries.pop(key_hash, None)

    def clear(self) -> None:
        self._revocations += 1
        self._entries.clear()


def bearer_key(header: str | None) -> str:
    if not header:
        raise unauthorized("missing_api_key",
                           "Send an API key as 'Authorization: Bearer <key>'.")
    scheme, _, key = header.strip().partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        raise unauthorized("missing_api_key",
                           "Send an API key as 'Authorization: Bearer <key>'.")
    return key


def project_key_hash(key: str) -> str:
    """The hash a project key is looked up by. A key longer than any project key is none,
    refused without hashing kilobytes (the admin key, of any length, is compared before)."""
    if len(key) > MAX_KEY_LEN:
        raise unauthorized("invalid_api_key", "The API key is not valid.")
    return hash_key(key)


def is_admin_key(key: str, admin_key: str | None) -> bool:
    return admin_key is not None and hmac.compare_digest(
        key.encode("utf-8", "surrogatepass"), admin_key.encode()
    )


def named_project(header: str | None, query: str | None) -> str | None:
    """The project a request names (``x-project-id`` first, then ``projectId``), normalised;
    None if it names none. Only the admin key acts on it (a project key may name only its own
    project), but a value that is not a project id, or a header and a query parameter naming
    two projects, is a 400 whoever sends it."""
    named: list[str] = []
    for field, raw in (("x-project-id", header), ("projectId", query)):
        if raw is None:
            continue
        normalised = parse_uuid(raw.strip())
        if normalised is None:
            raise invalid_field(field, "must be a project id (UUID)")
        named.append(normalised)
    if len(set(named)) > 1:  # which one the caller meant is anyone's guess
        raise invalid_field("projectId", "names another project than the x-project-id header")
    return named[0] if named else None


def project_not_found() -> ApiError:
    return ApiError(404, "project_not_found", "No project with that id exists.")


def unauthorized(code: str, message: str) -> ApiError:
    return ApiError(401, code, message, headers={"WWW-Authenticate": "Bearer"})


def forbidden(message: str) -> ApiError:
    return ApiError(403, "forbidden", message)
