"""OpenAI: `POST /v1/chat/completions` and `GET /v1/models`, Bearer API key, JSON body.

Completions are deterministic: the text is derived from a hash of the model and messages,
so the same prompt always gets the same answer and tests can assert on it. `usage` counts
tokens approximately (about four characters per prompt token, one per completion word).
`stream: true` answers as server-sent events, `max_tokens` truncates with
`finish_reason: "length"`, and the text ends before the first `stop` sequence it holds.
`response_format` `json_object` answers `{"text": <the text>}`;
`json_schema` answers a JSON instance of its `schema` built from the text (see
simulators/schema_instance.py), which the SDK's `parse()` helpers validate. A JSON answer
counts one token per word of its JSON text; one longer than `max_tokens` is cut to the plain
text's first `max_tokens` words with `finish_reason: "length"`, not JSON, as OpenAI's cut-off
answer is not. A `tool_choice` that forces a call answers that call instead of text, its
arguments an instance of the function's `parameters` built the same way.
`logprobs: true` answers each token (a word with its leading space) with a log probability
derived from it and `top_logprobs` alternatives.
Errors are `{"error": {"message", "type", "param", "code"}}`. As at OpenAI, an argument the
API reference does not list is a 400 "Unrecognized request argument supplied: <name>", and a
listed one of the wrong JSON type a 400 `invalid_type` naming it.

Known models are a fixed list plus anything named `sim-*`; others get 404 model_not_found.
The fault rules' recipient pattern (`to`) matches the model name, and `invalid_token` answers
that same 404 model_not_found for the model it matches. A configured limit's 429 names the
model the body asks for, as OpenAI's does ("the model" when the body names none). Task id:
`X-Notifkit-Task-Id` header, else `metadata.notifkit_task_id`.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import secrets
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, ClassVar

from aiohttp import web

from simulators.kinds import ErrorCase, Provider
from simulators.limits import retry_after_header
from simulators.pipeline import (
    IDEMPOTENCY_HEADER,
    ErrorSpec,
    HttpProvider,
    Rejection,
    Submission,
    bearer_token,
    body_if_readable,
    header_task_id,
)
from simulators.providers.common import stored_text, strict_json, task_id_text
from simulators.records import MessageRecord
from simulators.replies import EVENT_STREAM, Reply, json_reply
from simulators.schema_instance import instance
from simulators.state import SimState

KNOWN_MODELS = (
    "gpt-4o",
    "gpt-4o-mini",
    "gpt-4.1",
    "gpt-4.1-mini",
    "gpt-4.1-nano",
    "gpt-3.5-turbo",
    "o4-mini",
    "o3",
    "o3-mini",
    "gpt-5",
    "gpt-5-mini",
    "gpt-5-nano",
)
# The dated snapshots OpenAI serves under those names, each answering as its model does. A
# team pins one in OPENAI_MODEL as OpenAI advises; a 404 for it would dead-letter every send.
SNAPSHOTS = {
    "gpt-4o-2024-05-13": "gpt-4o",
    "gpt-4o-2024-08-06": "gpt-4o",
    "gpt-4o-2024-11-20": "gpt-4o",
    "gpt-4o-mini-2024-07-18": "gpt-4o-mini",
    "gpt-4.1-2025-04-14": "gpt-4.1",
    "gpt-4.1-mini-2025-04-14": "gpt-4.1-mini",
    "gpt-4.1-nano-2025-04-14": "gpt-4.1-nano",
    "gpt-3.5-turbo-0125": "gpt-3.5-turbo",
    "gpt-3.5-turbo-1106": "gpt-3.5-turbo",
    "o4-mini-2025-04-16": "o4-mini",
    "o3-2025-04-16": "o3",
    "o3-mini-2025-01-31": "o3-mini",
    "gpt-5-2025-08-07": "gpt-5",
    "gpt-5-mini-2025-08-07": "gpt-5-mini",
    "gpt-5-nano-2025-08-07": "gpt-5-nano",
}
# Reasoning models (the o-series, GPT-5): max_completion_tokens only, and only the default
# sampling temperature.
REASONING_MODELS = frozenset({"o4-mini", "o3", "o3-mini", "gpt-5", "gpt-5-mini", "gpt-5-nano"})
GPT5_MODELS = frozenset({"gpt-5", "gpt-5-mini", "gpt-5-nano"})
REASONING_EFFORTS = ("minimal", "low", "medium", "high")
VERBOSITIES = ("low", "medium", "high")
SIM_MODEL_PREFIX = "sim-"
# Context windows in tokens; a prompt longer than its model's is refused.
CONTEXT_TOKENS = {
    "gpt-4.1": 1_047_576,
    "gpt-4.1-mini": 1_047_576,
    "gpt-4.1-nano": 1_047_576,
    "gpt-3.5-turbo": 16_385,
    "o4-mini": 200_000,
}
DEFAULT_CONTEXT_TOKENS = 128_000  # gpt-4o, gpt-4o-mini and sim-* models
ROLES = ("system", "assistant", "user", "function", "tool", "developer")
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
_SCHEMA_NAME = re.compile(r"^[a-zA-Z0-9_-]+\Z")
MAX_SCHEMA_NAME_CHARS = 64
MAX_METADATA_KEYS = 16
MAX_STOP_SEQUENCES = 4
MAX_TOP_LOGPROBS = 20
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
TASK_KEY = "notifkit_task_id"
MODEL_CREATED_S = 1_700_000_000
FINGERPRINT = "fp_notifkit_sim"
# The tiers a completion can say it was served by; "auto" (and no tier asked for) is served
# by the default tier, as OpenAI reports it.
SERVICE_TIERS = frozenset({"default", "flex", "scale", "priority"})
ASKABLE_TIERS = ("auto", "default", "flex", "scale", "priority")
# Completion text is drawn from these words.
_VOCABULARY = (
    "notification delivered reliably across every channel while the queue stays calm and the "
    "workers keep pace with steady traffic so each message reaches its reader exactly once "
    "retries back off politely when providers push back and receipts confirm the outcome "
    "quickly digest summaries group related updates into one friendly note for the user today"
)
_WORDS = _VOCABULARY.split()

_NO_KEY = (
    "You didn't provide an API key. You need to provide your API key in an Authorization header "
    "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY), or as the password field (with "
    "blank username) if you're accessing the API from your browser and are prompted for a "
    "username and password. You can obtain an API key from "
    "https://platform.openai.com/account/api-keys."
)
# (message, type, code) per case.
_ERRORS: dict[ErrorCase, tuple[str, str, str | None]] = {
    ErrorCase.BAD_REQUEST: ("Invalid request.", "invalid_request_error", None),
    ErrorCase.MISSING_CREDENTIALS: (_NO_KEY, "invalid_request_error", None),
    ErrorCase.UNAUTHORIZED: (
        "Incorrect API key provided. You can find your API key at "
        "https://platform.openai.com/account/api-keys.",
        "invalid_request_error",
        "invalid_api_key",
    ),
    ErrorCase.FORBIDDEN: (
        "You are not allowed to sample from this model",
        "invalid_request_error",
        None,
    ),
    ErrorCase.NOT_FOUND: (
        "The model `{model}` does not exist or you do not have access to it.",
        "invalid_request_error",
        "model_not_found",
    ),
    ErrorCase.CONFLICT: (
        "The request conflicts with another request.",
        "invalid_request_error",
        None,
    ),
    ErrorCase.TOO_LARGE: ("Request too large.", "invalid_request_error", None),
    # The `invalid_token` fault: an AI provider's recipient is the model (the rule's `to`
    # matches its name), and OpenAI's answer for a model a key cannot use is this 404.
    ErrorCase.INVALID_RECIPIENT: (
        "The model `{model}` does not exist or you do not have access to it.",
        "invalid_request_error",
        "model_not_found",
    ),
    ErrorCase.RATE_LIMITED: (
        "Rate limit reached for {model} in organization org-notifkit-sim on requests per min "
        "(RPM): Limit {rpm}, Used {rpm}, Requested 1. Please try again in {wait}s. Visit "
        "https://platform.openai.com/account/rate-limits to learn more.",
        "requests",
        "rate_limit_exceeded",
    ),
    ErrorCase.QUOTA_EXCEEDED: (
        "You exceeded your current quota, please check your plan and billing details. For more "
        "information on this error, read the docs: "
        "https://platform.openai.com/docs/guides/error-codes/api-errors.",
        "insufficient_quota",
        "insufficient_quota",
    ),
    ErrorCase.SERVER_ERROR: (
        "The server had an error while processing your request. Sorry about that!",
        "server_error",
        None,
    ),
    ErrorCase.UNAVAILABLE: (
        "The engine is currently overloaded, please try again later.",
        "server_error",
        None,
    ),
}


def known_model(model: str) -> bool:
    return model in KNOWN_MODELS or model in SNAPSHOTS or model.startswith(SIM_MODEL_PREFIX)


def completion_text(model: str, messages: list[Any], index: int = 0) -> str:
    """A sentence fixed by the prompt: same model, messages and choice index, same text."""
    canonical = json.dumps([model, messages, index], sort_keys=True, ensure_ascii=False)
    digest = hashlib.sha256(canonical.encode()).digest()
    count = 8 + digest[0] % 17
    words = [_WORDS[digest[1 + i % 31] * (i + 1) % len(_WORDS)] for i in range(count)]
    return " ".join(words).capitalize() + "."


def prompt_tokens(messages: list[Any]) -> int:
    total = 3  # every reply is primed with <|start|>assistant<|message|>
    for message in messages:
        text = message.get("content") if isinstance(message, dict) else None
        if not isinstance(text, str):
            text = json.dumps(text, ensure_ascii=False)
        total += 3 + math.ceil(len(text) / 4)
    return total


class OpenAI(HttpProvider):
    provider = Provider.OPENAI
    status_overrides: ClassVar[dict[ErrorCase, int]] = {ErrorCase.INVALID_RECIPIENT: 404}

    def credentials(self, request: web.Request) -> str | None:
        return bearer_token(request)

    async def limited_recipient(self, request: web.Request, state: SimState) -> str | None:
        # OpenAI's 429 names the model asked for. A body that does not name one still gets
        # the 429, in the wording without a model, never the 400 it would get within the limit.
        body = await body_if_readable(request, self, state)
        try:
            payload = strict_json(body) if body is not None else None
        except (ValueError, RecursionError):
            return None
        model = payload.get("model") if isinstance(payload, dict) else None
        return model if isinstance(model, str) and model else None

    async def parse(self, request: web.Request, body: bytes, state: SimState) -> Submission:
        try:
            payload = strict_json(body)
        except (ValueError, RecursionError):
            raise Rejection(
                ErrorCase.BAD_REQUEST,
                "We could not parse the JSON body of your request. (HINT: This likely means you "
                "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, "
                "but what was sent was not valid JSON.)",
            ) from None
        if not isinstance(payload, dict):
            raise Rejection(ErrorCase.BAD_REQUEST, "Invalid type for body: expected an object.")
        _check_arguments(payload)
        model = payload.get("model")
        if not isinstance(model, str) or not model:
            raise Rejection(ErrorCase.BAD_REQUEST, "you must provide a model parameter")
        messages = _messages(payload.get("messages"))
        _check_ranges(payload)
        _check_metadata(payload.get("metadata"))
        _check_companions(payload)
        _check_tools(payload)
        _check_stop_and_logprobs(payload)
        _check_service_tier(payload.get("service_tier"))
        n = _positive_int(payload, "n", maximum=128) or 1
        limit = _positive_int(payload, "max_completion_tokens", maximum=1_000_000)
        limit = limit or _positive_int(payload, "max_tokens", maximum=1_000_000)
        if not known_model(model):
            raise Rejection(
                ErrorCase.NOT_FOUND, _ERRORS[ErrorCase.NOT_FOUND][0].format(model=model)
            )
        base_model = SNAPSHOTS.get(model, model)
        if not model.startswith(SIM_MODEL_PREFIX):
            _check_verbosity(payload.get("verbosity"), base_model)
        if base_model in REASONING_MODELS:
            _check_reasoning_options(payload, base_model)
        elif payload.get("reasoning_effort") is not None and not model.startswith(
                SIM_MODEL_PREFIX):
            # A model that does not reason does not know the argument, in OpenAI's words.
            raise Rejection(ErrorCase.BAD_REQUEST,
                            "Unrecognized request argument supplied: reasoning_effort")
        prompt_size = prompt_tokens(messages)
        window = CONTEXT_TOKENS.get(base_model, DEFAULT_CONTEXT_TOKENS)
        if prompt_size > window:
            raise Rejection(
                ErrorCase.BAD_REQUEST,
                f"This model's maximum context length is {window} tokens. However, your "
                f"messages resulted in {prompt_size} tokens. Please reduce the length of the "
                "messages.",
                field_name="messages",
                code="context_length_exceeded",
            )
        answer_format = _answer_format(payload.get("response_format"))
        if answer_format.kind == "json_object" and not _mentions_json(messages):
            raise Rejection(
                ErrorCase.BAD_REQUEST,
                "'messages' must contain the word 'json' in some form, to use "
                "'response_format' of type 'json_object'.",
                field_name="messages",
            )
        forced = _forced_tool(payload)
        stop = _stop_sequences(payload)
        choices = [
            _choice(completion_text(model, messages, index), answer_format, limit, stop)
            if forced is None
            else _tool_call(*forced, completion_text(model, messages, index), index, limit)
            for index in range(n)
        ]
        metadata = payload.get("metadata")
        task_id = header_task_id(request)
        if task_id is None and isinstance(metadata, dict):
            task_id = task_id_text(metadata.get(TASK_KEY))
        stream_options = payload.get("stream_options")
        return Submission(
            recipients=[model],
            content={
                "model": model,
                "messages": [_stored_message(m) for m in messages],
                "completion": choices[0]["content"],
                **{name: choices[0][name] for name in ("tool_calls", "function_call")
                   if name in choices[0]},
            },
            task_id=task_id,
            idempotency_key=request.headers.get(IDEMPOTENCY_HEADER),
            payload=payload,
            meta={
                "model": model,
                "service_tier": payload.get("service_tier")
                if payload.get("service_tier") in SERVICE_TIERS else "default",
                "choices": choices,
                "prompt_tokens": prompt_size,
                "stream": payload.get("stream") is True,
                "include_usage": isinstance(stream_options, dict)
                and stream_options.get("include_usage") is True,
                # How many alternatives each token's logprobs list; None: no logprobs asked.
                "top_logprobs": (payload.get("top_logprobs") or 0)
                if payload.get("logprobs") is True else None,
            },
        )

    def new_message_id(self, state: SimState, submission: Submission) -> str:
        return "chatcmpl-" + state.ids.token(29)

    def success(self, record: MessageRecord, submission: Submission, request: web.Request) -> Reply:
        meta = record.meta
        completion_tokens = sum(choice["tokens"] for choice in meta["choices"])
        # OpenAI itemises every usage; nothing here is cached, reasoned, spoken or predicted.
        usage: dict[str, Any] = {
            "prompt_tokens": meta["prompt_tokens"],
            "completion_tokens": completion_tokens,
            "total_tokens": meta["prompt_tokens"] + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0, "audio_tokens": 0,
                "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0,
            },
        }
        created = int(record.received_at.timestamp())
        headers = {
            "x-request-id": "req_" + record.id.removeprefix("chatcmpl-"),
            "openai-processing-ms": "1",
        }
        if meta["stream"]:
            body = _event_stream(record.id, created, meta, usage)
            return Reply(status=200, body=body, content_type=EVENT_STREAM, headers=headers)
        completion = {
            "id": record.id,
            "object": "chat.completion",
            "created": created,
            "model": meta["model"],
            "choices": [
                {
                    "index": index,
                    "message": {
                        "role": "assistant", "content": choice["content"], "refusal": None,
                        **{name: choice[name] for name in ("tool_calls", "function_call")
                           if name in choice},
                    },
                    "logprobs": _logprobs(_pieces(choice["content"]), meta.get("top_logprobs")),
                    "finish_reason": choice["finish_reason"],
                }
                for index, choice in enumerate(meta["choices"])
            ],
            "usage": usage,
            "service_tier": meta.get("service_tier", "default"),
            "system_fingerprint": FINGERPRINT,
        }
        return json_reply(200, completion, headers=headers)

    def quota_headers(self, state: SimState, api_key: str) -> dict[str, str]:
        """OpenAI states its request limit with every answer: the limit per minute, what the
        key has left and when it is full again. Unmetered (no limit set) the simulator has
        no limit to state, and states none."""
        quota = state.limits.quota(self.provider, api_key)
        if quota is None:
            return {}
        limit, remaining, refill_s = quota
        return {
            "x-ratelimit-limit-requests": str(limit.per_minute),
            "x-ratelimit-remaining-requests": str(remaining),
            "x-ratelimit-reset-requests": _duration(refill_s),
        }

    def no_route(self, method: str, path: str, status: int) -> Reply:
        error = {
            "message": f"Invalid URL ({method} {path})",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
        return json_reply(status, {"error": error}, headers=_request_id())

    def error(self, spec: ErrorSpec) -> Reply:
        message, kind, code = _ERRORS[spec.case]
        reset_s = (
            retry_after_header(spec.retry_after_s) if spec.retry_after_s is not None else "1"
        )
        # The wait the message names is the one Retry-After gives.
        # Requests per minute: a fault rule's 429 states a free tier's 3, a configured
        # limit its own rate.
        rpm = str(spec.limit.per_minute if spec.limit else 3)
        message = spec.detail or message.replace("{wait}", reset_s).replace(
            "{model}", spec.recipient or "the model"
        ).replace("{rpm}", rpm)
        headers = _request_id()
        if spec.status == 429:
            headers |= {
                "x-ratelimit-limit-requests": rpm,
                "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-reset-requests": f"{reset_s}s",
            }
        body = {
            "error": {
                "message": message,
                "type": kind,
                "param": spec.field_name,
                "code": spec.code if spec.code is not None else code,
            }
        }
        return json_reply(spec.status, body, headers=headers, retry_after_s=spec.retry_after_s)


def _duration(seconds: float) -> str:
    """A wait as OpenAI writes it in its reset headers: ``17ms``, ``8.64s``, ``6m0s``."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    minutes, rest = divmod(round(seconds, 3), 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".")
    return f"{int(minutes)}m{text}s" if minutes else f"{text}s"


