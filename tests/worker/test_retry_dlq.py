"""Retries through the reclaim sweep, and the dead-letter queue (CONTRACT §3.3–3.5)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

import pytest
from prometheus_client import REGISTRY
from redis.asyncio import Redis

from notifkit.errors import PermanentFailure
from notifkit.keys import Keys
from notifkit.streams import encode
from notifkit.worker import Entry
from tests.support.streams import xrange

if TYPE_CHECKING:
    from .conftest import Add, Payloads, Pending, WorkerFactory


class AlwaysFails:
    """A processor that fails every entry and counts its calls per entry id."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.calls: dict[str, int] = {}
        self.attempts_seen: list[int] = []

    async def __call__(self, batch: list[Entry]) -> None:
        for entry in batch:
            self.calls[entry.id] = self.calls.get(entry.id, 0) + 1
            self.attempts_seen.append(entry.attempt)
        raise self.error


@pytest.mark.parametrize(("service", "limit"), [("engine", 3), ("delivery", 3), ("enricher", 5)])
async def test_a_failing_entry_is_retried_by_the_sweep_then_dead_lettered(
    make_worker: WorkerFactory, redis: Redis, keys: Keys, add: Add, pending: Pending,
    payloads: Payloads, service: str, limit: int,
) -> None:
    # Given a handler that always raises, and entries reclaimable as soon as they fail
    stream = keys.enriched("normal")
    processor = AlwaysFails(RuntimeError("provider exploded"))
    worker = make_worker(processor, service=service)
    payload = {"projectId": "p1", "eventId": "ev-1", "taskId": "t-1", "userId": "u-1",
               "channel": "email", "n": 1}
    entry_id = await add(stream, payload)

    # When the worker drains the stream (first read, then reclaim sweeps)
    await worker.run_until_idle()

    # Then it was attempted exactly `limit` times, counting 1..limit, then dead-lettered
    assert processor.calls == {entry_id: limit}
    assert processor.attempts_seen == list(range(1, limit + 1))
    assert worker.stats.failed == limit
    assert worker.stats.dead_lettered == 1
    assert worker.stats.reclaimed == limit - 1

    [dead] = await payloads(keys.dlq)
    assert dead["stream"] == stream
    assert dead["group"] == f"notifkit:group:{service}"
    assert dead["entryId"] == entry_id
    assert dead["payload"] == payload
    assert dead["error"] == "RuntimeError: provider exploded"
    assert dead["attempts"] == limit
    assert datetime.fromisoformat(dead["failedAt"].replace("Z", "+00:00")).tzinfo is not None

    # And a notification:failed event carries the notification's ids
    [failed] = await payloads(keys.events_inbound)
    assert failed["type"] == "notification:failed"
    assert {k: failed[k] for k in ("projectId", "eventId", "taskId", "userId", "channel")} == {
        "projectId": "p1", "eventId": "ev-1", "taskId": "t-1", "userId": "u-1",
        "channel": "email",
    }
    assert failed["entryId"] == entry_id

    # And whoever reads the DLQ with XRANGE finds the record's main parts as fields too
    [(_id, fields)] = await xrange(redis, keys.dlq)
    assert {k.decode(): v.decode() for k, v in fields.items() if k != b"data"} == {
        "stream": stream, "group": f"notifkit:group:{service}", "entryId": entry_id,
        "payload": encode(payload)[b"data"].decode(), "error": "RuntimeError: provider exploded",
        "attempts": str(limit), "failedAt": dead["failedAt"],
    }
    assert failed["attempts"] == limit

    # And the original is acked and its attempt counter is gone
    assert await pending(stream, worker.group) == 0
    assert await redis.exists(keys.attempts(worker.group, entry_id, stream)) == 0

    # And a further drain finds nothing to do
    assert await worker.run_until_idle() == 0
    assert processor.calls == {entry_id: limit}


