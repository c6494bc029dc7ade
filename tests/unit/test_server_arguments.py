"""NotifkitServer refuses a bad argument when it is built, naming the argument, before it
touches Redis or PostgreSQL: a wrong type surfaced as a TypeError from deep inside (a join, or
the delivery service's start after the schema was migrated), or was taken character by
character (a string of transports)."""

from __future__ import annotations

from typing import Any

import pytest

from notifkit.config import ConfigError, Settings
from notifkit.server import NotifkitServer
from notifkit.transports.base import Message, SendResult, TransportContext


class FaxTransport:
    channel = "fax"
    provider = "fax"
    idempotent = False
    rate_per_s: float | None = None

    async def open(self, ctx: TransportContext) -> None:
        return None

    async def close(self) -> None:
        return None

    async def send(self, message: Message) -> SendResult:
        raise AssertionError("never sent")


@pytest.mark.parametrize("services", [5, [1], ["api", None], b"api"],
                         ids=["int", "list-of-int", "none-inside", "bytes"])
def test_services_of_the_wrong_type_are_refused_naming_services(services: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        NotifkitServer(services=services, settings=Settings())
    assert caught.value.variable == "services"


@pytest.mark.parametrize(
    "transports",
    [5, "resend", {"email": object()}, [object()], [{}], ["x", 3], [FaxTransport()]],
    ids=["int", "str", "dict", "object", "empty-dict", "garbage", "unknown-channel"])
def test_bad_transports_are_refused_naming_transports(transports: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        NotifkitServer(services=["api"], settings=Settings(), transports=transports)
    assert caught.value.variable == "transports"


def test_a_tuple_of_transports_is_taken() -> None:
    server = NotifkitServer(services=["api"], settings=Settings(), transports=())
    assert server.transports == []