def _request_id() -> dict[str, str]:
    """OpenAI names every answer, errors included, with an `x-request-id`: the SDK shows it as
    the exception's `request_id`, which teams log for support. No message carries an error's id
    and no run replays it, so it needs no seed."""
    return {"x-request-id": "req_" + secrets.token_hex(16)}


def _messages(value: object) -> list[Any]:
    if value is None:
        raise Rejection(
            ErrorCase.BAD_REQUEST,
            "Missing required parameter: 'messages'.",
            field_name="messages",
            code="missing_required_parameter",
        )
    if not isinstance(value, list):
        raise Rejection(
            ErrorCase.BAD_REQUEST,
            "Invalid type for 'messages': expected an array.",
            field_name="messages",
            code="invalid_type",
        )
    if not value:
        raise Rejection(
            ErrorCase.BAD_REQUEST,
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an "
            "empty array instead.",
            field_name="messages",
            code="empty_array",
        )
    for index, message in enumerate(value):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ROLES:
            shown = json.dumps(role)[:40]
            raise Rejection(
                ErrorCase.BAD_REQUEST,
                f"Invalid value: {shown}. Supported values are: 'system', 'assistant', 'user', "
                "'function', 'tool', and 'developer'.",
                field_name=f"messages[{index}].role",
                code="invalid_value",
            )
        assert isinstance(message, dict)
        _check_content(message, index)
        # A tool's answer names the call it answers, a legacy function's the function.
        if role in _ANSWER_NAMES:
            where = f"messages[{index}].{_ANSWER_NAMES[role]}"
            named = message.get(_ANSWER_NAMES[role])
            if named is None:
                raise _missing(where)
            if not isinstance(named, str):
                raise _invalid_type(where, "a string", named)
    return value


