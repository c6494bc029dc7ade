"""The official `resend` SDK, pointed at the simulator by `resend.api_url` alone, sends mail and
gets Resend's own errors (as the SDK's own exception classes) for every fault kind."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
import resend
from resend import exceptions

from simulators import SimulatorServer
from tests.support.waiting import until_async

SHORT_TIMEOUT_S = 0.5


def email(**overrides: Any) -> dict[str, Any]:
    params: dict[str, Any] = {
        "from": "Notifkit <noreply@example.com>",
        "to": ["ada@example.com"],
        "subject": "Your code",
        "html": "<p>Your code is <b>123456</b></p>",
        "tags": [{"name": "notifkit_task_id", "value": "task-1"}],
    }
    params.update(overrides)
    return params


async def send(params: dict[str, Any], options: dict[str, Any] | None = None) -> Any:
    # Plain dicts, not the SDK's TypedDicts: some tests send what those would not allow.
    return await asyncio.to_thread(
        resend.Emails.send, cast(resend.Emails.SendParams, params),
        cast(resend.Emails.SendOptions | None, options),
    )


async def test_send_is_recorded_with_task_id_from_tag(
    resend_sdk: Any, sim: SimulatorServer
) -> None:
    # Given a simulator, when the SDK sends one email
    sent = await send(email())

    # Then it gets a Resend id, and the simulator recorded the message under the task id
    [record] = await sim.messages("resend")
    assert record["id"] == sent["id"]
    assert record["to"] == "ada@example.com"
    assert record["taskId"] == "task-1"
    assert record["acceptCount"] == 1
    assert record["content"]["subject"] == "Your code"
    assert record["content"]["from"] == "Notifkit <noreply@example.com>"


async def test_task_id_header_wins_over_tag(sim: SimulatorServer) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        response = await session.post(
            sim.base_url + "/emails",
            json=email(),
            headers={"Authorization": "Bearer re_x", "X-Notifkit-Task-Id": "task-from-header"},
        )
        assert response.status == 200
    [record] = await sim.messages("resend")
    assert record["taskId"] == "task-from-header"


async def test_second_acceptance_of_a_task_is_a_duplicate(
    resend_sdk: Any, sim: SimulatorServer
) -> None:
    await send(email())
    await send(email())

    newest, oldest = await sim.messages("resend", task_id="task-1")
    assert (oldest["acceptCount"], newest["acceptCount"]) == (1, 2)
    assert (await sim.stats())["resend"]["duplicates"] == 1


async def test_idempotency_key_replays_original_response(
    resend_sdk: Any, sim: SimulatorServer
) -> None:
    # Given an email sent with an idempotency key
    first = await send(email(), {"idempotency_key": "welcome/ada"})

    # When the very same request is sent again under the same key
    second = await send(email(), {"idempotency_key": "welcome/ada"})

    # Then the original answer comes back and nothing new is recorded
    assert second["id"] == first["id"]
    assert len(await sim.messages("resend")) == 1
    stats = (await sim.stats())["resend"]
    assert (stats["accepted"], stats["replays"], stats["duplicates"]) == (1, 1, 0)


async def test_idempotency_key_with_other_body_is_409(
    resend_sdk: Any, sim: SimulatorServer
) -> None:
    await send(email(), {"idempotency_key": "k1"})

    with pytest.raises(exceptions.ResendError) as caught:
        await send(email(subject="Changed"), {"idempotency_key": "k1"})

    assert caught.value.code == 409
    assert caught.value.error_type == "invalid_idempotent_request"
    assert len(await sim.messages("resend")) == 1


@pytest.mark.parametrize("missing", ["from", "to", "subject"])
async def test_missing_field_is_422(resend_sdk: Any, missing: str) -> None:
    params = email()
    del params[missing]

    with pytest.raises(exceptions.MissingRequiredFieldsError) as caught:
        await send(params)

    assert caught.value.code == 422
    assert f"`{missing}`" in caught.value.message


@pytest.mark.parametrize("address", ["not-an-address", "ada@example.com\n"])
async def test_invalid_address_is_422_validation_error(resend_sdk: Any, address: str) -> None:
    with pytest.raises(exceptions.ValidationError) as caught:
        await send(email(to=[address]))
    assert caught.value.code == 422


async def test_an_email_without_a_body_is_422_missing_field(
    resend_sdk: Any, sim: SimulatorServer
) -> None:
    body = email()
    del body["html"]
    with pytest.raises(exceptions.ResendError) as caught:
        await send(body)
    assert caught.value.code == 422
    assert caught.value.error_type == "missing_required_field"
    assert "`html` or `text`" in caught.value.message
    assert await sim.messages("resend") == []
    # An empty text is a body: Resend takes it (and so sends no generated plain text).
    await send({**body, "text": ""})


@pytest.mark.parametrize("attachments", [[{}], [{"filename": "a.txt"}], [5],
                                         [{"filename": "a.txt", "content": None}]])
async def test_an_attachment_without_content_or_path_is_422_invalid_attachment(
    resend_sdk: Any, sim: SimulatorServer, attachments: object
) -> None:
    with pytest.raises(exceptions.ResendError) as caught:
        await send(email(attachments=attachments))
    assert caught.value.code == 422
    assert caught.value.error_type == "invalid_attachment"
    assert caught.value.message == "Attachment must have either a `content` or `path`."
    assert await sim.messages("resend") == []


async def test_attachments_that_are_no_list_are_422_naming_them(
    resend_sdk: Any, sim: SimulatorServer
) -> None:
    with pytest.raises(exceptions.ValidationError) as caught:
        await send(email(attachments="invoice.pdf"))
    assert "`attachments`" in caught.value.message
    assert await sim.messages("resend") == []


async def test_attachments_by_content_or_path_are_sent(
    resend_sdk: Any, sim: SimulatorServer
) -> None:
    await send(email(attachments=[{"filename": "a.txt", "content": list(b"hello")},
                                  {"path": "https://example.com/invoice.pdf"}]))
    assert len(await sim.messages("resend")) == 1


async def test_a_template_email_may_leave_its_sender_and_subject_to_the_template(
    resend_sdk: Any, sim: SimulatorServer
) -> None:
    """As in Resend's own example, `template` with `to` alone is a whole email: `from` and
    `subject` fall back to the template's defaults. The template is recorded."""
    template = {"id": "order-confirmation", "variables": {"PRODUCT": "Lamp", "PRICE": 499}}
    sent = await send({"to": "ada@example.com", "template": template,
                       "tags": [{"name": "notifkit_task_id", "value": "task-t"}]})

    [record] = await sim.messages("resend", task_id="task-t")
    assert record["id"] == sent["id"]
    assert record["content"]["template"] == template
    assert "subject" not in record["content"]


