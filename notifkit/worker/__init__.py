"""The stream worker: CONTRACT §3 as one small loop around a service's batch processor.

    read (priority fill, bounded by free capacity)
      -> INCR attempt counters (one script call) -> over the limit? dead-letter
      -> process(batch)                         -> per-entry success or failure
      -> success: XADD the entry's outputs, then XACK + DEL counter, in one script call
      -> failure: release its dedup marks, ack nothing; last attempt? dead-letter
         (a failure that met a PostgreSQL outage: the attempt is given back, and reads and
         reclaim sweeps pause until a probe gets an answer)
    reclaim sweep: XAUTOCLAIM idle entries every ``reclaim_interval_s`` and run them again
    keep-alive: entries this worker is still working on are touched (XCLAIM to itself, JUSTID)
                every third of ``reclaim_min_idle_s``, so only a dead or stuck worker's idle
                entries are taken over, never those of one that is merely slow

Outputs are written by the same script call as the ack, so a crash can never leave a stage
having acked its input without its outputs (nor the reverse). A script, unlike MULTI/EXEC,
stops at the first command Redis refuses: were an output stream's key of the wrong type, a
MULTI would still run the XACK after the failed XADD and lose the entry, where the script
leaves it pending, to be retried and, past its attempts, dead-lettered. Outputs written before
the refusal are written again by the retry; every stage's dedup absorbs such copies. Side
effects outside Redis (provider calls, PostgreSQL rows) are the processor's to make idempotent.

The package's modules: ``stream_worker`` (the loop: read, dispatch, settle, reclaim,
keep-alive, heartbeat), ``entry`` (what a processor is handed, and what the DLQ and
``notification:failed`` say about it), ``scripts`` (the Lua scripts), ``reading`` (XREADGROUP
replies), ``health`` (consumer names and heartbeats) and ``outage`` (holding work while
PostgreSQL is away instead of spending attempts on it).
"""

from __future__ import annotations

from notifkit.worker.entry import (
    REPLAYED_ATTEMPTS,
    BatchProcessor,
    ClaimKey,
    Entry,
    attempts_before,
    attempts_made,
    batch_stream,
    failed_event,
    held_task,
    payload_user,
)
from notifkit.worker.health import (
    consumer_name,
    heartbeat_failure,
    next_beat_in,
    remove_heartbeat,
    write_heartbeat,
)
from notifkit.worker.outage import Dependency, Outage
from notifkit.worker.reading import is_nogroup
from notifkit.worker.stream_worker import PRIORITY_RESERVE_DIVISOR, StreamWorker, WorkerStats

__all__ = [
    "PRIORITY_RESERVE_DIVISOR", "REPLAYED_ATTEMPTS",
    "BatchProcessor", "ClaimKey", "Dependency", "Entry", "Outage", "StreamWorker",
    "WorkerStats", "attempts_before",
    "attempts_made", "batch_stream", "consumer_name", "failed_event", "heartbeat_failure",
    "held_task",
    "is_nogroup", "next_beat_in",
    "payload_user", "remove_heartbeat", "write_heartbeat",
]
