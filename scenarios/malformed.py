"""Raw garbage XADDed into every stream a service consumes.

Proves: each garbage entry is acked by the first read (before the reclaim sweep could ever
see it), is reported exactly once (one log line naming its entry id), is never retried, and the
workers carry on: every process stays up and a normal notification sent afterwards is delivered.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from scenarios.harness import RunOptions, System, text_of
from scenarios.report import ScenarioResult

DESCRIPTION = ("raw garbage XADDed into each stream: acked at once, reported once, never "
               "retried; workers unaffected and a send afterwards is delivered")
PARAMS: dict[str, Any] = {"users": 5, "messages": 10, "drain_timeout_s": 60.0}
# Without a user or a message nothing is sent after the garbage, and "a send afterwards is
# delivered" would hold of nothing.
POSITIVE = frozenset({"users", "messages", "drain_timeout_s"})

# The api shares the workers' process so its /metrics shows their counters.
LAYOUT = {
    "all": ["api", "enricher", "engine", "delivery", "scheduler", "events", "workflow", "ai"],
}

METRIC_LINE = re.compile(
    r'^notifkit_malformed_total\{[^}]*stream="(?P<stream>[^"]*)"[^}]*\} (?P<value>\S+)$')

# Not JSON; not an object; JSON of the wrong shape; no data field at all.
GARBAGE: tuple[dict[str, str | bytes], ...] = (
    {"data": b"\xff\xfe not json {"},
    {"data": "[1, 2, 3]"},
    {"data": '{"projectId": 42, "eventId": "nope", "hello": "world"}'},
    {"junk": "no data field"},
)


async def run(options: RunOptions, params: dict[str, Any]) -> ScenarioResult:
    result = ScenarioResult(options.name, options.seed)
    async with System(options, LAYOUT) as system:
        users = await system.bootstrap(users=int(params["users"]), channels=("email",))
        # Every consumed stream: the DLQ is for people, not workers.
        streams = [s for s in system.keys.all_streams() if s != system.keys.dlq]
        added: set[tuple[str, str]] = set()  # (stream, entry id): ids repeat across streams
        started = time.monotonic()
        for stream in streams:
            for fields in GARBAGE:
                entry_id = await system.redis.xadd(stream, fields)  # type: ignore[arg-type]
                added.add((stream, text_of(entry_id)))
        system.say(f"XADDed {len(added)} garbage entries into {len(streams)} streams",
                   force=True)
        # Acked: nothing left pending or unread. (Acked by the *first* read is checked below
        # by the malformed counter: a second read could only be a reclaim, and it would count
        # the entry again. Not by the log lines: a record identical to one written within
        # 30 s is left out of the log, so a second report of the same entry is never seen.)
        deadline = started + float(params["drain_timeout_s"])
        unacked = set(added)
        while unacked and time.monotonic() < deadline:
            unacked = await still_unacked(system, added)
            if unacked:
                await asyncio.sleep(0.05)
        acked_s = time.monotonic() - started
        waiting = await system.quiesce(float(params["drain_timeout_s"]))
        result.check(not waiting, f"the system never drained: {waiting}")
        for stream, entry_id in sorted(await still_unacked(system, added)):
            result.check(False, f"garbage {entry_id} in {stream} is still unacked")

        # Reported, and never an attempt that failed (= a retry).
        reports: dict[tuple[str, str], int] = {}
        retried: set[tuple[str, str]] = set()
        # Services with a single stream may leave it out of their log lines.
        only_stream = {"notifkit.scheduler": system.keys.scheduled,
                       "notifkit.ai": system.keys.ai_pending,
                       "notifkit.workflow": system.keys.workflow_inbound,
                       "notifkit.events": system.keys.events_inbound}
        for name in system.processes:
            for record in system.log_records(name):
                stream = record.get("stream") or only_stream.get(str(record.get("logger")), "")
                where = (str(stream), str(record.get("entry_id") or ""))
                if where not in added:
                    continue
                message = str(record.get("msg", ""))
                if message.startswith("Acked "):
                    reports[where] = reports.get(where, 0) + 1
                elif "failed" in message or "Reclaimed" in message:
                    retried.add(where)
        for stream, entry_id in sorted(added):
            count = reports.get((stream, entry_id), 0)
            result.check(count != 0, f"garbage {entry_id} in {stream} was never reported")
        for stream, entry_id in sorted(retried):
            result.check(False, f"garbage {entry_id} in {stream} was retried")
        # Counted once each: notifkit_malformed_total, per stream, says how many each stream
        # had (more: an entry was read again, so its first read did not ack it).
        counted = await malformed_counts(system)
        for stream in streams:
            expected = sum(1 for s, _i in added if s == stream)
            result.check(counted.get(stream, 0) == expected,
                         f"notifkit_malformed_total for {stream} is {counted.get(stream, 0):g}, "
                         f"but {expected} garbage entries went into it (each is counted by "
                         "every read that handles it, and must be acked by the first)")
        reclaimed = system.count_log_lines("Reclaimed ", "idle entries")
        result.check(not reclaimed, f"a reclaim sweep found work: {reclaimed}")
        result.facts.update(garbage=len(added), streams=len(streams),
                            reported=sum(reports.values()), counted=sum(counted.values()),
                            acked_within_s=round(acked_s, 3))

        # Unaffected: the same processes deliver a normal notification.
        system.check_alive(result, LAYOUT)
        sent = await system.send_many(
            [users[i % len(users)] for i in range(int(params["messages"]))], template="basic")
        waiting = await system.quiesce(float(params["drain_timeout_s"]))
        result.check(not waiting, f"the system never drained after the garbage: {waiting}")
        await system.account(sent, result)
        system.check_alive(result, LAYOUT)
    return result


async def still_unacked(system: System,
                        added: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """Garbage entries not yet acked: still pending, or not yet read by some group."""
    waiting: set[tuple[str, str]] = set()
    for stream in {s for s, _i in added}:
        ids = {(s, i) for s, i in added if s == stream}
        try:
            groups = await system.redis.xinfo_groups(stream)
        except Exception:
            groups = []
        if not groups:
            waiting |= ids  # nobody consumes it yet
            continue
        for group in groups:
            last = text_of(group["last-delivered-id"])
            waiting |= {(s, i) for s, i in ids if _after(i, last)}
            rows = await system.redis.xpending_range(stream, group["name"], min="-", max="+",
                                                     count=10_000)
            waiting |= ids & {(stream, text_of(r["message_id"])) for r in rows}
    return waiting


def _after(entry_id: str, last: str) -> bool:
    a, b = entry_id.split("-"), last.split("-")
    return (int(a[0]), int(a[1])) > (int(b[0]), int(b[1]))


async def malformed_counts(system: System) -> dict[str, float]:
    """stream -> the notifkit_malformed_total counters for it (all services), from /metrics."""
    assert system.http is not None
    async with system.http.get(system.api_url + "/metrics") as response:
        text = await response.text()
    counts: dict[str, float] = {}
    for line in text.splitlines():
        match = METRIC_LINE.match(line)
        if match:
            stream = match.group("stream")
            counts[stream] = counts.get(stream, 0.0) + float(match.group("value"))
    return counts
