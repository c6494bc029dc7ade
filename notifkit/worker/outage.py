"""Holding work while a store the stage cannot work without (PostgreSQL) is away.

Every try of an entry counts against its attempt limit (CONTRACT §3), and a reclaim sweep
retries a failed entry every ``RECLAIM_MIN_IDLE_SECONDS``: without this, an outage longer than
the limit's worth of sweeps (three minutes with the defaults) dead-lettered every entry in
flight, each with a ``notification:failed`` event, although nothing was wrong with them. So:

- a failure the dependency calls its own unavailability (:func:`notifkit.db.availability
  .unavailable`: a connection refused or reset, a pool that cannot connect, a query cut off by
  its time limit; never a constraint violation or bad data), confirmed by a probe that gets no
  answer, starts an outage;
- during it the worker reads nothing new and reclaims nothing; the entries that met it stay
  pending, and the attempt they were counted for is given back, unless the stage did
  something in it that cannot be taken back (``Entry.irreversible``: a provider was called, a
  model paid), in which case the attempt happened and counts;
- a probe (``SELECT 1``) runs every ``PROBE_FIRST_S`` (or the reclaim interval, if shorter),
  doubling up to ``PROBE_MAX_S``; the first answer ends the outage, and a reclaim sweep runs
  at once for the entries held meanwhile;
- one log line when it starts and one when it ends, never one per probe; meanwhile the
  heartbeat's ``readError`` says what the worker waits for, so ``/health`` is ``degraded``.

On the healthy path nothing here runs: the worker only looks at a local flag before a read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from notifkit.tasks import cancel_and_wait

log = logging.getLogger("notifkit.worker")

# The first probe comes this soon after an outage starts (or after the reclaim interval, if
# shorter); each probe that gets no answer doubles the wait, up to PROBE_MAX_S.
PROBE_FIRST_S = 1.0
PROBE_MAX_S = 5.0
# A probe not answered within this is a failed one. Generous: a healthy server whose pool is
# busy with other batches must not look down.
PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Dependency:
    """A store a stage cannot work without: ``name`` and the ``setting`` that points at it
    (for the log lines), which failures mean it is away, and a probe (its argument: seconds
    to wait for an answer)."""

    name: str
    setting: str
    unavailable: Callable[[BaseException], bool]
    answers: Callable[[float], Awaitable[bool]]


class Outage:
    """Whether a worker's dependency is away, and the probe that watches for its return."""

    def __init__(self, dependency: Dependency, *, service: str, first_probe_s: float) -> None:
        self.dependency = dependency
        self.service = service
        self.first_probe_s = first_probe_s
        self.ok = asyncio.Event()  # cleared while the dependency is away
        self.ok.set()
        self.recovered = asyncio.Event()  # set when an outage ends, until the sweep it wakes
        self.cause: str | None = None
        self._since = 0.0
        self._confirming: asyncio.Future[bool] | None = None
        self._prober: asyncio.Task[None] | None = None

    @property
    def holding(self) -> bool:
        return not self.ok.is_set()

    def waiting_for(self) -> str | None:
        """What the heartbeat says while an outage lasts (None when there is none)."""
        if not self.holding:
            return None
        return (f"waiting for {self.dependency.name} ({self.dependency.setting}) to answer "
                f"again ({self.cause}); reading and reclaiming paused")

    async def confirms(self, error: BaseException) -> bool:
        """Whether ``error`` is the dependency being away: its kind says so, and either an
        outage is already known or a probe gets no answer (a timeout or a reset connection
        can also be the work's own doing). A confirmed one starts the outage."""
        if not self.dependency.unavailable(error):
            return False
        if self.holding:
            return True
        if self._confirming is None:
            # Batches failing together share one probe.
            self._confirming = asyncio.ensure_future(self._answers())
            self._confirming.add_done_callback(self._confirmed)
        answered = await asyncio.shield(self._confirming)
        if answered:
            return False
        if not self.holding:
            self._begin(error)
        return True

    def _confirmed(self, _probe: asyncio.Future[bool]) -> None:
        self._confirming = None

    async def _answers(self) -> bool:
        try:
            return await self.dependency.answers(PROBE_TIMEOUT_S)
        except Exception:  # a probe that cannot even be made got no answer
            return False

    def _begin(self, error: BaseException) -> None:
        self.cause = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        self._since = time.monotonic()
        self.recovered.clear()
        self.ok.clear()
        log.warning(
            "%s (%s) is unavailable (%s): the %s worker stops reading and reclaiming, and "
            "keeps the entries that met the outage pending without counting the attempt; it "
            "asks %s again every %g s or so until it answers.", self.dependency.name,
            self.dependency.setting, self.cause, self.service, self.dependency.name,
            self.first_probe_s, extra={"service": self.service, "outage": "start"},
        )
        self._prober = asyncio.create_task(self._probe_until_answered(),
                                           name=f"{self.service}:outage-probe")

    async def _probe_until_answered(self) -> None:
        delay = self.first_probe_s
        probes = 0
        while True:
            await asyncio.sleep(delay)
            probes += 1
            if await self._answers():
                break
            delay = min(delay * 2, max(PROBE_MAX_S, self.first_probe_s))
        lasted = time.monotonic() - self._since
        log.info("%s answers again after %.1f s (%d probes): the %s worker reads and reclaims "
                 "again, the entries it held first.", self.dependency.name, lasted, probes,
                 self.service, extra={"service": self.service, "outage": "end",
                                      "outage_s": round(lasted, 3)})
        self.cause = None
        self.ok.set()
        self.recovered.set()

    async def close(self) -> None:
        """Stop probing. A worker started again reads at once: a failure starts a new outage
        if the dependency is still away, and no prober would be left to end this one."""
        if self._prober is not None:
            await cancel_and_wait(self._prober)
            self._prober = None
        if self._confirming is not None:
            self._confirming.cancel()
        self.cause = None
        self.ok.set()
