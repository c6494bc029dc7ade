"""The official `sendgrid` SDK, given only `host=<simulator>`, sends mail (202 + X-Message-Id)
and gets SendGrid's errors, raised as python_http_client's exception classes."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, cast

import pytest
from python_http_client import exceptions
from sendgrid import SendGridAPIClient
from sendgrid.helpers.mail import CustomArg, Mail, MailSettings, SandBoxMode

from simulators import SimulatorServer
from simulators.kinds import ErrorCase
from simulators.providers.sendgrid import SendGrid

SHORT_TIMEOUT_S = 0.5


def message(to: str = "ada@example.com", task_id: str = "task-1") -> Mail:
    mail = Mail(
        from_email="noreply@example.com",
        to_emails=to,
        subject="Welcome",
        html_content="<p>Hello</p>",
        plain_text_content="Hello",
    )
    mail.custom_arg = CustomArg("notifkit_task_id", task_id)
    return mail


def client(sim: SimulatorServer, api_key: str = "SG.test") -> SendGridAPIClient:
    return SendGridAPIClient(api_key, host=sim.base_url)


async def send(sg: SendGridAPIClient, mail: Mail | dict[str, Any]) -> Any:
    return await asyncio.to_thread(sg.send, mail)


def errors(caught: pytest.ExceptionInfo[exceptions.HTTPError]) -> list[dict[str, Any]]:
    return cast(list[dict[str, Any]], json.loads(caught.value.body)["errors"])


async def test_send_is_202_with_message_id(sim: SimulatorServer) -> None:
    response = await send(client(sim), message())

    assert response.status_code == 202
    assert response.body == b""
    [record] = await sim.messages("sendgrid")
    assert response.headers["X-Message-Id"] == record["id"]
    assert record["taskId"] == "task-1"
    assert record["content"]["text"] == "Hello"
    assert record["content"]["html"] == "<p>Hello</p>"


async def test_sandbox_mode_is_200_and_sends_nothing(sim: SimulatorServer) -> None:
    mail = message()
    mail.mail_settings = MailSettings(sandbox_mode=SandBoxMode(True))

    response = await send(client(sim), mail)

    assert response.status_code == 200
    assert await sim.messages("sendgrid") == []


async def test_missing_subject_is_400_naming_the_field(sim: SimulatorServer) -> None:
    body = message().get()
    del body["subject"]

    with pytest.raises(exceptions.BadRequestsError) as caught:
        await send(client(sim), body)

    [error] = errors(caught)
    assert error["field"] == "subject"
    assert error["help"].startswith("http://sendgrid.com/docs/")


async def test_invalid_address_is_400(sim: SimulatorServer) -> None:
    body = message().get()
    body["personalizations"][0]["to"][0]["email"] = "nope"

    with pytest.raises(exceptions.BadRequestsError) as caught:
        await send(client(sim), body)

    assert errors(caught)[0]["field"] == "personalizations.0.to.0.email"


async def test_named_address_in_an_email_field_is_400(sim: SimulatorServer) -> None:
    """SendGrid's `email` holds the address alone (the name has its own field), so
    `Ada <ada@example.com>` there is not a valid address."""
    body = message().get()
    body["personalizations"][0]["to"][0]["email"] = "Ada <ada@example.com>"

    with pytest.raises(exceptions.BadRequestsError) as caught:
        await send(client(sim), body)

    assert errors(caught)[0]["field"] == "personalizations.0.to.0.email"
    assert await sim.messages("sendgrid") == []


async def test_duplicate_recipient_in_a_personalization_is_400(sim: SimulatorServer) -> None:
    """SendGrid refuses an address that appears twice among one personalization's to, cc and
    bcc (case aside), naming the field of the second one."""
    body = message().get()
    body["personalizations"][0]["cc"] = [{"email": "ADA@example.com"}]

    with pytest.raises(exceptions.BadRequestsError) as caught:
        await send(client(sim), body)

    [error] = errors(caught)
    assert error["field"] == "personalizations.0.cc"
    assert "unique" in error["message"]
    assert await sim.messages("sendgrid") == []


@pytest.mark.parametrize(
    ("personalizations", "named"),
    [
        # One personalization per recipient, as a bulk send builds them.
        ([{"to": [{"email": f"u{i}@example.com"}]} for i in range(1001)], "1000 personalizations"),
        # Fewer personalizations, but more than 1000 recipients across them.
        ([{"to": [{"email": f"u{i}-{j}@example.com"} for j in range(2)]} for i in range(501)],
         "1000 total recipients"),
    ],
)
async def test_more_than_1000_personalizations_or_recipients_is_400(
    sim: SimulatorServer, personalizations: list[dict[str, Any]], named: str
) -> None:
    body = message().get()
    body["personalizations"] = personalizations

    with pytest.raises(exceptions.BadRequestsError) as caught:
        await send(client(sim), body)

    [error] = errors(caught)
    assert error["field"] == "personalizations"
    assert named in error["message"]
    assert await sim.messages("sendgrid") == []


async def test_empty_content_value_is_400(sim: SimulatorServer) -> None:
    body = message().get()
    body["content"][0]["value"] = ""

    with pytest.raises(exceptions.BadRequestsError) as caught:
        await send(client(sim), body)

    assert errors(caught)[0]["field"] == "content.0.value"


async def test_html_before_plain_text_is_400_naming_content(sim: SimulatorServer) -> None:
    body = message().get()
    body["content"] = [{"type": "text/html", "value": "<p>Hello</p>"},
                       {"type": "text/plain", "value": "Hello"}]

    with pytest.raises(exceptions.BadRequestsError) as caught:
        await send(client(sim), body)

    assert errors(caught)[0]["field"] == "content"
    assert await sim.messages("sendgrid") == []


async def test_other_content_types_come_after_plain_text_and_html(sim: SimulatorServer) -> None:
    body = message().get()
    body["content"].append({"type": "text/calendar", "value": "BEGIN:VCALENDAR"})
    response = await send(client(sim), body)
    assert response.status_code == 202

    body["content"].insert(0, body["content"].pop())
    with pytest.raises(exceptions.BadRequestsError) as caught:
        await send(client(sim), body)
    assert errors(caught)[0]["field"] == "content"


@pytest.mark.parametrize("send_at", ["1700000000", 1.5, -1, True, -99_999_999_999_999])
@pytest.mark.parametrize("where", ["message", "personalization"])
async def test_send_at_that_is_not_a_unix_timestamp_is_400(
    sim: SimulatorServer, send_at: object, where: str
) -> None:
    # A personalization's send_at is the same Unix timestamp as the message's; it was taken
    # whatever it held, and one far before 1970 was the simulator's 500.
    body = message().get()
    if where == "message":
        body["send_at"] = send_at
    else:
        body["personalizations"][0]["send_at"] = send_at

    with pytest.raises(exceptions.BadRequestsError) as caught:
        await send(client(sim), body)

    field = "send_at" if where == "message" else "personalizations.0.send_at"
    assert errors(caught)[0]["field"] == field
    assert await sim.messages("sendgrid") == []


ATTACHMENT = {"content": "aGVsbG8=", "filename": "a.txt", "type": "text/plain"}


@pytest.mark.parametrize(("extra", "field", "text"), [
    ({"send_at": int(time.time()) + 73 * 3600}, "send_at",
     "Scheduling more than 72 hours in advance is forbidden."),
    ({"categories": [f"c{i}" for i in range(11)]}, "categories",
     "There is a limit of 10 categories for each email that is sent. You provided 11 "
     "categories."),
    ({"categories": ["a", 5]}, "categories", "Categories must be an array of strings."),
    ({"categories": "welcome"}, "categories", "Categories must be an array of strings."),
    ({"categories": ["x" * 256]}, "categories",
     f"Each category must not be longer than 255 characters. {'x' * 256} exceeds this limit"),
    ({"categories": ["a", "a"]}, "categories",
     "The categories must be a unique list, and you have included a more than once."),
    ({"categories": ["caf\u00e9"]}, "categories",
     "Categories can not contain non-ASCII characters."),
    ({"attachments": [{**ATTACHMENT, "content": "not base64!"}]}, "attachments.0.content",
     "The attachment content must be base64 encoded."),
    ({"attachments": [{**ATTACHMENT, "content": ""}]}, "attachments.0.content",
     "The attachment content must be a string at least one character in length."),
    ({"attachments": [ATTACHMENT, {"content": "aGk="}]}, "attachments.1.filename",
     "filename is required."),
    ({"attachments": [{**ATTACHMENT, "disposition": "inline-ish"}]},
     "attachments.0.disposition",
     'The disposition of your attachment can be either "inline" or "attachment". You '
     "provided inline-ish."),
    ({"headers": {"X-Count": 3}}, "headers", "All values of the headers object must be strings."),
    ({"headers": {"subject": "Hi"}}, "headers", "Header cannot be one of the reserved keys."),
    ({"asm": {"group_id": "12"}}, "asm.group_id", "The ASM group ID must be an integer."),
    ({"batch_id": 7}, "batch_id", "The batch_id must be a string."),
    ({"reply_to": {"email": "not-an-address"}}, "reply_to.email",
     "The reply_to email does not contain a valid address."),
    ({"reply_to": {"email": ""}}, "reply_to.email",
     "The reply_to email does not contain a valid address."),
    ({"reply_to_list": [{"email": "a@example.com"}, {"email": "nope"}]},
     "reply_to_list.1.email", "The reply_to_list email does not contain a valid address."),
], ids=["send-at-past-72h", "eleven-categories", "category-number", "categories-string",
        "long-category", "repeated-category", "non-ascii-category", "attachment-not-base64",
        "attachment-empty", "attachment-no-filename", "attachment-disposition",
        "header-number", "reserved-header", "asm-group-string", "batch-id-number",
        "reply-to-no-address", "reply-to-empty", "reply-to-list-no-address"])
async def test_what_sendgrid_refuses_beside_the_recipients_is_its_400(
    sim: SimulatorServer, extra: dict[str, Any], field: str, text: str
) -> None:
    """The refusals of SendGrid's mail-send error table, each naming its field, so a request
    that fails at SendGrid fails against the simulator too and nothing is sent."""
    body = {**message().get(), **extra}

    with pytest.raises(exceptions.BadRequestsError) as caught:
        await send(client(sim), body)

    [error] = errors(caught)
    assert (error["field"], error["message"]) == (field, text)
    assert await sim.messages("sendgrid") == []


async def test_what_sendgrid_takes_beside_the_recipients_is_sent(sim: SimulatorServer) -> None:
    body = {**message().get(), "send_at": int(time.time()) + 71 * 3600,
            "categories": [f"c{i}" for i in range(10)],
            "attachments": [{**ATTACHMENT, "disposition": "inline", "content_id": "logo"}],
            "headers": {"X-Entity-Ref-ID": "1"}, "asm": {"group_id": 12},
            "reply_to": {"email": "help@example.com", "name": "Help"},
            "batch_id": "YzJmNDcxMzQtZTUyNi0xMWU2LWI1ZDktNTI1NDAwMGRhNWMzLTg4YjIyYmFiYg"}
    body["personalizations"][0]["dynamic_template_data"] = {"name": "Ada", "items": [1, 2]}
    response = await send(client(sim), body)
    assert response.status_code == 202
    [record] = await sim.messages("sendgrid")
    assert record["content"]["dynamic_template_data"] == {"name": "Ada", "items": [1, 2]}


@pytest.mark.parametrize(
    ("where", "value", "given"),
    [
        ("custom_args", "this is a string", "string"),
        ("custom_args", ["notifkit_task_id"], "array"),
        ("personalizations.0.custom_args", 5, "integer"),
    ],
)
async def test_custom_args_that_are_not_an_object_are_400_naming_them(
    sim: SimulatorServer, where: str, value: object, given: str
) -> None:
    """SendGrid's type check: custom_args is an object, at the top or in a personalization."""
    body = message().get()
    body.pop("custom_args", None)
    target = body["personalizations"][0] if where.startswith("personalizations") else body
    target["custom_args"] = value

    with pytest.raises(exceptions.BadRequestsError) as caught:
        await send(client(sim), body)

    [error] = errors(caught)
    assert (error["field"], error["message"]) == (
        where, f"Invalid type. Expected: object, given: {given}.")
    assert await sim.messages("sendgrid") == []


