"""Baselines measured in the same run: the ceilings notifkit sits under, and Celery.

* Redis ceiling: a bare XADD -> XREADGROUP -> XACK loop (pipelined batches of 100) on one
  stream, with payloads the size of an enriched message.
* HTTP ceiling: a bare POST loop to the Resend simulator, one kept-alive session, 64 requests
  in flight.
* Commit latency: a lone single-row INSERT committed every few ms on the idle system, the
  floor under every latency figure: each notification waits for several commits on its way
  (accept, routing, the outbox claim, the outcome), and a commit waits for the WAL to reach
  the disk (``synchronous_commit``), so the storage's slowest flushes are the system's too.
* Celery: :mod:`benchmarks.celery_app` workers on a Redis broker doing the same work per
  notification; a producer thread keeps the queue full (a bare enqueue, no HTTP API in front:
  that favours Celery), and the rate is counted at the simulator by ``receivedAt``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, cast
from urllib.parse import parse_qs, urlencode, urlsplit

import aiohttp
import asyncpg
from redis.asyncio import Redis

from benchmarks.stats import Progress, commit_summary, epoch
from benchmarks.system import TEMPLATE, BenchSystem, user_id
from notifkit import codec
from notifkit.ids import derived_uuid7, uuid7
from scenarios.processes import ManagedProcess, child_env, python_module

PAYLOAD = codec.dumps({
    "eventId": uuid7(), "projectId": uuid7(), "template": "bench", "priority": "normal",
    "data": {"n": 1}, "createdAt": "2026-01-01T00:00:00.000Z",
    "user": {"id": "user-000001", "attributes": {}, "timezone": None, "locale": "en"},
    "contacts": {"email": ["user-000001@example.com"]},
    "preferences": {"channels": {}, "topics": {}, "quietHours": None},
})
BATCH = 100
# One commit every COMMIT_GAP_S: a probe of the storage under PostgreSQL, not a load on it.
COMMIT_GAP_S = 0.005


async def redis_ceiling(redis_url: str, namespace: str, duration_s: float) -> dict[str, Any]:
    stream, group = f"{namespace}:ceiling:stream", f"{namespace}:ceiling:group"
    producer, consumer = Redis.from_url(redis_url), Redis.from_url(redis_url)
    await producer.xgroup_create(stream, group, id="0", mkstream=True)
    produced = consumed = 0
    deadline = time.monotonic() + duration_s
    started = time.monotonic()

    async def produce() -> None:
        nonlocal produced
        while time.monotonic() < deadline:
            if produced - consumed > 20 * BATCH:
                await asyncio.sleep(0.001)
                continue
            pipe = producer.pipeline(transaction=False)
            for _ in range(BATCH):
                pipe.xadd(stream, {"data": PAYLOAD}, maxlen=1_000_000, approximate=True)
            await pipe.execute()
            produced += BATCH

    async def consume() -> None:
        nonlocal consumed
        while time.monotonic() < deadline:
            # RESP2 (this client's protocol): [[stream, [(id, fields), ...]], ...].
            reply = cast(list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]],
                         await consumer.xreadgroup(group, "c", {stream: ">"}, count=BATCH,
                                                   block=100) or [])
            entries = [entry for _stream, stream_entries in reply for entry in stream_entries]
            ids = [entry_id for entry_id, _fields in entries]
            if ids:
                for _entry_id, fields in entries:
                    codec.loads(fields[b"data"])
                await consumer.xack(stream, group, *ids)
                consumed += len(ids)

    await asyncio.gather(produce(), consume())
    elapsed = time.monotonic() - started
    await producer.delete(stream)
    await producer.aclose()
    await consumer.aclose()
    return {"messages": consumed, "seconds": elapsed, "per_s": consumed / elapsed}


async def http_ceiling(sim_url: str, duration_s: float, concurrency: int = 64) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(limit=concurrency, keepalive_timeout=60)
    done = errors = 0
    deadline = time.monotonic() + duration_s
    started = time.monotonic()
    event = uuid7()
    async with aiohttp.ClientSession(connector=connector) as session:

        async def loop(worker: int) -> None:
            nonlocal done, errors
            n = 0
            while time.monotonic() < deadline:
                n += 1
                task_id = derived_uuid7(event, str(worker), str(n))
                body = codec.dumps({
                    "from": "notifkit <noreply@example.com>", "to": ["ceiling@example.com"],
                    "subject": "Hello", "text": f"Message {n}",
                    "tags": [{"name": "notifkit_task_id", "value": task_id}]})
                headers = {"Authorization": "Bearer sim-placeholder-key",
                           "Content-Type": "application/json",
                           "Idempotency-Key": task_id, "X-Notifkit-Task-Id": task_id}
                try:
                    async with session.post(f"{sim_url}/emails", data=body,
                                            headers=headers) as resp:
                        await resp.read()
                        if resp.status == 200:
                            done += 1
                        else:
                            errors += 1
                except (aiohttp.ClientError, OSError):
                    errors += 1

        await asyncio.gather(*(loop(i) for i in range(concurrency)))
    elapsed = time.monotonic() - started
    return {"requests": done, "errors": errors, "seconds": elapsed, "per_s": done / elapsed}


async def commit_latency(db: asyncpg.Pool, duration_s: float,
                         gap_s: float = COMMIT_GAP_S) -> dict[str, Any]:
    """Time single-row INSERTs, each its own transaction, one every ``gap_s``: the latency of
    one durable commit on this PostgreSQL (with its ``synchronous_commit``, reported)."""
    latencies: list[float] = []
    async with db.acquire() as conn:
        setting = await conn.fetchval("SHOW synchronous_commit")
        await conn.execute("CREATE TABLE bench_commit_probe (n bigint PRIMARY KEY)")
        try:
            started = time.monotonic()
            deadline = started + duration_s
            while time.monotonic() < deadline:
                began = time.perf_counter()
                await conn.execute("INSERT INTO bench_commit_probe (n) VALUES ($1)",
                                   len(latencies))
                latencies.append((time.perf_counter() - began) * 1000)
                await asyncio.sleep(gap_s)
            elapsed = time.monotonic() - started
        finally:
            await conn.execute("DROP TABLE bench_commit_probe")
    return {**commit_summary(latencies, elapsed), "gap_ms": gap_s * 1000,
            "synchronous_commit": setting}


def celery_broker_url(redis_url: str) -> str:
    """The run's Redis as kombu names it: a Unix socket is ``redis+socket://``, its database
    the ``virtual_host`` (kombu reads no ``unix://`` URL, nor a ``db`` option)."""
    parts = urlsplit(redis_url)
    if parts.scheme != "unix":
        return redis_url
    options = parse_qs(parts.query)
    database = options.pop("db", ["0"])[0]
    query = urlencode({**{name: values[-1] for name, values in options.items()},
                       "virtual_host": database})
    return f"redis+socket://{parts.path}?{query}"


async def celery_baseline(system: BenchSystem, *, warmup_s: float, duration_s: float,
                          concurrency: int, progress: Progress) -> dict[str, Any]:
    queue = f"{system.namespace}-celery"
    # Inside the run's namespace: the queue, kombu's bindings and its 'unacked' bookkeeping go
    # with the run's other keys when the run ends.
    key_prefix = f"{system.namespace}:celery:"
    env = child_env(
        BENCH_CELERY_BROKER=celery_broker_url(system.redis_url), BENCH_CELERY_QUEUE=queue,
        BENCH_CELERY_KEY_PREFIX=key_prefix,
        BENCH_DATABASE_URL=system.database_url, BENCH_DB_SCHEMA=system.schema,
        BENCH_SIM_URL=system.sim_url,
    )
    worker = ManagedProcess(
        "celery",
        python_module("celery", "-A", "benchmarks.celery_app", "worker", "-P", "prefork",
                      "-c", str(concurrency), "-Q", queue, "--without-gossip",
                      "--without-mingle", "--without-heartbeat", "--loglevel", "WARNING"),
        env, system.folder / "celery.log",
    )
    from benchmarks import celery_app

    celery_app.configure(celery_broker_url(system.redis_url), queue, key_prefix)

    stop = threading.Event()
    enqueued = 0

    def produce() -> None:
        """Keep a few thousand tasks queued so the workers never wait for work."""
        nonlocal enqueued
        import redis as sync_redis

        client = sync_redis.Redis.from_url(system.redis_url)
        task = celery_app.send_notification
        with celery_app.app.producer_or_acquire() as producer:
            while not stop.is_set():
                if client.llen(key_prefix + queue) > 3000:
                    time.sleep(0.01)
                    continue
                for _ in range(500):
                    enqueued += 1
                    task.apply_async(
                        (system.project_id, uuid7(), user_id(enqueued % 10_000), TEMPLATE,
                         {"n": enqueued}), queue=queue, producer=producer)
        client.close()

    await system.sim.reset()
    await worker.start()
    thread = threading.Thread(target=produce, name="celery-producer", daemon=True)
    thread.start()
    try:
        # Worker processes take a while to boot on a busy machine: warm up once they work.
        deadline = time.monotonic() + 120
        while await system.accepted_at_sim() == 0:
            if not worker.running or time.monotonic() > deadline:
                raise RuntimeError(f"the Celery worker sent nothing:\n{worker.tail()}")
            await asyncio.sleep(0.2)
        await asyncio.sleep(warmup_s)
        await system.sim.reset()
        window_start = time.time()
        for second in range(int(duration_s)):
            await asyncio.sleep(1.0)
            progress.say(f"celery: {second + 1}/{int(duration_s)} s, "
                         f"{await system.accepted_at_sim()} received by the simulator")
        window_end = time.time()
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 30)
        await worker.terminate(timeout_s=20)
        worker.close_logs()
    messages = await system.sim.messages(limit=100_000)
    received = sum(1 for m in messages if window_start <= epoch(m["receivedAt"]) < window_end)
    return {"concurrency": concurrency, "pool": "prefork", "messages": received,
            "seconds": window_end - window_start,
            "per_s": received / (window_end - window_start)}
