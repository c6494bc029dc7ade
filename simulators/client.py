"""The control API as Python methods, in-process (`SimulatorServer`) or over HTTP.

`SimulatorControl` defines every method once; a subclass only says how one operation is
carried out. `SimulatorServer` runs them directly on its own state, `SimulatorClient` sends
them to a simulator running elsewhere (another process, a staging host). Both raise
`ControlError` for input the simulator refuses, with the same message.
"""

from __future__ import annotations

import asyncio
import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, cast
from urllib.parse import quote

import aiohttp

from simulators import control
from simulators.faults import FaultItem
from simulators.limits import LimitItem
from simulators.receipts import ReceiptsItem
from simulators.records import MessageItem
from simulators.state import SimState
from simulators.stats import ProviderStatsItem
from simulators.validation import ControlError

WAIT_POLL_S = 0.02


@dataclass(frozen=True)
class Op:
    """One control operation: its HTTP route and the function that performs it in-process."""

    method: str
    path: str  # "{arg}" is replaced by the operation's argument
    local: Callable[[SimState, Any], Any]


ADD_FAULT = Op("POST", "/_sim/faults", control.add_fault)
LIST_FAULTS = Op("GET", "/_sim/faults", lambda state, _: control.list_faults(state))
DELETE_FAULT = Op("DELETE", "/_sim/faults/{arg}", control.delete_fault)
CLEAR_FAULTS = Op("DELETE", "/_sim/faults", lambda state, _: control.clear_faults(state))
MESSAGES = Op("GET", "/_sim/messages", control.list_messages)
STATS = Op("GET", "/_sim/stats", lambda state, _: control.stats(state))
SET_LIMIT = Op("POST", "/_sim/limits", control.set_limit)
LIST_LIMITS = Op("GET", "/_sim/limits", lambda state, _: control.list_limits(state))
CLEAR_LIMITS = Op("DELETE", "/_sim/limits", lambda state, _: control.clear_limits(state))
SET_RECEIPTS = Op("POST", "/_sim/receipts", control.set_receipts)
GET_RECEIPTS = Op("GET", "/_sim/receipts", lambda state, _: control.get_receipts(state))
DISABLE_RECEIPTS = Op("DELETE", "/_sim/receipts", lambda state, _: control.disable_receipts(state))
RESET = Op("POST", "/_sim/reset", control.reset)
HEALTH = Op("GET", "/_sim/health", lambda state, _: control.health(state))


def _present(values: dict[str, Any]) -> dict[str, Any]:
    """Leave out what the caller did not set, so the simulator's defaults apply."""
    return {key: value for key, value in values.items() if value is not None}


