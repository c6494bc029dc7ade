"""The running pipeline against a small model, under random sends, crashes and provider faults.

Hypothesis drives a real system (the api and two full pipeline processes as OS processes, the
simulators, two tenants) with random operations: sends for either tenant by e-mail (Resend,
which honours idempotency keys) or SMS (Twilio, which has none), SIGKILL and restart of a
pipeline process, and provider faults (5xx, lost responses, latency) for a few requests. The
model is what the API accepted, per tenant, and which duplicates it would excuse.

Why these properties matter: "accepted" is a promise. Whatever crashes, each accepted
notification must end in exactly one terminal state (delivered or dead-lettered: nothing here
sets up a reason to skip one, so a skip is a violation too); a provider may see a task twice
only where nothing could prevent it (a lost response, or a send in flight in a killed process,
against a provider without idempotency keys), and each such duplicate is counted; and no tenant
ever sees or reaches another's data. The tenants choose the same user ids and template names,
each with its own addresses, profile and content, so a query that forgot its project would
hand one tenant's recipient the other's address, profile or template (or have delivery skip
the address as none of the recipient's), and the provider's record or the timeline shows it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from notifkit.streams import decode
from scenarios.harness import ADMIN_KEY, SKIP_STATUSES, RunOptions, Sent, System
from tests.support.streams import xrange

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PIPELINE = ["enricher", "engine", "delivery", "scheduler", "events"]
LAYOUT = {"api": ["api"], "pipeline-a": PIPELINE, "pipeline-b": PIPELINE}
USERS = 6
TEMPLATE_NAMES = ("mail", "text")
NO_IDEMPOTENCY_KEYS = {"twilio"}
RUN_DIR = Path("scenario-results") / "state-machine"


class Tenant:
    def __init__(self, name: str, project_id: str, key: str, prefix: str) -> None:
        self.name = name
        self.project_id = project_id
        self.key = key
        self.prefix = prefix
        self.accepted: list[tuple[Sent, str]] = []  # (send, template)

    @property
    def label(self) -> str:
        """What this tenant's templates and profiles say, and its deliveries must."""
        return f"tenant-{self.prefix}"

    def user(self, index: int) -> str:
        return f"user-{index}"  # the same ids in both tenants

    def templates(self) -> dict[str, dict[str, Any]]:
        # Whose template rendered (From) for whose profile (for): both must be the sender's.
        return {
            "mail": {"channels": {"email": {"subject": f"From {self.label}",
                                            "text": "for {{ user.attributes.tenant }}"}}},
            "text": {"channels": {"sms": {
                "text": f"From {self.label}, for {{{{ user.attributes.tenant }}}}"}}},
        }

    def contacts(self, index: int) -> list[dict[str, str]]:
        digit = "7" if self.prefix == "a" else "8"
        return [{"channel": "email", "target": f"{self.prefix}{index}@tenant-{self.prefix}.test"},
                {"channel": "sms", "target": f"+1555{digit}{index:06d}"}]


class PipelineMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.system: System | None = None
        self.tenants: list[Tenant] = []
        self.killed: set[str] = set()
        self.in_flight_at_kill: set[str] = set()  # task ids a killed delivery was sending

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    # -- setup ------------------------------------------------------------------------------
    @initialize()
    def start(self) -> None:
        options = RunOptions(name="state_machine", run_dir=RUN_DIR)
        self.system = System(options, LAYOUT)
        self.run(self.system.__aenter__())
        self.tenants = [self.run(self._tenant("a")), self.run(self._tenant("b"))]

    async def _tenant(self, prefix: str) -> Tenant:
        system = self.system
        assert system is not None
        status, body = await system.request("POST", "/v1/projects", key=ADMIN_KEY,
                                            json={"name": f"tenant-{prefix}"})
        assert status == 201, body
        project_id = body["id"]
        status, body = await system.request("POST", f"/v1/projects/{project_id}/keys",
                                            key=ADMIN_KEY, json={"role": "full"})
        assert status == 201, body
        tenant = Tenant(prefix, project_id, body["key"], prefix)
        for name, template in tenant.templates().items():
            status, body = await system.request("PUT", f"/v1/templates/{name}",
                                                key=tenant.key, json=template)
            assert status in (200, 201), body
        for index in range(USERS):
            status, body = await system.request(
                "PUT", f"/v1/users/{tenant.user(index)}", key=tenant.key,
                json={"attributes": {"tenant": tenant.label},
                      "contacts": tenant.contacts(index)})
            assert status in (200, 201), body
        return tenant

    def teardown(self) -> None:
        try:
            if self.system is not None and self.tenants:
                self.run(self._settle_and_check())
        finally:
            if self.system is not None:
                with contextlib.suppress(Exception):
                    self.run(self.system.__aexit__(None, None, None))
            self.loop.close()

    # -- rules ------------------------------------------------------------------------------
    @rule(tenant=st.sampled_from([0, 1]), user=st.integers(0, USERS - 1),
          template=st.sampled_from(TEMPLATE_NAMES),
          priority=st.sampled_from(["critical", "normal", "low"]))
    def send(self, tenant: int, user: int, template: str, priority: str) -> None:
        t = self.tenants[tenant]
        assert self.system is not None
        status, body = self.run(self.system.request(
            "POST", "/v1/notifications", key=t.key,
            json={"to": t.user(user), "template": template, "priority": priority}))
        assert status == 202, body
        t.accepted.append((Sent(body["id"], t.user(user), 0.0), template))

    @precondition(lambda self: not self.killed)
    @rule(name=st.sampled_from(["pipeline-a", "pipeline-b"]))
    def kill(self, name: str) -> None:
        system = self.system
        assert system is not None
        held = self.run(system.pending_of(name, "delivery"))
        self.in_flight_at_kill |= self.run(system.task_ids_of(held))
        self.run(system.kill(name))
        self.killed.add(name)

    @precondition(lambda self: bool(self.killed))
    @rule()
    def restart(self) -> None:
        assert self.system is not None
        for name in sorted(self.killed):
            self.run(self.system.restart(name))
        self.killed.clear()

    @rule(provider=st.sampled_from(["resend", "twilio"]),
          kind=st.sampled_from(["error", "lost_response", "latency"]),
          times=st.integers(1, 2))
    def provider_fault(self, provider: str, kind: str, times: int) -> None:
        assert self.system is not None
        self.run(self.system.sim.add_fault(
            kind, provider, times=times, delay_ms=300 if kind == "latency" else None))

    # -- invariants -------------------------------------------------------------------------
    @invariant()
    def tenants_see_only_their_own(self) -> None:
        if len(self.tenants) < 2 or self.system is None:
            return
        for own, other in ((self.tenants[0], self.tenants[1]),
                           (self.tenants[1], self.tenants[0])):
            if not own.accepted:
                continue
            event_id = own.accepted[-1][0].event_id
            status, _ = self.run(self.system.request(
                "GET", f"/v1/notifications/{event_id}", key=other.key))
            assert status == 404, f"tenant {other.name} read {own.name}'s notification"
            # The same id is the other tenant's own user, with nothing of this tenant's.
            status, user = self.run(self.system.request(
                "GET", f"/v1/users/{own.user(0)}", key=other.key))
            assert status == 200, user
            targets = {c["target"] for c in user["contacts"]}
            leaked = f"tenant {other.name} read {own.name}'s user: {user}"
            assert user["attributes"] == {"tenant": other.label}, leaked
            assert targets == {c["target"] for c in other.contacts(0)}, leaked

    async def _settle_and_check(self) -> None:
        system = self.system
        assert system is not None
        for name in sorted(self.killed):
            await system.restart(name)
        self.killed.clear()
        await system.sim.clear_faults()
        waiting = await system.quiesce(60)
        assert not waiting, f"the system never drained: {waiting}"

        task_owner: dict[str, tuple[str, str]] = {}  # task id -> (tenant, event id)
        skipped: dict[str, str] = {}  # event id -> why
        for t in self.tenants:
            rows = await system.db.fetch(  # type: ignore[union-attr]
                "SELECT task_id, event_id::text AS event_id, status, detail FROM message_logs "
                "WHERE project_id = $1 AND channel <> ''", t.project_id)
            for r in rows:
                task_owner[r["task_id"]] = (t.name, r["event_id"])
                if r["status"] in SKIP_STATUSES:
                    skipped.setdefault(r["event_id"], f"{r['status']}: {r['detail']}")
        # Every contact is valid, and no preference, suppression, throttle or quiet hours is
        # set up: a skip is a send wrongly held back (delivery's re-check refusing an address
        # that is not the recipient's in the sender's project, say), not a terminal state.
        assert not skipped, f"sends skipped with nothing set up to skip them: {skipped}"
        dead: set[str] = set()
        for _id, fields in await xrange(system.redis, system.keys.dlq):
            with contextlib.suppress(Exception):
                event_id = (decode(fields).get("payload") or {}).get("eventId")
                if event_id:
                    dead.add(str(event_id))
        delivered: set[str] = set()
        addresses = {t.name: {c["target"] for i in range(USERS) for c in t.contacts(i)}
                     for t in self.tenants}
        for message in await system.sim.messages(limit=100_000):
            owner = task_owner.get(message.get("taskId") or "")
            assert owner is not None, f"the provider got a task no tenant sent: {message}"
            tenant, event_id = owner
            to = message.get("to")
            targets = to if isinstance(to, list) else [to]
            assert all(any(a in str(x) for a in addresses[tenant]) for x in targets), \
                f"tenant {tenant}'s task {message['taskId']} went to {to}"
            content = json.dumps(message.get("content"))
            for marker in (f"From tenant-{tenant}", f"for tenant-{tenant}"):
                assert marker in content, \
                    f"tenant {tenant}'s task {message['taskId']} carried {content}"
            delivered.add(event_id)

        for t in self.tenants:
            for sent, template in t.accepted:
                states = [name for name, found in (("delivered", delivered), ("dead-lettered",
                          dead), ("skipped", skipped)) if sent.event_id in found]
                assert len(states) == 1, (
                    f"tenant {t.name}'s {template} notification {sent.event_id} ended "
                    f"{states or 'in no terminal state (lost)'}")

        stats = await system.sim.stats()
        excused: Counter[str] = Counter()
        for provider in NO_IDEMPOTENCY_KEYS:
            provider_stats: Mapping[str, Any] = stats.get(provider) or {}
            excused[provider] = int((provider_stats.get("faults") or {}).get("lost_response", 0))
        for task_id, (provider, extra) in (await system.duplicates()).items():
            assert provider in NO_IDEMPOTENCY_KEYS, (
                f"{provider} accepted task {task_id} {extra + 1} times despite its "
                "idempotency key")
            if task_id in self.in_flight_at_kill:
                continue  # in flight when its delivery process was killed
            excused[provider] -= extra
            assert excused[provider] >= 0, (
                f"{provider} duplicates outnumber its lost responses (task {task_id})")


PipelineMachine.TestCase.settings = settings(
    max_examples=5, stateful_step_count=15, deadline=None,
    suppress_health_check=list(HealthCheck),
)
TestPipelineStateMachine = PipelineMachine.TestCase