async def test_a_permanent_failure_is_dead_lettered_after_one_attempt(
    make_worker: WorkerFactory, redis: Redis, keys: Keys, add: Add, pending: Pending,
    payloads: Payloads,
) -> None:
    stream = keys.enriched("normal")
    processor = AlwaysFails(PermanentFailure("unsupported model"))
    worker = make_worker(processor)
    entry_id = await add(stream, {"eventId": "ev-2"})

    await worker.run_until_idle()

    assert processor.calls == {entry_id: 1}
    [dead] = await payloads(keys.dlq)
    assert dead["attempts"] == 1
    assert dead["error"] == "PermanentFailure: unsupported model"
    [failed] = await payloads(keys.events_inbound)
    assert failed["type"] == "notification:failed"
    assert failed["eventId"] == "ev-2"
    assert await pending(stream, worker.group) == 0
    assert await redis.exists(keys.attempts(worker.group, entry_id, stream)) == 0


async def test_an_event_the_events_service_cannot_record_is_dead_lettered_without_another(
    make_worker: WorkerFactory, keys: Keys, add: Add, payloads: Payloads,
) -> None:
    """A notification:failed for it would go to the very service that failed: it would be
    dead-lettered in turn, and emit another, without end."""
    processor = AlwaysFails(PermanentFailure("refused"))
    worker = make_worker(processor, service="events", streams=[keys.events_inbound])
    event = {"type": "notification:failed", "projectId": "p1", "eventId": "ev-3"}
    entry_id = await add(keys.events_inbound, event)

    await worker.run_until_idle()

    [dead] = await payloads(keys.dlq)
    assert (dead["entryId"], dead["payload"]) == (entry_id, event)
    assert await payloads(keys.events_inbound) == [event]  # the original alone, acked


async def test_the_failed_event_numbers_a_replays_last_attempt_after_the_earlier_ones(
    make_worker: WorkerFactory, keys: Keys, add: Add, payloads: Payloads,
) -> None:
    # Given an entry replayed from the DLQ after 3 attempts, failing for good again
    processor = AlwaysFails(PermanentFailure("still broken"))
    worker = make_worker(processor)
    await add(keys.enriched("normal"), {"eventId": "ev-r", "_replayedAttempts": 3})

    await worker.run_until_idle()

    # Then the record counts this round's attempt, and the event numbers it for the timeline
    [dead] = await payloads(keys.dlq)
    assert dead["attempts"] == 1
    [failed] = await payloads(keys.events_inbound)
    assert (failed["attempts"], failed["attempt"]) == (1, 4)


async def test_the_dlq_counts_the_attempts_an_entry_carries_from_its_parked_predecessors(
    make_worker: WorkerFactory, keys: Keys, add: Add, payloads: Payloads,
) -> None:
    # Given a task parked twice already (each park an attempt), failing for good on this entry
    processor = AlwaysFails(PermanentFailure("still rate limited"))
    worker = make_worker(processor, service="delivery")
    await add(keys.enriched("normal"), {"eventId": "ev-3", "priorAttempts": 2})

    await worker.run_until_idle()

    # Then the record and the event say three attempts, as the task had
    [dead] = await payloads(keys.dlq)
    assert dead["attempts"] == 3
    [failed] = await payloads(keys.events_inbound)
    assert failed["attempts"] == 3


async def test_a_parked_task_whose_last_attempt_never_finished_is_not_tried_a_fourth_time(
    make_worker: WorkerFactory, redis: Redis, keys: Keys, add: Add, pending: Pending,
    payloads: Payloads,
) -> None:
    # Given a task parked twice already (priorAttempts 2), so its entry's first attempt is
    # the task's third and last, and a process that died during that attempt: the entry is
    # pending for it with its attempt counted
    stream = keys.enriched("normal")
    processor = AlwaysFails(RuntimeError("must not be called"))
    worker = make_worker(processor, service="delivery")
    await worker.ensure_groups()
    entry_id = await add(stream, {"eventId": "ev-6", "taskId": "t-6", "priorAttempts": 2})
    await redis.xreadgroup(worker.group, "delivery-host-gone", {stream: ">"})
    await redis.incr(keys.attempts(worker.group, entry_id, stream))

    # When a surviving worker reclaims it
    await worker.run_until_idle()

    # Then it is dead-lettered without a fourth attempt (the provider saw three at most), and
    # the record says three attempts, the last unfinished
    assert processor.calls == {}
    [dead] = await payloads(keys.dlq)
    assert dead["attempts"] == 3
    assert "gave up after 3 attempts (last one never finished)" in dead["error"]
    [failed] = await payloads(keys.events_inbound)
    assert failed["attempts"] == 3
    assert await pending(stream, worker.group) == 0


