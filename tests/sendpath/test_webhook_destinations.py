"""Webhooks reach only public addresses unless WEBHOOK_ALLOW_PRIVATE_NETWORKS is set: a
tenant's URL must not make notifkit call the deployment's own network (server-side request
forgery). The check is made on the addresses the connector connects to, so a name that looks
public but resolves to an internal address, now or after a DNS change, is refused."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Sequence

import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult

from notifkit.transports.base import Message, Outcome, SendResult
from notifkit.transports.webhook import GuardedResolver, RefusedDestination, WebhookTransport

TIMEOUT_S = 2.0


class FakeResolver(AbstractResolver):
    """A DNS server under test control: each lookup answers the next list of addresses
    (the last one again once they run out)."""

    def __init__(self, *answers: Sequence[str]) -> None:
        self.answers = list(answers)
        self.asked: list[str] = []

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        self.asked.append(host)
        addresses = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return [{"hostname": host, "host": address, "port": port,
                 "family": socket.AF_INET6 if ":" in address else socket.AF_INET,
                 "proto": 0, "flags": socket.AI_NUMERICHOST} for address in addresses]

    async def close(self) -> None:
        pass


class Receiver:
    def __init__(self) -> None:
        self.posts: list[bytes] = []
        self.port = 0

    async def hook(self, request: web.Request) -> web.Response:
        self.posts.append(await request.read())
        return web.Response(status=204)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    """A webhook receiver on this machine's loopback address."""
    got = Receiver()
    app = web.Application()
    app.router.add_post("/hook", got.hook)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    got.port = runner.addresses[0][1]
    try:
        yield got
    finally:
        await runner.cleanup()


async def post(to: str, resolver: AbstractResolver, *,
               allow_private_networks: bool = False) -> SendResult:
    transport = WebhookTransport(secret="webhook-secret-0123456789", timeout_s=TIMEOUT_S,
                                 resolver=resolver,
                                 allow_private_networks=allow_private_networks)
    await transport.open(None)  # type: ignore[arg-type]
    try:
        return await transport.send(Message(
            task_id="t-hook", event_id="e", project_id="p", user_id="u", channel="webhook",
            to=to, content={"body": "{}"}))
    finally:
        await transport.close()


async def test_a_public_looking_name_that_resolves_to_loopback_is_refused(
    receiver: Receiver,
) -> None:
    resolver = FakeResolver(["127.0.0.1"])

    result = await post(f"http://hooks.example.com:{receiver.port}/hook", resolver)

    assert resolver.asked == ["hooks.example.com"]
    assert receiver.posts == []
    assert result.outcome is Outcome.PERMANENT, result
    assert not result.maybe_accepted
    assert "destination refused" in result.detail
    assert "hooks.example.com resolves only to loopback addresses" in result.detail
    # The deployment's DNS answers are not told to the tenant who owns the URL.
    assert "127.0.0.1" not in result.detail


async def test_every_resolved_address_is_refused_by_kind(receiver: Receiver) -> None:
    resolver = FakeResolver(["10.0.0.5", "169.254.169.254", "10.1.2.3", "fd00::1"])

    result = await post(f"http://hooks.example.com:{receiver.port}/hook", resolver)

    assert result.outcome is Outcome.PERMANENT, result
    assert "only to private and link-local addresses" in result.detail


async def test_the_setting_lets_a_name_reach_a_private_address(receiver: Receiver) -> None:
    resolver = FakeResolver(["127.0.0.1"])

    result = await post(f"http://hooks.example.com:{receiver.port}/hook", resolver,
                        allow_private_networks=True)

    assert result.outcome is Outcome.SENT, result
    assert len(receiver.posts) == 1


@pytest.mark.parametrize(("url", "kind"), [
    ("http://127.0.0.1:{port}/hook", "loopback"),
    ("http://localhost:{port}/hook", "loopback"),
    ("http://[::ffff:127.0.0.1]:{port}/hook", "loopback"),
    ("https://[::1]:{port}/hook", "loopback"),
    ("https://169.254.169.254/latest/meta-data/", "link-local"),
    ("https://10.0.0.5/hook", "private"),
    ("https://100.64.0.1/hook", "carrier-grade NAT"),
    ("https://[fe80::1]/hook", "link-local"),
    ("https://0.0.0.0:{port}/hook", "unspecified"),
])
async def test_an_address_in_the_url_is_refused_without_a_lookup(
    receiver: Receiver, url: str, kind: str,
) -> None:
    resolver = FakeResolver(["93.184.216.34"])

    result = await post(url.format(port=receiver.port), resolver)

    assert result.outcome is Outcome.PERMANENT, result
    assert f" is {'an' if kind[0] in 'aeiou' else 'a'} {kind} " in result.detail
    assert receiver.posts == []
    assert resolver.asked == []


async def test_the_setting_lets_an_address_in_the_url_be_reached(receiver: Receiver) -> None:
    result = await post(f"http://127.0.0.1:{receiver.port}/hook", FakeResolver(["10.9.9.9"]),
                        allow_private_networks=True)

    assert result.outcome is Outcome.SENT, result
    assert len(receiver.posts) == 1


async def test_each_lookup_is_checked_so_a_rebound_name_is_refused() -> None:
    """DNS rebinding: a name that answered a public address, then an internal one."""
    guarded = GuardedResolver(FakeResolver(["93.184.216.34"], ["10.0.0.5"]))

    [first] = await guarded.resolve("hooks.example.com", 443, socket.AF_UNSPEC)
    assert first["host"] == "93.184.216.34"
    with pytest.raises(RefusedDestination, match="only to private addresses"):
        await guarded.resolve("hooks.example.com", 443, socket.AF_UNSPEC)


async def test_only_the_public_addresses_of_a_mixed_answer_are_connected_to() -> None:
    guarded = GuardedResolver(FakeResolver(["127.0.0.1", "93.184.216.34", "::1",
                                            "2606:4700:4700::1111"]))

    kept = await guarded.resolve("hooks.example.com", 443, socket.AF_UNSPEC)

    assert [r["host"] for r in kept] == ["93.184.216.34", "2606:4700:4700::1111"]


async def test_a_name_with_no_address_is_retried_not_refused() -> None:
    """No answer is a lookup failure like any other, not a refused destination."""
    result = await post("https://hooks.example.com/hook", FakeResolver([]))

    assert result.outcome is Outcome.RETRY, result
    assert "destination refused" not in result.detail
    assert "no address found for hooks.example.com" in result.detail