# The member a `tool` or `function` message must carry, as OpenAI requires it.
_ANSWER_NAMES = {"tool": "tool_call_id", "function": "name"}


def _check_content(message: dict[str, Any], index: int) -> None:
    """Every message but an assistant's (which may carry only tool calls) needs content, a
    string or an array of content parts."""
    where = f"messages[{index}].content"
    content = message.get("content")
    if content is None:
        if message.get("role") in ("assistant", "function"):
            return
        raise Rejection(
            ErrorCase.BAD_REQUEST,
            f"Missing required parameter: '{where}'.",
            field_name=where,
            code="missing_required_parameter",
        )
    if not isinstance(content, str | list):
        raise Rejection(
            ErrorCase.BAD_REQUEST,
            f"Invalid type for '{where}': expected one of a string or array of objects, but "
            f"got {_json_type(content)} instead.",
            field_name=where,
            code="invalid_type",
        )


# Sampling options OpenAI range-checks: name -> (minimum, maximum).
_DECIMAL_RANGES: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}


# Every request parameter of chat completions in OpenAI's API reference (and so in the official
# SDK's `create()`), with the JSON type OpenAI refuses any other value of; null is taken for
# each, as leaving the parameter out. `messages` has checks of its own (_messages).
_STRING_OR_OBJECT = "one of a string or object"
PARAMETERS: dict[str, str | None] = {
    "model": "a string",
    "messages": None,
    "audio": "an object",
    "frequency_penalty": "a decimal",
    "function_call": _STRING_OR_OBJECT,
    "functions": "an array",
    "logit_bias": "an object",
    "logprobs": "a boolean",
    "max_completion_tokens": "an integer",
    "max_tokens": "an integer",
    "metadata": "an object",
    "modalities": "an array",
    "moderation": "an object",
    "n": "an integer",
    "parallel_tool_calls": "a boolean",
    "prediction": "an object",
    "presence_penalty": "a decimal",
    "prompt_cache_key": "a string",
    "prompt_cache_options": "an object",
    "prompt_cache_retention": "a string",
    "reasoning_effort": "a string",
    "response_format": "an object",
    "safety_identifier": "a string",
    "seed": "an integer",
    "service_tier": "a string",
    "stop": "one of a string or array of strings",
    "store": "a boolean",
    "stream": "a boolean",
    "stream_options": "an object",
    "temperature": "a decimal",
    "tool_choice": _STRING_OR_OBJECT,
    "tools": "an array",
    "top_logprobs": "an integer",
    "top_p": "a decimal",
    "user": "a string",
    "verbosity": "a string",
    "web_search_options": "an object",
}
# The Python types of each JSON type a parameter may take (a boolean is no number here).
_ACCEPTS: dict[str, tuple[type, ...]] = {
    "a boolean": (bool,),
    "an integer": (int,),
    "a decimal": (int, float),
    "a string": (str,),
    "an object": (dict,),
    "an array": (list,),
    _STRING_OR_OBJECT: (str, dict),
    "one of a string or array of strings": (str, list),
}


