"""Settings and the one mutable state object every simulator component shares."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import string
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from simulators.faults import FaultTable
from simulators.idempotency import IdempotencyCache
from simulators.limits import RateLimits
from simulators.receipts import ReceiptSender
from simulators.records import DEFAULT_MAX_MESSAGES, MessageStore
from simulators.stats import Stats

log = logging.getLogger("simulators")

# How often a held request looks whether its client has gone away.
HOLD_POLL_S = 0.05


@dataclass(frozen=True)
class SimSettings:
    host: str = "127.0.0.1"
    port: int = 8025  # 0 binds a free port
    smtp_port: int = 2525  # 0 binds a free port
    seed: int = 0
    max_messages: int = DEFAULT_MAX_MESSAGES
    # Largest accepted request body; SendGrid's own limit (30 MB) sits just below it.
    max_body_bytes: int = 32 * 1024 * 1024


# What uuid.UUID(version=4) does to the bits: RFC 4122 variant (10xx) and version 4 (0100).
_UUID4_KEEP = ~((0xc000 << 48) | (0xf000 << 64))
_UUID4_SET = (0x8000 << 48) | (4 << 76)


class IdSource:
    """Provider message ids, drawn from a seeded source so a replayed run names things alike."""

    def __init__(self, seed: int, generation: int = 0) -> None:
        # Each reset starts a new generation: ids stay replayable run to run, yet never repeat
        # those handed out before the reset, which a client may still hold (receipts resolve
        # by them).
        self._rng = random.Random(f"ids:{seed}" if not generation else f"ids:{seed}:{generation}")

    def hex(self, length: int) -> str:
        return "".join(self._rng.choice("0123456789abcdef") for _ in range(length))

    def token(self, length: int, alphabet: str = string.ascii_letters + string.digits) -> str:
        return "".join(self._rng.choice(alphabet) for _ in range(length))

    def uuid4(self) -> str:
        """``str(uuid.UUID(int=<128 random bits>, version=4))``, without building the UUID
        object, in half the time: one id per accepted e-mail was 4 % of a busy simulator's
        samples."""
        n = self._rng.getrandbits(128) & _UUID4_KEEP | _UUID4_SET
        h = f"{n:032x}"
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


@dataclass
class SimState:
    settings: SimSettings
    faults: FaultTable = field(init=False)
    messages: MessageStore = field(init=False)
    stats: Stats = field(default_factory=Stats)
    limits: RateLimits = field(default_factory=RateLimits)
    idempotency: IdempotencyCache = field(default_factory=IdempotencyCache)
    receipts: ReceiptSender = field(init=False)
    ids: IdSource = field(init=False)
    # Set when the simulator shuts down: held requests let go at once.
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    # Where the simulator listens, once bound (shown by /_sim/health).
    endpoints: dict[str, Any] = field(default_factory=dict)
    _generation: int = 0  # resets so far (see IdSource)

    def __post_init__(self) -> None:
        seed = self.settings.seed
        self.faults = FaultTable(seed)
        self.messages = MessageStore(self.settings.max_messages)
        self.receipts = ReceiptSender(seed)
        self.ids = IdSource(seed)

    @property
    def seed(self) -> int:
        return self.faults.seed

    def reset(self, seed: int | None = None) -> None:
        """Forget messages, faults, limits and counters, and restart every random sequence."""
        seed = self.seed if seed is None else seed
        self.faults.clear()
        self.faults.reseed(seed)
        self.messages.clear()
        self.stats.clear()
        self.limits.clear()
        self.idempotency.clear()
        self.receipts.cancel_pending()
        self.receipts.reseed(seed)
        self.receipts.reset_counters()
        self._generation += 1
        self.ids = IdSource(seed, self._generation)

    async def pause(self, seconds: float) -> None:
        """Sleep, unless the simulator is shutting down."""
        if seconds <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.closing.wait(), timeout=seconds)

    async def hold(self, request: web.BaseRequest, seconds: float) -> None:
        """Keep a request unanswered until its client gives up, `seconds` pass, or shutdown."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while not self.closing.is_set():
            transport = request.transport
            remaining = deadline - loop.time()
            if transport is None or transport.is_closing() or remaining <= 0:
                return
            await self.pause(min(HOLD_POLL_S, remaining))


STATE = web.AppKey("state", SimState)
