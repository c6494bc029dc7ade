"""Users, their contacts, segments and preferences (project scope).

``PUT /v1/users/{userId}`` is an upsert: fields sent replace the stored value (``segments`` and
``contacts`` replace the whole list; a contact that stays keeps its id and enabled state),
fields omitted are kept. ``POST .../contacts`` with an address the user already has answers
200 with the existing contact, unchanged: adding an address is idempotent, and a contact that a
provider disabled stays disabled (CONTRACT §5).
"""

from __future__ import annotations

import datetime
from typing import Any

import asyncpg
from aiohttp import web

from notifkit import quiet_hours
from notifkit.db import workflows as workflows_db
from notifkit.db.logs import insert_logs
from notifkit.destinations import normalise_contact
from notifkit.messages import CHANNELS
from notifkit.services.api.errors import ApiError, detail, json_response, not_found
from notifkit.services.api.middleware import project_id
from notifkit.services.api.routing import Operations, Reply
from notifkit.services.api.schemas import CONTACT_CHANNELS, ref
from notifkit.services.api.state import DB, HUB, KEYS, REDIS, SETTINGS
from notifkit.services.api.validation import (
    MAX_TARGET_BYTES,
    Fields,
    contact_problem,
    is_hhmm,
    is_locale,
    is_timezone,
    iso,
    lookup_id,
    name_problem,
    path_id,
    read_json,
    uuid_id,
)
from notifkit.services.scheduler import cancel_waiting
from notifkit.services.timeline import canceled_row

ops = Operations("users")

MAX_SEGMENTS = 100
MAX_CONTACTS = 100
MAX_TOPICS = 200


@ops.route("PUT", "/v1/users/{userId}", "Create or update a user",
           body=ref("UserPut"), responses={200: ref("User"), 201: ref("User")},
           errors=(404,))
async def put_user(request: web.Request) -> web.Response:
    project = project_id(request)
    user_id = path_id(request, "userId")
    fields = Fields(await read_json(request))
    fields.only(("attributes", "timezone", "locale", "segments", "contacts"))
    attributes = fields.obj("attributes")
    timezone = fields.string("timezone", nullable=True, max_len=64)
    if timezone is not None and not is_timezone(timezone):
        fields.fail("timezone", "must be an IANA time zone such as Europe/Berlin")
    locale = fields.string("locale", nullable=True, max_len=64)
    if locale is not None and not is_locale(locale):
        fields.fail("locale", "must be a language tag such as de or pt-BR")
    segments = _segments(fields)
    contacts = _contacts(fields, _allow_private(request))
    fields.raise_if_invalid()

    changes: dict[str, Any] = {}
    if attributes is not None:
        changes["attributes"] = attributes
    for name in ("timezone", "locale"):
        if name in fields.body:
            changes[name] = fields.body[name]

    sets = [f"{column} = ${i}" for i, column in enumerate(changes, start=3)]
    async with request.app[DB].acquire() as conn, conn.transaction():
        while True:
            created = await conn.fetchval(
                "INSERT INTO users (project_id, id, attributes, timezone, locale) "
                "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (project_id, id) DO NOTHING "
                "RETURNING true",
                project, user_id, changes.get("attributes", {}), changes.get("timezone"),
                changes.get("locale"),
            )
            # The UPDATE locks the row, so what follows sees the user until the commit. It
            # finds none when an erasure committed since the INSERT saw the row: this PUT
            # comes after it, and creates the user anew.
            if created or await conn.fetchval(
                f"UPDATE users SET {', '.join([*sets, 'updated_at = now()'])} "
                "WHERE project_id = $1 AND id = $2 RETURNING true",
                project, user_id, *changes.values(),
            ):
                break
        if segments is not None:
            await replace_segments(conn, project, user_id, segments)
        if contacts is not None:
            await replace_contacts(conn, project, user_id, contacts)
        user = await load_user(conn, project, user_id)
    assert user is not None  # written in this transaction
    return json_response(user, 201 if created else 200)


@ops.route("GET", "/v1/users/{userId}", "Get a user with contacts and preferences",
           responses={200: ref("User")})
async def get_user(request: web.Request) -> web.Response:
    project = project_id(request)
    user_id = lookup_id(request, "userId", "user")
    async with request.app[DB].acquire() as conn:
        user = await load_user(conn, project, user_id)
    if user is None:
        raise not_found("user", user_id)
    return json_response(user)


