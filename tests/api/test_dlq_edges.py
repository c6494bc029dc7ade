"""The DLQ routes at their edges: where a page ends, the largest entry id, whose dedup marks a
replay names, and a delete that finds its entry gone."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from notifkit.keys import Keys
from notifkit.services.api.routes import dlq as dlq_routes
from notifkit.streams import decode, encode, xadd
from tests.api.conftest import ADMIN, Api
from tests.support.streams import xrange


def record(keys: Keys, project: str, **fields: Any) -> dict[str, Any]:
    stream = keys.enriched("normal")
    return {"stream": stream, "group": "notifkit:group:engine", "entryId": "1-0",
            "service": "engine", "payload": {"projectId": project, "eventId": "e0"},
            "error": "RuntimeError: boom", "attempts": 3, "failedAt": "2030-01-01T00:00:00Z",
            "projectId": project, **fields}


async def test_a_page_holding_the_last_of_the_callers_entries_has_no_next_cursor(
    api: Api, redis: Redis, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A page filled by the end of one scanned chunk looks on for one more of the caller's
    entries: other projects' entries after it do not earn the caller an empty next page."""
    monkeypatch.setattr(dlq_routes, "SCAN_CHUNK", 2)
    keys = Keys(api.settings.namespace)
    a, b = await api.project("a"), await api.project("b")
    mine = [await xadd(redis, keys.dlq, record(keys, a.id), 1000) for _ in range(2)]
    for _ in range(2):
        await xadd(redis, keys.dlq, record(keys, b.id), 1000)

    page = await api.call("GET", "/v1/dlq", key=a.full, params={"limit": "2"})
    assert page.status == 200, page.body
    assert [i["id"] for i in page.body["items"]] == mine
    assert page.body["nextCursor"] is None


async def test_an_entry_at_the_largest_id_redis_takes_is_found(api: Api, redis: Redis) -> None:
    keys = Keys(api.settings.namespace)
    a = await api.project("a")
    largest = f"{2**64 - 1}-{2**64 - 1}"
    await redis.xadd(keys.dlq, encode(record(keys, a.id)), id=largest)
    found = await api.call("GET", f"/v1/dlq/{largest}", key=a.full)
    assert found.status == 200, found.body
    assert found.body["id"] == largest
    past = f"{2**64}-0"
    assert (await api.call("GET", f"/v1/dlq/{past}", key=a.full)).status == 404


async def test_a_replay_of_a_replay_names_the_first_entry_as_the_owner_of_its_marks(
    api: Api, redis: Redis,
) -> None:
    """The entry a replayed one failed again from holds the dedup marks of the first: the
    second replay names that first entry, not the one it came back as."""
    keys = Keys(api.settings.namespace)
    a = await api.project("a")
    stream = keys.enriched("normal")
    first = f"{stream}/5-0"
    entry_id = await xadd(redis, keys.dlq, record(keys, a.id, entryId="9-0", replayOf=first),
                          1000)
    reply = await api.call("POST", f"/v1/dlq/{entry_id}/replay", key=a.full)
    assert reply.status == 202, reply.body
    assert reply.body["replayOf"] == first
    [(_id, fields)] = await xrange(redis, stream)
    assert decode(fields)["_replayOf"] == first


async def test_a_record_naming_no_owner_is_replayed_as_the_entry_it_failed_as(
    api: Api, redis: Redis,
) -> None:
    """Without ``replayOf`` the marks are the failed entry's own: its id on its origin stream
    (``entryId``), not the record's id in the DLQ."""
    keys = Keys(api.settings.namespace)
    a = await api.project("a")
    stream = keys.enriched("normal")
    entry_id = await xadd(redis, keys.dlq, record(keys, a.id, entryId="7-0"), 1000)
    reply = await api.call("POST", f"/v1/dlq/{entry_id}/replay", key=a.full)
    assert reply.status == 202, reply.body
    assert reply.body["replayOf"] == f"{stream}/7-0"
    [(_id, fields)] = await xrange(redis, stream)
    assert decode(fields)["_replayOf"] == f"{stream}/7-0"


async def test_a_delete_that_finds_its_entry_gone_meanwhile_is_a_404(
    api: Api, redis: Redis, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two deletes (or a delete and a replay) of one entry: the one that did not remove it
    says so rather than answering 204 for what another request did."""
    keys = Keys(api.settings.namespace)
    entry_id = await xadd(redis, keys.dlq, record(keys, (await api.project("a")).id), 1000)
    real = dlq_routes.read_entry

    async def read_then_lose_it(client: Redis, dlq: str, wanted: str) -> Any:
        found = await real(client, dlq, wanted)
        await redis.xdel(dlq, wanted)  # another request's delete, between the read and ours
        return found

    monkeypatch.setattr(dlq_routes, "read_entry", read_then_lose_it)
    reply = await api.call("DELETE", f"/v1/dlq/{entry_id}", key=ADMIN)
    assert reply.status == 404, reply.body
    assert reply.body["error"]["code"] == "dlq_entry_not_found"
