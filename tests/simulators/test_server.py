"""SimulatorServer lifecycle: free ports, bounded memory, and a shutdown that never waits for
requests it is deliberately holding."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from simulators import SimulatorServer

EMAIL = {"from": "a@example.com", "to": "b@example.com", "subject": "s", "text": "t"}
AUTH = {"Authorization": "Bearer re_1"}


async def test_two_servers_get_their_own_free_ports() -> None:
    async with SimulatorServer() as one, SimulatorServer() as two:
        assert one.port != two.port
        assert one.smtp_port != two.smtp_port
        assert one.base_url == f"http://127.0.0.1:{one.port}"


async def test_smtp_can_be_left_out() -> None:
    async with SimulatorServer(smtp_port=None) as sim:
        assert sim.smtp_port == 0
        assert (await sim.health())["smtpPort"] is None


async def test_ring_buffer_keeps_the_newest_messages() -> None:
    async with (
        SimulatorServer(max_messages=3, smtp_port=None) as sim,
        aiohttp.ClientSession() as http,
    ):
        for n in range(5):
            headers = {**AUTH, "X-Notifkit-Task-Id": "same-task"}
            async with http.post(sim.base_url + "/emails", json=EMAIL, headers=headers) as response:
                assert response.status == 200, n
        kept = await sim.messages()
        assert [m["acceptCount"] for m in kept] == [5, 4, 3]
        assert (await sim.stats())["resend"]["duplicates"] == 4


@pytest.mark.parametrize("kind", ["timeout", "lost_response"])
async def test_stop_releases_held_requests_at_once(kind: str) -> None:
    sim = SimulatorServer(smtp_port=None)
    await sim.start()
    await sim.add_fault(kind, "resend")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        held = asyncio.create_task(http.post(sim.base_url + "/emails", json=EMAIL, headers=AUTH))
        await asyncio.sleep(0.2)
        assert not held.done()

        loop = asyncio.get_running_loop()
        started = loop.time()
        await sim.stop()

        assert loop.time() - started < 1.5
        with pytest.raises(aiohttp.ClientError):
            await asyncio.wait_for(held, 5)


async def test_a_second_start_while_running_is_refused_and_the_first_keeps_serving() -> None:
    # It bound a second pair of ports and lost the first runner, whose port stayed open
    # after stop(); a nested `async with` then stopped the server under the outer block.
    async with SimulatorServer() as sim:
        port = sim.port
        with pytest.raises(RuntimeError, match="already running"):
            async with sim:
                pass
        assert sim.port == port
        assert (await sim.health())["ok"] is True
        async with aiohttp.ClientSession() as http, http.get(
                f"{sim.base_url}/_sim/health") as response:
            assert response.status == 200
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.ClientConnectionError):
            await http.get(f"http://127.0.0.1:{port}/_sim/health")
    async with sim:  # once stopped, it starts again
        assert (await sim.health())["ok"] is True


@pytest.mark.parametrize(
    ("arguments", "error", "named"),
    [
        ({"port": -1}, ValueError, "port"),
        ({"port": 65536}, ValueError, "port"),
        ({"port": "x"}, TypeError, "port"),
        ({"port": True}, TypeError, "port"),
        ({"smtp_port": 70000}, ValueError, "smtp_port"),
        ({"smtp_port": 2.5}, TypeError, "smtp_port"),
        ({"seed": "x"}, TypeError, "seed"),
        ({"seed": -1}, ValueError, "seed"),
        ({"seed": 2**64}, ValueError, "seed"),
        ({"max_messages": 0}, ValueError, "max_messages"),
        ({"max_messages": "10"}, TypeError, "max_messages"),
        ({"host": 5}, TypeError, "host"),
        ({"host": " "}, ValueError, "host"),
    ],
    ids=lambda value: repr(value) if isinstance(value, dict) else "",
)
def test_bad_arguments_are_refused_naming_them(
        arguments: dict[str, object], error: type[Exception], named: str) -> None:
    with pytest.raises(error, match=rf"^{named}\b"):
        SimulatorServer(**arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["latency", "timeout"])
async def test_a_server_started_again_still_holds_what_its_faults_hold(kind: str) -> None:
    # The first stop released held requests for good: started again, a latency rule answered
    # at once and a timeout closed the connection at once, as if shutting down.
    sim = SimulatorServer(smtp_port=None)
    async with sim:
        pass
    async with sim, aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        await sim.add_fault(kind, "resend", delay_ms=300)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with http.post(sim.base_url + "/emails", json=EMAIL, headers=AUTH) as response:
                assert response.status == 200
        except aiohttp.ClientError:
            assert kind == "timeout"
        assert loop.time() - started >= 0.25