@pytest.mark.parametrize("body", ["html", "text"])
async def test_a_template_with_its_own_body_is_422(
    resend_sdk: Any, sim: SimulatorServer, body: str
) -> None:
    with pytest.raises(exceptions.ValidationError) as caught:
        await send(email(template={"id": "welcome"}, **{body: "x"}))
    assert caught.value.code == 422
    assert "`template`" in caught.value.message
    assert await sim.messages("resend") == []


@pytest.mark.parametrize("template", ["welcome", {}, {"id": ""}, {"id": 5},
                                      {"id": "welcome", "variables": ["a"]},
                                      {"id": "welcome", "variables": []}])
async def test_a_template_that_is_not_an_id_and_variables_is_422(
    resend_sdk: Any, sim: SimulatorServer, template: object
) -> None:
    params = email(template=template)
    del params["html"]
    with pytest.raises(exceptions.ValidationError) as caught:
        await send(params)
    assert caught.value.code == 422
    assert "`template`" in caught.value.message
    assert await sim.messages("resend") == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("html", 5),
        ("text", ["a"]),
        ("reply_to", "not-an-address"),
        ("reply_to", ["a@b.co", 7]),
        ("to", "ada@example.com, bob@example.com"),
    ],
)
async def test_mistyped_field_is_422_naming_it(
    resend_sdk: Any, sim: SimulatorServer, field: str, value: object
) -> None:
    """Resend refuses a body that is not a string and a reply-to that is not an address; the
    message is not sent."""
    with pytest.raises(exceptions.ValidationError) as caught:
        await send(email(**{field: value}))
    assert caught.value.code == 422
    assert f"`{field}`" in caught.value.message
    assert await sim.messages("resend") == []


