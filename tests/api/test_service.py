"""ApiService: the API as a notifkit service on a real port."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.keys import Keys
from notifkit.server import NotifkitServer
from notifkit.services.api.service import ApiService
from tests.api.conftest import ADMIN


async def test_the_service_serves_on_the_port_it_bound(settings: Settings) -> None:
    async with NotifkitServer(services=["api"], settings=settings.replace(port=0),
                              auto_migrate=False) as server:
        service = server.service("api")
        assert isinstance(service, ApiService)
        assert service.port not in (None, 0)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{service.base_url}/health") as response:
                assert response.status == 200
            async with http.post(f"{service.base_url}/v1/projects", json={"name": "p"},
                                 headers={"Authorization": f"Bearer {ADMIN}"}) as response:
                assert response.status == 201


async def test_an_ipv6_host_is_written_in_brackets(settings: Settings,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    # HOST=::1 logged "listening on ::1:8080" and gave a base_url of http://::1:8080, which no
    # client can dial.
    with caplog.at_level(logging.INFO, logger="notifkit.api"):
        async with NotifkitServer(services=["api"], settings=settings.replace(host="::1", port=0),
                                  auto_migrate=False) as server:
            service = server.service("api")
            assert isinstance(service, ApiService)
            assert service.base_url == f"http://[::1]:{service.port}"
            async with aiohttp.ClientSession() as http, \
                    http.get(f"{service.base_url}/health") as response:
                assert response.status == 200
    assert f"The API is listening on [::1]:{service.port}." in caplog.messages


@contextlib.asynccontextmanager
async def inbox_stream(service: ApiService,
                       http: aiohttp.ClientSession) -> AsyncIterator[aiohttp.ClientResponse]:
    """An open server-sent event stream of a new user's inbox, past its first heartbeat."""
    admin = {"Authorization": f"Bearer {ADMIN}"}
    async with http.post(f"{service.base_url}/v1/projects", json={"name": "p"},
                         headers=admin) as r:
        project = (await r.json())["id"]
    headers = {**admin, "x-project-id": project}
    async with http.put(f"{service.base_url}/v1/users/u1", json={}, headers=headers) as r:
        assert r.status == 201
    async with http.get(f"{service.base_url}/v1/users/u1/inbox/stream",
                        headers=headers) as stream:
        assert stream.status == 200
        await stream.content.readuntil(b"\n\n")
        yield stream


async def test_stopping_ends_open_event_streams(settings: Settings) -> None:
    service = ApiService(settings.replace(port=0, host="127.0.0.1"))
    await service.start()
    try:
        async with aiohttp.ClientSession() as http, inbox_stream(service, http) as stream:
            stopping = asyncio.create_task(service.stop())
            # The stream ends (EOF) instead of holding the shutdown for its timeout.
            rest = await asyncio.wait_for(stream.content.read(), 5)
            assert b"event: message" not in rest
            await asyncio.wait_for(stopping, 5)
    finally:
        await service.stop()


async def test_a_running_api_beats_with_the_requests_it_is_answering(
    settings: Settings, redis: Redis
) -> None:
    service = ApiService(settings.replace(port=0, host="127.0.0.1"))
    await service.start()
    try:
        # An open event stream is a request being answered; /health is another.
        async with aiohttp.ClientSession() as http, inbox_stream(service, http):
            await service.beat()
            async with http.get(f"{service.base_url}/health") as r:
                services = (await r.json())["services"]
        assert services[service.consumer]["service"] == "api"
        assert services[service.consumer]["inFlight"] == 1
        assert service.consumer.startswith("api-")
    finally:
        await service.stop()
    # A clean stop takes the heartbeat with it, as a stream consumer's does.
    keys = Keys(settings.namespace)
    assert await redis.exists(keys.health(service.consumer)) == 0
    assert await redis.zscore(keys.heartbeats, service.consumer) is None



async def test_an_api_whose_beat_failed_beats_again_within_a_second(
    settings: Settings, redis: Redis
) -> None:
    """A failed beat (Redis away) waited a whole interval for the next, so after an outage
    /health listed the API as stale, and answered degraded, for up to that long. With an
    interval of an hour, only the retry can put it back."""
    keys = Keys(settings.namespace)
    await redis.set(keys.heartbeats, "not a sorted set")  # the beat at start fails
    service = ApiService(settings.replace(port=0, host="127.0.0.1", heartbeat_interval_s=3600.0,
                                          heartbeat_ttl_s=14_400))
    await service.start()
    try:
        assert await redis.type(keys.heartbeats) == b"string"
        await redis.delete(keys.heartbeats)  # Redis serves again
        for _ in range(1000):  # bounded: the retry, which comes within a second
            if await redis.zscore(keys.heartbeats, service.consumer) is not None:
                break
            await asyncio.sleep(0.01)
        assert await redis.zscore(keys.heartbeats, service.consumer) is not None
    finally:
        await service.stop()