async def test_a_stage_that_settles_exhausted_entries_gets_them_marked_not_retried(
    make_worker: WorkerFactory, redis: Redis, keys: Keys, add: Add, pending: Pending,
    payloads: Payloads,
) -> None:
    # Given a stage that can finish an entry from what its last attempt recorded, and an
    # entry whose last attempt died with its process
    stream = keys.enriched("normal")
    seen: list[tuple[int, bool]] = []

    async def settle(batch: list[Entry]) -> None:
        seen.extend((e.attempt, e.exhausted) for e in batch)

    worker = make_worker(settle, service="delivery", settles_exhausted=True)
    await worker.ensure_groups()
    entry_id = await add(stream, {"eventId": "ev-7", "taskId": "t-7"})
    await redis.xreadgroup(worker.group, "delivery-host-gone", {stream: ">"})
    await redis.set(keys.attempts(worker.group, entry_id, stream), 3)

    # When a surviving worker reclaims it
    await worker.run_until_idle()

    # Then the stage gets it once, marked exhausted with the three attempts made, settles
    # it, and nothing is dead-lettered
    assert seen == [(3, True)]
    assert await payloads(keys.dlq) == []
    assert await pending(stream, worker.group) == 0


async def test_failures_and_dead_letters_are_counted_by_service_and_channel(
    make_worker: WorkerFactory, keys: Keys, add: Add,
) -> None:
    # Given a permanent failure on an SMS task and on an entry that names no channel
    worker = make_worker(AlwaysFails(PermanentFailure("rejected")), service="delivery")
    stream = keys.enriched("normal")
    labels = {"service": "delivery", "stream": stream}

    def sample(name: str, channel: str) -> float:
        return REGISTRY.get_sample_value(name, {**labels, "channel": channel}) or 0.0

    before = {(n, c): sample(n, c) for n in ("notifkit_failed_total",
                                             "notifkit_dead_lettered_total")
              for c in ("sms", "")}
    await add(stream, {"eventId": "ev-4", "channel": "sms"})
    await add(stream, {"eventId": "ev-5"})

    await worker.run_until_idle()

    # Then the metrics say which channel each was on (CONTRACT: by service and channel)
    for (name, channel), value in before.items():
        assert sample(name, channel) == value + 1


async def test_one_failing_entry_does_not_fail_its_batch_neighbours(
    make_worker: WorkerFactory, keys: Keys, add: Add, pending: Pending, payloads: Payloads,
) -> None:
    # Given a batch in which the processor marks only one entry as failed
    stream = keys.enriched("normal")
    calls: dict[str, int] = {}

    async def process(batch: list[Entry]) -> None:
        for entry in batch:
            calls[entry.id] = calls.get(entry.id, 0) + 1
            if entry.payload["bad"]:
                entry.fail(RuntimeError("bad recipient"))

    worker = make_worker(process)
    good = [await add(stream, {"bad": False, "n": n}) for n in range(4)]
    bad = await add(stream, {"bad": True})

    await worker.run_until_idle()

    # Then the good entries were processed once, the bad one three times then dead-lettered
    assert calls == {**dict.fromkeys(good, 1), bad: 3}
    assert worker.stats.processed == 4
    assert [d["entryId"] for d in await payloads(keys.dlq)] == [bad]
    assert await pending(stream, worker.group) == 0