def _check_arguments(payload: dict[str, Any]) -> None:
    """OpenAI refuses a request with an argument it does not know (400, no param or code),
    and one whose argument is not of its type (400 invalid_type naming it), first in the
    order the body gives them."""
    for name, value in payload.items():
        if name not in PARAMETERS:
            raise Rejection(ErrorCase.BAD_REQUEST,
                            f"Unrecognized request argument supplied: {name[:256]}")
        expected = PARAMETERS[name]
        if expected is not None and value is not None and not _is_a(value, expected):
            raise _invalid_type(name, expected, value)


def _is_a(value: object, expected: str) -> bool:
    # JSON's true and false are no numbers, though Python's bool is an int.
    return isinstance(value, _ACCEPTS[expected]) and (
        isinstance(value, bool) == (expected == "a boolean"))


def _check_ranges(payload: dict[str, Any]) -> None:
    """The numeric options OpenAI refuses out of range with a 400 naming the parameter (their
    types were checked with every argument's)."""
    for name, (low, high) in _DECIMAL_RANGES.items():
        value = payload.get(name)
        if value is None:
            continue
        if value > high:
            raise Rejection(
                ErrorCase.BAD_REQUEST,
                f"Invalid '{name}': decimal above maximum value. Expected a value <= {high:g}, "
                f"but got {_decimal_text(value)} instead.",
                field_name=name,
                code="decimal_above_max_value",
            )
        if value < low:
            raise Rejection(
                ErrorCase.BAD_REQUEST,
                f"Invalid '{name}': decimal below minimum value. Expected a value >= {low:g}, "
                f"but got {_decimal_text(value)} instead.",
                field_name=name,
                code="decimal_below_min_value",
            )


