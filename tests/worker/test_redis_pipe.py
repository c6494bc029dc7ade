"""The hot path's pipelines (notifkit.redis_pipe) against real Redis: the same answers and
errors as a redis-py pipeline, connections that never carry a half-read reply, and a total
still bounded by the client's pool."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import BlockingConnectionPool, Redis
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from notifkit.keys import Keys
from notifkit.redis_pipe import pipe


async def test_replies_come_back_in_order_as_redis_py_gives_them(redis: Redis,
                                                                  keys: Keys) -> None:
    stream, mark = keys.outbound("normal"), keys.processed("delivery", "t1")
    replies = await (pipe(redis)
                     .xadd(stream, {b"data": b"{}"}, maxlen=1000)
                     .set(mark, "owner-1", ex=60, nx=True, get=True)
                     .set(mark, "owner-2", ex=60, nx=True, get=True)
                     .eval("return {KEYS[1], ARGV[1]}", 1, "k", "v")
                     .execute())
    assert isinstance(replies[0], bytes)
    assert b"-" in replies[0]
    assert replies[1:] == [None, b"owner-1", [b"k", b"v"]]
    assert await redis.xlen(stream) == 1
    assert await redis.get(mark) == b"owner-1"
    assert 0 < await redis.ttl(mark) <= 60


async def test_an_error_reply_is_raised_after_every_reply_was_read(redis: Redis,
                                                                   keys: Keys) -> None:
    wrong = keys.processed("engine", "a-string")
    await redis.set(wrong, "x")
    stream = keys.enriched("normal")
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await pipe(redis).xadd(wrong, {b"data": b"{}"}).xadd(stream, {b"data": b"{}"}).execute()
    # The command after the failing one ran, and the connection is still in step.
    assert await redis.xlen(stream) == 1
    replies = await (pipe(redis).xadd(wrong, {b"data": b"{}"}).command("PING")
                     .execute(raise_on_error=False))
    assert isinstance(replies[0], ResponseError)
    assert replies[1] in (b"PONG", "PONG")


async def test_a_cancelled_call_closes_its_connection_instead_of_reusing_it(
        redis: Redis, keys: Keys) -> None:
    stream = keys.inbound("low")
    await redis.xgroup_create(stream, "g", id="$", mkstream=True)
    blocked = asyncio.create_task(pipe(redis).command(
        "XREADGROUP", "GROUP", "g", "c", "BLOCK", 5000, "STREAMS", stream, ">").execute())
    for _ in range(200):  # until Redis shows this read blocked (other clients may block too)
        if await _blocked_here(redis):
            break
        await asyncio.sleep(0.01)
    else:
        pytest.fail("the blocking read never reached Redis")
    blocked.cancel()
    with pytest.raises(asyncio.CancelledError):
        await blocked
    # Had the connection gone back to the lane, this XADD's entry would be the reply the
    # cancelled read was waiting for, and the next call would read it as its own.
    await redis.xadd(stream, {b"data": b"{}"})
    assert await pipe(redis).command("PING").execute() in ([b"PONG"], ["PONG"])
    assert await redis.xlen(stream) == 1


async def _blocked_here(redis: Redis) -> bool:
    """Whether one of this client's own connections is blocked in an XREADGROUP."""
    ports = set()
    for conn in redis.connection_pool._in_use_connections:
        writer = getattr(conn, "_writer", None)
        if writer is not None:
            ports.add(writer.get_extra_info("sockname")[1])
    return any(c.get("cmd") == "xreadgroup" and int(c["addr"].rpartition(":")[2]) in ports
               for c in await redis.client_list())


