"""key_revocation: revoke a key while two API processes serve it; both reject it within 1 s.

Both processes have the key cached (each served it successfully just before). While a steady
stream of requests with the key goes to each process, the admin key revokes it through one of
them. Every request *started* more than ``bound_s`` after the revocation returned must be a
401 on both; the time from the revocation to the last request that was still let through is
reported per process. Sends made with the key before the revocation are accounted as usual.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from scenarios.harness import ADMIN_KEY, RunOptions, Sent, System
from scenarios.report import ScenarioResult

DESCRIPTION = "revoke a key while two API processes serve it: rejected by both within 1 s"
PARAMS: dict[str, Any] = {"users": 5, "bound_s": 1.0, "watch_s": 3.0, "probe_interval_s": 0.02}
# The sends before the revocation go to the users; probes watched no longer than the bound
# show no request rejected after it.
POSITIVE = frozenset({"users", "watch_s"})
MORE_THAN = {"watch_s": "bound_s"}

LAYOUT = {
    "api-1": ["api"],
    "api-2": ["api"],
    "pipeline": ["enricher", "engine", "delivery", "scheduler", "events"],
}


async def run(options: RunOptions, params: dict[str, Any]) -> ScenarioResult:
    result = ScenarioResult(name=options.name, seed=options.seed)
    async with System(options, LAYOUT) as system:
        users = await system.bootstrap(users=int(params["users"]))
        bases = {name: f"http://127.0.0.1:{port}" for name, port in system.api_ports.items()}
        status, body = await system.request(
            "POST", f"/v1/projects/{system.project_id}/keys", key=ADMIN_KEY,
            json={"role": "full", "name": "to-revoke"},
        )
        result.check(status == 201, f"creating the key answered {status}: {body}")
        key, key_id = body["key"], body["id"]

        # Warm both caches: the key works on both processes before the revocation.
        sent: list[Sent] = []
        for name, base in bases.items():
            for user in users:
                status, reply = await system.request(
                    "POST", "/v1/notifications", key=key, base=base,
                    json={"to": user, "template": "basic", "data": {"n": name}},
                )
                result.check(status == 202, f"{name} refused the fresh key: {status} {reply}")
                if status == 202:
                    sent.append(Sent(reply["id"], user, time.time()))

        # Probe both processes continuously; revoke through api-1 part-way through.
        probes: dict[str, list[tuple[float, int]]] = {name: [] for name in bases}
        stop = asyncio.Event()

        async def probe(name: str, base: str) -> None:
            while not stop.is_set():
                started = time.monotonic()
                status, _ = await system.request("GET", "/v1/templates/basic", key=key,
                                                 base=base)
                probes[name].append((started, status))
                await asyncio.sleep(float(params["probe_interval_s"]))

        tasks = [asyncio.create_task(probe(n, b)) for n, b in bases.items()]
        await asyncio.sleep(0.5)
        system.say("revoking the key through api-1")
        status, body = await system.request("DELETE", f"/v1/keys/{key_id}", key=ADMIN_KEY,
                                            base=bases["api-1"])
        revoked_at = time.monotonic()
        result.check(status == 204, f"revoking the key answered {status}: {body}")
        await asyncio.sleep(float(params["watch_s"]))
        stop.set()
        await asyncio.gather(*tasks)

        bound_s = float(params["bound_s"])
        for name, seen in probes.items():
            before = [s for t, s in seen if t < revoked_at - 0.05]
            result.check(bool(before) and all(s == 200 for s in before),
                         f"{name} did not serve the key before the revocation: {before[-5:]}")
            allowed_after = [t - revoked_at for t, s in seen if t >= revoked_at and s == 200]
            late = [round(d, 3) for d in allowed_after if d > bound_s]
            window = max(allowed_after, default=0.0)
            result.facts[f"{name} accepted the key until (s after revocation)"] = round(window, 3)
            result.facts[f"{name} probes after revocation"] = sum(
                1 for t, _ in seen if t >= revoked_at)
            result.check(not late, f"{name} still accepted the revoked key {len(late)} time(s) "
                                   f"more than {bound_s} s after the revocation "
                                   f"(latest {max(late, default=0)} s)")
            after_bound = [s for t, s in seen if t >= revoked_at + bound_s]
            result.check(bool(after_bound), f"{name} answered no probe started more than "
                                            f"{bound_s} s after the revocation: nothing shown")
            odd = {s for s in after_bound if s not in (200, 401)}
            result.check(not odd, f"{name} answered {sorted(odd)} to the revoked key")

        status, reply = await system.request(
            "POST", "/v1/notifications", key=key, base=bases["api-2"],
            json={"to": users[0], "template": "basic"},
        )
        result.check(status == 401, f"api-2 accepted a send with the revoked key: {status}")
        left = await system.quiesce(30)
        result.check(not left, f"the system did not quiesce: {left}")
        await system.account(sent, result)
        system.check_alive(result, LAYOUT)
    return result
