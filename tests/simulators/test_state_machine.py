"""Stateful properties: the fault table and the message store against tiny in-memory models.

The fault table decides which requests fail in every scenario, and the message store is how
scenarios detect duplicate sends; a drift from the simple model (a spent rule firing again,
a duplicate counted once too few) would make a scenario pass or fail for the wrong reason.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from simulators.faults import FaultTable
from simulators.kinds import FaultKind, Provider
from simulators.records import MessageRecord, MessageStore

PROVIDERS = [Provider.RESEND, Provider.TWILIO, Provider.FCM]
RECIPIENTS = ["a@x.com", "b@y.com", "+15550001"]
PATTERNS = [None, "*@x.com", "+1555*", "b@*"]


@dataclass
class ModelRule:
    id: str
    provider: str
    to: str | None
    times: int | None
    fired: int = 0

    def live(self) -> bool:
        return self.times is None or self.fired < self.times

    def matches(self, provider: Provider, recipient: str) -> bool:
        if self.provider not in ("*", provider.value):
            return False
        if self.to is None:
            return True
        if "@" in recipient:  # only e-mail addresses ignore case
            return fnmatch.fnmatchcase(recipient.lower(), self.to.lower())
        return fnmatch.fnmatchcase(recipient, self.to)


class FaultTableMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.table = FaultTable(seed=0)
        self.model: list[ModelRule] = []

    @rule(
        provider=st.sampled_from(["*", *[p.value for p in PROVIDERS]]),
        to=st.sampled_from(PATTERNS),
        times=st.none() | st.integers(1, 3),
    )
    def add(self, provider: str, to: str | None, times: int | None) -> None:
        payload: dict[str, object] = {"provider": provider, "kind": "error"}
        if to is not None:
            payload["to"] = to
        if times is not None:
            payload["times"] = times
        created = self.table.add(payload)
        self.model.append(ModelRule(created.id, provider, to, times))

    @rule(index=st.integers(0, 5))
    def remove(self, index: int) -> None:
        if index < len(self.model):
            victim = self.model.pop(index)
            assert self.table.remove(victim.id)

    @rule()
    def clear(self) -> None:
        self.table.clear()
        self.model.clear()

    @rule(provider=st.sampled_from(PROVIDERS), recipient=st.sampled_from(RECIPIENTS))
    def decide(self, provider: Provider, recipient: str) -> None:
        decision = self.table.decide(provider, [recipient])
        expected = next(
            (r for r in self.model if r.live() and r.matches(provider, recipient)), None
        )
        if expected is None:
            assert decision is None
        else:
            assert decision is not None
            assert decision.rule.id == expected.id
            assert decision.kind is FaultKind.ERROR
            expected.fired += 1

    @invariant()
    def same_rules_and_counts(self) -> None:
        assert [(r.id, r.fired) for r in self.table.rules] == [(r.id, r.fired) for r in self.model]
        assert [r.id for r in self.table.active()] == [r.id for r in self.model if r.live()]


class MessageStoreMachine(RuleBasedStateMachine):
    CAPACITY = 5

    def __init__(self) -> None:
        super().__init__()
        self.store = MessageStore(max_messages=self.CAPACITY)
        self.accepts: dict[tuple[Provider, str], int] = {}
        self.sent = 0

    @rule(provider=st.sampled_from(PROVIDERS), task=st.sampled_from(["t1", "t2", "t3", None]))
    def accept(self, provider: Provider, task: str | None) -> None:
        self.sent += 1
        record = self.store.add(
            MessageRecord(
                id=f"m{self.sent}",
                provider=provider,
                recipients=["r"],
                task_id=task,
                idempotency_key=None,
                content={},
            )
        )
        if task is None:
            assert record.accept_count == 1
        else:
            self.accepts[(provider, task)] = self.accepts.get((provider, task), 0) + 1
            assert record.accept_count == self.accepts[(provider, task)]

    @invariant()
    def bounded_and_newest_first(self) -> None:
        assert len(self.store) == min(self.sent, self.CAPACITY)
        ids = [record.id for record in self.store.query(limit=1000)]
        assert ids == [f"m{n}" for n in range(self.sent, max(self.sent - self.CAPACITY, 0), -1)]


TestFaultTable = FaultTableMachine.TestCase
TestFaultTable.settings = settings(max_examples=80, stateful_step_count=30, deadline=None)
TestMessageStore = MessageStoreMachine.TestCase
TestMessageStore.settings = settings(max_examples=50, stateful_step_count=30, deadline=None)