async def test_recipient_limit_is_fifty_in_to(resend_sdk: Any, sim: SimulatorServer) -> None:
    """Resend allows 50 `to` addresses; cc and bcc do not count towards that."""
    many = [f"user{i}@example.com" for i in range(50)]
    await send(email(to=many, bcc=[f"audit{i}@example.com" for i in range(10)]))
    [record] = await sim.messages("resend")
    assert len(record["content"]["bcc"]) == 10

    with pytest.raises(exceptions.ValidationError) as caught:
        await send(email(to=[*many, "one-more@example.com"]))
    assert "`to`" in caught.value.message


async def test_missing_api_key_is_401(resend_sdk: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resend, "api_key", "")
    with pytest.raises(exceptions.MissingApiKeyError) as caught:
        await send(email())
    assert caught.value.code == 401


async def test_error_fault_is_500_application_error(resend_sdk: Any, sim: SimulatorServer) -> None:
    await sim.add_fault("error", "resend", times=1)

    with pytest.raises(exceptions.ApplicationError) as caught:
        await send(email())
    assert caught.value.code == 500
    assert await sim.messages("resend") == []

    # The rule was for one request only: the retry goes through.
    await send(email())
    assert len(await sim.messages("resend")) == 1


async def test_error_fault_with_429_is_quota_exceeded(
    resend_sdk: Any, sim: SimulatorServer
) -> None:
    await sim.add_fault("error", "resend", status=429)
    with pytest.raises(exceptions.RateLimitError) as caught:
        await send(email())
    assert caught.value.error_type == "daily_quota_exceeded"


async def test_rate_limit_fault_is_429_with_retry_after(
    resend_sdk: Any, sim: SimulatorServer
) -> None:
    await sim.add_fault("rate_limit", "resend", retry_after_s=7)

    with pytest.raises(exceptions.RateLimitError) as caught:
        await send(email())

    assert caught.value.code == 429
    assert caught.value.error_type == "rate_limit_exceeded"
    assert caught.value.headers["retry-after"] == "7"


async def test_invalid_token_fault_is_422_for_that_recipient_only(
    resend_sdk: Any, sim: SimulatorServer
) -> None:
    await sim.add_fault("invalid_token", "resend", to="*@bounce.example.com")

    with pytest.raises(exceptions.ValidationError):
        await send(email(to=["gone@bounce.example.com"]))
    await send(email(to=["ada@example.com"]))

    assert [m["to"] for m in await sim.messages("resend")] == ["ada@example.com"]


async def test_invalid_token_fault_names_the_field_of_the_recipient_it_matched(
    resend_sdk: Any, sim: SimulatorServer
) -> None:
    await sim.add_fault("invalid_token", "resend", to="gone@*")

    with pytest.raises(exceptions.ValidationError) as caught:
        await send(email(to=["ada@example.com"], bcc=["gone@example.com"]))

    assert str(caught.value.message).startswith("Invalid `bcc` field.")


async def test_malformed_fault_is_recorded_but_unparseable(
    resend_sdk: Any, sim: SimulatorServer
) -> None:
    await sim.add_fault("malformed", "resend")

    with pytest.raises(exceptions.ResendError) as caught:
        await send(email())

    assert caught.value.error_type == "application_error"
    assert len(await sim.messages("resend")) == 1


