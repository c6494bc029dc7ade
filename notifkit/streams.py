"""Stream plumbing: one JSON field per entry, trimmed XADDs, idempotent group creation.

Every entry is ``{"data": <json object>}``. Anything else on a stream is malformed. A
dead-letter entry also carries its record's main parts as fields of their own, for people
reading the DLQ with ``XRANGE``; ``data`` stays the whole record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import ResponseError

from notifkit import codec
from notifkit.errors import MalformedPayload
from notifkit.redis_pipe import Pipe

DATA_FIELD = b"data"


def encode(payload: Mapping[str, Any]) -> dict[Any, Any]:
    return {DATA_FIELD: codec.dumps(payload)}


# The parts of a dead-letter record an operator looks for first, as stream fields.
DLQ_FIELDS = ("stream", "group", "entryId", "payload", "error", "attempts", "failedAt")


def dlq_fields(record: Mapping[str, Any]) -> list[Any]:
    """Field/value pairs of a dead-letter entry: ``data`` first, then :data:`DLQ_FIELDS`."""
    fields: list[Any] = [DATA_FIELD, codec.dumps(record)]
    for name in DLQ_FIELDS:
        value = record.get(name)
        if value is None:
            continue
        fields += [name, value if isinstance(value, str | int) else codec.dumps(value)]
    return fields


def decode(fields: Mapping[bytes, bytes] | None) -> dict[str, Any]:
    """The payload of a stream entry; :class:`MalformedPayload` if it will never parse."""
    if not fields or DATA_FIELD not in fields:
        raise MalformedPayload("entry has no 'data' field")
    try:
        payload = codec.loads(fields[DATA_FIELD])
    except (ValueError, TypeError) as exc:
        raise MalformedPayload(f"'data' is not JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise MalformedPayload("'data' is not a JSON object")
    return payload


async def xadd(redis: Redis, stream: str, payload: Mapping[str, Any], maxlen: int) -> str:
    entry_id = await redis.xadd(stream, encode(payload), maxlen=maxlen, approximate=True)
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


def queue_xadd(pipe: Pipeline | Pipe, stream: str, payload: Mapping[str, Any], maxlen: int) -> None:
    pipe.xadd(stream, encode(payload), maxlen=maxlen, approximate=True)


# XADD an entry and SET a key in one step: the API stores a caller's idempotency record with
# the entry it answers for, so a process that dies in between cannot leave one without the
# other.
XADD_AND_SET = """
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', ARGV[2], ARGV[3])
redis.call('SET', KEYS[2], ARGV[4], 'EX', ARGV[5])
return id
"""


def xadd_and_set_args(stream: str, payload: Mapping[str, Any], maxlen: int, key: str,
                      value: bytes, ttl_s: int) -> list[Any]:
    """The EVAL arguments of :data:`XADD_AND_SET` (after the script)."""
    return [2, stream, key, maxlen, DATA_FIELD, codec.dumps(payload), value, max(1, ttl_s)]


async def xadd_and_set(redis: Redis, stream: str, payload: Mapping[str, Any], maxlen: int,
                       key: str, value: bytes, ttl_s: int) -> str:
    entry_id = await redis.eval(  # type: ignore[misc]
        XADD_AND_SET, *xadd_and_set_args(stream, payload, maxlen, key, value, ttl_s))
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


async def ensure_group(redis: Redis, stream: str, group: str) -> None:
    """Create ``group`` on ``stream`` (and the stream) reading from the start; idempotent.

    Starting at ``0`` rather than ``$`` means entries written before the first consumer of a
    service started are still delivered to it.
    """
    try:
        await redis.xgroup_create(stream, group, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


# Entries read per XRANGE call while searching a stream.
SEARCH_PAGE = 1000


@dataclass(frozen=True, slots=True)
class StreamSearch:
    """What :func:`find_notifications` saw: the event ids it found, and whether the stream
    still holds every entry added since the time it searched from (nothing trimmed or deleted
    there), without which an id it did not find may have been there once."""

    found: frozenset[str]
    complete: bool


async def find_notifications(redis: Redis, stream: str, since_ms: int,
                             wanted: Mapping[str, str]) -> StreamSearch:
    """Search ``stream``'s entries added at or after ``since_ms`` (Redis's clock: stream ids
    are times) for the notifications ``wanted`` (event id -> project id): an entry counts
    only if it names both. Reads pages until every one is found or the stream ends, so it is
    for rare checks, not the hot path. A stream that does not exist holds nothing, and lost
    nothing that can come back."""
    start = f"{since_ms}-0"
    try:
        info = await redis.xinfo_stream(stream)
    except ResponseError as exc:
        if "no such key" not in str(exc).lower():
            raise
        return StreamSearch(frozenset(), True)
    complete = _kept_since(info, start)
    found: set[str] = set()
    while len(found) < len(wanted):
        page = cast(list[tuple[bytes, dict[bytes, bytes]]],
                    await redis.xrange(stream, min=start, max="+", count=SEARCH_PAGE))
        for _entry_id, fields in page:
            try:
                payload = decode(fields)
            except MalformedPayload:
                continue
            event_id = payload.get("eventId")
            if isinstance(event_id, str) and wanted.get(event_id) == payload.get("projectId"):
                found.add(event_id)
        if len(page) < SEARCH_PAGE:
            break
        start = "(" + as_str(page[-1][0])
    return StreamSearch(frozenset(found), complete)


def _kept_since(info: Mapping[Any, Any], start: str) -> bool:
    """Whether the stream still holds every entry added at or after ``start``: nothing later
    was deleted (``max-deleted-entry-id``, Redis 7, which counts XDEL but not trimming), and
    nothing was ever removed (``entries-added``, Redis 7) or its oldest entry is no later
    (trimming removes from the oldest)."""
    deleted = info.get("max-deleted-entry-id")
    if deleted is not None and _id_key(as_str(deleted)) >= _id_key(start):
        return False
    added = info.get("entries-added")
    if added is not None and int(added) == int(info.get("length") or 0):
        return True
    first = info.get("first-entry")
    if first is None:  # emptied: complete only if nothing was added since start
        return _id_key(as_str(info.get("last-generated-id") or b"0-0")) < _id_key(start)
    return _id_key(as_str(first[0])) <= _id_key(start)


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def as_str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