async def test_an_entry_that_makes_its_whole_batch_raise_is_retried_alone(
    make_worker: WorkerFactory, keys: Keys, add: Add, pending: Pending, payloads: Payloads,
) -> None:
    """A stage's batch-wide write (one INSERT for the batch's rows) fails for every entry
    when one entry's data is refused: each is then tried alone, so its neighbours go through
    and only the poison reaches the DLQ, where they were once dead-lettered beside it."""
    stream = keys.enriched("normal")
    committed: list[int] = []
    batches: list[int] = []

    async def process(batch: list[Entry]) -> None:
        batches.append(len(batch))
        for entry in batch:
            entry.emit(keys.outbound("normal"), {"n": entry.payload["n"]})
        if any(entry.payload["bad"] for entry in batch):
            raise ValueError("the batch's INSERT refused a row")
        committed.extend(entry.payload["n"] for entry in batch)

    worker = make_worker(process)
    for n in range(4):
        await add(stream, {"bad": n == 2, "n": n})

    await worker.run_until_idle()

    assert sorted(committed) == [0, 1, 3]
    assert worker.stats.processed == 3
    [dead] = await payloads(keys.dlq)
    assert dead["payload"]["n"] == 2
    assert dead["error"] == "ValueError: the batch's INSERT refused a row"
    assert dead["attempts"] == 3
    # The poison's outputs never left; each neighbour's left once.
    assert sorted(p["n"] for p in await payloads(keys.outbound("normal"))) == [0, 1, 3]
    assert await pending(stream, worker.group) == 0
    assert batches[0] == 4


async def test_a_batch_that_raises_for_want_of_a_store_is_not_split(
    make_worker: WorkerFactory, keys: Keys, add: Add, payloads: Payloads,
) -> None:
    """Trying each entry alone is for an entry's own bad data; an error that is about no entry
    (the stage's store refused a connection) would only fail once per entry."""
    stream = keys.enriched("normal")
    batches: list[int] = []

    async def process(batch: list[Entry]) -> None:
        batches.append(len(batch))
        raise ConnectionRefusedError("PostgreSQL refused the connection")

    worker = make_worker(process)
    for n in range(3):
        await add(stream, {"n": n})

    await worker.run_until_idle()

    assert batches == [3, 3, 3]
    assert len(await payloads(keys.dlq)) == 3


async def test_an_entry_whose_last_attempt_never_finished_is_dead_lettered_on_reclaim(
    make_worker: WorkerFactory, redis: Redis, keys: Keys, add: Add, pending: Pending,
    payloads: Payloads,
) -> None:
    # Given an entry whose counter says all 3 attempts were started (the last by a process
    # that died mid-attempt), and which is pending for that dead consumer
    stream = keys.enriched("normal")
    calls: list[str] = []

    async def process(batch: list[Entry]) -> None:
        calls.extend(e.id for e in batch)

    worker = make_worker(process)
    await worker.ensure_groups()
    entry_id = await add(stream, {"eventId": "ev-3"})
    await redis.xreadgroup(worker.group, "engine-gone-1", {stream: ">"}, count=1)
    await redis.set(keys.attempts(worker.group, entry_id, stream), 3)

    # When the sweep takes it over
    await worker.run_until_idle()

    # Then it is not attempted a fourth time but dead-lettered with 3 attempts
    assert calls == []
    [dead] = await payloads(keys.dlq)
    assert (dead["entryId"], dead["attempts"]) == (entry_id, 3)
    assert await pending(stream, worker.group) == 0
    assert await redis.exists(keys.attempts(worker.group, entry_id, stream)) == 0


async def test_entries_with_the_same_id_on_two_priority_streams_count_attempts_apart(
    make_worker: WorkerFactory, redis: Redis, keys: Keys, pending: Pending,
    payloads: Payloads,
) -> None:
    # Given two failing entries that happen to get the same id on the critical and normal
    # streams (ids are per stream: two XADDs in the same millisecond produce this)
    processor = AlwaysFails(RuntimeError("down"))
    worker = make_worker(processor)
    for priority in ("critical", "normal"):
        await redis.xadd(keys.enriched(priority), encode({"p": priority}), id="5-0")

    await worker.run_until_idle()

    # Then each has its own attempt counter: both get exactly three attempts
    assert processor.attempts_seen == [1, 1, 2, 2, 3, 3]
    dead = await payloads(keys.dlq)
    assert sorted((d["stream"], d["attempts"]) for d in dead) == [
        (keys.enriched("critical"), 3), (keys.enriched("normal"), 3)
    ]
    assert await pending(keys.enriched("critical"), worker.group) == 0
    assert await pending(keys.enriched("normal"), worker.group) == 0