# An erased user's sends waiting in the scheduler (index scheduled_payloads_user_idx).
WAITING_SENDS_SQL = (
    "SELECT task_id, payload->>'eventId' AS event_id, payload->>'channel' AS channel, "
    "payload->>'campaignId' AS campaign_id FROM scheduled_payloads "
    "WHERE project_id = $1 AND payload->>'userId' = $2"
)


@ops.route("DELETE", "/v1/users/{userId}", "Erase a user and all their data",
           responses={204: Reply(None, "The profile, contacts, segments, preferences, quiet "
                                       "hours and in-app inbox are erased; the user's "
                                       "unfinished workflow instances are canceled and "
                                       "sends waiting in the scheduler dropped.")})
async def delete_user(request: web.Request) -> web.Response:
    project = project_id(request)
    user_id = lookup_id(request, "userId", "user")
    async with request.app[DB].acquire() as conn, conn.transaction():
        # Contacts, segments, preferences and quiet hours go with the row (ON DELETE CASCADE);
        # the inbox is not tied by a foreign key, so it is erased explicitly.
        deleted = await conn.fetchval(
            "DELETE FROM users WHERE project_id = $1 AND id = $2 RETURNING true",
            project, user_id,
        )
        if not deleted:
            raise not_found("user", user_id)
        await conn.execute(
            "DELETE FROM inapp_messages WHERE project_id = $1 AND user_id = $2", project, user_id
        )
        # The user's unfinished workflow instances end with them, as a cancel ends one: a
        # waitForEvent would otherwise wake on an event for this id, and a later step send
        # to a user created again under it.
        for instance_id in await conn.fetchval(
            "SELECT coalesce(array_agg(id::text), '{}') FROM workflow_instances "
            "WHERE project_id = $1 AND user_id = $2 AND NOT (status = ANY($3::text[]))",
            project, user_id, list(workflows_db.TERMINAL_STATUSES),
        ):
            await workflows_db.cancel_instance(conn, project, instance_id)
        waiting = await conn.fetch(WAITING_SENDS_SQL, project, user_id)
    await _drop_waiting_sends(request, project, user_id, waiting)
    # Their throttle window goes too: named by their id, it lived as long as their latest
    # send was due, and the sends just dropped held back a user created again under the id.
    await request.app[REDIS].delete(request.app[KEYS].throttle(project, user_id))
    await request.app[HUB].end_user_streams(project, user_id)
    return web.Response(status=204)


async def _drop_waiting_sends(request: web.Request, project: str, user_id: str,
                              waiting: list[asyncpg.Record]) -> None:
    """Take an erased user's sends out of the scheduler (their rows go as a moved task's
    do), so none reaches a user created again under the id. One still on its way to the
    scheduler finds no user or contact at delivery's check, and is skipped there."""
    claimed = await cancel_waiting(request.app[REDIS], request.app[KEYS], project,
                                   [row["task_id"] for row in waiting])
    if claimed:
        await insert_logs(request.app[DB], [
            canceled_row(project, row["event_id"], row["task_id"], user_id,
                         row["channel"] or "", row["campaign_id"],
                         " before it was due: the user was erased")
            for row in waiting if row["task_id"] in claimed and row["event_id"]])


@ops.route("POST", "/v1/users/{userId}/contacts", "Add a contact (address) to a user",
           body=ref("ContactCreate"),
           responses={201: ref("Contact"),
                      200: Reply(ref("Contact"), "The user already had this address; the "
                                                 "existing contact, unchanged.")},
           errors=(409,))
