"""How a task's provider answers become one action: the contract's failure classes (CONTRACT
§5) in one place. Pure, so every combination is tested without a provider.

A task goes to one or more destinations (a user's push devices; one address elsewhere):

    destinations suppressed since routing     -> left out; all of them: FALLBACK if there is a
                                                  next channel (recorded as suppressed or
                                                  skipped, not failed), else SUPPRESSED
    contacts erased, or the channel or topic  -> left out the same way; all of them (and none
    turned off, since routing                    suppressed): SKIPPED without a next channel
    any destination SENT                      -> SENT, unless others failed transiently (5xx,
                                                  timeout, 429) with attempts left: then RETRY
                                                  or PARK for those alone (the outbox keeps the
                                                  accepted ones from going out twice), no
                                                  fallback since the recipient has it
    any PERMANENT raised by notifkit itself   -> PERMANENT: dead-lettered now, never a
    (the transport could not build the            fallback: the message is at fault, not the
    message)                                      address, and a replay sends it once fixed
    any PERMANENT from the provider (a 4xx)   -> FALLBACK to the chain's next channel if there
                                                  is one, else PERMANENT: dead-lettered now
    any RETRY (timeout, 5xx, connection)      -> FALLBACK to the chain's next channel if there
                                                  is one, else RETRY (the reclaim cycle), and
                                                  DEAD once the attempts are used up
    any provider RATE_LIMITED                 -> PARK until Retry-After, counting as an
                                                  attempt; once the attempts are used up,
                                                  FALLBACK if there is a next channel, else DEAD
    notifkit's own bucket empty               -> PARK, not counted (nothing reached a provider)
    all INVALID_RECIPIENT                     -> contacts disabled; FALLBACK if there is a next
                                                  channel, else INVALID (failed, not retried)

A channel without a transport is a PERMANENT failure too, moved on the same way by delivery
before anything is sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from notifkit.transports.base import Outcome, SendResult
from notifkit.wording import counted


class Action(StrEnum):
    SENT = "sent"
    FALLBACK = "fallback"
    RETRY = "retry"
    PARK = "park"
    INVALID = "invalid"
    SUPPRESSED = "suppressed"  # every destination was suppressed after the task was routed
    SKIPPED = "skipped"  # every destination was erased or turned off meanwhile
    PERMANENT = "permanent"
    DEAD = "dead"  # a transient failure with no attempts left


@dataclass(frozen=True)
class Attempted:
    """One destination's answer in this attempt."""

    destination: str
    result: SendResult
    # The outbox said an earlier attempt may have reached a provider that has no idempotency
    # key: if this send is accepted too, the recipient may get the message twice.
    possible_duplicate: bool = False
    local_limit: bool = False  # refused by notifkit's own token bucket, not by the provider
    # The transport raised instead of answering: a failure to build or encode the message is
    # notifkit's own, the same on every attempt, and says nothing about the address.
    raised: bool = False
    # The outbox says an earlier attempt was accepted: nothing was sent this time.
    already_sent: bool = False
    # The address was suppressed (bounce, complaint) after the task was routed: not sent.
    suppressed: bool = False
    # The contact, or its user, was erased after the task was routed, or the user turned the
    # channel or topic off: not sent.
    removed: bool = False


@dataclass(frozen=True)
class Verdict:
    action: Action
    reason: str
    retry_after_s: float | None = None
    counts_as_attempt: bool = True  # for PARK: a provider 429 counts, our own bucket does not
    # For FALLBACK: SUPPRESSED or SKIPPED when nothing was attempted because every destination
    # was left out; None when the channel really failed.
    left_out: Action | None = None


def judge(
    attempted: Sequence[Attempted], *, has_next_channel: bool, attempt: int, max_attempts: int
) -> Verdict:
    """``attempt`` is this attempt's number counting earlier parked entries of the task."""
    left_out = [a for a in attempted if a.suppressed or a.removed]
    attempted = [a for a in attempted if not (a.suppressed or a.removed)]
    if left_out and not attempted:
        suppressed = [a for a in left_out if a.suppressed]
        reason = (suppressed or left_out)[0].result.detail
        why = Action.SUPPRESSED if suppressed else Action.SKIPPED
        if has_next_channel:
            return Verdict(Action.FALLBACK, reason, left_out=why)
        return Verdict(why, reason)
    outcomes = [a.result.outcome for a in attempted]
    first = {o: a for a, o in reversed(list(zip(attempted, outcomes, strict=True)))}
    if Outcome.SENT in first:
        unsent = [a for a in attempted
                  if a.result.outcome in (Outcome.RETRY, Outcome.RATE_LIMITED)]
        if unsent:
            rest = judge(unsent, has_next_channel=False, attempt=attempt,
                         max_attempts=max_attempts)
            if rest.action in (Action.RETRY, Action.PARK):
                accepted = sum(1 for a in attempted if a.result.sent)
                return Verdict(rest.action, f"accepted for {accepted} of {len(attempted)} "
                               f"destinations; {rest.reason}", rest.retry_after_s,
                               rest.counts_as_attempt)
        return Verdict(Action.SENT, "accepted")
    if Outcome.PERMANENT in first:
        refused = [a for a in attempted if a.result.outcome is Outcome.PERMANENT]
        ours = [a for a in refused if a.raised]
        if has_next_channel and not ours:
            return Verdict(Action.FALLBACK, first[Outcome.PERMANENT].result.detail)
        return Verdict(Action.PERMANENT, (ours or refused)[0].result.detail)
    exhausted = attempt >= max_attempts
    if Outcome.RETRY in first:
        reason = first[Outcome.RETRY].result.detail
        if has_next_channel:
            return Verdict(Action.FALLBACK, reason)
        if exhausted:
            return Verdict(Action.DEAD, f"gave up after {counted(attempt, 'attempt')}: {reason}")
        return Verdict(Action.RETRY, reason)
    if Outcome.RATE_LIMITED in first:
        limited = [a for a in attempted if a.result.outcome is Outcome.RATE_LIMITED]
        by_provider = [a for a in limited if not a.local_limit]
        wait_s = max((a.result.retry_after_s or 0.0) for a in limited)
        reason = (by_provider or limited)[0].result.detail
        if by_provider:
            if exhausted:
                reason = f"still rate limited after {counted(attempt, 'attempt')}: {reason}"
                if has_next_channel:
                    return Verdict(Action.FALLBACK, reason)
                return Verdict(Action.DEAD, reason)
            return Verdict(Action.PARK, reason, wait_s)
        return Verdict(Action.PARK, reason, wait_s, counts_as_attempt=False)
    reason = first[Outcome.INVALID_RECIPIENT].result.detail if attempted else "no destination"
    if has_next_channel:
        # Worded as the last channel's INVALID row is (delivery disables the contacts).
        return Verdict(Action.FALLBACK, f"invalid recipient, contact disabled: {reason}")
    return Verdict(Action.INVALID, reason)