async def test_a_call_cancelled_while_it_connects_is_cancelled(
        redis: Redis, redis_url: str, keys: Keys) -> None:
    """Cancelled at every point of opening its connection (one event-loop step further each
    time), a blocking read is cancelled: the cancel is never swallowed, as Python 3.11's
    wait_for inside redis-py's connect and write would, leaving the read blocked."""
    for steps in range(30):
        # A stream of its own each time: nothing is waiting in it before the read.
        stream = f"{keys.inbound('low')}:{steps}"
        await redis.xgroup_create(stream, "g", id="$", mkstream=True)
        client = Redis.from_url(redis_url)  # a new pool: the read opens its connection
        try:
            read = asyncio.create_task(pipe(client).command(
                "XREADGROUP", "GROUP", "g", "c", "BLOCK", 0, "STREAMS", stream, ">"
            ).execute())
            for _ in range(steps):
                await asyncio.sleep(0)
            read.cancel()
            # A read that went on despite the cancel now gets this entry and returns it.
            await redis.xadd(stream, {b"data": b"{}"})
            await asyncio.wait({read})
            assert read.cancelled(), f"cancelled {steps} steps in, the read went on"
        finally:
            await client.aclose()


async def test_a_connection_killed_while_idle_is_replaced_once(redis: Redis,
                                                              keys: Keys) -> None:
    await pipe(redis).command("CLIENT", "SETNAME", "notifkit-pipe-test").execute()
    clients = await redis.client_list()
    victim = [c for c in clients if c.get("name") == "notifkit-pipe-test"]
    assert len(victim) == 1
    await redis.client_kill_filter(_id=victim[0]["id"])
    stream = keys.enriched("low")
    assert await pipe(redis).xadd(stream, {b"data": b"{}"}).execute()
    assert await redis.xlen(stream) == 1


async def test_connections_stay_within_the_pools_limit_and_close_with_the_client(
        redis_url: str) -> None:
    pool = BlockingConnectionPool.from_url(redis_url, max_connections=3, timeout=10)
    client = Redis.from_pool(pool)
    in_flight = 0
    most = 0

    async def one() -> None:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await pipe(client).command("PING").execute()
        in_flight -= 1

    await asyncio.gather(*(one() for _ in range(40)))
    assert most > 3  # 40 calls really were waiting at once ...
    opened = list(pool._in_use_connections) + list(pool._available_connections)
    assert 0 < len(opened) <= 3  # ... on no more than the pool's three connections
    assert await client.ping()  # the client's own commands still find a connection
    await client.aclose()
    assert not any(c.is_connected for c in opened)


async def test_a_write_larger_than_the_socket_buffer_waits_for_it_to_drain(
        redis: Redis, keys: Keys) -> None:
    key = keys.processed("engine", "large")
    value = b"v" * 8_000_000  # well past what a socket takes without waiting
    assert await pipe(redis).set(key, value).command("STRLEN", key).execute() == [b"OK", 8_000_000]
    assert await redis.get(key) == value


async def test_a_write_nobody_reads_times_out_and_its_connection_is_dropped() -> None:
    held: list[asyncio.StreamWriter] = []

    async def stalls_on_set(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answers the client's connection handshake, then reads nothing once a SET comes."""
        held.append(writer)
        while chunk := await reader.read(65536):
            if b"\r\nSET\r\n" in chunk.upper():
                return  # the connection stays open; nobody reads it any more
            if b"\r\nHELLO\r\n" in chunk.upper():
                # As a server before Redis 6 answers; a client then speaks RESP2.
                writer.write(b"-ERR unknown command 'HELLO'\r\n")
                continue
            commands = chunk.count(b"\r\n*") + chunk.startswith(b"*")
            writer.write(b"+OK\r\n" * commands)

    server = await asyncio.start_server(stalls_on_set, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = BlockingConnectionPool(host="127.0.0.1", port=port, socket_timeout=0.5,
                                  max_connections=2)
    client = Redis.from_pool(pool)
    try:
        with pytest.raises(RedisTimeoutError, match="writing"):
            await pipe(client).set("k", b"x" * 64_000_000).execute()
        # The connection that might still hold part of that write is closed, not reused.
        assert not any(c.is_connected for c in pool._in_use_connections)
    finally:
        await client.aclose()
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()
