"""The vocabularies shared by every simulator module: providers, fault kinds, error cases."""

from __future__ import annotations

from enum import StrEnum


class Provider(StrEnum):
    """A simulated provider; the value is the name used in the control API."""

    RESEND = "resend"
    SENDGRID = "sendgrid"
    SMTP = "smtp"
    TWILIO = "twilio"
    FCM = "fcm"
    OPENAI = "openai"


ANY_PROVIDER = "*"


class FaultKind(StrEnum):
    """What a fault rule makes the provider do instead of answering normally."""

    TIMEOUT = "timeout"
    ERROR = "error"
    RATE_LIMIT = "rate_limit"
    INVALID_TOKEN = "invalid_token"
    LOST_RESPONSE = "lost_response"
    LATENCY = "latency"
    MALFORMED = "malformed"


class ErrorCase(StrEnum):
    """A provider-neutral reason for an error answer.

    Each provider renders a case in its own wire format; the pipeline, the rate limiter and
    the fault rules only ever speak in cases, so no provider format leaks into them.
    """

    BAD_REQUEST = "bad_request"  # validation failure or unparseable body
    MISSING_CREDENTIALS = "missing_credentials"  # no credentials, or empty ones
    UNAUTHORIZED = "unauthorized"  # credentials the provider rejects (an `error` rule's 401)
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"  # idempotency key reused with another body
    TOO_LARGE = "too_large"
    INVALID_RECIPIENT = "invalid_recipient"  # the `invalid_token` fault
    RATE_LIMITED = "rate_limited"  # retryable 429
    QUOTA_EXCEEDED = "quota_exceeded"  # 429 that retrying will not fix
    SERVER_ERROR = "server_error"
    UNAVAILABLE = "unavailable"


def case_for_status(status: int) -> ErrorCase:
    """The case an `error` fault with an explicit HTTP status stands for."""
    by_status = {
        400: ErrorCase.BAD_REQUEST,
        401: ErrorCase.UNAUTHORIZED,
        403: ErrorCase.FORBIDDEN,
        404: ErrorCase.NOT_FOUND,
        409: ErrorCase.CONFLICT,
        413: ErrorCase.TOO_LARGE,
        422: ErrorCase.BAD_REQUEST,
        429: ErrorCase.QUOTA_EXCEEDED,
        502: ErrorCase.UNAVAILABLE,
        503: ErrorCase.UNAVAILABLE,
        504: ErrorCase.UNAVAILABLE,
    }
    if status in by_status:
        return by_status[status]
    return ErrorCase.SERVER_ERROR if status >= 500 else ErrorCase.BAD_REQUEST