@dataclass(frozen=True)
class AnswerFormat:
    """What `response_format` asks for: `kind` is one of RESPONSE_FORMATS, `schema` the JSON
    Schema of a `json_schema` answer (None when it gives none)."""

    kind: str = "text"
    schema: dict[str, Any] | None = None


def _answer_format(value: object) -> AnswerFormat:
    """`response_format` checked as OpenAI checks it (the type of the whole was checked with
    the other options)."""
    if not isinstance(value, dict):
        return AnswerFormat()
    kind = value.get("type")
    if kind is None:
        raise _missing("response_format.type")
    if not isinstance(kind, str) or kind not in RESPONSE_FORMATS:
        raise Rejection(
            ErrorCase.BAD_REQUEST,
            f"Invalid value: {json.dumps(kind)[:40]}. Supported values are: 'json_object', "
            "'json_schema', and 'text'.",
            field_name="response_format.type",
            code="invalid_value",
        )
    if kind != "json_schema":
        return AnswerFormat(kind)
    return AnswerFormat(kind, _json_schema(value.get("json_schema")))


def _mentions_json(messages: list[Any]) -> bool:
    """Whether any message's text (a string, or its text parts) says "json", in any case."""
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        parts = content if isinstance(content, list) else [{"text": content}]
        for part in parts:
            text = part.get("text") if isinstance(part, dict) else None
            if isinstance(text, str) and "json" in text.lower():
                return True
    return False


def _json_schema(spec: object) -> dict[str, Any] | None:
    """The schema of `response_format.json_schema`, once its `name`, `schema` and `strict`
    are the types OpenAI takes."""
    where = "response_format.json_schema"
    spec = _check_named(spec, where)
    name: str = spec["name"]
    _check_schema_name(name)
    schema = spec.get("schema")
    if schema is not None and not isinstance(schema, dict):
        raise _invalid_type(f"{where}.schema", "an object", schema)
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise _invalid_type(f"{where}.strict", "a boolean", strict)
    return schema


def _check_schema_name(name: str) -> None:
    where = "response_format.json_schema.name"
    if len(name) > MAX_SCHEMA_NAME_CHARS:
        raise _too_long(where, MAX_SCHEMA_NAME_CHARS, len(name))
    if not _SCHEMA_NAME.match(name):
        raise Rejection(
            ErrorCase.BAD_REQUEST,
            f"Invalid '{where}': string does not match pattern. Expected a string that "
            "matches the pattern '^[a-zA-Z0-9_-]+$'.",
            field_name=where,
            code="invalid_value",
        )


def _choice(
    text: str, answer_format: AnswerFormat, limit: int | None, stop: list[str]
) -> dict[str, Any]:
    """One choice: its content, finish reason and completion tokens (one per word). The
    content ends before the first of the `stop` sequences it holds, which OpenAI leaves out."""
    answer = _before_stop(_answer(text, answer_format), stop)
    text = _before_stop(text, stop)
    if limit is not None and len(answer.split()) > limit:
        # A cut-off answer is the plain text's first words in every mode: cut JSON does not
        # parse, and OpenAI's cut-off structured answer does not either.
        words = text.split()[:limit]
        return {"content": " ".join(words), "finish_reason": "length", "tokens": len(words)}
    return {"content": answer, "finish_reason": "stop", "tokens": len(answer.split())}


def _stop_sequences(payload: dict[str, Any]) -> list[str]:
    """`stop` as a list: a string is one sequence, and an empty one stops nothing."""
    stop = payload.get("stop")
    sequences = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    return [sequence for sequence in sequences if sequence]


def _before_stop(text: str, stop: list[str]) -> str:
    cut = min((i for i in (text.find(sequence) for sequence in stop) if i >= 0), default=-1)
    return text if cut < 0 else text[:cut]


def _forced_tool(payload: dict[str, Any]) -> tuple[dict[str, Any], str, bool] | None:
    """The function that `tool_choice` (or the legacy `function_call`, the third item True)
    makes the model call, and the finish reason OpenAI gives that answer: `"required"` calls
    the first function tool (`tool_calls`), a named function that one (`stop`). None when the
    model may answer in text."""
    legacy = payload.get("function_call")
    if isinstance(legacy, dict):
        listed = payload.get("functions")
        functions = [f for f in (listed if isinstance(listed, list) else [])
                     if isinstance(f, dict)]
        called = _named(functions, legacy.get("name"), "function_call", "function", "functions")
        return called, "stop", True
    choice = payload.get("tool_choice")
    tools = payload.get("tools")
    functions = [
        tool["function"] for tool in (tools if isinstance(tools, list) else [])
        if isinstance(tool, dict) and isinstance(tool.get("function"), dict)
        and isinstance(tool["function"].get("name"), str)
    ]
    if choice == "required":
        return (functions[0], "tool_calls", False) if functions else None
    if not (isinstance(choice, dict) and isinstance(choice.get("function"), dict)):
        return None
    name = choice["function"].get("name")
    return _named(functions, name, "tool_choice", "tool choice", "tools"), "stop", False


def _named(
    functions: list[dict[str, Any]], name: object, field: str, what: str, listed_in: str
) -> dict[str, Any]:
    """The function of ``functions`` called ``name``, else OpenAI's 400 on ``field``."""
    for function in functions:
        if function.get("name") == name:
            return function
    raise Rejection(
        ErrorCase.BAD_REQUEST,
        f"Invalid value for '{field}': {what} '{str(name)[:64]}' not found in '{listed_in}' "
        "parameter.",
        field_name=field,
    )


