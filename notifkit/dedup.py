"""Deduplication (CONTRACT §4): pure key functions and provisional marks.

A mark ``notif:processed:{stage}:{key}`` holds the *owner* of the claim: the stream entry
that made it (``Entry.owner``, stable across reclaims and DLQ replays). So:

- a different entry with the same key finds the mark and is a duplicate;
- a reclaimed retry of the same entry finds its own mark and proceeds, even when a crash left
  the mark behind;
- when an attempt fails the worker releases the entry's marks (compare-and-delete), so the
  retry is never swallowed.

Claiming is one ``SET key owner NX GET EX ttl`` per key, pipelined for a whole batch. A stage
whose key comes from the entry's payload alone (enricher, delivery) lets the worker claim it in
the round trip that counts the attempt (``StreamWorker(claim_key=...)``); ``claim_many`` then
reuses that answer instead of asking again.
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio import Redis

from notifkit.keys import Keys
from notifkit.redis_pipe import pipe
from notifkit.streams import as_str
from notifkit.worker import Entry
from notifkit.worker.scripts import RELEASE_MARKS

STAGES = ("enricher", "engine", "ai", "delivery")


# -- pure key functions ---------------------------------------------------------------
# The contract's formats, joined with ":" as they stand. They stay unambiguous because of what
# each part is: project, event and task ids are UUIDs (no ":"), a channel is one of a fixed few
# words, so only the recipient id or a caller's idempotency key, which may hold anything, sits
# where the rest of the key still tells where it ends.


def enricher_key(project_id: str, *, idempotency_key: str | None, event_id: str) -> str:
    """``projectId:idempotencyKey``, else ``projectId:eventId``."""
    return f"{project_id}:{idempotency_key or event_id}"


def enricher_page_key(notification_key: str, after: str) -> str:
    """A segment continuation: its notification's key and the page's cursor. It starts with
    ``page:``, which no notification key (a project id first) does. The key's length goes
    first because a caller's key and a user id may both hold ``:``: joined bare, key
    ``batch`` after ``de:u1`` and key ``batch:de`` after ``u1`` were one mark, and the later
    notification's page was dropped as a duplicate."""
    return f"page:{len(notification_key)}:{notification_key}:{after}"


def engine_key(raw_event_id: str, recipient_id: str, channel: str) -> str:
    return f"{raw_event_id}:{recipient_id}:{channel}"


def ai_key(enriched_event_id: str, recipient_id: str, channel: str) -> str:
    return f"{enriched_event_id}:{recipient_id}:{channel}:ai"


def delivery_key(task_id: str) -> str:
    return task_id


class Dedup:
    """Provisional dedup marks for one stage."""

    def __init__(self, redis: Redis, keys: Keys, stage: str, ttl_s: int) -> None:
        if stage not in STAGES:
            raise ValueError(f"unknown dedup stage {stage!r}")
        self.redis = redis
        self.keys = keys
        self.stage = stage
        self.ttl_s = ttl_s

    async def claim(self, entry: Entry, key: str, ttl_s: int | None = None) -> bool:
        return (await self.claim_many([(entry, key, ttl_s)]))[0]

    async def claim_many(
        self, claims: Sequence[tuple[Entry, str, int | None]]
    ) -> list[bool]:
        """True where the entry may proceed (fresh mark or its own), False for duplicates.

        Claimed keys are recorded on the entry so the worker releases them if it fails.
        """
        if not claims:
            return []
        allowed: list[bool | None] = []
        asked: list[tuple[Entry, str]] = []
        marks = pipe(self.redis)
        for entry, key, ttl_s in claims:
            name = self.keys.processed(self.stage, key)
            if entry.claimed is not None and entry.claimed[0] == name:
                allowed.append(entry.claimed[1])  # the worker claimed it with the count
                continue
            allowed.append(None)
            asked.append((entry, name))
            marks.set(name, entry.owner, ex=max(1, int(ttl_s or self.ttl_s)), nx=True,
                      get=True)
        answers = zip(asked, await marks.execute() if asked else [], strict=True)
        for index, ok in enumerate(allowed):
            if ok is not None:
                continue
            (entry, name), before = next(answers)
            mine = before is None or as_str(before) == entry.owner
            if mine:
                entry.marks.append(name)
            allowed[index] = mine
        return [bool(ok) for ok in allowed]

    def mark_of(self, key: str, ttl_s: int | None = None) -> tuple[str, int]:
        """The mark :meth:`claim_many` would claim for ``key``, for a worker's ClaimKey."""
        return self.keys.processed(self.stage, key), max(1, int(ttl_s or self.ttl_s))

    async def release(self, entry: Entry) -> None:
        """Drop the entry's marks now (only those it still owns). For an entry that succeeds
        but hands its work back under the same key, e.g. a task parked until a provider's
        Retry-After, which must not be taken for its own duplicate when it returns."""
        if entry.marks:
            # The worker's own compare-and-delete: one script for a failed entry and this.
            await self.redis.eval(RELEASE_MARKS, len(entry.marks), *entry.marks, entry.owner)
            entry.marks.clear()

    async def extend(self, key: str, ttl_s: int) -> None:
        """Keep a mark at least ``ttl_s`` (a scheduled send must stay deduplicated until it
        has gone out)."""
        name = self.keys.processed(self.stage, key)
        current = await self.redis.ttl(name)
        if current is not None and 0 <= current < ttl_s:
            await self.redis.expire(name, ttl_s)


