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

A wait for a lock another session holds (:func:`notifkit.db.availability.lock_wait`: a long
migration, VACUUM FULL, an operator's LOCK TABLE) is the same for the work that met it: the
server answers every probe, but the work is no more at fault, and a lock held for the limit's
worth of tries dead-lettered healthy entries. So it is held the same way, without a probe (the
server's error says what happened): the worker pauses for ``first_probe_s`` (doubling with
each try that meets the lock again, up to ``PROBE_MAX_S``), then reads and sweeps again, and
the held entries are retried as any failed entry is. The wait lasts, in the heartbeat and
between its one line in and one line out, until every entry held for it has gone through or
failed for a reason of its own (or has not come back for ``forget_after_s``: another process
took it over).

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

EntryKey = tuple[str, str]  # (stream, entry id)


def _never(_error: BaseException) -> bool:
    return False


@dataclass(frozen=True)
class Dependency:
    """A store a stage cannot work without: ``name`` and the ``setting`` that points at it
    (for the log lines), which failures mean it is away, a probe (its argument: seconds to
    wait for an answer), and which failures are a wait for a lock another session holds."""

    name: str
    setting: str
    unavailable: Callable[[BaseException], bool]
    answers: Callable[[float], Awaitable[bool]]
    lock_wait: Callable[[BaseException], bool] = _never


class Outage:
    """Whether a worker's dependency is away, and the probe that watches for its return; and
    whether a lock held there keeps its work waiting, and the pauses between its tries."""

    def __init__(self, dependency: Dependency, *, service: str, first_probe_s: float,
                 forget_after_s: float = 300.0) -> None:
        self.dependency = dependency
        self.service = service
        self.first_probe_s = first_probe_s
        self.forget_after_s = forget_after_s
        self.ok = asyncio.Event()  # cleared while the dependency is away, or a lock paused us
        self.ok.set()
        self.recovered = asyncio.Event()  # set when an outage ends, until the sweep it wakes
        self.cause: str | None = None
        self._since = 0.0
        self._confirming: asyncio.Future[bool] | None = None
        self._prober: asyncio.Task[None] | None = None
        # A wait for a lock held elsewhere, while it lasts: its cause, the entries held for
        # it (-> when last held), and the pause before the next try.
        self.lock_cause: str | None = None
        self._lock_since = 0.0
        self._lock_pause_s = first_probe_s
        self._lock_held: dict[EntryKey, float] = {}
        self._resumer: asyncio.Task[None] | None = None

    @property
    def holding(self) -> bool:
        return not self.ok.is_set()

    def waiting_for(self) -> str | None:
        """What the heartbeat says while an outage or a lock wait lasts (None when neither
        does). Asked at every heartbeat, it also ends a lock wait whose held entries have
        not come back for ``forget_after_s``."""
        if self.cause is None and self.lock_cause is not None:
            self._forget_stale()
        if self.cause is None and self.lock_cause is not None:
            doing = ("reading and reclaiming paused" if self.holding
                     else "retrying them as they come due")
            return (f"waiting for a lock held in {self.dependency.name} "
                    f"({self.dependency.setting}) to be released ({self.lock_cause}); "
                    f"{len(self._lock_held)} entries held without counting the attempt, "
                    f"{doing}")
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
        if self.cause is not None:
            return True
        if self._confirming is None:
            # Batches failing together share one probe.
            self._confirming = asyncio.ensure_future(self._answers())
            self._confirming.add_done_callback(self._confirmed)
        answered = await asyncio.shield(self._confirming)
        if answered:
            return False
        if self.cause is None:
            self._begin(error)
        return True

    def lock_waited(self, error: BaseException, held: list[EntryKey]) -> None:
        """``held`` (entries whose attempt is given back) waited on a lock another session
        holds until ``error``: pause reading and reclaiming for a while, longer each time the
        wait is met again, and say so once, when the wait begins."""
        if self.cause is not None:
            return  # an outage holds everything already, and its probe ends it
        now = time.monotonic()
        self._lock_held.update(dict.fromkeys(held, now))
        text = _describe(error)
        if self.lock_cause is None:
            self._lock_since = now
            self._lock_pause_s = self.first_probe_s
            log.warning(
                "%s (%s) answers, but a lock held by another session kept the %s worker's "
                "work waiting past its limit (%s): the worker keeps the entries that waited "
                "pending without counting the attempt, pauses reading for %g s or so, and "
                "retries them until the lock is released.", self.dependency.name,
                self.dependency.setting, self.service, text, self.first_probe_s,
                extra={"service": self.service, "outage": "start", "reason": "lock"},
            )
        elif not self.holding:
            # Met again after a pause: pause longer before the next try.
            self._lock_pause_s = min(self._lock_pause_s * 2,
                                     max(PROBE_MAX_S, self.first_probe_s))
        self.lock_cause = text
        if not self.holding:
            self.recovered.clear()
            self.ok.clear()
            self._resumer = asyncio.create_task(self._resume_after(self._lock_pause_s),
                                                name=f"{self.service}:lock-pause")

    async def _resume_after(self, pause_s: float) -> None:
        await asyncio.sleep(pause_s)
        if self.cause is None:  # else the outage's probe resumes the worker
            self.ok.set()
            self.recovered.set()
            if not self._lock_held:  # what it held went through during the pause
                self._end_lock_wait()

    def settled(self, entries: list[EntryKey]) -> None:
        """``entries`` went through, or failed for a reason of their own: those held for a
        lock wait no longer wait, and when none does, the wait is over."""
        if self.lock_cause is None:
            return
        for key in entries:
            self._lock_held.pop(key, None)
        if not self._lock_held and not self.holding:
            self._end_lock_wait()

    def _forget_stale(self) -> None:
        """Entries held for the lock that have not come back for ``forget_after_s`` (another
        process took them over, or they were deleted) are no longer waited for."""
        oldest = time.monotonic() - self.forget_after_s
        for key in [k for k, held_at in self._lock_held.items() if held_at < oldest]:
            del self._lock_held[key]
        if not self._lock_held and not self.holding:
            self._end_lock_wait()

    def _end_lock_wait(self) -> None:
        if self.lock_cause is None:
            return
        lasted = time.monotonic() - self._lock_since
        log.info("The %s worker's work no longer waits on a lock in %s after %.1f s: the "
                 "entries it held have gone through.", self.service, self.dependency.name,
                 lasted, extra={"service": self.service, "outage": "end", "reason": "lock",
                                "outage_s": round(lasted, 3)})
        self.lock_cause = None
        self._lock_held.clear()

    def _confirmed(self, _probe: asyncio.Future[bool]) -> None:
        self._confirming = None

    async def _answers(self) -> bool:
        try:
            return await self.dependency.answers(PROBE_TIMEOUT_S)
        except Exception:  # a probe that cannot even be made got no answer
            return False

    def _begin(self, error: BaseException) -> None:
        self.cause = _describe(error)
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
        if self._resumer is not None:
            await cancel_and_wait(self._resumer)
            self._resumer = None
        if self._confirming is not None:
            self._confirming.cancel()
        self.cause = None
        self.lock_cause = None
        self._lock_held.clear()
        self.ok.set()


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