async def test_a_clean_stop_after_a_redis_blip_still_takes_the_heartbeat(
    settings: Settings, redis: Redis
) -> None:
    """Given a running API whose pooled Redis connections were closed by the server (a restart,
    a failover, a proxy that dropped it), when it stops cleanly, then its heartbeat still
    goes: a stale connection failed the one removal, /health then listed the stopped
    process as stale and answered degraded until its key expired."""
    service = ApiService(settings.replace(port=0, host="127.0.0.1"))
    await service.start()
    keys = Keys(settings.namespace)
    try:
        assert await redis.zscore(keys.heartbeats, service.consumer) is not None
        # Several pooled connections, as a busy API holds, all closed by the server.
        ids = set(await asyncio.gather(*(service.redis.client_id() for _ in range(4))))
        assert len(ids) > 1
        for client_id in ids:
            await redis.client_kill_filter(_id=str(client_id))
    finally:
        await service.stop()
    assert await redis.exists(keys.health(service.consumer)) == 0
    assert await redis.zscore(keys.heartbeats, service.consumer) is None

# Requests aiohttp's parser refuses before any handler runs, and the part each names. curl
# sends a URL's non-ASCII characters as raw bytes, so the first is a mistake anyone can make.
UNPARSEABLE = [
    (b"GET /v1/users/\xc3\xa9 HTTP/1.1\r\nHost: x\r\n", "path"),
    (b"GET /v1/messages?userId=\xff HTTP/1.1\r\nHost: x\r\n", "query"),
    (b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header\r\n", "headers"),
    (b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n", "Content-Length"),
    (b"G@T /health HTTP/1.1\r\nHost: x\r\n", "method"),
]


async def test_a_request_aiohttp_cannot_parse_is_answered_in_the_error_shape(
    settings: Settings,
) -> None:
    """Given the API on a real port, when a request arrives that the HTTP parser refuses (a
    raw non-ASCII byte in the URL, a malformed header, a Content-Length that is no number),
    then the answer is still a JSON 400 in the contract's error shape naming the part that is
    wrong, not aiohttp's text/plain page echoing the request's bytes, and the server carries
    on answering."""
    service = ApiService(settings.replace(port=0, host="127.0.0.1"))
    await service.start()
    try:
        for head, field in UNPARSEABLE:
            reader, writer = await asyncio.open_connection("127.0.0.1", service.port)
            writer.write(head + b"Connection: close\r\n\r\n")
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            status_line, _, rest = answer.partition(b"\r\n")
            headers, _, body = rest.partition(b"\r\n\r\n")
            assert status_line.split()[1] == b"400", answer
            assert b"content-type: application/json" in headers.lower(), answer
            error = json.loads(body)["error"]
            assert set(error) == {"code", "message", "details"}, error
            assert error["code"] == "malformed_request", error
            assert [d["field"] for d in error["details"]] == [field], error
        async with aiohttp.ClientSession() as http, http.get(f"{service.base_url}/health") as r:
            assert r.status == 200
    finally:
        await service.stop()


async def test_a_request_that_finds_every_connection_taken_answers_503(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While PostgreSQL stalled, each of the pool's connections was held about 20 s by a query
    timing out and being cancelled, and the requests behind them queued for a connection with
    no limit: under steady sends the n-th waited some n x 9 s (54 s seen in a 55 s stall).
    Waiting for a connection is bounded as opening one is, and a request that finds none free
    in time is a 503 that asks to retry. Here every connection is taken by the test."""
    monkeypatch.setattr(ApiService, "acquire_timeout_s", 0.2)
    service = ApiService(settings.replace(port=0, host="127.0.0.1", db_max_connections=2))
    await service.start()
    held = [await service.pool.acquire() for _ in range(2)]
    try:
        # Bounded only so a regression fails instead of hanging.
        async with aiohttp.ClientSession() as http, asyncio.timeout(30), http.post(
                f"{service.base_url}/v1/projects", json={"name": "p"},
                headers={"Authorization": f"Bearer {ADMIN}"}) as response:
            assert response.status == 503
            assert response.headers["Retry-After"] == "1"
            assert (await response.json())["error"]["code"] == "service_unavailable"
    finally:
        for conn in held:
            await service.pool.release(conn)
        await service.stop()
