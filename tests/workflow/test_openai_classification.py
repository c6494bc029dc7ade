"""How the chat-completions client classifies a provider's answer (CONTRACT §5)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from notifkit.errors import PermanentFailure, RateLimited, RetryLater
from notifkit.transports.base import HttpReply
from notifkit.transports.openai import MAX_TOKENS, parse_reply


def reply(status: int, body: Any, headers: dict[str, str] | None = None) -> HttpReply:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return HttpReply(status, headers or {}, raw)


def error(code: str | None, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": "no", "type": kind, "param": None, "code": code}}


def test_a_completion_gives_text_and_tokens() -> None:
    body = {"id": "chatcmpl-1", "model": "gpt-4o-mini",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": " Hi! "}}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}}
    done = parse_reply(reply(200, body), "gpt-4o-mini")
    assert (done.text, done.prompt_tokens, done.completion_tokens) == ("Hi!", 11, 3)
    assert done.total_tokens == 14


def test_rate_limit_is_parked_for_retry_after_but_missing_quota_is_permanent() -> None:
    with pytest.raises(RateLimited) as limited:
        parse_reply(reply(429, error("rate_limit_exceeded", "requests"), {"Retry-After": "7"}),
                    "m")
    assert limited.value.after_s == 7.0
    with pytest.raises(PermanentFailure):
        parse_reply(reply(429, error("insufficient_quota", "insufficient_quota")), "m")


@pytest.mark.parametrize(("headers", "expected"), [
    # Without a Retry-After, OpenAI's own headers say when the limit that refused reopens: the
    # task waited the 1 s default, met another 429 and was dead-lettered long before that.
    ({"retry-after-ms": "2500"}, 2.5),
    ({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "6m0s"}, 360.0),
    ({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1h2m3.5s"}, 3723.5),
    ({"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "20ms",
      "x-ratelimit-remaining-requests": "9", "x-ratelimit-reset-requests": "5s"}, 0.02),
    ({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "7s",
      "x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "30s"}, 30.0),
    # Retry-After, where given, is the provider's word and wins
    ({"Retry-After": "3", "x-ratelimit-remaining-requests": "0",
      "x-ratelimit-reset-requests": "6m0s"}, 3.0),
    # Nothing readable: the default wait
    ({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "soon"}, 1.0),
    ({"x-ratelimit-remaining-requests": "5", "x-ratelimit-reset-requests": "6m0s"}, 1.0),
    ({"retry-after-ms": "nan"}, 1.0),
    ({}, 1.0),
])
def test_a_rate_limit_without_retry_after_waits_until_openai_says_it_resets(
    headers: dict[str, str], expected: float,
) -> None:
    with pytest.raises(RateLimited) as limited:
        parse_reply(reply(429, error("rate_limit_exceeded", "requests"), headers), "m")
    assert limited.value.after_s == pytest.approx(expected)


@pytest.mark.parametrize(("status", "code"), [(400, None), (401, "invalid_api_key"),
                                         (403, None), (404, "model_not_found"), (422, None)])
def test_client_errors_are_permanent(status: int, code: str | None) -> None:
    with pytest.raises(PermanentFailure):
        parse_reply(reply(status, error(code)), "m")


@pytest.mark.parametrize("status", [408, 500, 502, 503])
def test_server_errors_are_retried(status: int) -> None:
    with pytest.raises(RetryLater) as failed:
        parse_reply(reply(status, error(None, "server_error")), "m")
    assert not isinstance(failed.value, RateLimited)


def test_an_unreadable_success_is_retried() -> None:
    with pytest.raises(RetryLater):
        parse_reply(reply(200, b"<html>oops"), "m")


def test_a_usage_figure_longer_than_python_reads_as_an_int_does_not_unread_the_text() -> None:
    """Past 4,300 digits int() refuses a number (a ValueError), which made the whole answer
    unreadable: its text, paid for, was retried and paid for again, then dead-lettered."""
    body = (b'{"id": "chatcmpl-1", "model": "m", "choices": [{"index": 0, "message": '
            b'{"role": "assistant", "content": "Hi!"}}], "usage": {"prompt_tokens": '
            + b"9" * 5000 + b', "completion_tokens": 3}}')
    done = parse_reply(reply(200, body), "m")
    assert (done.text, done.completion_tokens) == ("Hi!", 3)
    assert 0 <= done.prompt_tokens <= MAX_TOKENS


def test_an_answer_with_bytes_that_are_no_utf8_is_sent_with_them_replaced_not_paid_again() -> None:
    """A gateway that re-encodes (Latin-1, say) leaves a byte UTF-8 has no place for: the
    whole answer was unreadable, retried (paid for again each time) and dead-lettered,
    though its text is there. It is read as a lone surrogate is, the byte as U+FFFD."""
    body = (b'{"id": "chatcmpl-1", "model": "m", "choices": [{"index": 0, "message": '
            b'{"role": "assistant", "content": "Caf\xe9 is open"}}], '
            b'"usage": {"prompt_tokens": 4, "completion_tokens": 3}}')
    done = parse_reply(reply(200, body), "m")
    assert (done.text, done.prompt_tokens) == ("Caf\ufffd is open", 4)


def test_an_answer_nested_too_deep_to_parse_is_retried_like_any_unreadable_one() -> None:
    """Python's parser gives up on deep nesting with a RecursionError, not a ValueError: it
    escaped the classification and failed the whole batch as a bug, an attempt spent by
    every task read with it."""
    deep = b"[" * 200_000 + b"]" * 200_000
    with pytest.raises(RetryLater) as failed:
        parse_reply(reply(200, deep), "m")
    assert "not JSON" in str(failed.value)


@pytest.mark.parametrize("content", ["", " \n "])
def test_a_blank_completion_is_retried_not_sent(content: str) -> None:
    body = {"id": "chatcmpl-1", "model": "m", "usage": {"prompt_tokens": 5},
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}
    with pytest.raises(RetryLater) as failed:
        parse_reply(reply(200, body), "m")
    assert "empty" in str(failed.value)


@pytest.mark.parametrize("content", [None, ""])
def test_an_answer_withheld_by_the_content_filter_is_permanent_as_a_refusal_is(
    content: str | None,
) -> None:
    """A filtered answer (finish_reason content_filter, Azure OpenAI's and OpenAI's word for
    it) holds no text, but it is no blank answer to retry: the same prompt is filtered again,
    and each retry pays for its prompt."""
    body = {"id": "chatcmpl-1", "model": "m", "usage": {"prompt_tokens": 5},
            "choices": [{"index": 0, "finish_reason": "content_filter",
                         "message": {"role": "assistant", "content": content}}]}
    with pytest.raises(PermanentFailure) as failed:
        parse_reply(reply(200, body), "m")
    assert "content filter" in str(failed.value)


def test_a_filtered_answer_that_still_holds_text_is_sent() -> None:
    body = {"choices": [{"index": 0, "finish_reason": "content_filter",
                         "message": {"role": "assistant", "content": "Your invoice"}}]}
    assert parse_reply(reply(200, body), "m").text == "Your invoice"