@pytest.mark.parametrize(("where", "value"), [
    ("custom_args", 1234),
    ("personalizations.0.custom_args", {"a": "b"}),
    ("custom_args", None),
])
async def test_a_custom_arg_that_is_no_string_is_400(
    sim: SimulatorServer, where: str, value: object
) -> None:
    """Each custom argument is a string, as SendGrid's error table says: a number sent as a
    task id or user id is refused, not recorded."""
    body = message().get()
    body.pop("custom_args", None)
    target = body["personalizations"][0] if where.startswith("personalizations") else body
    target["custom_args"] = {"notifkit_task_id": "task-1", "user_id": value}

    with pytest.raises(exceptions.BadRequestsError) as caught:
        await send(client(sim), body)

    [error] = errors(caught)
    assert (error["field"], error["message"]) == (
        where, "All values of custom arguments object must be strings")
    assert await sim.messages("sendgrid") == []


async def test_missing_key_is_401(sim: SimulatorServer) -> None:
    sg = client(sim, api_key="")
    sg.client.request_headers["Authorization"] = "Bearer "
    with pytest.raises(exceptions.UnauthorizedError) as caught:
        await send(sg, message())
    assert errors(caught)[0]["message"] == "authorization required"


@pytest.mark.parametrize(
    ("status", "exception"),
    [
        (500, exceptions.InternalServerError),
        (503, exceptions.ServiceUnavailableError),
        (413, exceptions.PayloadTooLargeError),
        (400, exceptions.BadRequestsError),
    ],
)
async def test_error_fault_statuses(
    sim: SimulatorServer, status: int, exception: type[exceptions.HTTPError]
) -> None:
    await sim.add_fault("error", "sendgrid", status=status)
    with pytest.raises(exception) as caught:
        await send(client(sim), message())
    assert caught.value.status_code == status
    assert errors(caught)[0]["message"]
    assert await sim.messages("sendgrid") == []


