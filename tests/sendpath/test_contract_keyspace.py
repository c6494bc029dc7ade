"""CONTRACT §2-4 read literally: after a send through the API, the keyspace holds the
contract's streams, groups, consumers, dedup marks (with their windows) and nothing left of
the attempt counters."""

from __future__ import annotations

import socket

from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.keys import Keys
from notifkit.services.delivery import DeliveryService
from notifkit.services.engine import EngineService
from notifkit.services.enricher import EnricherService
from notifkit.services.events import EventsService
from notifkit.streams import as_str
from simulators import SimulatorServer
from tests.api.conftest import Api

from .conftest import ServiceFactory
from .helpers import drain


async def _names(redis: Redis, pattern: str) -> dict[str, str]:
    found = {}
    async for key in redis.scan_iter(match=pattern, count=1000):
        name = as_str(key)
        found[name] = as_str(await redis.type(name))
    return found


async def test_a_send_leaves_the_contracts_names_in_redis(
    api: Api, redis: Redis, services: ServiceFactory, sim: SimulatorServer,
    sim_settings: Settings,
) -> None:
    ns = sim_settings.namespace
    keys = Keys(ns)
    prefix = f"{ns}:" if ns else ""
    project = await api.project()
    await api.call("PUT", "/v1/users/ada", key=project.full, json={
        "contacts": [{"channel": "email", "target": "ada@example.com"}]})
    await api.call("PUT", "/v1/templates/welcome", key=project.full, json={
        "channels": {"email": {"subject": "Hi", "text": "Hello"}}})
    plain = await api.call("POST", "/v1/notifications", key=project.send,
                           json={"to": "ada", "template": "welcome"})
    keyed = await api.call("POST", "/v1/notifications", key=project.send,
                           json={"to": "ada", "template": "welcome"},
                           headers={"x-idempotency-key": "order-1"})
    assert (plain.status, keyed.status) == (202, 202), (plain.body, keyed.body)
    running = [await services(cls, sim_settings) for cls in
               (EnricherService, EngineService, DeliveryService, EventsService)]
    await drain(*running)

    # Streams and their groups, under the exact names
    for stage, stream in (("enricher", f"{prefix}notifkit:stream:inbound:normal"),
                          ("engine", f"{prefix}notifkit:stream:enriched:normal"),
                          ("delivery", f"{prefix}notifkit:stream:outbound:normal"),
                          ("events", f"{prefix}notifkit:stream:events:inbound")):
        assert as_str(await redis.type(stream)) == "stream"
        groups = {as_str(g["name"]): g for g in await redis.xinfo_groups(stream)}
        group = groups[f"notifkit:group:{stage}"]
        assert group["pending"] == 0, (stream, group)
        consumers = [as_str(c["name"])
                     for c in await redis.xinfo_consumers(stream, f"notifkit:group:{stage}")]
        host = socket.gethostname()
        assert all(c.startswith(f"{stage}-{host}-") and c.rsplit("-", 1)[1].isdigit()
                   for c in consumers), consumers

    # Dedup marks: one per stage, strings, 1 h; the caller's key 24 h
    marks = await _names(redis, f"{prefix}notif:processed:*")
    assert set(marks.values()) == {"string"}
    by_stage: dict[str, list[str]] = {}
    for name in marks:
        stage = name[len(f"{prefix}notif:processed:"):].split(":", 1)[0]
        by_stage.setdefault(stage, []).append(name)
    assert set(by_stage) == {"enricher", "engine", "delivery"}, marks
    project_id = project.id
    plain_mark = keys.processed("enricher", f"{project_id}:{plain.body['id']}")
    keyed_mark = keys.processed("enricher", f"{project_id}:order-1")
    assert set(by_stage["enricher"]) == {plain_mark, keyed_mark}, by_stage
    assert 3500 < await redis.ttl(plain_mark) <= 3600
    assert 23 * 3600 < await redis.ttl(keyed_mark) <= 24 * 3600
    for name in by_stage["engine"]:
        event_id, user, channel = name.rsplit(":", 3)[1:]
        assert event_id in (plain.body["id"], keyed.body["id"])
        assert user == "ada"
        assert channel == "email"
        assert 3500 < await redis.ttl(name) <= 3600
    for name in by_stage["delivery"]:
        assert 3500 < await redis.ttl(name) <= 3600

    # Attempt counters are deleted on ack
    assert await _names(redis, f"{prefix}notif:attempts:*") == {}
