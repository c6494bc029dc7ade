"""An OpenAI-compatible chat-completions client for the ai service.

``POST {base_url}/chat/completions`` with a Bearer key; every call bounded by
``PROVIDER_TIMEOUT_SECONDS``. Answers are classified once, here (CONTRACT §5):

    200 with a message          -> Completion (text and tokens used)
    429 rate_limit_exceeded     -> RateLimited(after_s = Retry-After): the task is parked
    429 insufficient_quota      -> PermanentFailure: waiting does not buy quota
    200 with a refusal, or withheld by the content filter, no text
                                -> PermanentFailure, as a 4xx
    other 4xx (400, 401, 403, 404 model_not_found, ...)
                                -> PermanentFailure: dead-lettered at once, never re-sent,
                                   so a rejection is billed (and logged) once
    5xx, 408, timeout, connection failure, unparseable 200, an answer over 8 MiB (read no
    further)
                                -> RetryLater: the reclaim cycle tries again

A 200 whose text is there is paid for, so nothing else in it may fail the task (a retry would
ask, and pay, again): the text loses the characters no message carries and PostgreSQL cannot
store (NUL, other control characters but tab and line breaks, lone surrogates; bytes that
are no UTF-8 are read as U+FFFD), usage figures that are not counts (negative, fractional,
not numbers, past what a column holds) count as 0 or the most it holds, and a model name
that is not a clean name is the one asked for.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from dataclasses import dataclass

import aiohttp

from notifkit.config import Settings
from notifkit.errors import PermanentFailure, RateLimited, RetryLater
from notifkit.transports.base import (
    TASK_ID_HEADER,
    HttpReply,
    bounded_wait,
    error_detail,
    header,
    read_head,
)

DEFAULT_RETRY_AFTER_S = 1.0
NOT_RETRYABLE_429 = ("insufficient_quota",)
# The most of an answer the client reads. A completion, even one of the largest output a
# model writes, JSON-escaped, is a few MiB at most; a gateway answering with an endless or
# huge body would otherwise be held in memory whole until the timeout.
MAX_ANSWER_BYTES = 8 << 20
# The most a usage column (PostgreSQL integer) holds.
MAX_TOKENS = 2**31 - 1
# C0 but tab and line feed, DEL and C1: no e-mail, SMS or push body carries them.
_UNSENDABLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# OpenAI's reset times: "20ms", "1s", "6m0s", "1h2m3.5s".
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


@dataclass(frozen=True)
class Completion:
    text: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    response_id: str | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class OpenAiClient:
    provider = "openai"

    def __init__(
        self, *, base_url: str, api_key: str | None, timeout_s: float = 10.0,
        connections: int = 32,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.connections = connections
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> OpenAiClient:
        return cls(base_url=settings.ai.base_url, api_key=settings.ai.api_key,
                   timeout_s=settings.provider_timeout_s)

    async def open(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self.connections, keepalive_timeout=30)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def complete(
        self, *, model: str, messages: list[dict[str, str]], task_id: str,
    ) -> Completion:
        """One chat completion; raises RetryLater, RateLimited or PermanentFailure."""
        if not self.api_key:
            raise PermanentFailure("no AI provider is configured (set OPENAI_API_KEY)")
        await self.open()
        assert self._session is not None
        # The task id rides in the header only: OpenAI takes `metadata` only with `store: true`
        # (a 400 otherwise), and storing would keep every prompt, user data included, there.
        body = {"model": model, "messages": messages}
        headers = {"Authorization": f"Bearer {self.api_key}", TASK_ID_HEADER: task_id}
        try:
            async with asyncio.timeout(self.timeout_s):
                async with self._session.post(
                    f"{self.base_url}/chat/completions", json=body, headers=headers
                ) as response:
                    parts: list[bytes] = []
                    if not await read_head(response.content, MAX_ANSWER_BYTES, parts):
                        response.close()  # the rest is never read
                        raise RetryLater(f"the model's answer is larger than "
                                         f"{MAX_ANSWER_BYTES >> 20} MiB, more than any "
                                         f"completion; it was not read")
                    reply = HttpReply(response.status, dict(response.headers), b"".join(parts))
        except TimeoutError:
            raise RetryLater(f"the model gave no answer within {self.timeout_s:g} s") from None
        except aiohttp.ClientConnectorError as exc:
            # Its repr is aiohttp's connection key; its text names host and port, as
            # delivery's "could not connect" does.
            raise RetryLater(f"could not reach the model: {exc}") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise RetryLater(f"could not reach the model: {exc!r}") from None
        return parse_reply(reply, model)


def error_code(reply: HttpReply) -> str | None:
    """OpenAI's ``error.code`` (or ``error.type``) from an error answer."""
    payload = reply.json()
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        error = payload["error"]
        code = error.get("code") or error.get("type")
        return str(code) if code else None
    return None