async def test_timeout_fault_records_nothing(
    resend_sdk: Any, sim: SimulatorServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # requests takes a float timeout; the SDK annotates the parameter as int.
    monkeypatch.setattr(
        resend, "default_http_client", resend.RequestsClient(timeout=SHORT_TIMEOUT_S)  # type: ignore[arg-type]
    )
    await sim.add_fault("timeout", "resend")

    with pytest.raises(exceptions.ResendError) as caught:
        await send(email())

    assert caught.value.error_type == "HttpClientError"
    assert "timed out" in caught.value.message.lower()
    assert await sim.messages("resend") == []
    assert (await sim.stats())["resend"]["faults"]["timeout"] == 1


async def test_lost_response_is_accepted_and_idempotent_retry_is_not_resent(
    resend_sdk: Any, sim: SimulatorServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # requests takes a float timeout; the SDK annotates the parameter as int.
    monkeypatch.setattr(
        resend, "default_http_client", resend.RequestsClient(timeout=SHORT_TIMEOUT_S)  # type: ignore[arg-type]
    )
    await sim.add_fault("lost_response", "resend", times=1)

    # When the response is lost, the client sees a timeout...
    with pytest.raises(exceptions.ResendError) as caught:
        await send(email(), {"idempotency_key": "order-42"})
    assert caught.value.error_type == "HttpClientError"

    # ...but the provider accepted and recorded the message.
    [record] = await sim.messages("resend")
    assert record["idempotencyKey"] == "order-42"

    # A retry under the same key gets the original id and sends nothing new.
    retry = await send(email(), {"idempotency_key": "order-42"})
    assert retry["id"] == record["id"]
    assert len(await sim.messages("resend")) == 1

    # A retry without the key is the duplicate-send case.
    await send(email())
    newest = (await sim.messages("resend"))[0]
    assert newest["acceptCount"] == 2


async def test_rate_limit_reset_header_agrees_with_retry_after(
    resend_sdk: Any, sim: SimulatorServer
) -> None:
    await sim.add_fault("rate_limit", "resend", retry_after_s=7)

    with pytest.raises(exceptions.RateLimitError) as caught:
        await send(email())

    headers = caught.value.headers or {}
    assert headers["retry-after"] == "7"
    assert headers["ratelimit-reset"] == "7"


async def test_latency_fault_delays_then_answers(resend_sdk: Any, sim: SimulatorServer) -> None:
    await sim.add_fault("latency", "resend", delay_ms=200)
    loop = asyncio.get_running_loop()
    started = loop.time()

    await send(email())

    assert loop.time() - started >= 0.2
    assert len(await sim.messages("resend")) == 1


async def test_provider_rate_limit_per_api_key(resend_sdk: Any, sim: SimulatorServer) -> None:
    # Given a limit of 1 request per second with no burst
    await sim.set_limit("resend", 1, burst=1)

    await send(email())
    with pytest.raises(exceptions.RateLimitError) as caught:
        await send(email())
    assert int(caught.value.headers["retry-after"]) >= 1

    # Another API key has its own bucket.
    resend.api_key = "re_other_key"
    await send(email())
    assert (await sim.stats())["resend"]["rateLimited"] == 1


async def test_same_key_while_first_is_in_flight_is_409(
    resend_sdk: Any, sim: SimulatorServer
) -> None:
    # Given a first request that is slow to be processed, its key claimed (the simulator
    # claims it as it decides on the latency, with nothing awaited in between)
    await sim.add_fault("latency", "resend", delay_ms=2000, times=1)
    first = asyncio.create_task(send(email(), {"idempotency_key": "slow"}))

    async def delayed() -> int:
        return (await sim.stats())["resend"]["faults"]["latency"]

    await until_async(delayed)

    # When the same key arrives before it finished, Resend refuses it as concurrent
    with pytest.raises(exceptions.ResendError) as caught:
        await send(email(), {"idempotency_key": "slow"})

    assert caught.value.code == 409
    assert caught.value.error_type == "concurrent_idempotent_requests"
    await first
    assert len(await sim.messages("resend")) == 1
