"""The API while a lock held by another session keeps its accept INSERT waiting past its
limit: the send is not accepted, and the client is told to retry (503 with Retry-After, the
answer to a PostgreSQL that cannot serve), not that the server failed (500)."""

from __future__ import annotations

import asyncpg
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.db.pool import create_pool
from notifkit.keys import Keys
from tests.api.conftest import Api, start_api


async def test_a_send_whose_insert_waits_on_a_lock_past_its_limit_is_a_503(
    api_settings: Settings, redis: Redis,
) -> None:
    settings = api_settings
    # as the api service makes it, with its query limit (QUERY_TIMEOUT_S) 1 s here
    pool = await create_pool(settings, command_timeout=1.0)
    _server, client = await start_api(settings, db=pool)
    api = Api(client, settings)
    holder = await asyncpg.connect(settings.database_url)
    try:
        project = await api.project()
        made = await api.call("PUT", "/v1/templates/hello", key=project.full, json={
            "channels": {"email": {"subject": "s", "text": "t"}}})
        assert made.status == 201, made.body
        body = {"to": "u1", "template": "hello"}

        # Given a session holding a lock on the table a send's acceptance writes
        await holder.execute(f'SET search_path = "{settings.db_schema}"')
        lock = holder.transaction()
        await lock.start()
        await holder.execute("LOCK TABLE notifications IN ACCESS EXCLUSIVE MODE")

        # When a send comes in, it is told to retry, and nothing was accepted
        refused = await api.call("POST", "/v1/notifications", key=project.send, json=body)
        assert refused.status == 503, refused.body
        assert refused.headers["Retry-After"] == "1"
        assert refused.error["code"] == "service_unavailable"
        inbound = Keys(settings.namespace).inbound("normal")
        assert await redis.xlen(inbound) == 0

        # And once the lock is released the retry is accepted
        await lock.rollback()
        accepted = await api.call("POST", "/v1/notifications", key=project.send, json=body)
        assert accepted.status == 202, accepted.body
        assert await redis.xlen(inbound) == 1
    finally:
        await holder.close()
        await client.close()
        await pool.close()
