"""Admin routes: projects (tenants) and their API keys.

A key is shown once, in the response that creates it; only its SHA-256 is stored. Revoking a
key marks it revoked in PostgreSQL and then publishes the revocation, so every API process
drops it from its cache at once (pubsub.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import asyncpg
from aiohttp import web

from notifkit.config import MIN_PROVIDER_RATE
from notifkit.services.api.auth import ROLES, hash_key, new_key, project_not_found
from notifkit.services.api.errors import ApiError, invalid_field, json_response
from notifkit.services.api.middleware import naming_field, principal
from notifkit.services.api.routing import Operations, Reply
from notifkit.services.api.schemas import CONTACT_CHANNELS, ref
from notifkit.services.api.state import DB, HUB, SETTINGS
from notifkit.services.api.validation import Fields, iso, parse_uuid, read_json

ops = Operations("admin")

MAX_THROTTLE_LIMIT = 1_000_000
MAX_WINDOW_S = 31_536_000
MAX_RATE_PER_S = 100_000


@ops.route("POST", "/v1/projects", "Create a project", access="admin",
           body=ref("ProjectCreate"), responses={201: ref("Project")})
async def create_project(request: web.Request) -> web.Response:
    if principal(request).project_id is not None:
        raise invalid_field(naming_field(request), "does not apply: this call creates a project")
    fields = Fields(await read_json(request))
    fields.only(("name", "settings"))
    name = fields.name("name", required=True, max_len=200)
    settings = project_settings(fields)
    fields.raise_if_invalid()
    row = await request.app[DB].fetchrow(
        "INSERT INTO projects (name, settings) VALUES ($1, $2) "
        "RETURNING id, name, settings, created_at",
        name, settings,
    )
    return json_response(project_json(row), 201)


@ops.route("GET", "/v1/projects/{projectId}", "Get a project", access="admin",
           responses={200: ref("Project")})
async def get_project(request: web.Request) -> web.Response:
    project_id = _path_project(request)
    row = await request.app[DB].fetchrow(
        "SELECT id, name, settings, created_at FROM projects WHERE id = $1", project_id
    )
    if row is None:
        raise project_not_found()
    return json_response(project_json(row))


@ops.route("POST", "/v1/projects/{projectId}/keys", "Create an API key (shown once)",
           access="admin", body=ref("KeyCreate"), responses={201: ref("KeyCreated")})
async def create_key(request: web.Request) -> web.Response:
    project_id = _path_project(request)
    fields = Fields(await read_json(request))
    fields.only(("role", "name"))
    role = fields.choice("role", ROLES, required=True)
    # null: unnamed, as shown
    name = fields.name("name", nullable=True, max_len=200)
    fields.raise_if_invalid()
    key = new_key()
    try:
        row = await request.app[DB].fetchrow(
            "INSERT INTO project_api_keys (project_id, key_hash, role, name) "
            "VALUES ($1, $2, $3, $4) RETURNING id, role, name, created_at",
            project_id, hash_key(key), role, name,
        )
    except asyncpg.ForeignKeyViolationError:
        raise project_not_found() from None
    return json_response({
        "id": str(row["id"]), "key": key, "role": row["role"], "name": row["name"],
        "projectId": project_id, "createdAt": iso(row["created_at"]),
    }, 201)


@ops.route("DELETE", "/v1/keys/{keyId}", "Revoke an API key", access="admin",
           responses={204: Reply(None, "Revoked; every API process rejects it within 1 s.")})
async def revoke_key(request: web.Request) -> web.Response:
    key_id = _uuid(request, "keyId", key_not_found)
    # Naming a project, the caller means a key of that project: another's is a 404.
    row = await request.app[DB].fetchrow(
        "UPDATE project_api_keys SET revoked_at = coalesce(revoked_at, now()) "
        "WHERE id = $1 AND ($2::uuid IS NULL OR project_id = $2::uuid) RETURNING key_hash",
        key_id, principal(request).project_id,
    )
    if row is None:
        raise key_not_found()
    # Published even when it was revoked already: a repeat is harmless and heals a lost one.
    hub = request.app[HUB]
    if request.app[SETTINGS].injects("unpublished_key_revocations"):  # test-only fault
        hub.key_cache.drop(row["key_hash"])  # this process only
    else:
        await hub.publish_revocation(row["key_hash"], key_id)
    return web.Response(status=204)


# ---------------------------------------------------------------------------------------------


def project_settings(fields: Fields) -> dict[str, Any]:
    """The validated ``settings`` object of a project (``{}`` when absent or null)."""
    raw = fields.obj("settings", nullable=True)
    if raw is None:
        return {}
    inner = fields.child("settings", raw)
    inner.only(("throttle", "rateLimits"))
    out: dict[str, Any] = {}
    throttle = inner.obj("throttle")
    if throttle is not None:
        t = inner.child("throttle", throttle)
        t.only(("limit", "windowSeconds"))
        # 0 turns the throttle off for this project even where THROTTLE_LIMIT sets one.
        limit = t.integer("limit", required=True, minimum=0, maximum=MAX_THROTTLE_LIMIT)
        window = t.integer("windowSeconds", required=True, minimum=1, maximum=MAX_WINDOW_S)
        if limit is not None and window is not None:
            out["throttle"] = {"limit": limit, "windowSeconds": window}
    rates = inner.obj("rateLimits")
    if rates is not None:
        r = inner.child("rateLimits", rates)
        r.only(CONTACT_CHANNELS)
        chosen: dict[str, float] = {}
        for channel, value in rates.items():
            if channel not in CONTACT_CHANNELS:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) \
                    or not MIN_PROVIDER_RATE <= value <= MAX_RATE_PER_S:
                # Below the floor a send would wait past any date the scheduler can park it to.
                r.fail(channel, f"must be a number of sends per second from "
                                f"{MIN_PROVIDER_RATE:g} to {MAX_RATE_PER_S}")
            else:
                chosen[channel] = value
        out["rateLimits"] = chosen
    return out


def project_json(row: asyncpg.Record) -> dict[str, Any]:
    return {
        "id": str(row["id"]), "name": row["name"], "settings": row["settings"],
        "createdAt": iso(row["created_at"]),
    }


# Projects and keys belong to no project, so their 404s do not say "in this project".


def key_not_found() -> ApiError:
    return ApiError(404, "key_not_found", "No key with that id exists.")


def _path_project(request: web.Request) -> str:
    """The path's project, which x-project-id or ?projectId=, if sent, must name too."""
    project_id = _uuid(request, "projectId", project_not_found)
    named = principal(request).project_id
    if named is not None and named != project_id:
        raise invalid_field(naming_field(request), "names another project than the path")
    return project_id


def _uuid(request: web.Request, name: str, missing: Callable[[], ApiError]) -> str:
    """A generated id from the path; anything that is not a UUID is the 404 of ``missing``."""
    value = parse_uuid(request.match_info[name])
    if value is None:
        raise missing()
    return value