def _tool_call(
    function: dict[str, Any], finish_reason: str, legacy: bool, text: str, index: int,
    limit: int | None,
) -> dict[str, Any]:
    """One choice that calls ``function``, its arguments a JSON instance of its parameters
    built from the completion text (cut off after ``limit`` tokens, finish reason `length`, as
    OpenAI cuts them); the call id is derived from them, so a replay names it alike. A
    ``legacy`` call answers `function_call` (name and arguments, no id) instead."""
    parameters = function.get("parameters")
    schema = parameters if isinstance(parameters, dict) else {"type": "object"}
    arguments = json.dumps(instance(schema, text), ensure_ascii=False)
    if limit is not None and len(arguments.split(" ")) > limit:
        arguments = " ".join(arguments.split(" ")[:limit])
        finish_reason = "length"
    tokens = len(arguments.split(" "))
    if legacy:
        return {"content": None, "finish_reason": finish_reason, "tokens": tokens,
                "function_call": {"name": function["name"], "arguments": arguments}}
    digest = hashlib.sha256(f"{function['name']}\0{arguments}\0{index}".encode()).hexdigest()
    call = {"id": "call_" + digest[:24], "type": "function",
            "function": {"name": function["name"], "arguments": arguments}}
    return {"content": None, "tool_calls": [call], "finish_reason": finish_reason,
            "tokens": tokens}


def _answer(text: str, answer_format: AnswerFormat) -> str:
    if answer_format.schema is not None:
        return json.dumps(instance(answer_format.schema, text), ensure_ascii=False)
    if answer_format.kind != "text":
        return json.dumps({"text": text})
    return text


def _too_long(where: str, maximum: int, length: int, what: str = "string") -> Rejection:
    return Rejection(
        ErrorCase.BAD_REQUEST,
        f"Invalid '{where}': {what} too long. Expected a {what} with maximum length {maximum}, "
        f"but got a {what} with length {length} instead.",
        field_name=where,
        code="string_above_max_length",
    )


def _check_metadata(metadata: object) -> None:
    """OpenAI's metadata is a map of at most 16 keys of up to 64 characters, each to a string
    of up to 512 (its type as a whole was checked with every argument's)."""
    if not isinstance(metadata, dict):
        return
    if len(metadata) > MAX_METADATA_KEYS:
        raise Rejection(
            ErrorCase.BAD_REQUEST,
            f"Invalid 'metadata': too many properties. Expected an object with at most "
            f"{MAX_METADATA_KEYS} properties, but got an object with {len(metadata)} "
            "properties instead.",
            field_name="metadata",
            code="object_above_max_properties",
        )
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY_CHARS:
            raise _too_long("metadata", MAX_METADATA_KEY_CHARS, len(key), "key")
        if not isinstance(value, str):
            raise _invalid_type(f"metadata.{key}", "a string", value)
        if len(value) > MAX_METADATA_VALUE_CHARS:
            raise _too_long(f"metadata.{key}", MAX_METADATA_VALUE_CHARS, len(value))


def _check_reasoning_options(payload: dict[str, Any], base_model: str) -> None:
    """What an o-series model refuses that gpt-4o takes, in OpenAI's words, and the efforts
    each reasoning model takes (``minimal`` is the gpt-5 family's only)."""
    effort = payload.get("reasoning_effort")
    if effort is not None:
        if effort not in REASONING_EFFORTS:
            raise _invalid_value("reasoning_effort", effort, REASONING_EFFORTS)
        takes = REASONING_EFFORTS if base_model in GPT5_MODELS else REASONING_EFFORTS[1:]
        if effort not in takes:
            raise _unsupported_value("reasoning_effort", effort, takes)
    if payload.get("max_tokens") is not None:
        raise Rejection(
            ErrorCase.BAD_REQUEST,
            "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
            "'max_completion_tokens' instead.",
            field_name="max_tokens",
            code="unsupported_parameter",
        )
    temperature = payload.get("temperature")
    if temperature is not None and temperature != 1:
        raise Rejection(
            ErrorCase.BAD_REQUEST,
            f"Unsupported value: 'temperature' does not support {_decimal_text(temperature)} "
            "with this model. Only the default (1) value is supported.",
            field_name="temperature",
            code="unsupported_value",
        )


def _check_verbosity(verbosity: object, base_model: str) -> None:
    """A verbosity OpenAI has; any but ``medium`` is the gpt-5 family's alone."""
    if verbosity is None:
        return
    if verbosity not in VERBOSITIES:
        raise _invalid_value("verbosity", verbosity, VERBOSITIES)
    if base_model not in GPT5_MODELS and verbosity != "medium":
        raise _unsupported_value("verbosity", verbosity, ("medium",))


def _quoted(values: tuple[str, ...]) -> str:
    """'a', 'b', and 'c', as OpenAI lists what it takes."""
    items = [f"'{v}'" for v in values]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + ", and " + items[-1]


def _invalid_value(name: str, value: object, values: tuple[str, ...]) -> Rejection:
    return Rejection(
        ErrorCase.BAD_REQUEST,
        f"Invalid value: '{str(value)[:40]}'. Supported values are: {_quoted(values)}.",
        field_name=name,
        code="invalid_value",
    )


def _unsupported_value(name: str, value: object, values: tuple[str, ...]) -> Rejection:
    return Rejection(
        ErrorCase.BAD_REQUEST,
        f"Unsupported value: '{name}' does not support '{str(value)[:40]}' with this "
        f"model. Supported values are: {_quoted(values)}.",
        field_name=name,
        code="unsupported_value",
    )


def _check_service_tier(tier: object) -> None:
    """A tier OpenAI has (its JSON type was checked with every argument's)."""
    if tier is None or tier in ASKABLE_TIERS:
        return
    shown = json.dumps(tier)[:40]
    raise Rejection(
        ErrorCase.BAD_REQUEST,
        f"Invalid value: {shown}. Supported values are: 'auto', 'default', 'flex', 'scale', "
        "and 'priority'.",
        field_name="service_tier",
        code="invalid_value",
    )