async def test_rate_limit_fault_is_429_with_retry_after(sim: SimulatorServer) -> None:
    await sim.add_fault("rate_limit", "sendgrid", retry_after_s=3)
    with pytest.raises(exceptions.TooManyRequestsError) as caught:
        await send(client(sim), message())
    assert caught.value.headers["Retry-After"] == "3"
    assert errors(caught)[0]["message"] == "too many requests"


async def test_invalid_token_fault_is_400_invalid_address(sim: SimulatorServer) -> None:
    await sim.add_fault("invalid_token", "sendgrid")
    with pytest.raises(exceptions.BadRequestsError) as caught:
        await send(client(sim), message())
    assert errors(caught)[0]["message"] == "Does not contain a valid address."


def test_an_invalid_address_answer_not_told_the_field_names_the_first_recipients_email() -> None:
    """SendGrid names the field of the refused address; when the simulator was not told which
    recipient it was, it names the first one's, as SendGrid does for a one-recipient request,
    so a client that maps the field back to an address still finds one."""
    reply = SendGrid().render(ErrorCase.INVALID_RECIPIENT)

    [error] = json.loads(reply.body)["errors"]
    assert (reply.status, error["field"], error["message"]) == (
        400, "personalizations.0.to.0.email", "Does not contain a valid address.")


