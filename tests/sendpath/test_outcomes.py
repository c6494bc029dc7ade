"""How provider answers become a task's action (pure; the contract's failure classes)."""

from __future__ import annotations

import pytest

from notifkit.services.delivery.outcomes import Action, Attempted, judge
from notifkit.transports.base import Outcome, SendResult


def answer(outcome: Outcome, retry_after_s: float | None = None, *,
           local: bool = False, suppressed: bool = False) -> Attempted:
    return Attempted("dest", SendResult(outcome, detail=outcome.value,
                                        retry_after_s=retry_after_s), local_limit=local,
                     suppressed=suppressed)


@pytest.mark.parametrize(("answers", "has_next", "attempt", "expected"), [
    ([Outcome.SENT], False, 1, Action.SENT),
    # one device accepted, another failed: that one is retried (the recipient has the
    # message, so no fallback), and once the attempts are used up the accepted one stands
    ([Outcome.RETRY, Outcome.SENT], True, 1, Action.RETRY),
    ([Outcome.RETRY, Outcome.SENT], True, 3, Action.SENT),
    ([Outcome.SENT, Outcome.RATE_LIMITED], False, 1, Action.PARK),
    ([Outcome.SENT, Outcome.RATE_LIMITED], False, 3, Action.SENT),
    # a device that is invalid or refused for good is not retried
    ([Outcome.SENT, Outcome.INVALID_RECIPIENT], False, 1, Action.SENT),
    ([Outcome.SENT, Outcome.PERMANENT], False, 1, Action.SENT),
    ([Outcome.RETRY], True, 1, Action.FALLBACK),
    ([Outcome.RETRY], False, 1, Action.RETRY),
    ([Outcome.RETRY], False, 3, Action.DEAD),
    ([Outcome.RATE_LIMITED], True, 1, Action.PARK),  # a 429 waits rather than falls back
    ([Outcome.RATE_LIMITED], True, 2, Action.PARK),
    ([Outcome.RATE_LIMITED], True, 3, Action.FALLBACK),  # ... while attempts are left
    ([Outcome.RATE_LIMITED], False, 3, Action.DEAD),
    ([Outcome.INVALID_RECIPIENT], False, 1, Action.INVALID),
    ([Outcome.INVALID_RECIPIENT], True, 1, Action.FALLBACK),
    ([Outcome.INVALID_RECIPIENT, Outcome.RETRY], False, 1, Action.RETRY),
    # a provider's refusal for good: the chain's next channel, else the DLQ at once
    ([Outcome.PERMANENT], True, 1, Action.FALLBACK),
    ([Outcome.PERMANENT], False, 1, Action.PERMANENT),
    ([Outcome.PERMANENT, Outcome.RETRY], True, 1, Action.FALLBACK),
    ([Outcome.PERMANENT, Outcome.RETRY], False, 1, Action.PERMANENT),
    ([Outcome.PERMANENT, Outcome.INVALID_RECIPIENT], True, 1, Action.FALLBACK),
    ([Outcome.PERMANENT, Outcome.INVALID_RECIPIENT], False, 1, Action.PERMANENT),
])
def test_answers_to_actions(answers: list[Outcome], has_next: bool, attempt: int,
                            expected: Action) -> None:
    verdict = judge([answer(o, 2.0) for o in answers], has_next_channel=has_next,
                    attempt=attempt, max_attempts=3)
    assert verdict.action is expected


def test_notifkits_own_bucket_parks_without_using_an_attempt() -> None:
    verdict = judge([answer(Outcome.RATE_LIMITED, 4.0, local=True)], has_next_channel=False,
                    attempt=3, max_attempts=3)
    assert verdict.action is Action.PARK
    assert verdict.counts_as_attempt is False
    assert verdict.retry_after_s == 4.0


def test_several_rate_limited_destinations_park_for_the_longest_wait() -> None:
    # The shortest would bring the task back into the other destinations' 429s.
    verdict = judge([answer(Outcome.RATE_LIMITED, 5.0), answer(Outcome.RATE_LIMITED, 30.0),
                     answer(Outcome.RATE_LIMITED, 12.0)],
                    has_next_channel=False, attempt=1, max_attempts=3)
    assert (verdict.action, verdict.retry_after_s) == (Action.PARK, 30.0)


