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