def _check_stop_and_logprobs(payload: dict[str, Any]) -> None:
    """Up to 4 `stop` sequences, each a string, and 0-20 `top_logprobs` (their JSON types
    were checked with every argument's), in OpenAI's words."""
    stop = payload.get("stop")
    if isinstance(stop, list):
        if len(stop) > MAX_STOP_SEQUENCES:
            raise Rejection(
                ErrorCase.BAD_REQUEST,
                f"Invalid 'stop': array too long. Expected an array with maximum length "
                f"{MAX_STOP_SEQUENCES}, but got an array with length {len(stop)} instead.",
                field_name="stop",
                code="array_above_max_length",
            )
        for index, sequence in enumerate(stop):
            if not isinstance(sequence, str):
                raise _invalid_type(f"stop[{index}]", "a string", sequence)
    top = payload.get("top_logprobs")
    if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
        above = top > MAX_TOP_LOGPROBS
        raise Rejection(
            ErrorCase.BAD_REQUEST,
            f"Invalid 'top_logprobs': integer {'above maximum' if above else 'below minimum'} "
            f"value. Expected a value {'<=' if above else '>='} "
            f"{MAX_TOP_LOGPROBS if above else 0}, but got {_decimal_text(top)} instead.",
            field_name="top_logprobs",
            code="integer_above_max_value" if above else "integer_below_min_value",
        )


def _check_companions(payload: dict[str, Any]) -> None:
    """Options OpenAI takes only beside another: `stream_options` with `stream: true`,
    `metadata` with `store: true`, and `tool_choice` and `parallel_tool_calls` with `tools`.
    Alone they are its 400, which a client that always sends them meets in production."""
    if payload.get("stream_options") is not None and payload.get("stream") is not True:
        raise Rejection(
            ErrorCase.BAD_REQUEST,
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            field_name="stream_options",
        )
    # OpenAI keeps metadata with a stored completion and has nowhere to put it otherwise.
    if payload.get("metadata") and payload.get("store") is not True:
        raise Rejection(
            ErrorCase.BAD_REQUEST,
            "The 'metadata' parameter is only allowed when 'store' is enabled.",
            field_name="metadata",
        )
    if payload.get("function_call") is not None and payload.get("functions") is None:
        raise Rejection(
            ErrorCase.BAD_REQUEST,
            "Invalid value for 'function_call': 'function_call' is only allowed when "
            "'functions' are specified.",
            field_name="function_call",
        )
    if payload.get("tools") is None:
        for name in ("tool_choice", "parallel_tool_calls"):
            if payload.get(name) is not None:
                raise Rejection(
                    ErrorCase.BAD_REQUEST,
                    f"Invalid value for '{name}': '{name}' is only allowed when 'tools' are "
                    "specified.",
                    field_name=name,
                )


# The modes a `tool_choice` (or the legacy `function_call`) string may name.
TOOL_CHOICES = ("none", "auto", "required")
FUNCTION_CALL_MODES = ("none", "auto")


def _check_tools(payload: dict[str, Any]) -> None:
    """`tools`, `tool_choice` and the legacy `functions` and `function_call`, checked as OpenAI
    checks them (their own types were checked with every argument's): each tool an object with
    a `type`, a function tool's `function` an object with a `name`, a choice one of OpenAI's
    modes or an object naming its function. Anything else is OpenAI's 400 naming the field,
    not an answer in text or a call of a function with no name."""
    tools = payload.get("tools")
    for index, tool in enumerate(tools if isinstance(tools, list) else []):
        where = f"tools[{index}]"
        if not isinstance(tool, dict):
            raise _invalid_type(where, "an object", tool)
        if _string_member(tool, "type", where) == "function":
            _check_function(tool.get("function"), f"{where}.function")
    functions = payload.get("functions")
    for index, function in enumerate(functions if isinstance(functions, list) else []):
        _check_function(function, f"functions[{index}]")
    choice = payload.get("tool_choice")
    _check_mode(choice, "tool_choice", TOOL_CHOICES)
    if isinstance(choice, dict) and _string_member(choice, "type", "tool_choice") == "function":
            _check_named(choice.get("function"), "tool_choice.function")
    call = payload.get("function_call")
    _check_mode(call, "function_call", FUNCTION_CALL_MODES)
    if isinstance(call, dict):
        _check_named(call, "function_call")


def _check_function(function: object, where: str) -> None:
    """A function definition: an object with a `name` and, if any, `parameters` an object."""
    function = _check_named(function, where)
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise _invalid_type(f"{where}.parameters", "an object", parameters)


def _check_named(value: object, where: str) -> dict[str, Any]:
    """``value`` as an object with a string `name` (a function's definition or choice, a
    response format's schema), else OpenAI's 400 naming what is missing or mistyped."""
    if value is None:
        raise _missing(where)
    if not isinstance(value, dict):
        raise _invalid_type(where, "an object", value)
    _string_member(value, "name", where)
    return value


def _string_member(value: dict[str, Any], member: str, where: str) -> str:
    """``value[member]``, a string, else OpenAI's 400 naming ``{where}.{member}``."""
    found = value.get(member)
    if found is None:
        raise _missing(f"{where}.{member}")
    if not isinstance(found, str):
        raise _invalid_type(f"{where}.{member}", "a string", found)
    return found


def _check_mode(choice: object, field: str, modes: tuple[str, ...]) -> None:
    """A string `tool_choice` or `function_call` must be one of OpenAI's modes."""
    if not isinstance(choice, str) or choice in modes:
        return
    listed = [f"'{mode}'" for mode in modes]
    supported = (f"{listed[0]} and {listed[1]}" if len(listed) == 2
                 else ", ".join(listed[:-1]) + f", and {listed[-1]}")
    raise Rejection(
        ErrorCase.BAD_REQUEST,
        f"Invalid value: {json.dumps(choice)[:40]}. Supported values are: {supported}.",
        field_name=field,
        code="invalid_value",
    )


def _missing(name: str) -> Rejection:
    return Rejection(
        ErrorCase.BAD_REQUEST,
        f"Missing required parameter: '{name}'.",
        field_name=name,
        code="missing_required_parameter",
    )


