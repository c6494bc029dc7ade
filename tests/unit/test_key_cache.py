"""The API key cache remembers unknown keys briefly: a client retrying a revoked or mistyped key
in a loop must not cost a PostgreSQL query per request (the revoked-key behaviour itself, 401
at once in every process, is tested against real services in tests/api)."""

from __future__ import annotations

from typing import Any

from notifkit.services.api.auth import MAX_UNKNOWN_KEYS, PROJECT_CHECK_INTERVAL_S, KeyCache


class CountingPool:
    """Answers the key query from a dict, counting the queries."""

    def __init__(self, known: dict[str, dict[str, Any]]) -> None:
        self.known = known
        self.queries = 0

    async def fetchrow(self, _sql: str, key_hash: str) -> dict[str, Any] | None:
        self.queries += 1
        return self.known.get(key_hash)

    async def fetchval(self, _sql: str, project_id: str) -> int | None:
        """The project query: a project exists while one of its keys does."""
        self.queries += 1
        return 1 if any(k["project_id"] == project_id for k in self.known.values()) else None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_an_unknown_key_is_refused_from_memory_until_its_interval_ends() -> None:
    # Given a cache over a database that knows no key
    pool, clock = CountingPool({}), Clock()
    cache = KeyCache(pool, unknown_ttl_s=5.0, clock=clock)  # type: ignore[arg-type]

    # When the same unknown key is presented again and again within the interval
    answers = [await cache.lookup("h1") for _ in range(50)]

    # Then it is refused every time after one query
    assert answers == [None] * 50
    assert pool.queries == 1
    # and asked about again once the interval is over
    clock.now += 5.1
    assert await cache.lookup("h1") is None
    assert pool.queries == 2


async def test_known_keys_are_unaffected_and_the_memory_of_unknown_ones_is_bounded() -> None:
    pool, clock = CountingPool({"good": {"id": 1, "project_id": "p", "role": "full"}}), Clock()
    cache = KeyCache(pool, clock=clock)  # type: ignore[arg-type]
    record = await cache.lookup("good")
    assert record is not None
    assert (record.project_id, record.role) == ("p", "full")

    # A flood of distinct random keys never holds more than MAX_UNKNOWN_KEYS in memory.
    for n in range(MAX_UNKNOWN_KEYS + 10):
        await cache.lookup(f"random-{n}")
    assert len(cache._unknown) <= MAX_UNKNOWN_KEYS
    assert await cache.lookup("good") is not None


async def test_a_project_is_checked_once_a_second_not_at_every_request() -> None:
    """POST /v1/events asks whether the key's project still exists (it writes nothing to
    PostgreSQL that would fail if not): once per interval, and not at all right after the
    key itself was read, since deleting a project deletes its keys."""
    pool, clock = CountingPool({"good": {"id": 1, "project_id": "p", "role": "full"}}), Clock()
    cache = KeyCache(pool, clock=clock)  # type: ignore[arg-type]
    await cache.lookup("good")
    assert pool.queries == 1

    assert [await cache.project_exists("p") for _ in range(50)] == [True] * 50
    assert pool.queries == 1
    clock.now += PROJECT_CHECK_INTERVAL_S
    assert await cache.project_exists("p")
    assert pool.queries == 2

    pool.known.clear()  # the project deleted, and its keys with it
    assert [await cache.project_exists("p") for _ in range(3)] == [True] * 3
    clock.now += PROJECT_CHECK_INTERVAL_S
    assert [await cache.project_exists("p") for _ in range(3)] == [False] * 3
    assert pool.queries == 5  # a project found gone is asked about again, never remembered