async def add_contact(request: web.Request) -> web.Response:
    project = project_id(request)
    user_id = lookup_id(request, "userId", "user")
    fields = Fields(await read_json(request))
    fields.only(("channel", "target"))
    channel, target = contact_fields(fields, _allow_private(request))
    fields.raise_if_invalid()
    assert channel is not None
    assert target is not None
    async with request.app[DB].acquire() as conn, conn.transaction():
        # The user's row lock orders this against other additions, a PUT of the contacts and
        # the user's erasure, so the count below stays true until the insert commits.
        if not await conn.fetchval(
            "SELECT true FROM users WHERE project_id = $1 AND id = $2 FOR NO KEY UPDATE",
            project, user_id,
        ):
            raise not_found("user", user_id)
        row = await conn.fetchrow(
            "SELECT id, channel, target, enabled, created_at FROM user_contacts "
            "WHERE project_id = $1 AND user_id = $2 AND channel = $3 AND target = $4",
            project, user_id, channel, target,
        )
        if row is not None:
            return json_response(contact_json(row), 200)
        held = await conn.fetchval(
            "SELECT count(*) FROM user_contacts WHERE project_id = $1 AND user_id = $2",
            project, user_id,
        )
        if held >= MAX_CONTACTS:
            raise ApiError(
                409, "too_many_contacts",
                f"This user already has {MAX_CONTACTS} contacts, the most one user may hold; "
                "remove one first.",
                [detail("target", f"the user already has {MAX_CONTACTS} contacts")],
            )
        row = await conn.fetchrow(
            "INSERT INTO user_contacts (project_id, user_id, channel, target) "
            "VALUES ($1, $2, $3, $4) RETURNING id, channel, target, enabled, created_at",
            project, user_id, channel, target,
        )
    assert row is not None
    return json_response(contact_json(row), 201)


@ops.route("DELETE", "/v1/users/{userId}/contacts/{contactId}", "Remove a contact",
           responses={204: Reply(None, "Removed.")})
async def delete_contact(request: web.Request) -> web.Response:
    project = project_id(request)
    user_id = lookup_id(request, "userId", "user")
    contact_id = uuid_id(request, "contactId", "contact")
    deleted = await request.app[DB].fetchval(
        "DELETE FROM user_contacts WHERE id = $1 AND project_id = $2 AND user_id = $3 "
        "RETURNING true",
        contact_id, project, user_id,
    )
    if not deleted:
        raise not_found("contact", contact_id)
    return web.Response(status=204)


@ops.route("GET", "/v1/users/{userId}/preferences", "Get a user's preferences",
           responses={200: ref("Preferences")},
           description="The preferences as the PUT beside it answers them (also part of "
                       "GET /v1/users/{userId}).")
async def get_preferences(request: web.Request) -> web.Response:
    project = project_id(request)
    user_id = lookup_id(request, "userId", "user")
    async with request.app[DB].acquire() as conn:
        exists = await conn.fetchval(
            "SELECT 1 FROM users WHERE project_id = $1 AND id = $2", project, user_id)
        if not exists:
            raise not_found("user", user_id)
        preferences = await load_preferences(conn, project, user_id)
    return json_response(preferences)


@ops.route("PUT", "/v1/users/{userId}/preferences", "Set a user's preferences",
           body=ref("PreferencesPut"), responses={200: ref("Preferences")},
           description="Each of channels, topics and quietHours that is sent replaces the "
                       "stored one; quietHours null removes quiet hours. A channel or topic "
                       "without an entry is allowed.")
async def put_preferences(request: web.Request) -> web.Response:
    project = project_id(request)
    user_id = lookup_id(request, "userId", "user")
    fields = Fields(await read_json(request))
    fields.only(("channels", "topics", "quietHours"))
    channels = _bool_map(fields, "channels", allowed=CHANNELS)
    topics = _bool_map(fields, "topics", max_keys=MAX_TOPICS)
    quiet = _quiet_hours(fields)
    fields.raise_if_invalid()
    async with request.app[DB].acquire() as conn, conn.transaction():
        exists = await conn.fetchval(
            "SELECT 1 FROM users WHERE project_id = $1 AND id = $2 FOR UPDATE", project, user_id
        )
        if not exists:
            raise not_found("user", user_id)
        if channels is not None:
            await conn.execute(
                "DELETE FROM user_channel_preferences WHERE project_id = $1 AND user_id = $2",
                project, user_id,
            )
            await conn.execute(
                "INSERT INTO user_channel_preferences (project_id, user_id, channel, enabled) "
                "SELECT $1, $2, c, e FROM unnest($3::text[], $4::boolean[]) AS p(c, e)",
                project, user_id, list(channels), list(channels.values()),
            )
        if topics is not None:
            await conn.execute(
                "DELETE FROM user_topic_preferences WHERE project_id = $1 AND user_id = $2",
                project, user_id,
            )
            await conn.execute(
                "INSERT INTO user_topic_preferences (project_id, user_id, topic, enabled) "
                "SELECT $1, $2, t, e FROM unnest($3::text[], $4::boolean[]) AS p(t, e)",
                project, user_id, list(topics), list(topics.values()),
            )
        if "quietHours" in fields.body:
            if quiet is None:
                await conn.execute(
                    "DELETE FROM quiet_hours WHERE project_id = $1 AND user_id = $2",
                    project, user_id,
                )
            else:
                await conn.execute(
                    "INSERT INTO quiet_hours (project_id, user_id, start_time, end_time) "
                    "VALUES ($1, $2, $3, $4) ON CONFLICT (project_id, user_id) "
                    "DO UPDATE SET start_time = EXCLUDED.start_time, "
                    "end_time = EXCLUDED.end_time",
                    project, user_id, quiet[0], quiet[1],
                )
        await conn.execute(
            "UPDATE users SET updated_at = now() WHERE project_id = $1 AND id = $2",
            project, user_id,
        )
        preferences = await load_preferences(conn, project, user_id)
    return json_response(preferences)


