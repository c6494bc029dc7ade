"""Disabling the contacts a provider rejected, in PostgreSQL."""

from __future__ import annotations

import asyncpg

from notifkit.db.outbox import disable_contacts

from .helpers import add_user


async def test_a_rejected_address_is_disabled_on_its_own_channel_only(
    db: asyncpg.Pool, project: str
) -> None:
    # Given two users holding the rejected push token, one of them also as another channel's
    # target, and a user of another project holding it too
    await add_user(db, project, "u1", contacts=[("push", "tok-1"), ("webhook", "tok-1")])
    await add_user(db, project, "u2", contacts=[("push", "tok-1")])
    other = await db.fetchval("INSERT INTO projects (name) VALUES ('other') RETURNING id::text")
    await add_user(db, other, "u1", contacts=[("push", "tok-1")])

    # When push rejects the token
    await disable_contacts(db, [(project, "push", "tok-1", "invalid_recipient")])

    # Then it is disabled for every user of the project on push, and nowhere else
    rows = await db.fetch("SELECT project_id::text AS p, user_id, channel, enabled, "
                          "disabled_reason FROM user_contacts")
    state = {(r["p"] == project, r["user_id"], r["channel"]): (r["enabled"], r["disabled_reason"])
             for r in rows}
    assert state == {
        (True, "u1", "push"): (False, "invalid_recipient"),
        (True, "u2", "push"): (False, "invalid_recipient"),
        (True, "u1", "webhook"): (True, None),
        (False, "u1", "push"): (True, None),
    }
