"""What a batch processor is handed (:class:`Entry`), and what the DLQ and the
``notification:failed`` event say about an entry that could not be processed."""

from __future__ import annotations

import contextvars
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from notifkit.messages import CHANNELS

# The stream of the batch being processed in the current task (None outside batches).
batch_stream: contextvars.ContextVar[str | None] = contextvars.ContextVar("batch_stream",
                                                                         default=None)

@dataclass(slots=True, eq=False)
class Entry:
    """One stream entry handed to a processor.

    A processor marks a failure with :meth:`fail` (or by raising, which fails the whole
    batch) and queues outputs with :meth:`emit`; outputs of failed entries are discarded.
    """

    stream: str
    id: str
    payload: dict[str, Any]
    attempt: int
    reclaimed: bool = False
    taken_at: float = field(default_factory=time.monotonic)  # when this worker took it
    error: BaseException | None = None
    emits: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    marks: list[str] = field(default_factory=list)
    # The dedup mark the worker claimed while counting the attempt (see ClaimKey): its name,
    # and whether this entry may proceed. None = the stage claims its marks itself.
    claimed: tuple[str, bool] | None = None
    # Its last allowed attempt was taken by a process that died before finishing it: the
    # stage (one that settles such entries, see StreamWorker) may only finish it from what
    # that attempt recorded, never try again; ``attempt`` counts the attempts made.
    exhausted: bool = False
    # The stage did something in this attempt that cannot be taken back (called a provider,
    # paid for a model's answer): set before it does, so an attempt that then fails counts
    # even when PostgreSQL was away (see notifkit/worker/outage.py).
    irreversible: bool = False

    @property
    def owner(self) -> str:
        """Who holds this entry's dedup marks. Stable across reclaims and DLQ replays."""
        replay_of = self.payload.get("_replayOf")
        return replay_of if isinstance(replay_of, str) else f"{self.stream}/{self.id}"

    def emit(self, stream: str, payload: Mapping[str, Any]) -> None:
        self.emits.append((stream, dict(payload)))

    def fail(self, error: BaseException) -> None:
        self.error = error


BatchProcessor = Callable[[list[Entry]], Awaitable[None]]
# The dedup mark a stage will claim for an entry, from its stream and payload: the mark's full
# key and its TTL in seconds, or None (a payload the stage will refuse, or one it claims for
# itself). The worker claims it in the round trip that counts the attempt.
ClaimKey = Callable[[str, dict[str, Any]], tuple[str, int] | None]

def dlq_record(entry: Entry, service: str, group: str, failed_at: str) -> dict[str, Any]:
    """The DLQ's record of an entry given up on (see notifkit/services/api/routes/dlq.py)."""
    return {
        "stream": entry.stream,
        "group": group,
        "entryId": entry.id,
        "service": service,
        "payload": entry.payload,
        "error": describe_error(entry.error),
        "attempts": attempts_made(entry),
        "failedAt": failed_at,
        "projectId": entry.payload.get("projectId"),
        "replayOf": entry.owner,
    }


def failed_event(entry: Entry, record: Mapping[str, Any]) -> dict[str, Any]:
    p = entry.payload
    task = held_task(p)
    return {
        "type": "notification:failed",
        "projectId": p.get("projectId"),
        "eventId": task.get("eventId"),
        "taskId": p.get("taskId") or task.get("taskId"),
        "userId": payload_user(task),
        "channel": task.get("channel"),
        "campaignId": task.get("campaignId"),
        # A workflow trigger or wake names its instance (a timer's wake as "{id}:{tag}"):
        # the instance is marked failed, rather than left looking in progress for good.
        "instanceId": workflow_instance(p),
        "stream": entry.stream,
        "entryId": entry.id,
        "error": record["error"],
        "attempts": record["attempts"],
        # The timeline's number for the last attempt: after those of the rounds before a DLQ
        # replay, as delivery numbers its own rows, so a replay that fails again shows.
        "attempt": attempts_before(p) + record["attempts"],
        "at": record["failedAt"],
    }


def held_task(payload: Mapping[str, Any]) -> Mapping[str, Any]:
    """The work a stage's payload is about: a scheduler entry holds the task it moves later
    under ``payload`` (its failure is that task's, on that task's timeline); any other entry
    is its own."""
    held = payload.get("payload")
    return held if isinstance(held, dict) and "eventId" not in payload else payload


def workflow_instance(payload: Mapping[str, Any]) -> str | None:
    """The workflow instance a ``workflow:inbound`` trigger or wake is for, else None."""
    if payload.get("type") not in ("trigger", "wake"):
        return None
    instance = payload.get("instanceId")
    if isinstance(instance, str) and instance:
        return instance
    timer = payload.get("timer")
    if isinstance(timer, str) and timer:
        return timer.split(":", 1)[0]
    return None


def payload_user(payload: Mapping[str, Any]) -> str | None:
    """The recipient a stage's payload is about: a task's ``userId``, or an enriched
    message's ``user.id`` (work that has no task yet, but already one recipient)."""
    user = payload.get("userId")
    if isinstance(user, str):
        return user
    nested = payload.get("user")
    if isinstance(nested, Mapping) and isinstance(nested.get("id"), str):
        return str(nested["id"])
    return None


# Set by a DLQ replay: the attempts the work had before it was replayed. The replay's own
# attempts count afresh against the limit; this only numbers them after the earlier ones.
REPLAYED_ATTEMPTS = "_replayedAttempts"


def attempts_before(payload: Mapping[str, Any]) -> int:
    """Attempts made before the last DLQ replay of this work (0 if never replayed)."""
    value = payload.get(REPLAYED_ATTEMPTS)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def attempts_made(entry: Entry) -> int:
    """The attempts the work has had: this entry's, plus those of the earlier entries it was
    parked from (``priorAttempts``, carried by delivery and AI tasks across a 429), so the DLQ
    says 3 for a task refused three times, not 1 for its last entry."""
    prior = entry.payload.get("priorAttempts")
    if isinstance(prior, int) and not isinstance(prior, bool) and prior > 0:
        return prior + entry.attempt
    return entry.attempt


def channel_label(entry: Entry) -> str:
    """The entry's channel for the metrics' ``channel`` label ("" when it names none)."""
    channel = entry.payload.get("channel")
    return channel if channel in CHANNELS else ""


def describe_error(error: BaseException | None) -> str:
    if error is None:
        return "unknown error"
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def log_fields(service: str, entry: Entry) -> dict[str, Any]:
    p = entry.payload
    fields: dict[str, Any] = {"service": service, "stream": entry.stream, "entry_id": entry.id}
    for key, name in (("eventId", "event_id"), ("taskId", "task_id"), ("projectId", "project_id")):
        if p.get(key):
            fields[name] = p[key]
    # Which channel failed is the first thing an operator filters a failure by.
    channel = channel_label(entry)
    if channel:
        fields["channel"] = channel
    return fields


# How many of a batch's entries a line about the whole batch names.
BATCH_IDS_LOGGED = 20


def batch_fields(service: str, entries: Sequence[Entry]) -> dict[str, Any]:
    """What a line about a whole batch carries: its stream and the first entries' ids, and
    their notifications' event ids, so an operator can follow one notification to it."""
    named = entries[:BATCH_IDS_LOGGED]
    fields: dict[str, Any] = {"service": service, "stream": entries[0].stream,
                              "entry_ids": [e.id for e in named]}
    events = [e.payload.get("eventId") for e in named]
    if any(isinstance(event, str) and event for event in events):
        fields["event_ids"] = [event for event in events if isinstance(event, str) and event]
    return fields