def _decimal_text(value: int | float) -> str:
    """``value`` as OpenAI writes a decimal in its messages (`9`, `2.5`, `1e+20`)."""
    try:
        return f"{value:g}"
    except OverflowError:
        # JSON integers have no size limit, and `:g` converts an int to float first.
        return format(Decimal(value), ".6g")


def _invalid_type(name: str, expected: str, value: object) -> Rejection:
    return Rejection(
        ErrorCase.BAD_REQUEST,
        f"Invalid type for '{name}': expected {expected}, but got {_json_type(value)} instead.",
        field_name=name,
        code="invalid_type",
    )


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "null"


def _positive_int(payload: dict[str, Any], name: str, *, maximum: int) -> int | None:
    value = payload.get(name)
    if value is None:
        return None
    assert isinstance(value, int)  # _check_arguments refused any other type
    if not 1 <= value <= maximum:
        raise Rejection(
            ErrorCase.BAD_REQUEST,
            f"Invalid '{name}': integer between 1 and {maximum} expected.",
            field_name=name,
            code="invalid_value",
        )
    return value


def _stored_message(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    return {
        "role": message.get("role"),
        "content": stored_text(content) if isinstance(content, str) else content,
    }


def _event_stream(
    completion_id: str, created: int, meta: dict[str, Any], usage: dict[str, Any]
) -> bytes:
    """The same completion as chat.completion.chunk events, one word per chunk."""
    base = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": meta["model"],
        "service_tier": meta.get("service_tier", "default"),
    }
    base["system_fingerprint"] = FINGERPRINT
    events: list[dict[str, Any]] = []
    for index, choice in enumerate(meta["choices"]):
        calls = choice.get("tool_calls")
        legacy = choice.get("function_call")
        if calls:
            # A call streams as its id and name first, then its arguments piece by piece.
            call = calls[0]
            opening = {**call, "index": 0, "function": {**call["function"], "arguments": ""}}
            events.append({**base, "choices": [_delta(
                index, {"role": "assistant", "content": None, "tool_calls": [opening]})]})
            pieces = call["function"]["arguments"].split(" ")
        elif legacy:
            events.append({**base, "choices": [_delta(index, {
                "role": "assistant", "content": None,
                "function_call": {"name": legacy["name"], "arguments": ""}})]})
            pieces = legacy["arguments"].split(" ")
        else:
            events.append(
                {**base, "choices": [_delta(index, {"role": "assistant", "content": ""})]})
            pieces = choice["content"].split(" ")
        for position, word in enumerate(pieces):
            piece = word if position == 0 else " " + word
            delta = ({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]} if calls
                     else {"function_call": {"arguments": piece}} if legacy
                     else {"content": piece})
            chunk = _delta(index, delta)
            if not (calls or legacy) and meta.get("top_logprobs") is not None:
                [entry] = _token_logprobs([piece], meta["top_logprobs"], first=position)
                chunk["logprobs"] = {"content": [entry], "refusal": None}
            events.append({**base, "choices": [chunk]})
        events.append({**base, "choices": [_delta(index, {}, choice["finish_reason"])]})
    if meta["include_usage"]:
        events.append({**base, "choices": [], "usage": usage})
    lines = [f"data: {json.dumps(event, ensure_ascii=False)}\n\n" for event in events]
    lines.append("data: [DONE]\n\n")
    return "".join(lines).encode()


# Alternatives a token's top_logprobs may list beside the answer's own tokens, so that any
# top_logprobs up to 20 is filled with distinct tokens.
_ALTERNATIVES = tuple(f" {word}" for word in (
    "the", "a", "and", "to", "of", "in", "is", "for", "on", "with", "that", "it", "as", "at",
    "by", "this", "be", "or", "from", "an", "are", "was"))


def _pieces(content: str | None) -> list[str]:
    """``content`` as the tokens the simulator counts: each word with its leading space."""
    if not content:
        return []
    words = content.split(" ")
    return [word if position == 0 else " " + word for position, word in enumerate(words)]


def _logprobs(pieces: list[str], top: int | None) -> dict[str, Any] | None:
    """A choice's `logprobs` when they were asked for (`top` alternatives per token)."""
    if top is None:
        return None
    return {"content": _token_logprobs(pieces, top), "refusal": None}


def _token_logprobs(pieces: list[str], top: int, *, first: int = 0) -> list[dict[str, Any]]:
    """Each token with a log probability derived from it and its position (``first`` is the
    position of ``pieces[0]``), and ``top`` alternatives, the token itself the likeliest."""
    entries = []
    for position, token in enumerate(pieces, start=first):
        digest = hashlib.sha256(f"{position}\0{token}".encode()).digest()
        logprob = -round(int.from_bytes(digest[:2], "big") / 32768, 6)  # in (-2, 0]
        others = [t for t in dict.fromkeys((*_ALTERNATIVES, " " + token.strip())) if t != token]
        alternatives = [token, *others][:top]
        entries.append({
            "token": token, "logprob": logprob, "bytes": list(token.encode()),
            "top_logprobs": [
                {"token": t, "logprob": round(logprob - rank, 6), "bytes": list(t.encode())}
                for rank, t in enumerate(alternatives)
            ],
        })
    return entries


def _delta(index: int, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


async def list_models(request: web.Request) -> web.Response:
    provider = OpenAI()
    if provider.credentials(request) is None:
        return provider.render(ErrorCase.MISSING_CREDENTIALS).response()
    data = [_model(name) for name in (*KNOWN_MODELS, *SNAPSHOTS)]
    return json_reply(200, {"object": "list", "data": data}).response()


async def get_model(request: web.Request) -> web.Response:
    provider = OpenAI()
    if provider.credentials(request) is None:
        return provider.render(ErrorCase.MISSING_CREDENTIALS).response()
    name = request.match_info["model"]
    if not known_model(name):
        message = _ERRORS[ErrorCase.NOT_FOUND][0].format(model=name)
        return provider.render(ErrorCase.NOT_FOUND, detail=message).response()
    return json_reply(200, _model(name)).response()


def _model(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": MODEL_CREATED_S, "owned_by": "system"}