# ---------------------------------------------------------------------------------------------
# Reading


async def load_user(
    conn: asyncpg.Connection, project: str, user_id: str
) -> dict[str, Any] | None:
    row = await conn.fetchrow(
        "SELECT id, attributes, timezone, locale, created_at, updated_at FROM users "
        "WHERE project_id = $1 AND id = $2",
        project, user_id,
    )
    if row is None:
        return None
    segments = await conn.fetch(
        "SELECT segment FROM user_segments WHERE project_id = $1 AND user_id = $2 "
        "ORDER BY segment",
        project, user_id,
    )
    contacts = await conn.fetch(
        "SELECT id, channel, target, enabled, created_at FROM user_contacts "
        "WHERE project_id = $1 AND user_id = $2 ORDER BY created_at, channel, target",
        project, user_id,
    )
    return {
        "id": row["id"],
        "attributes": row["attributes"],
        "timezone": row["timezone"],
        "locale": row["locale"],
        "segments": [r["segment"] for r in segments],
        "contacts": [contact_json(c) for c in contacts],
        "preferences": await load_preferences(conn, project, user_id),
        "createdAt": iso(row["created_at"]),
        "updatedAt": iso(row["updated_at"]),
    }


async def load_preferences(
    conn: asyncpg.Connection, project: str, user_id: str
) -> dict[str, Any]:
    channels = await conn.fetch(
        "SELECT channel, enabled FROM user_channel_preferences "
        "WHERE project_id = $1 AND user_id = $2 ORDER BY channel",
        project, user_id,
    )
    topics = await conn.fetch(
        "SELECT topic, enabled FROM user_topic_preferences "
        "WHERE project_id = $1 AND user_id = $2 ORDER BY topic",
        project, user_id,
    )
    quiet = await conn.fetchrow(
        "SELECT start_time, end_time FROM quiet_hours WHERE project_id = $1 AND user_id = $2",
        project, user_id,
    )
    return {
        "channels": {r["channel"]: r["enabled"] for r in channels},
        "topics": {r["topic"]: r["enabled"] for r in topics},
        "quietHours": None if quiet is None else {
            "start": quiet_hours.wall_time(quiet["start_time"]),
            "end": quiet_hours.wall_time(quiet["end_time"]),
        },
    }


def contact_json(row: asyncpg.Record) -> dict[str, Any]:
    return {
        "id": str(row["id"]), "channel": row["channel"], "target": row["target"],
        "enabled": row["enabled"], "createdAt": iso(row["created_at"]),
    }


# ---------------------------------------------------------------------------------------------
# Writing


async def replace_segments(
    conn: asyncpg.Connection, project: str, user_id: str, segments: list[str]
) -> None:
    await conn.execute(
        "DELETE FROM user_segments WHERE project_id = $1 AND user_id = $2 "
        "AND NOT (segment = ANY($3::text[]))",
        project, user_id, segments,
    )
    await conn.execute(
        "INSERT INTO user_segments (project_id, user_id, segment) "
        "SELECT $1, $2, s FROM unnest($3::text[]) AS s ON CONFLICT DO NOTHING",
        project, user_id, segments,
    )


