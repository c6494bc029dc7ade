"""What a failure means, in two or three exception types.

Services raise these; the worker and delivery map them onto the contract's failure classes
(CONTRACT §5) in one place each, so a reader finds "how is a 429 handled" without grepping.
"""

from __future__ import annotations


class NotifkitError(Exception):
    """Base class of notifkit's own exceptions."""


class MalformedPayload(NotifkitError):
    """A stream entry that can never be parsed: logged, counted and acked at once."""


class RetryLater(NotifkitError):
    """A transient failure; the attempt failed and the retry cycle (or parking) takes over.

    ``after_s`` is the provider's Retry-After when it named one (429 parking).
    """

    def __init__(self, message: str, *, after_s: float | None = None) -> None:
        super().__init__(message)
        self.after_s = after_s


class RateLimited(RetryLater):
    """The provider answered 429: park the task until the window reopens."""


class PermanentFailure(NotifkitError):
    """Retrying cannot help (AI 4xx, unsupported model, rejected payload): dead-letter now."""


class AttemptsExhausted(PermanentFailure):
    """A transient failure (timeout, 5xx, 429) on the last attempt: dead-letter now, and say
    so rather than calling the cause permanent."""
