"""The official `openai` SDK, given only `base_url=<simulator>/v1`, gets deterministic chat
completions with usage, and OpenAI's errors as the SDK's own exception classes."""

from __future__ import annotations

import datetime
import enum
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam
from openai.types.shared_params import ResponseFormatJSONSchema
from pydantic import BaseModel, Field

from simulators import SimulatorServer

SHORT_TIMEOUT_S = 0.5
PROMPT: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Summarise today's notifications."}
]
# JSON mode needs the word in the messages, as at OpenAI.
JSON_PROMPT: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Summarise today's notifications as JSON."}
]


Factory = Callable[..., AsyncOpenAI]


@pytest.fixture
async def client() -> AsyncIterator[Factory]:
    """Build SDK clients for a simulator; all are closed after the test."""
    made: list[AsyncOpenAI] = []

    def build(sim: SimulatorServer, *, timeout_s: float = 5.0) -> AsyncOpenAI:
        # max_retries=0: the test sees each answer itself instead of the SDK's own retries.
        ai = AsyncOpenAI(
            api_key="sk-test", base_url=f"{sim.base_url}/v1", max_retries=0, timeout=timeout_s
        )
        made.append(ai)
        return ai

    yield build
    for ai in made:
        await ai.close()


async def test_completion_is_deterministic_with_usage(
    sim: SimulatorServer, client: Factory
) -> None:
    ai = client(sim)

    first = await ai.chat.completions.create(model="gpt-4o-mini", messages=PROMPT)
    second = await ai.chat.completions.create(model="gpt-4o-mini", messages=PROMPT)
    other = await ai.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "Something else"}]
    )

    text = first.choices[0].message.content
    assert text
    assert second.choices[0].message.content == text
    assert other.choices[0].message.content != text
    assert first.choices[0].finish_reason == "stop"
    assert first.id.startswith("chatcmpl-")
    assert first.usage is not None
    usage = first.usage
    assert usage.prompt_tokens > 0
    assert usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert len(await sim.messages("openai")) == 3


async def test_task_id_from_metadata_and_max_tokens(sim: SimulatorServer, client: Factory) -> None:
    completion = await client(sim).chat.completions.create(
        model="sim-digest",
        messages=PROMPT,
        max_tokens=3,
        store=True,
        metadata={"notifkit_task_id": "task-ai"},
    )
    assert completion.choices[0].finish_reason == "length"
    assert len((completion.choices[0].message.content or "").split()) == 3
    [record] = await sim.messages("openai", task_id="task-ai")
    assert record["to"] == "sim-digest"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_a_stop_sequence_ends_the_answer_before_it(
    sim: SimulatorServer, client: Factory, stream: bool
) -> None:
    """OpenAI stops at the first stop sequence the text holds and leaves it out."""
    full = await client(sim).chat.completions.create(model="gpt-4o-mini", messages=PROMPT)
    words = (full.choices[0].message.content or "").split()
    assert len(words) > 3
    stop = " " + words[2]
    expected = (full.choices[0].message.content or "").split(stop)[0]
    if stream:
        chunks = await client(sim).chat.completions.create(
            model="gpt-4o-mini", messages=PROMPT, stop=[stop, "never in it"], stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
    else:
        cut = await client(sim).chat.completions.create(
            model="gpt-4o-mini", messages=PROMPT, stop=stop
        )
        assert cut.choices[0].finish_reason == "stop"
        text = cut.choices[0].message.content or ""
    assert text == expected
    assert stop not in text


async def test_json_mode_returns_json(sim: SimulatorServer, client: Factory) -> None:
    completion = await client(sim).chat.completions.create(
        model="gpt-4o", messages=JSON_PROMPT, response_format={"type": "json_object"}
    )
    assert "text" in json.loads(completion.choices[0].message.content or "")


async def test_json_mode_needs_the_word_json_in_the_messages(
    sim: SimulatorServer, client: Factory
) -> None:
    """OpenAI's JSON mode refuses messages that never say "json" (in any case, in any
    message or text part)."""
    with pytest.raises(openai.BadRequestError) as caught:
        await client(sim).chat.completions.create(
            model="gpt-4o", messages=PROMPT, response_format={"type": "json_object"})
    assert caught.value.param == "messages"
    assert caught.value.message.endswith(
        "'messages' must contain the word 'json' in some form, to use 'response_format' of "
        "type 'json_object'.")
    assert await sim.messages("openai") == []
    parts: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": [{"type": "text", "text": "Answer in Json."}]},
        *PROMPT]
    await client(sim).chat.completions.create(
        model="gpt-4o", messages=parts, response_format={"type": "json_object"})


async def test_streaming_matches_plain_completion(sim: SimulatorServer, client: Factory) -> None:
    ai = client(sim)
    plain = await ai.chat.completions.create(model="gpt-4o", messages=PROMPT)
    stream = await ai.chat.completions.create(
        model="gpt-4o", messages=PROMPT, stream=True, stream_options={"include_usage": True}
    )
    pieces = []
    usage = None
    async for chunk in stream:
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(pieces) == plain.choices[0].message.content
    assert usage is not None
    assert plain.usage is not None
    assert usage.total_tokens == plain.usage.total_tokens


async def test_models_list(sim: SimulatorServer, client: Factory) -> None:
    models = [model.id async for model in client(sim).models.list()]
    assert "gpt-4o-mini" in models


async def test_unknown_model_is_404_model_not_found(sim: SimulatorServer, client: Factory) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await client(sim).chat.completions.create(model="gpt-nonexistent", messages=PROMPT)
    assert caught.value.code == "model_not_found"
    assert "gpt-nonexistent" in caught.value.message
    # Errors carry a request id as every OpenAI answer does; teams log it for support.
    assert (caught.value.request_id or "").startswith("req_")