def _rate_limit_wait(reply: HttpReply) -> float | None:
    """How long a 429 asks to wait: Retry-After, else ``retry-after-ms``, else the latest
    reset (``x-ratelimit-reset-requests`` / ``-tokens``) of a limit with nothing remaining.
    OpenAI often sends only the last: the default second then met another 429 each time."""
    if reply.retry_after_s is not None:
        return reply.retry_after_s
    try:
        millis = float(header(reply, "retry-after-ms") or "nan")
    except ValueError:
        millis = math.nan
    if math.isfinite(millis):
        return bounded_wait(millis / 1000)
    resets = [_duration_s(header(reply, f"x-ratelimit-reset-{limit}"))
              for limit in ("requests", "tokens")
              if (header(reply, f"x-ratelimit-remaining-{limit}") or "").strip() == "0"]
    known = [r for r in resets if r is not None]
    return bounded_wait(max(known)) if known else None


def _duration_s(value: str | None) -> float | None:
    """``6m0s`` and the like in seconds; None when it is not one."""
    text = (value or "").strip()
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        return None
    return sum(float(number) * _UNIT_S[unit] for number, unit in parts)


def parse_reply(reply: HttpReply, model: str) -> Completion:
    detail = error_detail(reply)
    if reply.status == 429:
        if error_code(reply) in NOT_RETRYABLE_429:
            raise PermanentFailure(f"the AI provider refused for quota: {detail}")
        raise RateLimited(f"the AI provider is rate limiting: {detail}",
                          after_s=_rate_limit_wait(reply) or DEFAULT_RETRY_AFTER_S)
    if reply.status == 408 or reply.status >= 500:
        raise RetryLater(f"the AI provider failed: {detail}")
    if not reply.ok:
        raise PermanentFailure(f"the AI provider rejected the request: {detail}")
    payload = reply.json()
    if payload is None:
        # Reading into None would report a Python TypeError instead of what was wrong.
        raise RetryLater(f"the AI provider's answer could not be read (it is not JSON): "
                         f"{reply.body[:200]!r}")
    try:
        choice = payload["choices"][0]
        text = choice["message"]["content"]
        refusal = choice["message"].get("refusal")
        if not (isinstance(text, str) and text.strip()) and isinstance(refusal, str) \
                and refusal.strip():
            # The same prompt gets the same refusal: asking again would only pay for it again.
            raise PermanentFailure(f"the model refused to write the content: "
                                   f"{sendable(refusal)[:200]}")
        if not (isinstance(text, str) and text.strip()) \
                and choice.get("finish_reason") == "content_filter":
            # Withheld by the provider's content filter: the same prompt is filtered again.
            raise PermanentFailure("the model's answer was withheld by the provider's content "
                                   "filter")
        if not isinstance(text, str):
            raise TypeError("content is not text")
        if not text.strip():  # sent as is, it would be a blank notification
            raise ValueError("content is empty")
        text = sendable(text)
        if not text:  # sent as is, it would be a blank notification
            raise ValueError("content holds no text")
        usage = payload.get("usage")
        if not isinstance(usage, dict):
            usage = {}
        answered = payload.get("model")
        if isinstance(answered, int | float) and not isinstance(answered, bool):
            answered = str(answered)
        return Completion(
            text=text,
            model=answered if isinstance(answered, str) and answered
            and answered.isprintable() and sendable(answered) == answered else model,
            prompt_tokens=token_count(usage.get("prompt_tokens")),
            completion_tokens=token_count(usage.get("completion_tokens")),
            response_id=payload.get("id") if isinstance(payload.get("id"), str) else None,
        )
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        shown = json.dumps(payload)[:200]
        raise RetryLater(f"the AI provider's answer could not be read ({exc}): {shown!r}") \
            from None


def sendable(text: str) -> str:
    """``text`` as a message can carry it: line breaks as ``\\n``, no other control character,
    a lone surrogate (valid JSON, invalid UTF-8) as U+FFFD, no surrounding white space."""
    text = _UNSENDABLE.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))
    if not text.isascii():
        text = "".join("\ufffd" if "\ud800" <= char <= "\udfff" else char for char in text)
    return text.strip()


def token_count(value: object) -> int:
    """A usage figure as a count a usage column holds: 0 when it is not one."""
    if isinstance(value, float) and math.isfinite(value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        return 0
    return min(max(value, 0), MAX_TOKENS)