async def test_a_failed_attempt_leaves_its_counter_with_the_contract_ttl(
    make_worker: WorkerFactory, redis: Redis, keys: Keys, add: Add,
) -> None:
    # Given two entries on two streams of one group, both failing their first attempt
    processor = AlwaysFails(RuntimeError("boom"))
    worker = make_worker(processor)
    normal, low = keys.enriched("normal"), keys.enriched("low")
    # (ids of their own: two XADDs in one millisecond may give both the same id)
    first, second = "1-0", "2-0"
    await redis.xadd(normal, encode({"n": 1}), id=first)
    await redis.xadd(low, encode({"n": 2}), id=second)
    await worker.run_until_idle(reclaim=False)  # one attempt each, nothing reclaimed

    # Then each counter is a plain INCR counter saying one attempt, expiring in 2 h: the
    # deciding one with the priority appended, and the contract's name beside it
    assert keys.attempts(worker.group, second, low).endswith(f"{second}:low")
    for stream, entry_id in ((normal, first), (low, second)):
        counters = keys.attempt_counters(worker.group, entry_id, stream)
        assert counters[1] == keys.attempts(worker.group, entry_id, keys.dlq)
        for key in counters:
            assert await redis.get(key) == b"1"
            assert 7000 < await redis.ttl(key) <= 7200


async def test_an_entry_of_every_priority_counts_under_the_contracts_name(
    make_worker: WorkerFactory, redis: Redis, keys: Keys, pending: Pending, namespace: str,
) -> None:
    # Given a failing entry on each priority stream of one group, each with an id of its own
    processor = AlwaysFails(RuntimeError("boom"))
    worker = make_worker(processor)
    ids = {p: f"{n}-0" for n, p in enumerate(("critical", "normal", "low"), start=1)}
    for priority, entry_id in ids.items():
        await redis.xadd(keys.enriched(priority), encode({"p": priority}), id=entry_id)
    await worker.run_until_idle(reclaim=False)  # one attempt each, nothing reclaimed

    # Then notif:attempts:{group}:{entryId}, exactly as CONTRACT §2 names it, counts each
    # one's attempt with the 2 h TTL, whatever its priority
    for entry_id in ids.values():
        key = f"{namespace}:notif:attempts:{worker.group}:{entry_id}"
        assert await redis.get(key) == b"1", key
        assert 7000 < await redis.ttl(key) <= 7200

    # And when they are dead-lettered (acked), no counter of theirs is left behind
    processor.error = PermanentFailure("rejected")
    await worker.run_until_idle()
    for priority in ids:
        assert await pending(keys.enriched(priority), worker.group) == 0
    assert [k async for k in redis.scan_iter(match=f"{namespace}:notif:attempts:*")] == []


async def test_a_failure_without_a_message_is_logged_by_its_type(
    make_worker: WorkerFactory, keys: Keys, add: Add, caplog: pytest.LogCaptureFixture,
) -> None:
    # Given an entry whose processing raises an exception with no text (a query timeout's)
    worker = make_worker(AlwaysFails(TimeoutError()), service="engine")
    await add(keys.enriched("normal"), {"projectId": "p1", "eventId": "ev-1", "n": 1})

    # When its attempts fail
    with caplog.at_level("WARNING", logger="notifkit.worker"):
        await worker.run_until_idle()

    # Then each warning names what failed, not an empty reason ("failed: .")
    warnings = [r.getMessage() for r in caplog.records
                if r.name == "notifkit.worker" and r.levelname == "WARNING"]
    assert warnings[0].startswith("Attempt 1 of 3 failed: TimeoutError."), warnings