@pytest.mark.parametrize("model", ["gpt-4o-mini-2024-07-18", "gpt-4o-2024-08-06",
                                   "gpt-4.1-2025-04-14", "gpt-3.5-turbo-0125",
                                   "gpt-5-mini-2025-08-07"])
async def test_a_pinned_snapshot_of_a_known_model_is_served(
    sim: SimulatorServer, client: Factory, model: str
) -> None:
    """Teams pin a dated snapshot (OPENAI_MODEL=gpt-4o-mini-2024-07-18), as OpenAI advises:
    answered by the simulator too, not a 404 model_not_found that notifkit dead-letters."""
    ai = client(sim)
    completion = await ai.chat.completions.create(model=model, messages=PROMPT)
    assert completion.model == model
    assert (await ai.models.retrieve(model)).id == model
    assert model in [listed.id async for listed in ai.models.list()]
    [record] = await sim.messages("openai")
    assert record["to"] == model


async def test_a_snapshot_openai_does_not_have_is_404(
    sim: SimulatorServer, client: Factory
) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await client(sim).chat.completions.create(model="gpt-4o-mini-2099-01-01",
                                                  messages=PROMPT)
    assert caught.value.code == "model_not_found"


@pytest.mark.parametrize(("option", "code", "text"), [
    ({"max_tokens": 50}, "unsupported_parameter",
     "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
     "'max_completion_tokens' instead."),
    ({"temperature": 0.2}, "unsupported_value",
     "Unsupported value: 'temperature' does not support 0.2 with this model. Only the "
     "default (1) value is supported."),
], ids=["max_tokens", "temperature"])
@pytest.mark.parametrize("model", ["o4-mini", "o4-mini-2025-04-16", "o3", "gpt-5",
                                   "gpt-5-mini", "gpt-5-nano-2025-08-07"])
async def test_a_reasoning_model_refuses_max_tokens_and_a_temperature(
    sim: SimulatorServer, client: Factory, model: str, option: dict[str, Any], code: str,
    text: str,
) -> None:
    """o-series models take max_completion_tokens, not max_tokens, and only the default
    temperature: OpenAI's 400s for both, so a client written for gpt-4o fails here first."""
    ai = client(sim)
    with pytest.raises(openai.BadRequestError) as caught:
        await ai.chat.completions.create(model=model, messages=PROMPT, **option)
    assert (caught.value.param, caught.value.code) == (next(iter(option)), code)
    assert caught.value.message.endswith(text)
    assert await sim.messages("openai") == []
    await ai.chat.completions.create(model=model, messages=PROMPT, max_completion_tokens=50,
                                     temperature=1)
    # gpt-4o takes both.
    await ai.chat.completions.create(model="gpt-4o", messages=PROMPT, **option)


async def test_missing_messages_is_400(sim: SimulatorServer, client: Factory) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await client(sim).chat.completions.create(model="gpt-4o", messages=[])
    assert caught.value.code == "empty_array"
    assert caught.value.param == "messages"


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"messages": [{"role": "user"}]}, "messages[0].content", "missing_required_parameter"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "invalid_type"),
        ({"stream": "yes"}, "stream", "invalid_type"),
        ({"temperature": 9}, "temperature", "decimal_above_max_value"),
        ({"top_p": -0.5}, "top_p", "decimal_below_min_value"),
        ({"presence_penalty": "high"}, "presence_penalty", "invalid_type"),
        ({"metadata": ["x"]}, "metadata", "invalid_type"),
        # Metadata is at most 16 string keys of up to 64 characters, each a string of up to
        # 512: what OpenAI stores refuses anything else, so a transport relying on more fails.
        ({"metadata": {"notifkit_task_id": 7}}, "metadata.notifkit_task_id", "invalid_type"),
        ({"metadata": {"a": None}}, "metadata.a", "invalid_type"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata",
         "object_above_max_properties"),
        ({"metadata": {"k": "v" * 513}}, "metadata.k", "string_above_max_length"),
        ({"metadata": {"k" * 65: "v"}}, "metadata", "string_above_max_length"),
        # Options that only mean something beside another: OpenAI refuses them alone.
        ({"stream_options": {"include_usage": True}}, "stream_options", None),
        ({"stream": False, "stream_options": {"include_usage": True}}, "stream_options", None),
        ({"metadata": {"k": "v"}}, "metadata", None),
        ({"store": False, "metadata": {"k": "v"}}, "metadata", None),
        ({"tool_choice": "auto"}, "tool_choice", None),
        ({"parallel_tool_calls": True}, "parallel_tool_calls", None),
        # Up to 4 stop sequences, each a string; up to 20 top_logprobs.
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "array_above_max_length"),
        ({"stop": ["a", 1]}, "stop[1]", "invalid_type"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "integer_above_max_value"),
        ({"logprobs": True, "top_logprobs": -1}, "top_logprobs", "integer_below_min_value"),
    ],
)
async def test_invalid_parameters_are_400_naming_the_parameter(
    sim: SimulatorServer, client: Factory, body: dict[str, object], param: str, code: str | None
) -> None:
    """OpenAI refuses a message without content or an out-of-range option with a 400 that
    names the parameter; nothing is recorded as a completion."""
    request = {"messages": PROMPT, **body}
    with pytest.raises(openai.BadRequestError) as caught:
        await client(sim).chat.completions.create(model="gpt-4o", **request)  # type: ignore[call-overload]
    assert caught.value.param == param
    assert caught.value.code == code
    assert param in caught.value.message
    assert await sim.messages("openai") == []