def test_a_task_out_of_attempts_says_so_and_why() -> None:
    # The DLQ entry and the timeline must tell an operator it was given up, not rejected.
    verdict = judge([answer(Outcome.RETRY)], has_next_channel=False, attempt=3, max_attempts=3)
    assert verdict.action is Action.DEAD
    assert verdict.reason == "gave up after 3 attempts: retry"
    # with one attempt allowed (MAX_ATTEMPTS=1)
    verdict = judge([answer(Outcome.RATE_LIMITED, 2.0)], has_next_channel=False, attempt=1,
                    max_attempts=1)
    assert verdict.reason == "still rate limited after 1 attempt: rate_limited"


def test_a_429_at_the_attempt_limit_falls_back_saying_it_was_still_rate_limited() -> None:
    verdict = judge([answer(Outcome.RATE_LIMITED, 2.0)], has_next_channel=True, attempt=3,
                    max_attempts=3)
    assert verdict.action is Action.FALLBACK
    assert verdict.reason == "still rate limited after 3 attempts: rate_limited"
    # notifkit's own bucket is no provider's refusal: it parks, uncounted, whatever the attempt
    own = judge([answer(Outcome.RATE_LIMITED, 2.0, local=True)], has_next_channel=True,
                attempt=3, max_attempts=3)
    assert (own.action, own.counts_as_attempt) == (Action.PARK, False)


def test_a_message_the_transport_raised_on_is_dead_lettered_even_with_a_next_channel() -> None:
    """notifkit's own failure to build the message says nothing about the address: the DLQ
    keeps it for a replay once fixed, with its own reason first."""
    raised = Attempted("a", SendResult(Outcome.PERMANENT, detail="ValueError: body"),
                       raised=True)
    refused = Attempted("b", SendResult(Outcome.PERMANENT, detail="HTTP 400"))
    for answers in ([raised], [refused, raised]):
        verdict = judge(answers, has_next_channel=True, attempt=1, max_attempts=3)
        assert (verdict.action, verdict.reason) == (Action.PERMANENT, "ValueError: body")
    # beside an accepted device it is that device's failure alone, as any refusal
    assert judge([raised, answer(Outcome.SENT)], has_next_channel=True, attempt=1,
                 max_attempts=3).action is Action.SENT


def test_destinations_suppressed_since_routing_are_left_out() -> None:
    gone = answer(Outcome.INVALID_RECIPIENT, suppressed=True)
    assert judge([gone], has_next_channel=False, attempt=1,
                 max_attempts=3).action is Action.SUPPRESSED
    assert judge([gone], has_next_channel=True, attempt=1,
                 max_attempts=3).action is Action.FALLBACK
    # the others decide: one accepted is sent, one failing is retried, not suppressed
    assert judge([gone, answer(Outcome.SENT)], has_next_channel=False, attempt=1,
                 max_attempts=3).action is Action.SENT
    assert judge([gone, answer(Outcome.RETRY)], has_next_channel=False, attempt=1,
                 max_attempts=3).action is Action.RETRY


def test_a_partial_retry_says_how_many_destinations_have_it() -> None:
    verdict = judge([answer(Outcome.SENT), answer(Outcome.RATE_LIMITED, 3.0)],
                    has_next_channel=True, attempt=1, max_attempts=3)
    assert (verdict.action, verdict.retry_after_s) == (Action.PARK, 3.0)
    assert verdict.reason.startswith("accepted for 1 of 2 destinations; ")


def test_destinations_whose_contact_was_erased_since_routing_are_left_out() -> None:
    removed = Attempted("dest", SendResult(Outcome.INVALID_RECIPIENT, detail="removed"),
                        removed=True)
    suppressed = answer(Outcome.INVALID_RECIPIENT, suppressed=True)
    assert judge([removed], has_next_channel=False, attempt=1,
                 max_attempts=3).action is Action.SKIPPED
    onward = judge([removed], has_next_channel=True, attempt=1, max_attempts=3)
    # nothing was tried: the channel is recorded as skipped on the way to the next one
    assert (onward.action, onward.left_out) == (Action.FALLBACK, Action.SKIPPED)
    assert judge([suppressed], has_next_channel=True, attempt=1,
                 max_attempts=3).left_out is Action.SUPPRESSED
    assert judge([answer(Outcome.RETRY)], has_next_channel=True, attempt=1,
                 max_attempts=3).left_out is None
    # a suppression among them is the stronger reason
    assert judge([removed, suppressed], has_next_channel=False, attempt=1,
                 max_attempts=3).action is Action.SUPPRESSED
    assert judge([removed, answer(Outcome.SENT)], has_next_channel=False, attempt=1,
                 max_attempts=3).action is Action.SENT