async def test_each_failed_attempt_is_logged_and_the_dead_lettering_names_its_cause(
    make_worker: WorkerFactory, keys: Keys, add: Add, caplog: pytest.LogCaptureFixture,
) -> None:
    # Given an entry that fails every attempt
    processor = AlwaysFails(RuntimeError("provider exploded"))
    worker = make_worker(processor, service="engine")
    await add(keys.enriched("normal"), {"projectId": "p1", "eventId": "ev-1", "n": 1})

    # When it is retried until it is dead-lettered
    with caplog.at_level("WARNING", logger="notifkit.worker"):
        await worker.run_until_idle()

    # Then every attempt is one warning (the attempts really made, which the dlq_poison
    # scenario counts), and the dead-lettering's error record names the cause
    records = [(r.levelname, r.getMessage()) for r in caplog.records
               if r.name == "notifkit.worker"]
    assert [level for level, _ in records] == ["WARNING", "WARNING", "WARNING", "ERROR"]
    # (a RuntimeError is no failure a stage expects: a bug, named by its type as well)
    assert records[0][1].startswith("Attempt 1 of 3 failed: RuntimeError: provider exploded.")
    assert records[2][1].endswith("Dead-lettering it.")
    assert "after 3 attempts (RuntimeError: provider exploded)" in records[3][1]


