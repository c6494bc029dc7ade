"""Every Redis name notifkit uses, built in one place. This comment is the key schema.

Streams (one consumer group per service reads each; ``{p}`` is critical | normal | low):

    notifkit:stream:inbound:{p}        api, workflow,        -> enricher
                                       enricher (segment pages)
    notifkit:stream:enriched:{p}       enricher, delivery    -> engine   (delivery: fallback)
    notifkit:stream:outbound:{p}       engine, scheduler, ai -> delivery
    notifkit:stream:ai:pending         engine                -> ai
    notifkit:stream:scheduled          engine, delivery, ai  -> scheduler (sendAt, quiet hours, 429)
    notifkit:stream:workflow:inbound   api, events, timers   -> workflow
    notifkit:stream:events:inbound     api, delivery, worker -> events
    notifkit:stream:dlq                any worker            -> humans, via /v1/dlq

Consumer groups are ``notifkit:group:{service}``; consumers are ``{service}-{hostname}-{pid}``.

Other keys:

    notif:scheduled:zset:{0..f}              ZSET  task id -> due time (ms); shard = last hex
                                                   digit of the task id
    notif:scheduled:payload:{0..f}           HASH  task id -> "{target stream}\n{projectId}\n
                                                   {entry JSON}": what the move script XADDs
                                                   when it is due (the project scopes a cancel)
    notif:scheduled:moved:{0..f}             ZSET  "{projectId} {taskId}" -> due time (ms) of
                                                   tasks moved (or canceled) whose
                                                   scheduled_payloads row is not deleted yet
    notif:scheduled:ready                    STR   set once the shards are built; missing =
                                                   Redis lost them, rebuild from PostgreSQL
    notif:workflow:timers                    ZSET  "{instanceId}:{stepPath}" (or ":retry") -> wake
                                                   time (ms); moved to workflow:inbound by Lua
    notif:workflow:timers:ready              STR   set once the timers are built; missing =
                                                   Redis lost them, rebuild from PostgreSQL
    notif:lock:scheduler:poll                STR   token of the one polling scheduler, 30 s TTL
    notif:reconcile:cursor                   STR   time (ms, UUIDv7 order) up to which the poll
                                                   lock holder has checked accepted notifications
                                                   for ones never enqueued (notifkit.reconcile)
    notif:reconcile:since                    STR   Redis time (ms) of the first reconciliation
                                                   pass of this data set: the streams can tell
                                                   about entries from then on only; missing =
                                                   Redis lost its data (or a first start)
    lock:workflow:{instanceId}               STR   token of the instance's runner, 60 s TTL
    throttle:{projectId}:user:{userId}       ZSET  sliding window of send times per user
    notif:processed:{stage}:{dedupKey}       STR   dedup mark = id of the stream entry that
                                                   claimed it; 1 h TTL (24 h for caller keys)
    notif:attempts:{group}:{entryId}         STR   attempt counter (INCR before each attempt),
                                                   2 h TTL, deleted on ack; every entry has one.
                                                   Stream ids are unique only per stream and a
                                                   group reads one stream per priority (two XADDs
                                                   in one millisecond give both entries the same
                                                   id), so an entry of a priority stream is also
                                                   counted, the same way, under
                                                   ``...:{entryId}:{priority}``, and that counter
                                                   is the one its attempt limit reads: two
                                                   entries with the same id never share the
                                                   count that decides (the plain one, shared,
                                                   may then read high or go early).
    notif:health:{consumer}                  STR   JSON heartbeat, a few beats' TTL
    notif:heartbeats                         ZSET  consumer -> time of its last beat (s): the
                                                   consumers /health reads, found without a
                                                   SCAN of the whole keyspace
    notif:metrics:counters                   HASH  Prometheus counters and histograms summed
                                                   over every process: field = JSON [family,
                                                   sample, labels], value = total
    notif:ratelimit:{provider}:{projectId}   HASH  token bucket shared by delivery processes
    notif:apirate:{projectId}                HASH  API request token bucket per project
    notif:idempotency:api:{projectId}:{key}  STR   first response to a caller's idempotency key
    notif:idempotency:since                  STR   Redis time (ms) of the first key claimed in
                                                   this data set; missing = Redis lost its data
                                                   (or a first start). Younger than 24 h: a key
                                                   missing here is looked up in PostgreSQL
                                                   among the sends made before this time
    notif:channel:keys                       PUB/SUB  API-key revocations
    notif:channel:templates                  PUB/SUB  template deletions
    notif:channel:inbox:{projectId}:{userId} PUB/SUB  new in-app messages (SSE)

A namespace (``NOTIFKIT_NAMESPACE``) prefixes every name as ``{namespace}:{name}`` (a namespace
that already ends in ``:`` gets no second one) so several deployments or test runs can share
one Redis.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

PRIORITIES: Final = ("critical", "normal", "low")
# Priority lanes whose entries' deciding attempt counters carry the lane's name (a stream that
# is the only one its group reads counts under the plain name alone).
_OWN_COUNTER_LANES: Final = frozenset(PRIORITIES)
SCHEDULER_SHARDS: Final = "0123456789abcdef"


@dataclass(frozen=True)
class Keys:
    namespace: str = ""
    _prefix: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # "team-a" and "team-a:" both give "team-a:notifkit:...": a namespace written with its
        # separator keeps the literal prefix an operator scans for.
        ns = self.namespace
        object.__setattr__(self, "_prefix", ns if not ns or ns.endswith(":") else f"{ns}:")

    def _k(self, name: str) -> str:
        return f"{self._prefix}{name}"

    # -- streams --------------------------------------------------------------
    def inbound(self, priority: str) -> str:
        return self._k(f"notifkit:stream:inbound:{_priority(priority)}")

    def enriched(self, priority: str) -> str:
        return self._k(f"notifkit:stream:enriched:{_priority(priority)}")

    def outbound(self, priority: str) -> str:
        return self._k(f"notifkit:stream:outbound:{_priority(priority)}")

    def inbound_all(self) -> list[str]:
        return [self.inbound(p) for p in PRIORITIES]

    def enriched_all(self) -> list[str]:
        return [self.enriched(p) for p in PRIORITIES]

    def outbound_all(self) -> list[str]:
        return [self.outbound(p) for p in PRIORITIES]

    @property
    def ai_pending(self) -> str:
        return self._k("notifkit:stream:ai:pending")

    @property
    def scheduled(self) -> str:
        return self._k("notifkit:stream:scheduled")

    @property
    def workflow_inbound(self) -> str:
        return self._k("notifkit:stream:workflow:inbound")

    @property
    def events_inbound(self) -> str:
        return self._k("notifkit:stream:events:inbound")

    @property
    def dlq(self) -> str:
        return self._k("notifkit:stream:dlq")

    def all_streams(self) -> list[str]:
        return [
            *self.inbound_all(),
            *self.enriched_all(),
            *self.outbound_all(),
            self.ai_pending,
            self.scheduled,
            self.workflow_inbound,
            self.events_inbound,
            self.dlq,
        ]

    def group(self, service: str) -> str:
        # Group names live inside a stream, so they need no namespace of their own.
        return f"notifkit:group:{service}"

    # -- scheduler and workflow -----------------------------------------------
    def scheduled_zset(self, task_id: str) -> str:
        return self.scheduled_shard(shard_of(task_id))

    def scheduled_shard(self, shard: str) -> str:
        return self._k(f"notif:scheduled:zset:{shard}")

    def scheduled_shards(self) -> list[str]:
        return [self.scheduled_shard(s) for s in SCHEDULER_SHARDS]

    def scheduled_payloads(self, shard: str) -> str:
        return self._k(f"notif:scheduled:payload:{shard}")

    def scheduled_moved(self, shard: str) -> str:
        return self._k(f"notif:scheduled:moved:{shard}")

    @property
    def scheduled_ready(self) -> str:
        return self._k("notif:scheduled:ready")

    @property
    def workflow_timers(self) -> str:
        return self._k("notif:workflow:timers")

    @property
    def workflow_timers_ready(self) -> str:
        return self._k("notif:workflow:timers:ready")

    @property
    def scheduler_lock(self) -> str:
        return self._k("notif:lock:scheduler:poll")

    @property
    def reconcile_cursor(self) -> str:
        return self._k("notif:reconcile:cursor")

    @property
    def reconcile_since(self) -> str:
        return self._k("notif:reconcile:since")

    def workflow_lock(self, instance_id: str) -> str:
        return self._k(f"lock:workflow:{instance_id}")

    # -- per-message state ------------------------------------------------------
    def throttle(self, project_id: str, user_id: str) -> str:
        return self._k(f"throttle:{project_id}:user:{user_id}")

    def processed(self, stage: str, dedup_key: str) -> str:
        return self._k(f"notif:processed:{stage}:{dedup_key}")

    def attempts(self, group: str, entry_id: str, stream: str) -> str:
        """The attempt counter whose count decides for ``stream``'s entry ``entry_id`` (see
        the schema above)."""
        name = f"notif:attempts:{group}:{entry_id}"
        lane = stream.rpartition(":")[2]
        return self._k(f"{name}:{lane}" if lane in _OWN_COUNTER_LANES else name)

    def attempt_counters(self, group: str, entry_id: str, stream: str) -> list[str]:
        """Every counter the entry's attempts are counted in: the deciding one first, then
        the contract's ``notif:attempts:{group}:{entryId}`` when that is another key."""
        deciding = self.attempts(group, entry_id, stream)
        named = self._k(f"notif:attempts:{group}:{entry_id}")
        return [deciding] if named == deciding else [deciding, named]

    def health(self, consumer: str) -> str:
        return self._k(f"notif:health:{consumer}")

    def health_pattern(self) -> str:
        return self._k("notif:health:*")

    def health_prefix(self) -> str:
        return self._k("notif:health:")

    @property
    def heartbeats(self) -> str:
        return self._k("notif:heartbeats")

    @property
    def metrics_counters(self) -> str:
        return self._k("notif:metrics:counters")

    # -- rate limits, API state, pub/sub -------------------------------------------
    def provider_bucket(self, provider: str, project_id: str) -> str:
        return self._k(f"notif:ratelimit:{provider}:{project_id}")

    def api_rate(self, project_id: str) -> str:
        return self._k(f"notif:apirate:{project_id}")

    def api_idempotency(self, project_id: str, key: str) -> str:
        return self._k(f"notif:idempotency:api:{project_id}:{key}")

    @property
    def api_idempotency_since(self) -> str:
        return self._k("notif:idempotency:since")

    @property
    def key_revocations(self) -> str:
        return self._k("notif:channel:keys")

    @property
    def template_deletions(self) -> str:
        return self._k("notif:channel:templates")

    def inbox_channel(self, project_id: str, user_id: str) -> str:
        return self._k(f"notif:channel:inbox:{project_id}:{user_id}")


def shard_of(task_id: str) -> str:
    """The scheduler shard of a task: the last hex digit of its id (``0`` if none)."""
    for char in reversed(task_id.lower()):
        if char in SCHEDULER_SHARDS:
            return char
    return "0"


def _priority(priority: str) -> str:
    if priority not in PRIORITIES:
        raise ValueError(f"unknown priority {priority!r}")
    return priority