class SimulatorControl(ABC):
    @abstractmethod
    async def _call(self, op: Op, payload: Any = None) -> Any:
        """Perform `op`; payload is the JSON body, the query (GET) or the path argument."""

    async def add_fault(
        self,
        kind: str,
        provider: str = "*",
        *,
        to: str | None = None,
        probability: float | None = None,
        times: int | None = None,
        status: int | None = None,
        retry_after_s: float | None = None,
        delay_ms: int | tuple[int, int] | None = None,
    ) -> FaultItem:
        """Add a rule after the existing ones; returns it with its `id`.

        `provider` is required by the control API; this method sends "*" (every provider)
        when it is left out."""
        delay = list(delay_ms) if isinstance(delay_ms, tuple) else delay_ms
        payload = _present(
            {
                "provider": provider,
                "kind": kind,
                "to": to,
                "probability": probability,
                "times": times,
                "status": status,
                "retryAfter": retry_after_s,
                "delayMs": delay,
            }
        )
        return cast(FaultItem, await self._call(ADD_FAULT, payload))

    async def faults(self) -> list[FaultItem]:
        return cast(list[FaultItem], (await self._call(LIST_FAULTS))["items"])

    async def remove_fault(self, rule_id: str) -> None:
        await self._call(DELETE_FAULT, rule_id)

    async def clear_faults(self) -> None:
        await self._call(CLEAR_FAULTS)

    async def messages(
        self,
        provider: str | None = None,
        *,
        to: str | None = None,
        task_id: str | None = None,
        limit: int | None = None,
    ) -> list[MessageItem]:
        """Accepted messages, newest first."""
        query = _present({"provider": provider, "to": to, "taskId": task_id})
        if limit is not None:
            query["limit"] = str(limit)
        return cast(list[MessageItem], (await self._call(MESSAGES, query))["items"])

    async def wait_for_messages(
        self,
        count: int = 1,
        provider: str | None = None,
        *,
        to: str | None = None,
        task_id: str | None = None,
        timeout_s: float = 5.0,
    ) -> list[MessageItem]:
        """Wait until at least `count` messages match, then return them (newest first)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            found = await self.messages(provider, to=to, task_id=task_id)
            if len(found) >= count:
                return found
            if loop.time() >= deadline:
                raise TimeoutError(
                    f"expected {count} message(s) for provider={provider} to={to} "
                    f"task_id={task_id} within {timeout_s}s, found {len(found)}"
                )
            await asyncio.sleep(WAIT_POLL_S)

    async def stats(self) -> dict[str, ProviderStatsItem]:
        return cast(dict[str, ProviderStatsItem], await self._call(STATS))

    async def set_limit(
        self, provider: str, rate_per_s: float, burst: int | None = None
    ) -> list[LimitItem]:
        """Meter each API key of `provider` (or `*`) with a token bucket; returns all limits."""
        payload = _present({"provider": provider, "ratePerSecond": rate_per_s, "burst": burst})
        return cast(list[LimitItem], (await self._call(SET_LIMIT, payload))["items"])

    async def limits(self) -> list[LimitItem]:
        return cast(list[LimitItem], (await self._call(LIST_LIMITS))["items"])

    async def clear_limits(self) -> None:
        await self._call(CLEAR_LIMITS)

    async def set_receipts(
        self,
        url: str,
        secret: str,
        *,
        delay_ms: int | None = None,
        delivered: float | None = None,
        bounced: float | None = None,
        complained: float | None = None,
        opened: float | None = None,
        clicked: float | None = None,
    ) -> ReceiptsItem:
        payload = _present(
            {
                "url": url,
                "secret": secret,
                "delayMs": delay_ms,
                "delivered": delivered,
                "bounced": bounced,
                "complained": complained,
                "opened": opened,
                "clicked": clicked,
            }
        )
        return cast(ReceiptsItem, await self._call(SET_RECEIPTS, payload))

    async def receipts(self) -> ReceiptsItem:
        return cast(ReceiptsItem, await self._call(GET_RECEIPTS))

    async def disable_receipts(self) -> None:
        await self._call(DISABLE_RECEIPTS)

    async def drain_receipts(self, timeout_s: float = 30.0) -> None:
        """Wait until no receipt is waiting to be posted (each is posted or given up on)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (await self.receipts())["pending"]:
            if loop.time() >= deadline:
                raise TimeoutError(f"receipts still pending after {timeout_s}s")
            await asyncio.sleep(WAIT_POLL_S)

    async def reset(self, seed: int | None = None) -> int:
        """Clear messages, faults, limits and counters and restart the random sequences.

        Returns the seed now in use (`seed`, or the current one).
        """
        result = await self._call(RESET, _present({"seed": seed}))
        return int(result["seed"])

    async def health(self) -> dict[str, Any]:
        return cast(dict[str, Any], await self._call(HEALTH))


class SimulatorClient(SimulatorControl):
    """Control a simulator over HTTP: `async with SimulatorClient("http://host:8025") as sim:`."""

    def __init__(
        self,
        base_url: str,
        *,
        session: aiohttp.ClientSession | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._session = session
        self._own_session = session is None
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def __aenter__(self) -> SimulatorClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def _call(self, op: Op, payload: Any = None) -> Any:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        path = op.path
        options: dict[str, Any] = {}
        if "{arg}" in path:
            # One path segment, whatever it holds: a "#", "?" or "/" in a rule id must not
            # end it early (and so remove another rule, or be refused as a query).
            path = path.replace("{arg}", quote(str(payload), safe=""))
        elif op.method == "GET":
            options["params"] = payload or {}
        elif payload is not None:
            options["json"] = payload
        async with self._session.request(op.method, self.base_url + path, **options) as response:
            if response.status == 204:
                return None
            text = await response.text(errors="replace")
            try:
                body = json.loads(text)
            except ValueError:
                # Not the simulator answering (a proxy's error page, another server at that
                # URL): say what came back instead of failing to decode it.
                snippet = " ".join(text.split())[:200]
                raise ControlError(
                    f"HTTP {response.status} from {op.method} {self.base_url}{path} is not the "
                    f"simulator's JSON: {snippet!r}", status=response.status,
                ) from None
            if response.status >= 400:
                message = body.get("error") if isinstance(body, dict) else None
                raise ControlError(
                    str(message or f"HTTP {response.status}"), status=response.status
                )
            return body
