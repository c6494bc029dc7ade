"""Fault rules: how a provider is told to misbehave, and the seeded choice of when it does.

Rules are kept in the order they were added. For each request the table walks the rules in
that order; the first rule that matches the provider and recipient, still has `times` left and
wins its probability draw decides the request. A rule whose draw fails lets the next rule try.

All randomness (probability draws and random latencies) comes from one `random.Random(seed)`,
so the same seed and the same sequence of requests give the same sequence of decisions.
"""

from __future__ import annotations

import random
from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import TypedDict

from simulators.kinds import ANY_PROVIDER, FaultKind, Provider
from simulators.recipients import glob_matches
from simulators.validation import (
    ControlError,
    get_int,
    get_number,
    get_str,
    reject_unknown,
    require_choice,
    require_object,
    show,
    whole_number,
)

# How long `timeout` and `lost_response` hold a request when the rule gives no `delayMs`:
# far past any sensible client timeout. The hold also ends when the client disconnects.
DEFAULT_HOLD_MS = 300_000
DEFAULT_LATENCY_MS = 500
MAX_DELAY_MS = 3_600_000
MAX_RETRY_AFTER_S = 86_400.0

# Kinds whose answer is an error status, so `status` may override the default one.
_STATUS_KINDS = {
    FaultKind.ERROR,
    FaultKind.RATE_LIMIT,
    FaultKind.INVALID_TOKEN,
    FaultKind.MALFORMED,
}
_RETRY_AFTER_KINDS = {FaultKind.ERROR, FaultKind.RATE_LIMIT}
# SMTP's replies for a failed transaction. A `*` rule's `status` is an HTTP status: SMTP takes
# it only when it is one of these, since 500-504 mean a malformed command in SMTP (a 503
# "service unavailable" would become a permanent "bad sequence of commands").
SMTP_FAILURE_CODES = frozenset({421, 450, 451, 452, 550, 551, 552, 553, 554})
# Those with no meaning in HTTP (421 and 451 have one): a `*` rule giving one is written for
# SMTP, and an HTTP provider answers as if the rule named no status.
SMTP_ONLY_CODES = SMTP_FAILURE_CODES - {int(status) for status in HTTPStatus}
_DELAY_KINDS = {FaultKind.LATENCY, FaultKind.TIMEOUT, FaultKind.LOST_RESPONSE}
RULE_FIELDS = (
    "provider",
    "kind",
    "to",
    "probability",
    "times",
    "status",
    "retryAfter",
    "delayMs",
)


class FaultItem(TypedDict):
    """A rule as the control API shows it."""

    id: str
    provider: str
    kind: str
    to: str | None
    probability: float
    times: int | None
    status: int | None
    retryAfter: float | None
    delayMs: int | list[int] | None
    fired: int
    remaining: int | None


@dataclass
class FaultRule:
    id: str
    provider: str  # a Provider value or "*"
    kind: FaultKind
    to: str | None = None
    probability: float = 1.0
    times: int | None = None
    status: int | None = None
    retry_after_s: float | None = None
    delay_ms: int | tuple[int, int] | None = None
    fired: int = 0

    @property
    def remaining(self) -> int | None:
        return None if self.times is None else max(self.times - self.fired, 0)

    @property
    def spent(self) -> bool:
        return self.times is not None and self.fired >= self.times

    def status_for(self, provider: Provider) -> int | None:
        """The status this rule answers with at ``provider``; None for the provider's own
        default for the kind. A rule naming its provider is taken at its word; a `*` rule's
        status reaches only the providers it means something to (see SMTP_FAILURE_CODES)."""
        if self.status is None or self.provider != ANY_PROVIDER:
            return self.status
        if provider is Provider.SMTP:
            return self.status if self.status in SMTP_FAILURE_CODES else None
        return None if self.status in SMTP_ONLY_CODES else self.status

    def matches(self, provider: Provider, recipients: Iterable[str]) -> bool:
        if self.provider not in (ANY_PROVIDER, provider.value):
            return False
        if self.to is None:
            return True
        return self.matched(recipients) is not None

    def matched(self, recipients: Iterable[str]) -> str | None:
        """The first of ``recipients`` this rule's glob matches (without one, the first)."""
        pattern = self.to if self.to is not None else "*"
        return next((r for r in recipients if glob_matches(r, pattern)), None)

    def to_item(self) -> FaultItem:
        delay: int | list[int] | None
        delay = list(self.delay_ms) if isinstance(self.delay_ms, tuple) else self.delay_ms
        return {
            "id": self.id,
            "provider": self.provider,
            "kind": self.kind.value,
            "to": self.to,
            "probability": self.probability,
            "times": self.times,
            "status": self.status,
            "retryAfter": self.retry_after_s,
            "delayMs": delay,
            "fired": self.fired,
            "remaining": self.remaining,
        }


@dataclass(frozen=True)
class FaultDecision:
    """The rule that fired for one request, with its random parts already drawn."""

    rule: FaultRule
    delay_s: float

    @property
    def kind(self) -> FaultKind:
        return self.rule.kind