HUGE = int("9" * 400)


@pytest.mark.parametrize("param", ["temperature", "top_p", "presence_penalty",
                                   "frequency_penalty"])
@pytest.mark.parametrize(("value", "code"), [(HUGE, "decimal_above_max_value"),
                                             (-HUGE, "decimal_below_min_value")],
                         ids=["huge", "minus-huge"])
async def test_an_option_of_any_size_is_openais_400(
    sim: SimulatorServer, client: Factory, param: str, value: int, code: str
) -> None:
    """JSON integers have no size limit: a 400-digit temperature is out of range like 9 is."""
    request = {"messages": PROMPT, param: value}
    with pytest.raises(openai.BadRequestError) as caught:
        await client(sim).chat.completions.create(model="gpt-4o", **request)  # type: ignore[call-overload]
    assert (caught.value.param, caught.value.code) == (param, code)
    assert caught.value.type == "invalid_request_error"
    assert param in caught.value.message
    assert await sim.messages("openai") == []


@pytest.mark.parametrize("param", ["n", "max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("value", [HUGE, -HUGE], ids=["huge", "minus-huge"])
async def test_a_count_of_any_size_is_openais_400(
    sim: SimulatorServer, client: Factory, param: str, value: int
) -> None:
    request = {"messages": PROMPT, param: value}
    with pytest.raises(openai.BadRequestError) as caught:
        await client(sim).chat.completions.create(model="gpt-4o", **request)  # type: ignore[call-overload]
    assert (caught.value.param, caught.value.code) == (param, "invalid_value")


async def test_prompt_beyond_the_context_window_is_400(
    sim: SimulatorServer, client: Factory
) -> None:
    """gpt-3.5-turbo's window is 16,385 tokens; at about four characters a token, 80,000
    characters do not fit, and OpenAI refuses with context_length_exceeded."""
    long_prompt: list[ChatCompletionMessageParam] = [{"role": "user", "content": "x" * 80_000}]
    with pytest.raises(openai.BadRequestError) as caught:
        await client(sim).chat.completions.create(model="gpt-3.5-turbo", messages=long_prompt)
    assert caught.value.code == "context_length_exceeded"
    assert caught.value.param == "messages"
    assert "16385" in caught.value.message

    completion = await client(sim).chat.completions.create(model="gpt-4o", messages=long_prompt)
    assert completion.usage is not None
    assert completion.usage.prompt_tokens > 16_385


async def test_assistant_turn_with_only_tool_calls_is_accepted(
    sim: SimulatorServer, client: Factory
) -> None:
    messages: list[ChatCompletionMessageParam] = [
        *PROMPT,
        {"role": "assistant", "content": None},
        {"role": "user", "content": "And now?"},
    ]
    completion = await client(sim).chat.completions.create(model="gpt-4o", messages=messages)
    assert completion.choices[0].message.content


@pytest.mark.parametrize(
    ("answer", "param", "code"),
    [
        ({"role": "tool", "content": "42"}, "messages[1].tool_call_id",
         "missing_required_parameter"),
        ({"role": "tool", "content": "42", "tool_call_id": 5}, "messages[1].tool_call_id",
         "invalid_type"),
        ({"role": "function", "content": "42"}, "messages[1].name", "missing_required_parameter"),
    ],
)
async def test_a_tool_answer_that_names_no_call_is_400_naming_the_field(
    sim: SimulatorServer, client: Factory, answer: dict[str, Any], param: str, code: str
) -> None:
    """OpenAI needs the call a `tool` message answers (and a `function` message's name);
    the simulator answered without them, so such a conversation passed only here."""
    messages: list[Any] = [*PROMPT, answer]
    with pytest.raises(openai.BadRequestError) as caught:
        await client(sim).chat.completions.create(model="gpt-4o", messages=messages)
    assert (caught.value.param, caught.value.code) == (param, code)
    assert await sim.messages("openai") == []


async def test_a_tool_answer_naming_its_call_is_accepted(
    sim: SimulatorServer, client: Factory
) -> None:
    messages: list[ChatCompletionMessageParam] = [
        *PROMPT,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "count", "arguments": "{}"}}]},
        {"role": "tool", "content": "42", "tool_call_id": "call_1"},
    ]
    completion = await client(sim).chat.completions.create(model="gpt-4o", messages=messages)
    assert completion.choices[0].message.content


async def test_missing_key_is_401(sim: SimulatorServer, client: Factory) -> None:
    ai = client(sim)
    with pytest.raises(openai.AuthenticationError):
        await ai.chat.completions.create(
            model="gpt-4o", messages=PROMPT, extra_headers={"Authorization": ""}
        )


async def test_rate_limit_fault_is_retryable_429(sim: SimulatorServer, client: Factory) -> None:
    await sim.add_fault("rate_limit", "openai", retry_after_s=2)
    with pytest.raises(openai.RateLimitError) as caught:
        await client(sim).chat.completions.create(model="gpt-4o", messages=PROMPT)
    assert caught.value.code == "rate_limit_exceeded"
    assert (caught.value.request_id or "").startswith("req_")
    assert caught.value.response.headers["retry-after"] == "2"
    # The reset hint agrees with Retry-After, so a client trusting either waits long enough.
    assert caught.value.response.headers["x-ratelimit-reset-requests"] == "2s"
    assert "Please try again in 2s." in caught.value.message


