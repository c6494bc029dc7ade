"""SIGKILL enricher, engine and delivery processes mid-flight, repeatedly, under load, while a
second process of each stage keeps running.

Proves: nothing accepted is lost; the entries a killed process held are reclaimed by the
surviving process of its stage; a provider without idempotency keys (Twilio) receives a task
twice only if that task was in the killed process's hands, and a provider with them (Resend)
never does.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from typing import Any

from scenarios.harness import RunOptions, Sent, System, basic_template, summarize_counter
from scenarios.report import ScenarioResult

DESCRIPTION = ("SIGKILL enricher/engine/delivery workers mid-flight under load; a survivor "
               "reclaims; 0 lost, duplicates only for sends in flight")
PARAMS: dict[str, Any] = {
    "users": 100,
    "messages": 600,  # at least; traffic lasts as long as the kills
    "kills": 3,  # per stage
    "send_rate_per_s": 150,
    "provider_delay_ms": 80,  # keeps sends in flight long enough to be caught by a kill,
    "drain_timeout_s": 60.0,  # waiting longer than this for quiescence is a violation
}
# No kill, nothing to reclaim; no message, no traffic asked for; a drain timeout of 0 calls
# every send still on its way lost.
POSITIVE = frozenset({"users", "messages", "kills", "send_rate_per_s", "drain_timeout_s"})

STAGES = ("enricher", "engine", "delivery")
RECLAIMED = re.compile(r"^Reclaimed (\d+) idle entries")


def layout() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"api": ["api"], "aux": ["scheduler", "events"]}
    for stage in STAGES:
        out[f"{stage}-1"] = [stage]  # the victim
        out[f"{stage}-2"] = [stage]  # the survivor
    return out


async def run(options: RunOptions, params: dict[str, Any]) -> ScenarioResult:
    result = ScenarioResult(options.name, options.seed)
    rng = random.Random(options.seed)
    async with System(options, layout()) as system:
        users = await system.bootstrap(
            users=int(params["users"]), channels=("email", "sms"),
            templates={"mail": basic_template(["email"]), "text": basic_template(["sms"])},
        )
        for provider in ("resend", "twilio"):
            await system.sim.add_fault("latency", provider,
                                       delay_ms=int(params["provider_delay_ms"]))
        stop = asyncio.Event()
        in_flight_tasks: set[str] = set()
        orphaned: dict[str, int] = {}
        kills: list[str] = []
        not_taken_over: list[str] = []
        # A survivor's sweep runs every reclaim interval and takes entries idle that long.
        takeover_s = 4 * options.reclaim_s + 4.0

        async def killer() -> None:
            rounds = int(params["kills"])
            for round_no in range(rounds):
                for stage in STAGES:
                    if stop.is_set():
                        return
                    victim = f"{stage}-1"
                    await asyncio.sleep(rng.uniform(0.2, 0.6))
                    await stop_mid_flight(system, victim, stage, rng, time.monotonic() + 4.0)
                    await system.kill(victim)
                    # What it held is now orphaned: the pending list says so exactly.
                    held = await system.pending_of(victim, stage)
                    orphaned[stage] = orphaned.get(stage, 0) + len(held)
                    if stage == "delivery":
                        in_flight_tasks.update(await system.task_ids_of(held))
                    kills.append(f"{victim} (round {round_no + 1}, held {len(held)})")
                    system.say(f"killed {victim}; it held {len(held)} entries", force=True)
                    # Only the survivor runs now: it alone must take over what the victim held.
                    left = await wait_for_takeover(system, victim, stage, takeover_s)
                    if left:
                        not_taken_over.append(f"{victim}: {len(left)} of {len(held)}")
                    await system.restart(victim)

        killing = asyncio.create_task(killer())
        # Traffic keeps flowing for as long as the kills go on (and at least `messages`).
        sent: list[Sent] = []
        rate = float(params["send_rate_per_s"])
        wave = max(1, int(rate))
        while len(sent) < int(params["messages"]) or not killing.done():
            n = len(sent)
            sent += await system.send_paced(
                [(users[(n + i) % len(users)], {"template": "mail" if (n + i) % 2 else "text"})
                 for i in range(wave)], rate_per_s=rate, label=f"sending (sent {n})")
        await killing
        stop.set()
        waiting = await system.quiesce(float(params["drain_timeout_s"]))
        result.check(not waiting, f"the system never drained: {waiting}")
        # A crash costs no notification: none may be given up on (the accounting's rule).
        await system.account(sent, result)

        # Every entry a killed process held was reclaimed and finished: nothing is pending for
        # any consumer that no longer exists.
        stale = await system.pending_of_dead_consumers()
        result.check(not stale, f"entries still pending for killed consumers: {stale}")
        # Taken over by the survivor: each victim stays dead until what it held has moved,
        # so the survivor's own reclaim sweeps must account for every orphan of its stage.
        reclaimed = reclaimed_entries(system)
        # A stage whose victims never held anything when killed proves nothing about reclaim.
        for stage in STAGES:
            result.check(orphaned.get(stage, 0) > 0,
                         f"no {stage} kill caught an entry in flight: the kills proved nothing "
                         "for that stage (raise send_rate_per_s or kills; a worker that acks "
                         "what it reads before it is done holds nothing to catch)")
        for problem in not_reclaimed_by_survivor(orphaned, reclaimed):
            result.check(False, problem)
        result.check(not not_taken_over,
                     "the survivor did not take over what a killed process held within "
                     f"{takeover_s:g} s: {', '.join(not_taken_over)}")
        result.facts.update(kills=kills, orphaned=orphaned, reclaimed_entries_by=reclaimed,
                            in_flight_at_kill=len(in_flight_tasks))

        # Duplicates: attribute each one. Only a provider without idempotency keys may get a
        # task twice, and only if a killed delivery process held it or an attempt's answer
        # was lost (a timeout on a loaded machine; the timeline says so).
        dupes = await system.duplicates()
        result.duplicates.clear()
        lost_answers = set(await system.unanswered_attempts(list(dupes)))
        for task_id, (provider, extra) in dupes.items():
            if provider == "resend":
                result.check(False, f"Resend accepted task {task_id} {extra + 1} times despite "
                                    "its idempotency key")
                cause = "despite idempotency key"
            elif task_id in in_flight_tasks:
                cause = "in flight at a kill"
            elif task_id in lost_answers:
                cause = "answer lost (timeout)"
            else:
                event = await system.event_of_task(task_id)
                result.check(False, f"{provider} accepted task {task_id} (notification "
                                    f"{event}) {extra + 1} times, but it was neither in flight "
                                    "in a killed process nor retried after a lost answer")
                cause = "unexplained"
            result.duplicates[f"{provider}: {cause}"] += extra
        result.facts["duplicates"] = summarize_counter(result.duplicates)
        system.check_alive(result, [n for n in system.layout if not n.endswith("-1")])
    return result


async def stop_mid_flight(system: System, victim: str, stage: str, rng: random.Random,
                          deadline: float) -> None:
    """Leave ``victim`` stopped (SIGSTOP) while it works on entries, or at ``deadline``.

    Working on, not just read: an entry pending at one look and still pending at a second,
    the victim having run in between until its event loop waited for I/O (what it was about to
    send, an ack included, went out first). Holding out for any pending entry stopped the
    victim in the moment between its read and what it does next, and a worker that acked on
    read (at-least-once broken) then lost nothing to the kill: its entries were still pending,
    and the survivor reclaimed them. It is stopped while its pending list is read, so what it
    holds then is what it holds when killed."""
    while True:
        system.pause(victim)
        first = set(await system.pending_of(victim, stage))
        if first:
            await let_run(system, victim, rng)
            if first & set(await system.pending_of(victim, stage)):
                return
        if time.monotonic() >= deadline:
            return
        system.resume(victim)
        await asyncio.sleep(0.02)


async def let_run(system: System, victim: str, rng: random.Random) -> None:
    """Resume the stopped ``victim`` until its event loop has waited twice (two voluntary
    context switches: on a loaded machine a few milliseconds may pass without it running at
    all), then stop it again at once.

    Watched without yielding for the first few milliseconds: a stage like the enricher is
    done with an entry a millisecond after its second wait on a fast machine, so a watch that
    slept a millisecond between looks (and first let it run 2-6 ms) stopped it after its ack
    nearly every time, and a CI-sized run's kills all found it idle."""
    pid = system.processes[victim].pid
    before = voluntary_switches(pid)
    system.resume(victim)
    started = time.monotonic()
    spin_until, give_up = started + rng.uniform(0.004, 0.006), started + 0.5
    while before is not None and time.monotonic() < give_up:
        now = voluntary_switches(pid)
        if now is None or now >= before + 2:
            break
        if time.monotonic() >= spin_until:
            await asyncio.sleep(0.001)
    system.pause(victim)