def parse_rule(payload: object, rule_id: str) -> FaultRule:
    """Build a rule from its control-API JSON, or raise ControlError naming the bad field."""
    body = require_object(payload, "fault rule")
    reject_unknown(body, RULE_FIELDS, "fault rule")
    providers = [ANY_PROVIDER, *(p.value for p in Provider)]
    # Required, as the spec's shape has it: "*" hits every provider, and a rule that forgot
    # its provider must not silently do that.
    provider = require_choice(body, "provider", providers)
    kind = FaultKind(require_choice(body, "kind", [k.value for k in FaultKind]))
    to = get_str(body, "to", max_len=512)
    probability = get_number(body, "probability", minimum=0.0, maximum=1.0)
    times = get_int(body, "times", minimum=1, maximum=1_000_000_000)
    status = get_int(body, "status", minimum=100, maximum=599)
    retry_after_s = get_number(body, "retryAfter", minimum=0.0, maximum=MAX_RETRY_AFTER_S)
    delay_ms = _parse_delay(body.get("delayMs"))

    if status is not None:
        if kind not in _STATUS_KINDS:
            raise ControlError(f"'status' does not apply to kind '{kind}'")
        _check_status(kind, provider, status)
    if retry_after_s is not None and kind not in _RETRY_AFTER_KINDS:
        raise ControlError(f"'retryAfter' does not apply to kind '{kind}'")
    if delay_ms is not None and kind not in _DELAY_KINDS:
        raise ControlError(f"'delayMs' does not apply to kind '{kind}'")
    return FaultRule(
        id=rule_id,
        provider=provider,
        kind=kind,
        to=to,
        probability=1.0 if probability is None else probability,
        times=times,
        status=status,
        retry_after_s=retry_after_s,
        delay_ms=delay_ms,
    )


def _check_status(kind: FaultKind, provider: str, status: int) -> None:
    if provider == Provider.SMTP.value:
        if kind is FaultKind.MALFORMED:
            raise ControlError(
                "'status' does not apply to kind 'malformed' for smtp: its reply is no SMTP "
                "reply, so it has no code"
            )
        # RFC 5321 4.2: the second digit of a reply code is 0-5; 4x6..5x9 do not exist.
        if not 400 <= status <= 599 or status // 10 % 10 > 5:
            raise ControlError(
                "'status' for smtp must be an SMTP failure reply code (4yz or 5yz with y "
                f"0-5, as RFC 5321 has them), got {status}"
            )
    elif kind is FaultKind.MALFORMED:
        # 204 and 304 carry no body, so nothing would be malformed.
        if not 200 <= status <= 599 or status in (204, 304):
            raise ControlError(
                f"'status' for malformed must be 200-599 but not 204/304, got {status}"
            )
    elif not 400 <= status <= 599:
        raise ControlError(f"'status' for kind '{kind}' must be 400-599, got {status}")


def _parse_delay(value: object) -> int | tuple[int, int] | None:
    """`delayMs` is a fixed number of milliseconds or a `[min, max]` range drawn per request."""
    if value is None:
        return None
    if isinstance(value, list) and len(value) == 2:
        low, high = (_delay_number(v) for v in value)
        if low > high:
            raise ControlError(f"'delayMs' range must be [min, max] with min <= max, got {value}")
        return (low, high)
    return _delay_number(value)


def _delay_number(value: object) -> int:
    number = whole_number(value)
    if number is None or not 0 <= number <= MAX_DELAY_MS:
        raise ControlError(
            f"'delayMs' must be an integer 0-{MAX_DELAY_MS} or a [min, max] pair, got {show(value)}"
        )
    return number


@dataclass
class FaultTable:
    """The ordered rule list plus the seeded random source that makes decisions replayable."""

    seed: int
    rules: list[FaultRule] = field(default_factory=list)
    _rng: random.Random = field(init=False)
    _next_id: int = field(init=False, default=1)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def reseed(self, seed: int) -> None:
        self.seed = seed
        self._rng = random.Random(seed)

    def add(self, payload: object) -> FaultRule:
        rule = parse_rule(payload, f"f_{self._next_id}")
        self._next_id += 1
        self.rules.append(rule)
        return rule

    def remove(self, rule_id: str) -> bool:
        before = len(self.rules)
        self.rules = [rule for rule in self.rules if rule.id != rule_id]
        return len(self.rules) != before

    def clear(self) -> None:
        self.rules.clear()

    def active(self) -> list[FaultRule]:
        return [rule for rule in self.rules if not rule.spent]

    def decide(
        self, provider: Provider, recipients: Iterable[str], *,
        kinds: Container[FaultKind] | None = None, skip: Container[FaultKind] = (),
    ) -> FaultDecision | None:
        """The first live rule for this request (only rules of ``kinds``, none of ``skip``)."""
        targets = list(recipients)
        for rule in self.rules:
            if rule.spent or not rule.matches(provider, targets):
                continue
            if (kinds is not None and rule.kind not in kinds) or rule.kind in skip:
                continue
            # Draw only for partial probabilities: a rule with probability 1 never consumes
            # randomness, so adding one does not shift the sequence other rules see.
            if rule.probability < 1.0 and self._rng.random() >= rule.probability:
                continue
            rule.fired += 1
            return FaultDecision(rule=rule, delay_s=self._delay_s(rule))
        return None

    def _delay_s(self, rule: FaultRule) -> float:
        delay = rule.delay_ms
        if delay is None:
            if rule.kind is FaultKind.LATENCY:
                delay = DEFAULT_LATENCY_MS
            elif rule.kind in (FaultKind.TIMEOUT, FaultKind.LOST_RESPONSE):
                delay = DEFAULT_HOLD_MS
            else:
                delay = 0
        if isinstance(delay, tuple):
            return self._rng.uniform(delay[0], delay[1]) / 1000.0
        return delay / 1000.0