async def test_error_429_is_insufficient_quota(sim: SimulatorServer, client: Factory) -> None:
    await sim.add_fault("error", "openai", status=429)
    with pytest.raises(openai.RateLimitError) as caught:
        await client(sim).chat.completions.create(model="gpt-4o", messages=PROMPT)
    assert caught.value.code == "insufficient_quota"
    assert caught.value.type == "insufficient_quota"


async def test_error_fault_is_internal_server_error(sim: SimulatorServer, client: Factory) -> None:
    await sim.add_fault("error", "openai", to="gpt-4o")
    with pytest.raises(openai.InternalServerError):
        await client(sim).chat.completions.create(model="gpt-4o", messages=PROMPT)
    # The rule names one model; others are unaffected.
    await client(sim).chat.completions.create(model="gpt-4o-mini", messages=PROMPT)


async def test_invalid_token_fault_is_404_model_not_found(
    sim: SimulatorServer, client: Factory
) -> None:
    """An AI provider's "invalid recipient" is the model the rule's `to` matches: OpenAI's
    404 for a model that does not exist or that the key may not use."""
    await sim.add_fault("invalid_token", "openai", to="gpt-4o")
    with pytest.raises(openai.NotFoundError) as caught:
        await client(sim).chat.completions.create(model="gpt-4o", messages=PROMPT)
    assert caught.value.status_code == 404
    assert caught.value.body == {
        "message": "The model `gpt-4o` does not exist or you do not have access to it.",
        "type": "invalid_request_error",
        "param": None,
        "code": "model_not_found",
    }
    # Other models are not matched by the rule.
    await client(sim).chat.completions.create(model="gpt-4o-mini", messages=PROMPT)


async def test_malformed_fault_is_unparseable(sim: SimulatorServer, client: Factory) -> None:
    await sim.add_fault("malformed", "openai")
    with pytest.raises((openai.APIResponseValidationError, json.JSONDecodeError, ValueError)):
        await client(sim).chat.completions.create(model="gpt-4o", messages=PROMPT)


async def test_malformed_fault_on_a_stream_is_unparseable(
    sim: SimulatorServer, client: Factory
) -> None:
    """A streamed request gets a stream whose event the SDK cannot read, not a JSON body the
    SDK's event reader skips without a word, which would pass for an empty success."""
    await sim.add_fault("malformed", "openai")
    stream = await client(sim).chat.completions.create(
        model="gpt-4o", messages=PROMPT, stream=True
    )
    with pytest.raises(json.JSONDecodeError):
        [chunk async for chunk in stream]


async def test_timeout_fault_is_api_timeout(sim: SimulatorServer, client: Factory) -> None:
    await sim.add_fault("timeout", "openai")
    with pytest.raises(openai.APITimeoutError):
        await client(sim, timeout_s=SHORT_TIMEOUT_S).chat.completions.create(
            model="gpt-4o", messages=PROMPT
        )
    assert await sim.messages("openai") == []


class Urgency(enum.StrEnum):
    LOW = "low"
    HIGH = "high"


class Action(BaseModel):
    label: str = Field(min_length=3, max_length=12)
    url: str


class Digest(BaseModel):
    title: str
    urgency: Urgency
    unread: int = Field(ge=1, le=50)
    actions: list[Action]
    sent_at: datetime.datetime
    snoozed_until: str | None


async def test_structured_output_parses_into_the_sdk_model(
    sim: SimulatorServer, client: Factory
) -> None:
    """The SDK's parse helper sends the model as a strict json_schema and validates the answer
    with pydantic: the simulator's answer must be an instance of that schema, the same one
    each time the same prompt is sent."""
    ai = client(sim)

    first = await ai.chat.completions.parse(
        model="gpt-4o-mini", messages=PROMPT, response_format=Digest
    )
    again = await ai.chat.completions.parse(
        model="gpt-4o-mini", messages=PROMPT, response_format=Digest
    )

    digest = first.choices[0].message.parsed
    assert isinstance(digest, Digest)
    assert first.choices[0].finish_reason == "stop"
    assert again.choices[0].message.parsed == digest
    assert digest.actions
    assert all(3 <= len(action.label) <= 12 for action in digest.actions)
    assert 1 <= digest.unread <= 50
    assert first.usage is not None
    assert first.usage.completion_tokens == len((first.choices[0].message.content or "").split())


async def test_structured_output_cut_by_max_tokens_is_a_length_finish(
    sim: SimulatorServer, client: Factory
) -> None:
    """Cut off at max_tokens the answer is not the schema's JSON, as OpenAI's is not: the SDK
    refuses to parse it."""
    with pytest.raises(openai.LengthFinishReasonError):
        await client(sim).chat.completions.parse(
            model="gpt-4o-mini", messages=PROMPT, response_format=Digest, max_tokens=3
        )


SCHEMA_FORMAT: ResponseFormatJSONSchema = {
    "type": "json_schema",
    "json_schema": {
        "name": "triage",
        "strict": True,
        "schema": {
            "type": "object",
            "additionalProperties": False,
            "required": ["label", "score"],
            "properties": {
                "label": {"type": "string", "enum": ["spam", "ham"]},
                "score": {"type": "number", "minimum": 0, "maximum": 1},
            },
        },
    },
}


async def test_a_json_schema_answer_streams_as_the_same_json(
    sim: SimulatorServer, client: Factory
) -> None:
    ai = client(sim)
    plain = await ai.chat.completions.create(
        model="gpt-4o", messages=PROMPT, response_format=SCHEMA_FORMAT
    )
    stream = await ai.chat.completions.create(
        model="gpt-4o", messages=PROMPT, response_format=SCHEMA_FORMAT, stream=True
    )
    pieces = [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]

    answer = json.loads(plain.choices[0].message.content or "")
    assert answer["label"] in ("spam", "ham")
    assert 0 <= answer["score"] <= 1
    assert list(answer) == ["label", "score"]
    assert "".join(pieces) == plain.choices[0].message.content