async def replace_contacts(
    conn: asyncpg.Connection, project: str, user_id: str, contacts: list[tuple[str, str]]
) -> None:
    channels = [c for c, _ in contacts]
    targets = [t for _, t in contacts]
    await conn.execute(
        "DELETE FROM user_contacts AS c WHERE c.project_id = $1 AND c.user_id = $2 "
        "AND NOT EXISTS (SELECT 1 FROM unnest($3::text[], $4::text[]) AS k(channel, target) "
        "WHERE k.channel = c.channel AND k.target = c.target)",
        project, user_id, channels, targets,
    )
    await conn.execute(
        "INSERT INTO user_contacts (project_id, user_id, channel, target) "
        "SELECT $1, $2, k.channel, k.target FROM unnest($3::text[], $4::text[]) "
        "AS k(channel, target) ON CONFLICT (project_id, user_id, channel, target) DO NOTHING",
        project, user_id, channels, targets,
    )


# ---------------------------------------------------------------------------------------------
# Validation


def _segments(fields: Fields) -> list[str] | None:
    items = fields.array("segments", max_items=MAX_SEGMENTS)
    if items is None:
        return None
    out: list[str] = []
    for index, item in enumerate(items):
        name = f"segments[{index}]"
        if not isinstance(item, str) or not 1 <= len(item) <= 100:
            fields.fail(name, "must be a string of 1 to 100 characters")
        # A send refuses the same names, so none of them could be reached.
        elif problem := name_problem(item):
            fields.fail(name, problem)
        elif item in out:
            fields.fail(name, f"repeats {item!r}")
        else:
            out.append(item)
    return out


def _allow_private(request: web.Request) -> bool:
    return request.app[SETTINGS].webhook_allow_private_networks


def contact_fields(fields: Fields, allow_private: bool) -> tuple[str | None, str | None]:
    """The ``channel`` and ``target`` fields as a contact is stored (problems go to
    ``fields``)."""
    channel = fields.choice("channel", CONTACT_CHANNELS, required=True)
    target = fields.string("target", required=True, max_len=MAX_TARGET_BYTES)
    if channel is None or target is None:
        return None, None
    problem = contact_problem(channel, target, allow_private_networks=allow_private)
    if problem:
        fields.fail("target", problem)
        return None, None
    return channel, normalise_contact(channel, target)


def _contacts(fields: Fields, allow_private: bool) -> list[tuple[str, str]] | None:
    items = fields.array("contacts", max_items=MAX_CONTACTS)
    if items is None:
        return None
    out: list[tuple[str, str]] = []
    for index, item in enumerate(items):
        name = f"contacts[{index}]"
        if not isinstance(item, dict):
            fields.fail(name, "must be an object with channel and target")
            continue
        inner = fields.child(name, item)
        inner.only(("channel", "target"))
        channel, target = contact_fields(inner, allow_private)
        if channel is not None and target is not None and (channel, target) not in out:
            out.append((channel, target))
    return out


def _bool_map(
    fields: Fields, name: str, *, allowed: tuple[str, ...] | None = None, max_keys: int = 50
) -> dict[str, bool] | None:
    raw = fields.obj(name)
    if raw is None:
        return None
    inner = fields.child(name, raw)
    if allowed is not None:
        inner.only(allowed)
    if len(raw) > max_keys:
        fields.fail(name, f"must hold at most {max_keys} entries")
        return None
    out: dict[str, bool] = {}
    for key, value in raw.items():
        if allowed is not None and key not in allowed:
            continue
        if not 1 <= len(key) <= 100:
            inner.fail(key[:100] or "''", "must be a name of 1 to 100 characters")
        # Refused like a template's topic (blank, a control character): no template could
        # ever name it.
        elif problem := name_problem(key):
            inner.fail(key, problem)
        elif not isinstance(value, bool):
            inner.fail(key, "must be true or false")
        else:
            out[key] = value
    return out


def _quiet_hours(fields: Fields) -> tuple[datetime.time, datetime.time] | None:
    raw = fields.obj("quietHours", nullable=True)
    if raw is None:
        return None
    inner = fields.child("quietHours", raw)
    inner.only(("start", "end"))
    start = inner.string("start", required=True, max_len=8)
    end = inner.string("end", required=True, max_len=8)
    times: list[datetime.time] = []
    for key, value in (("start", start), ("end", end)):
        if value is None:
            continue
        if not is_hhmm(value):
            inner.fail(key, "must be a time of day as HH:MM (or HH:MM:SS), such as 22:00")
        else:
            times.append(quiet_hours.parse_time(value))
    if len(times) != 2:
        return None
    if times[0] == times[1]:
        inner.fail("end", "must differ from start")
        return None
    return times[0], times[1]
