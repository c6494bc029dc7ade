"""Every numeric control field refuses a number of any size with a 400 naming the field.

JSON integers have no size limit and Python reads them exactly, so a 400-digit integer
reaches the range checks intact; it must be refused like any other out-of-range number.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from simulators import ControlError, SimulatorServer

HUGE = int("9" * 401)
RECEIPTS = {"url": "http://127.0.0.1:9/hooks", "secret": "s"}

# (path, the body without the field, the field)
NUMERIC_FIELDS = [
    ("/_sim/faults", {"provider": "resend", "kind": "error"}, "probability"),
    ("/_sim/faults", {"provider": "resend", "kind": "error"}, "times"),
    ("/_sim/faults", {"provider": "resend", "kind": "error"}, "status"),
    ("/_sim/faults", {"provider": "resend", "kind": "error"}, "retryAfter"),
    ("/_sim/faults", {"provider": "resend", "kind": "latency"}, "delayMs"),
    ("/_sim/limits", {"provider": "resend", "ratePerSecond": 1}, "burst"),
    ("/_sim/limits", {"provider": "resend"}, "ratePerSecond"),
    ("/_sim/receipts", RECEIPTS, "delayMs"),
    *[("/_sim/receipts", RECEIPTS, event)
      for event in ("delivered", "bounced", "complained", "opened", "clicked")],
    ("/_sim/reset", {}, "seed"),
]


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.mark.parametrize(
    "value", [HUGE, -HUGE, 10**400, 1e308, -1e308],
    ids=["401-digits", "minus-401-digits", "1e400", "1e308", "minus-1e308"],
)
@pytest.mark.parametrize(("path", "base", "field"), NUMERIC_FIELDS)
async def test_a_number_of_any_size_is_400_naming_the_field(
    http: aiohttp.ClientSession,
    sim: SimulatorServer,
    path: str,
    base: dict[str, Any],
    field: str,
    value: int | float,
) -> None:
    # Written by hand: the test must send the integer digit for digit.
    raw = json.dumps({**base, field: value}).encode()
    async with http.post(sim.base_url + path, data=raw) as response:
        assert response.status == 400, await response.text()
        assert f"'{field}'" in (await response.json())["error"]


@pytest.mark.parametrize("value", [HUGE, -HUGE], ids=["401-digits", "minus-401-digits"])
async def test_a_delay_range_of_huge_numbers_is_400(
    http: aiohttp.ClientSession, sim: SimulatorServer, value: int
) -> None:
    body = {"provider": "resend", "kind": "latency", "delayMs": [0, value]}
    async with http.post(sim.base_url + "/_sim/faults", data=json.dumps(body)) as response:
        assert response.status == 400
        assert "'delayMs'" in (await response.json())["error"]


async def test_python_control_methods_raise_control_error_for_huge_numbers(
    sim: SimulatorServer,
) -> None:
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: sim.add_fault("error", "resend", probability=10**400),
        lambda: sim.add_fault("error", "resend", retry_after_s=-(10**400)),
        lambda: sim.add_fault("error", "resend", times=10**400),
        lambda: sim.set_limit("resend", 10**400),
        lambda: sim.set_receipts("http://127.0.0.1:9/hooks", "s", delivered=10**400),
        # Past the 4300 digits Python will write as text: the message cannot quote it.
        lambda: sim.add_fault("error", "resend", status=10**5000),
        lambda: sim.add_fault("error", "resend", probability=-(10**5000)),
        lambda: sim.reset(seed=10**5000),
    ]
    for call in calls:
        with pytest.raises(ControlError) as caught:
            await call()
        assert caught.value.status == 400
    assert await sim.faults() == []
    assert await sim.limits() == []