async def test_the_dead_letter_log_line_names_the_dlq_entry_to_replay(
    make_worker: WorkerFactory, redis: Redis, keys: Keys, add: Add,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The line an operator is paged for says which DLQ entry to replay: the id that
    # POST /v1/dlq/{id}/replay takes, not only the origin stream's entry id.
    worker = make_worker(AlwaysFails(PermanentFailure("HTTP 401: bad key")), service="delivery",
                         streams=keys.outbound_all())
    entry_id = await add(keys.outbound("normal"), {"projectId": "p1", "eventId": "ev-1",
                                                   "taskId": "t-1", "channel": "sms"})
    with caplog.at_level("WARNING", logger="notifkit.worker"):
        await worker.run_until_idle()

    [(dlq_id, _fields)] = await xrange(redis, keys.dlq)
    [record] = [r for r in caplog.records if "dead-letter queue" in r.getMessage()]
    assert record.dlq_id == dlq_id.decode()  # type: ignore[attr-defined]
    assert record.entry_id == entry_id  # type: ignore[attr-defined]
    assert f"POST /v1/dlq/{dlq_id.decode()}/replay" in record.getMessage()
    # and which channel failed, as every line about the entry does
    assert record.channel == "sms"  # type: ignore[attr-defined]
    attempts = [r for r in caplog.records if r.getMessage().startswith("Attempt ")]
    assert attempts
    assert all(r.channel == "sms" for r in attempts)  # type: ignore[attr-defined]


async def test_the_reclaim_line_names_the_stream_and_entries_it_took(
    make_worker: WorkerFactory, keys: Keys, add: Add, caplog: pytest.LogCaptureFixture,
) -> None:
    # "Reclaimed 1 idle entries from <stream>." said neither which entries (to follow one
    # through the logs) nor the stream as a field a log query can select on. (The text
    # stays: the scenarios count these lines by it.)
    worker = make_worker(AlwaysFails(RuntimeError("provider exploded")), service="engine")
    entry_id = await add(keys.enriched("normal"), {"projectId": "p1", "eventId": "ev-1"})
    with caplog.at_level("INFO", logger="notifkit.worker"):
        await worker.run_until_idle()

    [first, *_] = [r for r in caplog.records if r.getMessage().startswith("Reclaimed")]
    assert first.getMessage() == f"Reclaimed 1 idle entries from {keys.enriched('normal')}."
    assert first.stream == keys.enriched("normal")  # type: ignore[attr-defined]
    assert first.entry_ids == [entry_id]  # type: ignore[attr-defined]


class Buggy:
    """A processor with a bug: a lookup that fails for every entry of the batch."""

    async def __call__(self, batch: list[Entry]) -> None:
        payload: dict[str, object] = {}
        payload["userId"]  # the bug


async def test_an_unexpected_error_is_logged_with_its_traceback_once_per_batch(
    make_worker: WorkerFactory, keys: Keys, add: Add, caplog: pytest.LogCaptureFixture,
) -> None:
    # A bug in a stage said only "Attempt 1 of 3 failed: 'userId'." for each entry: neither
    # the exception's type nor where it was raised, so nobody could find the line to fix.
    worker = make_worker(Buggy(), service="engine")
    for n in range(3):
        await add(keys.enriched("normal"), {"projectId": "p1", "eventId": f"ev-{n}"})
    with caplog.at_level("WARNING", logger="notifkit.worker"):
        await worker.run_until_idle()

    first = [r for r in caplog.records if r.getMessage().startswith("Attempt 1 of 3")]
    assert len(first) == 3
    with_traceback = [r for r in first if r.exc_info]
    assert len(with_traceback) == 1  # one per batch, not one per entry
    assert "KeyError" in caplog.text
    assert 'payload["userId"]' in caplog.text


async def test_a_bug_met_again_and_again_is_traced_once(
    make_worker: WorkerFactory, keys: Keys, add: Add, caplog: pytest.LogCaptureFixture,
) -> None:
    # Each attempt of each batch carried the same traceback again: a bug that fails all the
    # traffic wrote one per batch (hundreds a minute under load), and a poison entry one per
    # attempt. The first says where the bug is; the others name it by its text.
    worker = make_worker(Buggy(), service="engine")
    for n in range(3):
        await add(keys.enriched("normal"), {"projectId": "p1", "eventId": f"ev-{n}"})
    with caplog.at_level("WARNING", logger="notifkit.worker"):
        await worker.run_until_idle()
        await add(keys.enriched("normal"), {"projectId": "p1", "eventId": "ev-later"})
        await worker.run_until_idle()

    attempts = [r for r in caplog.records if r.getMessage().startswith("Attempt ")]
    assert len(attempts) == 4 * 3
    assert len([r for r in attempts if r.exc_info]) == 1
    assert all("KeyError" in r.getMessage() or r.exc_info for r in attempts)
    whole = [r.getMessage() for r in caplog.records if "failed as a whole" in r.getMessage()]
    assert whole
    assert all("KeyError: 'userId'" in message for message in whole), whole


async def test_a_line_about_a_whole_batch_names_its_entries_and_notifications(
    make_worker: WorkerFactory, keys: Keys, add: Add, caplog: pytest.LogCaptureFixture,
) -> None:
    # "A batch of 3 failed as a whole" named only the stream: which notifications it held
    # could not be found from the line, so nobody could follow one of them to it.
    worker = make_worker(Buggy(), service="engine")
    ids = [await add(keys.enriched("normal"), {"projectId": "p1", "eventId": f"ev-{n}"})
           for n in range(3)]
    with caplog.at_level("WARNING", logger="notifkit.worker"):
        await worker.run_until_idle()

    first = next(r for r in caplog.records if "failed as a whole" in r.getMessage())
    assert first.stream == keys.enriched("normal")  # type: ignore[attr-defined]
    assert first.entry_ids == ids  # type: ignore[attr-defined]
    assert first.event_ids == ["ev-0", "ev-1", "ev-2"]  # type: ignore[attr-defined]


async def test_an_expected_failure_carries_no_traceback(
    make_worker: WorkerFactory, keys: Keys, add: Add, caplog: pytest.LogCaptureFixture,
) -> None:
    # A provider's answer or a store that cannot serve is no bug: one line, as before.
    worker = make_worker(AlwaysFails(ConnectionRefusedError("refused")), service="engine")
    await add(keys.enriched("normal"), {"projectId": "p1", "eventId": "ev-1"})
    with caplog.at_level("WARNING", logger="notifkit.worker"):
        await worker.run_until_idle()
    assert not [r for r in caplog.records if r.exc_info]


async def test_an_entry_that_did_something_irreversible_is_not_tried_again_alone(
    make_worker: WorkerFactory, keys: Keys, add: Add, payloads: Payloads,
) -> None:
    """A batch that raises is tried entry by entry, but not an entry that already called its
    provider in the failed run: trying it again within the same attempt would send it twice.
    It fails this attempt and is retried (counted) by the sweep."""
    stream = keys.enriched("normal")
    provider_calls: list[tuple[str, int]] = []

    async def process(batch: list[Entry]) -> None:
        for entry in batch:
            if entry.payload["sends"]:
                entry.irreversible = True  # set before the provider is called
                provider_calls.append((entry.id, entry.attempt))
        if any(entry.payload["bad"] for entry in batch):
            raise ValueError("the batch's INSERT refused a row")

    worker = make_worker(process)
    sender = await add(stream, {"sends": True, "bad": False})
    await add(stream, {"sends": False, "bad": False})
    await add(stream, {"sends": False, "bad": True})

    await worker.run_until_idle()

    # One provider call per attempt of the sender, never two within one attempt
    assert provider_calls
    assert all(entry_id == sender for entry_id, _attempt in provider_calls)
    assert len(set(provider_calls)) == len(provider_calls)
    assert worker.stats.processed == 1  # the other neighbour, tried alone


async def test_a_replayed_entry_dead_lettered_again_names_the_first_entry_as_its_owner(
    make_worker: WorkerFactory, keys: Keys, add: Add, payloads: Payloads,
) -> None:
    """The DLQ record says who holds the work's dedup marks: for a replayed entry, the entry
    it replays (``_replayOf``), so a second replay still finds the marks its own."""
    stream = keys.enriched("normal")
    worker = make_worker(AlwaysFails(PermanentFailure("still broken")))
    first = f"{stream}/1-0"
    entry_id = await add(stream, {"eventId": "ev-r", "_replayOf": first})

    await worker.run_until_idle()

    [dead] = await payloads(keys.dlq)
    assert (dead["entryId"], dead["replayOf"]) == (entry_id, first)


async def test_counts_carried_as_booleans_are_no_attempts(
    make_worker: WorkerFactory, keys: Keys, add: Add, payloads: Payloads,
) -> None:
    """``priorAttempts`` and ``_replayedAttempts`` count only as whole numbers: ``true`` (which
    Python would add as 1) adds nothing to the attempts recorded or numbered."""
    worker = make_worker(AlwaysFails(PermanentFailure("still broken")), service="delivery")
    await add(keys.enriched("normal"),
              {"eventId": "ev-b", "priorAttempts": True, "_replayedAttempts": True})

    await worker.run_until_idle()

    [dead] = await payloads(keys.dlq)
    assert dead["attempts"] == 1
    [failed] = await payloads(keys.events_inbound)
    assert (failed["attempts"], failed["attempt"]) == (1, 1)


async def test_an_entry_failed_with_its_own_error_keeps_it_when_the_batch_then_raises(
    make_worker: WorkerFactory, keys: Keys, add: Add, payloads: Payloads,
) -> None:
    """A processor that failed one entry (``Entry.fail``) and then raised for the batch: that
    entry's own error stands (a permanent one dead-letters it at once) and it is not tried
    again alone; only its neighbours are."""
    stream = keys.enriched("normal")
    calls: dict[str, int] = {}

    async def process(batch: list[Entry]) -> None:
        for entry in batch:
            calls[entry.id] = calls.get(entry.id, 0) + 1
            if entry.payload["refused"]:
                entry.fail(PermanentFailure("address refused"))
        if len(batch) > 1:
            raise ValueError("the batch's INSERT refused a row")

    worker = make_worker(process)
    refused = await add(stream, {"refused": True})
    neighbours = [await add(stream, {"refused": False}) for _ in range(2)]

    await worker.run_until_idle()

    assert calls == {refused: 1, **dict.fromkeys(neighbours, 2)}
    [dead] = await payloads(keys.dlq)
    assert (dead["entryId"], dead["error"], dead["attempts"]) \
        == (refused, "PermanentFailure: address refused", 1)
    assert worker.stats.processed == 2