async def test_invalid_token_fault_names_the_field_of_the_recipient_it_matched(
    sim: SimulatorServer,
) -> None:
    # Given a rule for one address, and a request where that address is not the first
    await sim.add_fault("invalid_token", "sendgrid", to="gone@*")
    body = {
        "personalizations": [
            {"to": [{"email": "ada@example.com"}]},
            {"to": [{"email": "bob@example.com"}], "cc": [{"email": "gone@example.com"}]},
        ],
        "from": {"email": "noreply@example.com"},
        "subject": "Welcome",
        "content": [{"type": "text/plain", "value": "Hello"}],
    }

    with pytest.raises(exceptions.BadRequestsError) as caught:
        await send(client(sim), body)

    # Then the error points at that address, not at the request's first recipient
    [error] = errors(caught)
    assert error["field"] == "personalizations.1.cc.0.email"
    assert error["message"] == "Does not contain a valid address."


async def test_malformed_fault_is_200_without_message_id(sim: SimulatorServer) -> None:
    await sim.add_fault("malformed", "sendgrid")
    response = await send(client(sim), message())
    assert response.status_code == 200
    assert "X-Message-Id" not in response.headers
    with pytest.raises(json.JSONDecodeError):
        json.loads(response.body)


async def test_timeout_fault_times_out_the_client(sim: SimulatorServer) -> None:
    await sim.add_fault("timeout", "sendgrid")
    sg = client(sim)
    sg.client.timeout = SHORT_TIMEOUT_S
    with pytest.raises(TimeoutError):
        await send(sg, message())
    assert await sim.messages("sendgrid") == []


async def test_provider_rate_limit(sim: SimulatorServer) -> None:
    await sim.set_limit("sendgrid", 0.5, burst=2)
    sg = client(sim)
    await send(sg, message())
    await send(sg, message())
    with pytest.raises(exceptions.TooManyRequestsError) as caught:
        await send(sg, message())
    assert int(caught.value.headers["Retry-After"]) >= 1
    # X-RateLimit-Reset is a Unix time no sooner than Retry-After allows.
    reset_at = int(caught.value.headers["X-RateLimit-Reset"])
    assert reset_at >= int(time.time()) + int(caught.value.headers["Retry-After"]) - 1


@pytest.mark.parametrize("where", ["message", "personalization"])
async def test_a_message_sent_later_gets_its_receipts_after_its_send_at(
    sim: SimulatorServer, where: str
) -> None:
    """SendGrid sends a message with a send_at (on the message or its personalization) at
    that time, and nothing happens to it before; the simulator's receipts for it came at
    once."""
    from simulators.kinds import Provider
    from simulators.receipts import due_in_s

    later = int(time.time()) + 3600
    mail = message().get()
    if where == "message":
        mail["send_at"] = later
    else:
        mail["personalizations"][0]["send_at"] = later
    await send(client(sim), mail)
    await send(client(sim), message("bob@example.com"))

    [now_sent, scheduled] = [sim.state.messages.find(Provider.SENDGRID, m["id"])
                             for m in await sim.messages("sendgrid")]
    assert scheduled is not None
    assert now_sent is not None
    assert 3500 < due_in_s(scheduled) <= 3600
    assert due_in_s(now_sent) == 0.0
