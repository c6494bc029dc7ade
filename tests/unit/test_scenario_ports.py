"""The ports the scenario harness hands its processes: another program, or another run picking
from the same range, must not take one between the choice and the child's bind, which failed
the run with the child's "address already in use"."""

from __future__ import annotations

import asyncio
import errno
import random
import socket
from collections.abc import Iterator

import pytest

from scenarios.processes import free_port


def picks(monkeypatch: pytest.MonkeyPatch, *ports: int) -> None:
    """Make the harness's random choices ``ports``, in order."""
    chosen: Iterator[int] = iter(ports)
    monkeypatch.setattr(random, "randint", lambda _low, _high: next(chosen))


def unused_ports(count: int) -> list[int]:
    """``count`` different ports nothing uses now (held together, so none repeats)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def test_a_port_handed_out_cannot_be_taken_before_the_child_binds_it() -> None:
    port = free_port()

    # Another program's plain bind (another run's check, say) is refused meanwhile
    with socket.socket() as other, pytest.raises(OSError) as refused:
        other.bind(("127.0.0.1", port))
    assert refused.value.errno == errno.EADDRINUSE


def test_the_child_listens_on_the_port_it_was_handed() -> None:
    port = free_port()

    async def listen() -> int:
        # As the simulators, notifkit's api and the proxy do (asyncio's servers)
        server = await asyncio.start_server(lambda _r, _w: None, "127.0.0.1", port)
        bound = int(server.sockets[0].getsockname()[1])
        server.close()
        await server.wait_closed()
        return bound

    assert asyncio.run(listen()) == port


def test_a_port_is_not_handed_out_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given the random choice repeating itself (the simulators' HTTP and SMTP ports are
    # chosen one after the other, before either is bound)
    first, second = unused_ports(2)
    picks(monkeypatch, first, first, second)

    # Then the second choice is another port
    assert (free_port(), free_port()) == (first, second)


def test_a_port_something_listens_on_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        [free] = unused_ports(1)
        picks(monkeypatch, int(taken.getsockname()[1]), free)

        assert free_port() == free
