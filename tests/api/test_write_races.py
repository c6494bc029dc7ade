"""Writes that race on one row: whichever comes second sees the first one's result, and no
interleaving of two requests is answered with a 500 or leaves a mix of both.

A second PostgreSQL session stands in for the other request: it takes the row's lock, the
request under test is left waiting on it, and the session then does its write and commits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from notifkit.config import Settings
from tests.api.conftest import Api, Project
from tests.support.waiting import until_async


@pytest.fixture
async def other(api_settings: Settings) -> AsyncIterator[asyncpg.Connection]:
    """Another session on the test's schema."""
    conn = await asyncpg.connect(api_settings.database_url)
    await conn.execute(f'SET search_path = "{api_settings.db_schema}"')
    try:
        yield conn
    finally:
        await conn.close()


async def waiting_on_a_lock(conn: asyncpg.Connection) -> bool:
    """Whether some other session of the database is waiting for a lock."""
    return bool(await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND datname = current_database() AND pid <> pg_backend_pid()"))


async def test_a_user_put_that_finds_the_user_erased_under_it_creates_the_user_again(
    api: Api, project: Project, other: asyncpg.Connection,
) -> None:
    # Given a user
    made = await api.call("PUT", "/v1/users/u1", key=project.full, json={"segments": ["a"]})
    assert made.status == 201, made.body

    # And an erasure of that user that holds its row
    erasing = other.transaction()
    await erasing.start()
    await other.execute("SELECT 1 FROM users WHERE project_id = $1 AND id = 'u1' FOR UPDATE",
                        project.id)

    # When a PUT of the user comes in meanwhile, and the erasure then commits
    put = asyncio.create_task(api.call(
        "PUT", "/v1/users/u1", key=project.full,
        json={"segments": ["b"], "contacts": [{"channel": "email", "target": "b@example.com"}]}))
    await until_async(lambda: waiting_on_a_lock(other))
    await other.execute("DELETE FROM users WHERE project_id = $1 AND id = 'u1'", project.id)
    await erasing.commit()
    reply = await put

    # Then the PUT, coming second, created the user anew with what it sent
    assert reply.status == 201, reply.body
    assert reply.body["segments"] == ["b"]
    assert [c["target"] for c in reply.body["contacts"]] == ["b@example.com"]
    got = await api.call("GET", "/v1/users/u1", key=project.full)
    assert got.status == 200, got.body
    assert got.body["segments"] == ["b"]
    assert got.body["attributes"] == {}