def voluntary_switches(pid: int | None) -> int | None:
    """How often process ``pid``'s main thread (its event loop) gave up the CPU to wait, from
    /proc; None where that cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("voluntary_ctxt_switches:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def not_reclaimed_by_survivor(orphaned: dict[str, int], reclaimed: dict[str, int]) -> list[str]:
    """Stages whose survivor (``{stage}-2``) reports reclaiming fewer entries than the killed
    ``{stage}-1`` processes left pending. Only XAUTOCLAIM moves an entry off a dead consumer,
    and while a victim is dead its survivor is the only process of its stage: entries reclaimed
    by a restarted victim are not the survivor's takeover."""
    problems: list[str] = []
    for stage, count in orphaned.items():
        by_survivor = reclaimed.get(f"{stage}-2", 0)
        if by_survivor < count:
            others = sum(v for k, v in reclaimed.items()
                         if k.startswith(f"{stage}-") and k != f"{stage}-2")
            problems.append(f"killed {stage} processes left {count} entries pending, but the "
                            f"surviving {stage}-2 reports reclaiming only {by_survivor} (the "
                            f"restarted victims {others})")
    return problems


def reclaimed_entries(system: System) -> dict[str, int]:
    """Per process: how many entries its reclaim sweeps took over, from its log."""
    out: dict[str, int] = {}
    for name in system.processes:
        for record in system.log_records(name):
            match = RECLAIMED.match(str(record.get("msg", "")))
            if match:
                out[name] = out.get(name, 0) + int(match.group(1))
    return out


async def wait_for_takeover(system: System, victim: str, stage: str,
                            timeout_s: float) -> list[tuple[str, str]]:
    """Wait until nothing is pending for the killed ``victim``; returns what still is."""
    deadline = time.monotonic() + timeout_s
    left = await system.pending_of(victim, stage)
    while left and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        left = await system.pending_of(victim, stage)
    return left