async def test_json_object_mode_is_cut_to_plain_words_at_max_tokens(
    sim: SimulatorServer, client: Factory
) -> None:
    completion = await client(sim).chat.completions.create(
        model="gpt-4o", messages=JSON_PROMPT, response_format={"type": "json_object"},
        max_tokens=3
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "length"
    assert (choice.message.content or "").split() == (
        (await client(sim).chat.completions.create(model="gpt-4o", messages=JSON_PROMPT))
        .choices[0].message.content or "").split()[:3]


@pytest.mark.parametrize(
    ("response_format", "param", "code"),
    [
        ({}, "response_format.type", "missing_required_parameter"),
        ({"type": "xml"}, "response_format.type", "invalid_value"),
        ({"type": "json_schema"}, "response_format.json_schema", "missing_required_parameter"),
        ({"type": "json_schema", "json_schema": "x"}, "response_format.json_schema",
         "invalid_type"),
        ({"type": "json_schema", "json_schema": {"schema": {}}},
         "response_format.json_schema.name", "missing_required_parameter"),
        ({"type": "json_schema", "json_schema": {"name": "a b"}},
         "response_format.json_schema.name", "invalid_value"),
        ({"type": "json_schema", "json_schema": {"name": "n" * 65}},
         "response_format.json_schema.name", "string_above_max_length"),
        ({"type": "json_schema", "json_schema": {"name": "n", "schema": []}},
         "response_format.json_schema.schema", "invalid_type"),
        ({"type": "json_schema", "json_schema": {"name": "n", "strict": "yes"}},
         "response_format.json_schema.strict", "invalid_type"),
    ],
)
async def test_a_malformed_response_format_is_400_naming_the_parameter(
    sim: SimulatorServer, client: Factory, response_format: dict[str, Any], param: str,
    code: str,
) -> None:
    request = {"messages": PROMPT, "response_format": response_format}
    with pytest.raises(openai.BadRequestError) as caught:
        await client(sim).chat.completions.create(model="gpt-4o", **request)  # type: ignore[call-overload]
    assert (caught.value.param, caught.value.code) == (param, code)
    assert await sim.messages("openai") == []


FUNCTION_TOOL = {"type": "function", "function": {"name": "notify"}}


@pytest.mark.parametrize(
    ("request_options", "param", "code"),
    [
        ({"tools": [5]}, "tools[0]", "invalid_type"),
        ({"tools": [{}]}, "tools[0].type", "missing_required_parameter"),
        ({"tools": [{"type": "function"}], "tool_choice": "required"}, "tools[0].function",
         "missing_required_parameter"),
        ({"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name",
         "missing_required_parameter"),
        ({"tools": [{"type": "function", "function": {"name": 5}}]}, "tools[0].function.name",
         "invalid_type"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": 5}}]},
         "tools[0].function.parameters", "invalid_type"),
        ({"tools": [FUNCTION_TOOL], "tool_choice": "always"}, "tool_choice", "invalid_value"),
        ({"tools": [FUNCTION_TOOL], "tool_choice": {}}, "tool_choice.type",
         "missing_required_parameter"),
        ({"tools": [FUNCTION_TOOL], "tool_choice": {"type": "function"}},
         "tool_choice.function", "missing_required_parameter"),
        ({"tools": [FUNCTION_TOOL], "tool_choice": {"type": "function", "function": {}}},
         "tool_choice.function.name", "missing_required_parameter"),
        ({"functions": [5], "function_call": "auto"}, "functions[0]", "invalid_type"),
        ({"functions": [{"name": "f"}], "function_call": "required"}, "function_call",
         "invalid_value"),
        ({"functions": [{"name": "f"}], "function_call": {}}, "function_call.name",
         "missing_required_parameter"),
    ],
)
async def test_a_malformed_tool_or_tool_choice_is_400_naming_the_parameter(
    sim: SimulatorServer, client: Factory, request_options: dict[str, Any], param: str,
    code: str,
) -> None:
    """OpenAI refuses a tool that is no object or names no function, and a choice it does not
    have; the simulator answered them in text (or called a function with no name), so a
    malformed tools payload passed here and failed in production."""
    with pytest.raises(openai.BadRequestError) as caught:
        await client(sim).chat.completions.create(
            model="gpt-4o", messages=PROMPT, **request_options)
    assert (caught.value.param, caught.value.code) == (param, code)
    assert await sim.messages("openai") == []


async def test_an_unknown_argument_is_400_unrecognized(
    sim: SimulatorServer, client: Factory
) -> None:
    """OpenAI refuses an argument its API does not have, rather than ignore it: a typo'd
    option would otherwise pass against the simulator and fail in production."""
    with pytest.raises(openai.BadRequestError) as caught:
        await client(sim).chat.completions.create(
            model="gpt-4o", messages=PROMPT, extra_body={"temprature": 0.2})
    assert caught.value.status_code == 400
    assert caught.value.body == {
        "message": "Unrecognized request argument supplied: temprature",
        "type": "invalid_request_error", "param": None, "code": None,
    }
    assert await sim.messages("openai") == []


@pytest.mark.parametrize(("param", "value", "expected", "got"), [
    ("model", 4, "a string", "an integer"),
    ("n", "2", "an integer", "a string"),
    ("max_tokens", 10.5, "an integer", "a decimal"),
    ("max_completion_tokens", True, "an integer", "a boolean"),
    ("seed", "42", "an integer", "a string"),
    ("temperature", True, "a decimal", "a boolean"),
    ("user", 7, "a string", "an integer"),
    ("store", "yes", "a boolean", "a string"),
    ("logprobs", 1, "a boolean", "an integer"),
    ("tools", {"type": "function"}, "an array", "an object"),
    ("logit_bias", [1], "an object", "an array"),
    ("response_format", "json_object", "an object", "a string"),
    ("stop", 5, "one of a string or array of strings", "an integer"),
    ("tool_choice", 1, "one of a string or object", "an integer"),
])
async def test_a_known_argument_of_the_wrong_type_is_400_invalid_type(
    sim: SimulatorServer, client: Factory, param: str, value: object, expected: str, got: str,
) -> None:
    request: dict[str, Any] = {"model": "gpt-4o", "messages": PROMPT, param: value}
    with pytest.raises(openai.BadRequestError) as caught:
        await client(sim).chat.completions.create(**request)
    assert caught.value.body == {
        "message": f"Invalid type for '{param}': expected {expected}, but got {got} instead.",
        "type": "invalid_request_error", "param": param, "code": "invalid_type",
    }
    assert await sim.messages("openai") == []


# A valid value for every parameter of the SDK's `chat.completions.create()`.
EVERY_PARAMETER: dict[str, Any] = {
    "audio": {"voice": "alloy", "format": "wav"},
    "frequency_penalty": 0.5,
    "function_call": "auto",
    "functions": [{"name": "lookup", "parameters": {"type": "object", "properties": {}}}],
    "logit_bias": {"50256": -100},
    "logprobs": True,
    "max_completion_tokens": 200,
    "max_tokens": 200,
    "metadata": {"notifkit_task_id": "task-every"},
    "modalities": ["text"],
    "moderation": {"policy": {"input": {"mode": "score"}}},
    "n": 2,
    "parallel_tool_calls": False,
    "prediction": {"type": "content", "content": "A summary."},
    "presence_penalty": -0.5,
    "prompt_cache_key": "summaries",
    "prompt_cache_options": {},
    "prompt_cache_retention": "24h",
    "reasoning_effort": "low",
    "response_format": {"type": "text"},
    "safety_identifier": "user-hash",
    "seed": 7,
    "service_tier": "auto",
    "stop": ["\n\n"],
    "store": True,
    "stream": False,
    "stream_options": None,
    "temperature": 0.2,
    "tool_choice": "auto",
    "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {}}}}],
    "top_logprobs": 2,
    "top_p": 0.9,
    "user": "user-1",
    "verbosity": "medium",  # any other is the gpt-5 family's (below)
    "web_search_options": {},
}


def test_the_simulator_knows_every_parameter_the_sdk_sends() -> None:
    """The SDK's parameters are OpenAI's documented ones: a newer SDK adding one fails here,
    not in a team's CI against the simulator."""
    from openai.types.chat.completion_create_params import (
        CompletionCreateParamsNonStreaming,
        CompletionCreateParamsStreaming,
    )

    from simulators.providers.openai import PARAMETERS

    sdk = set(CompletionCreateParamsStreaming.__annotations__) | set(
        CompletionCreateParamsNonStreaming.__annotations__)
    for base in CompletionCreateParamsStreaming.__mro__:
        sdk |= set(getattr(base, "__annotations__", {}))
    assert sdk - set(PARAMETERS) == set()
    assert set(EVERY_PARAMETER) | {"model", "messages"} >= sdk


async def test_every_documented_parameter_is_accepted(
    sim: SimulatorServer, client: Factory
) -> None:
    # reasoning_effort is a reasoning model's (below); gpt-4o refuses it.
    completion = await client(sim).chat.completions.create(
        model="gpt-4o", messages=PROMPT,
        **{k: v for k, v in EVERY_PARAMETER.items() if k != "reasoning_effort"})
    assert len(completion.choices) == 2
    [record] = await sim.messages("openai")
    assert record["taskId"] == "task-every"


@pytest.mark.parametrize("model", ["o4-mini", "gpt-5-mini-2025-08-07", "sim-digest"])
async def test_reasoning_effort_is_taken_by_the_reasoning_models(
    sim: SimulatorServer, client: Factory, model: str
) -> None:
    completion = await client(sim).chat.completions.create(
        model=model, messages=PROMPT, reasoning_effort="low")
    assert completion.choices[0].message.content


@pytest.mark.parametrize("model", ["gpt-4o", "gpt-4o-mini-2024-07-18", "gpt-4.1-nano",
                                   "gpt-3.5-turbo"])
async def test_reasoning_effort_is_an_unrecognized_argument_to_other_models(
    sim: SimulatorServer, client: Factory, model: str
) -> None:
    """OpenAI refuses reasoning_effort to a model that does not reason, as an argument it
    does not know; the simulator answered it, so a client sending it to gpt-4o passed only
    here."""
    with pytest.raises(openai.BadRequestError) as refused:
        await client(sim).chat.completions.create(
            model=model, messages=PROMPT, reasoning_effort="low")

    error = refused.value.body
    assert isinstance(error, dict)
    assert error["message"] == "Unrecognized request argument supplied: reasoning_effort"
    assert (error["param"], error["code"]) == (None, None)
    assert await sim.messages("openai") == []


@pytest.mark.parametrize(("model", "argument", "value", "code", "message"), [
    ("gpt-5", "reasoning_effort", "extreme", "invalid_value",
     "Invalid value: 'extreme'. Supported values are: 'minimal', 'low', 'medium', and "
     "'high'."),
    ("o4-mini", "reasoning_effort", "minimal", "unsupported_value",
     "Unsupported value: 'reasoning_effort' does not support 'minimal' with this model. "
     "Supported values are: 'low', 'medium', and 'high'."),
    ("gpt-4o", "verbosity", "low", "unsupported_value",
     "Unsupported value: 'verbosity' does not support 'low' with this model. Supported "
     "values are: 'medium'."),
    ("gpt-5-mini", "verbosity", "loud", "invalid_value",
     "Invalid value: 'loud'. Supported values are: 'low', 'medium', and 'high'."),
], ids=["effort-unknown", "effort-minimal-o-series", "verbosity-gpt-4o", "verbosity-unknown"])
async def test_an_effort_or_verbosity_the_model_does_not_take_is_openais_400(
    sim: SimulatorServer, client: Factory, model: str, argument: str, value: str, code: str,
    message: str,
) -> None:
    """OpenAI refuses these values naming the argument; the simulator answered them."""
    options: dict[str, Any] = {argument: value}
    with pytest.raises(openai.BadRequestError) as refused:
        await client(sim).chat.completions.create(model=model, messages=PROMPT, **options)

    error = refused.value.body
    assert isinstance(error, dict)
    assert (error["param"], error["code"], error["message"]) == (argument, code, message)
    assert await sim.messages("openai") == []


@pytest.mark.parametrize(("model", "effort", "verbosity"), [
    ("gpt-5-nano", "minimal", "high"), ("o3", "high", "medium"), ("gpt-4.1", None, "medium"),
    ("sim-digest", "minimal", "low"),
])
async def test_an_effort_and_verbosity_the_model_takes_are_answered(
    sim: SimulatorServer, client: Factory, model: str, effort: str | None, verbosity: str,
) -> None:
    options: dict[str, Any] = {"verbosity": verbosity}
    if effort is not None:
        options["reasoning_effort"] = effort
    completion = await client(sim).chat.completions.create(
        model=model, messages=PROMPT, **options)
    assert completion.choices[0].message.content


class Lookup(BaseModel):
    city: str
    days: int


LOOKUP_TOOL: Any = {"type": "function", "function": {
    "name": "lookup", "parameters": Lookup.model_json_schema()}}


@pytest.mark.parametrize(
    ("tool_choice", "finish_reason"),
    [("required", "tool_calls"), ({"type": "function", "function": {"name": "lookup"}}, "stop")],
)
async def test_a_forced_tool_choice_is_answered_with_a_call_to_that_tool(
    sim: SimulatorServer, client: Factory, tool_choice: Any, finish_reason: str
) -> None:
    # OpenAI always calls a tool when tool_choice requires one; the simulator answered text
    # and no tool_calls, so a client reading the call failed only against the simulator.
    ai = client(sim)

    answer = await ai.chat.completions.create(
        model="gpt-4o-mini", messages=PROMPT, tools=[LOOKUP_TOOL], tool_choice=tool_choice)

    choice = answer.choices[0]
    assert choice.finish_reason == finish_reason
    assert choice.message.content is None
    assert choice.message.tool_calls is not None
    [call] = choice.message.tool_calls
    assert call.type == "function"
    assert call.id.startswith("call_")
    assert call.function.name == "lookup"
    Lookup.model_validate_json(call.function.arguments)
    again = await ai.chat.completions.create(
        model="gpt-4o-mini", messages=PROMPT, tools=[LOOKUP_TOOL], tool_choice=tool_choice)
    assert again.choices[0].message.tool_calls == choice.message.tool_calls


async def test_a_forced_tool_call_streams_and_parses_with_the_sdk(
    sim: SimulatorServer, client: Factory
) -> None:
    ai = client(sim)

    async with ai.chat.completions.stream(
        model="gpt-4o-mini", messages=PROMPT, tools=[openai.pydantic_function_tool(Lookup)],
        tool_choice="required",
    ) as stream:
        final = await stream.get_final_completion()

    [call] = final.choices[0].message.tool_calls or []
    assert call.function.name == "Lookup"
    assert isinstance(call.function.parsed_arguments, Lookup)
    assert final.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_a_forced_legacy_function_call_is_answered_with_that_call(
    sim: SimulatorServer, client: Factory, stream: bool
) -> None:
    """`functions` with `function_call: {"name"}`, which the API still takes, answers
    `message.function_call` (name and arguments), no text and no tool_calls."""
    ai = client(sim)
    functions: Any = [{"name": "lookup", "parameters": Lookup.model_json_schema()}]
    forced: Any = {"name": "lookup"}
    if stream:
        chunks = await ai.chat.completions.create(
            model="gpt-4o-mini", messages=PROMPT, functions=functions, function_call=forced,
            stream=True)
        deltas = [c.choices[0].delta async for c in chunks if c.choices]
        calls = [d.function_call for d in deltas if d.function_call is not None]
        assert calls[0].name == "lookup"
        arguments = "".join(call.arguments or "" for call in calls)
        assert not [d for d in deltas if d.content or d.tool_calls]
    else:
        answer = await ai.chat.completions.create(
            model="gpt-4o-mini", messages=PROMPT, functions=functions, function_call=forced)
        choice = answer.choices[0]
        assert (choice.finish_reason, choice.message.content, choice.message.tool_calls) == (
            "stop", None, None)
        assert choice.message.function_call is not None
        assert choice.message.function_call.name == "lookup"
        arguments = choice.message.function_call.arguments
    Lookup.model_validate_json(arguments)


async def test_a_legacy_function_call_naming_no_function_is_refused(
    sim: SimulatorServer, client: Factory
) -> None:
    ai = client(sim)
    lookup: Any = [{"name": "lookup", "parameters": Lookup.model_json_schema()}]
    for functions, name in ((lookup, "weather"), (None, "lookup")):
        with pytest.raises(openai.BadRequestError) as refused:
            await ai.chat.completions.create(
                model="gpt-4o-mini", messages=PROMPT, function_call={"name": name},
                **({"functions": functions} if functions else {}))
        assert refused.value.param == "function_call"
    plain = await ai.chat.completions.create(
        model="gpt-4o-mini", messages=PROMPT, functions=lookup, function_call="auto")
    assert plain.choices[0].message.content
    assert len(await sim.messages("openai")) == 1


async def test_a_tool_choice_naming_no_tool_is_refused(
    sim: SimulatorServer, client: Factory
) -> None:
    ai = client(sim)

    with pytest.raises(openai.BadRequestError) as refused:
        await ai.chat.completions.create(
            model="gpt-4o-mini", messages=PROMPT, tools=[LOOKUP_TOOL],
            tool_choice={"type": "function", "function": {"name": "weather"}})

    assert refused.value.param == "tool_choice"
    assert await sim.messages("openai") == []


async def test_logprobs_are_given_for_every_token_when_asked(
    sim: SimulatorServer, client: Factory
) -> None:
    # OpenAI answers logprobs: true with each token's log probability (and top_logprobs
    # alternatives); the simulator answered null, so reading them failed only against it.
    ai = client(sim)

    plain = await ai.chat.completions.create(model="gpt-4o-mini", messages=PROMPT)
    answer = await ai.chat.completions.create(
        model="gpt-4o-mini", messages=PROMPT, logprobs=True, top_logprobs=2)

    assert plain.choices[0].logprobs is None
    logprobs = answer.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.content
    assert "".join(entry.token for entry in logprobs.content) == answer.choices[0].message.content
    for entry in logprobs.content:
        assert entry.logprob <= 0
        assert entry.bytes == list(entry.token.encode())
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == entry.logprob
        assert entry.top_logprobs[1].logprob < entry.logprob
    assert answer.usage is not None
    assert answer.usage.completion_tokens == len(logprobs.content)

    streamed = await ai.chat.completions.create(
        model="gpt-4o-mini", messages=PROMPT, logprobs=True, stream=True)
    pieces = [entry async for chunk in streamed for choice in chunk.choices
              if choice.logprobs and choice.logprobs.content
              for entry in choice.logprobs.content]
    assert [(e.token, e.logprob) for e in pieces] == [
        (e.token, e.logprob) for e in logprobs.content]
    assert all(e.top_logprobs == [] for e in pieces)


async def test_a_forced_tool_call_past_max_tokens_is_cut_off(
    sim: SimulatorServer, client: Factory
) -> None:
    ai = client(sim)

    answer = await ai.chat.completions.create(
        model="gpt-4o-mini", messages=PROMPT, tools=[LOOKUP_TOOL], tool_choice="required",
        max_tokens=1)

    choice = answer.choices[0]
    assert choice.finish_reason == "length"
    [call] = choice.message.tool_calls or []
    assert call.type == "function"
    with pytest.raises(ValueError):
        Lookup.model_validate_json(call.function.arguments)
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 1


async def test_usage_breaks_its_tokens_down_and_names_the_service_tier(
    sim: SimulatorServer, client: Factory
) -> None:
    """OpenAI's completions itemise usage (cached prompt tokens, reasoning tokens) and name
    the tier that served them, plain and streamed; code reading
    ``usage.completion_tokens_details.reasoning_tokens`` must not fail only here."""
    ai = client(sim)
    plain = await ai.chat.completions.create(model="o4-mini", messages=PROMPT)
    flex = await ai.chat.completions.create(model="gpt-4o", messages=PROMPT,
                                            service_tier="flex")
    stream = await ai.chat.completions.create(
        model="gpt-4o", messages=PROMPT, stream=True, stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]

    for usage in (plain.usage, flex.usage, chunks[-1].usage):
        assert usage is not None
        assert usage.prompt_tokens_details is not None
        assert usage.prompt_tokens_details.cached_tokens == 0
        assert usage.prompt_tokens_details.audio_tokens == 0
        assert usage.completion_tokens_details is not None
        assert usage.completion_tokens_details.reasoning_tokens == 0
        assert usage.completion_tokens_details.audio_tokens == 0
        assert usage.completion_tokens_details.accepted_prediction_tokens == 0
        assert usage.completion_tokens_details.rejected_prediction_tokens == 0
    assert plain.service_tier == "default"
    assert flex.service_tier == "flex"
    assert {chunk.service_tier for chunk in chunks} == {"default"}


async def test_a_service_tier_openai_does_not_have_is_its_400(
    sim: SimulatorServer, client: Factory
) -> None:
    """OpenAI serves auto (its default tier), default, flex, scale and priority, and refuses
    any other tier naming it, rather than serving it as the default."""
    ai = client(sim)
    auto = await ai.chat.completions.create(model="gpt-4o", messages=PROMPT, service_tier="auto")
    assert auto.service_tier == "default"

    with pytest.raises(openai.BadRequestError) as refused:
        await ai.chat.completions.create(
            model="gpt-4o", messages=PROMPT,
            extra_body={"service_tier": "premium"})

    error = refused.value.body
    assert isinstance(error, dict)
    assert (error["param"], error["code"]) == ("service_tier", "invalid_value")
    assert error["message"] == ("Invalid value: \"premium\". Supported values are: 'auto', "
                                "'default', 'flex', 'scale', and 'priority'.")
    assert len(await sim.messages("openai")) == 1
