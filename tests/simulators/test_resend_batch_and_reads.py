"""The official `resend` SDK's other common calls work against the simulator: `Batch.send`
(`POST /emails/batch`) records each email as its own message, with faults, idempotency and
validation applying to the batch as a whole; `Emails.get` (`GET /emails/{id}`) and
`Emails.list` (`GET /emails`) read back what was sent, `last_event` following the receipts the
simulator posted."""

from __future__ import annotations

import asyncio
import base64
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
import resend
from resend import exceptions

from simulators import SimulatorServer

SECRET = "whsec_" + base64.b64encode(b"notifkit-batch-secret").decode()


def email(to: str, task_id: str | None = None, **overrides: Any) -> dict[str, Any]:
    params: dict[str, Any] = {
        "from": "Notifkit <noreply@example.com>",
        "to": [to],
        "subject": f"Hello {to}",
        "html": "<p>Hi</p>",
    }
    if task_id is not None:
        params["tags"] = [{"name": "notifkit_task_id", "value": task_id}]
    params.update(overrides)
    return params


async def batch(emails: list[dict[str, Any]], options: dict[str, Any] | None = None) -> Any:
    return await asyncio.to_thread(
        resend.Batch.send,
        cast(list[resend.Emails.SendParams], emails),
        cast(resend.Batch.SendOptions | None, options),
    )


async def get(email_id: str) -> Any:
    return await asyncio.to_thread(resend.Emails.get, email_id)


async def test_batch_records_each_email_with_its_own_task(
    resend_sdk: Any, sim: SimulatorServer
) -> None:
    sent = await batch([email("ada@example.com", "task-a"), email("bob@example.com", "task-b")])

    ids = [item["id"] for item in sent["data"]]
    assert len(set(ids)) == 2
    records = {m["id"]: m for m in await sim.messages("resend")}
    assert records[ids[0]]["to"] == "ada@example.com"
    assert records[ids[0]]["taskId"] == "task-a"
    assert records[ids[1]]["to"] == "bob@example.com"
    assert records[ids[1]]["taskId"] == "task-b"
    stats = (await sim.stats())["resend"]
    assert (stats["requests"], stats["accepted"]) == (1, 2)


async def test_a_fault_fails_the_whole_batch(resend_sdk: Any, sim: SimulatorServer) -> None:
    # A rule matching one recipient decides the request, as the real provider fails it whole.
    await sim.add_fault("error", "resend", to="bob@*", times=1)

    with pytest.raises(exceptions.ApplicationError) as caught:
        await batch([email("ada@example.com"), email("bob@example.com")])

    assert caught.value.code == 500
    assert await sim.messages("resend") == []
    [rule] = await sim.faults()
    assert rule["fired"] == 1
    await batch([email("ada@example.com"), email("bob@example.com")])
    assert len(await sim.messages("resend")) == 2


async def test_an_invalid_token_fault_names_the_email_and_field_it_matched(
    resend_sdk: Any, sim: SimulatorServer
) -> None:
    await sim.add_fault("invalid_token", "resend", to="bob@*")

    with pytest.raises(exceptions.ValidationError) as caught:
        await batch([email("ada@example.com"), email("bob@example.com")])

    assert str(caught.value.message).startswith("emails[1]: Invalid `to` field.")
    assert await sim.messages("resend") == []


async def test_a_lost_response_records_every_email_of_the_batch(
    resend_sdk: Any, sim: SimulatorServer
) -> None:
    await sim.add_fault("lost_response", "resend", delay_ms=100, times=1)

    with pytest.raises(exceptions.ResendError):
        await batch([email("ada@example.com", "task-a"), email("bob@example.com", "task-b")])

    assert sorted(m["taskId"] or "" for m in await sim.messages("resend")) == ["task-a", "task-b"]


async def test_strict_batch_with_one_invalid_email_sends_nothing(
    resend_sdk: Any, sim: SimulatorServer
) -> None:
    with pytest.raises(exceptions.ValidationError) as caught:
        await batch([email("ada@example.com"), email("not-an-address")])

    assert caught.value.code == 422
    assert "emails[1]" in caught.value.message
    assert await sim.messages("resend") == []


async def test_permissive_batch_sends_the_valid_emails_and_lists_the_others(
    resend_sdk: Any, sim: SimulatorServer
) -> None:
    sent = await batch(
        [email("ada@example.com"), email("not-an-address"), email("cy@example.com")],
        {"batch_validation": "permissive"},
    )

    assert len(sent["data"]) == 2
    [error] = sent["errors"]
    assert error["index"] == 1
    assert "`to`" in error["message"]
    assert sorted(m["to"] for m in await sim.messages("resend")) == [
        "ada@example.com",
        "cy@example.com",
    ]


async def test_batch_over_100_emails_is_422(resend_sdk: Any, sim: SimulatorServer) -> None:
    with pytest.raises(exceptions.ValidationError):
        await batch([email(f"user{i}@example.com") for i in range(101)])
    assert await sim.messages("resend") == []


async def test_batch_email_with_attachments_is_refused(
    resend_sdk: Any, sim: SimulatorServer
) -> None:
    attached = email("ada@example.com", attachments=[{"filename": "a.txt", "content": "aGk="}])
    with pytest.raises(exceptions.ValidationError) as caught:
        await batch([attached])
    assert "attachments" in caught.value.message
    # An empty list asks for nothing the batch endpoint lacks.
    await batch([email("ada@example.com", attachments=[])])
    assert len(await sim.messages("resend")) == 1


async def test_a_batch_takes_one_token_of_the_rate_limit(
    resend_sdk: Any, sim: SimulatorServer
) -> None:
    await sim.set_limit("resend", 0.01, burst=1)

    await batch([email(f"user{i}@example.com") for i in range(5)])
    with pytest.raises(exceptions.RateLimitError):
        await batch([email("late@example.com")])

    assert len(await sim.messages("resend")) == 5


async def test_batch_idempotency_key_replays_the_whole_batch(
    resend_sdk: Any, sim: SimulatorServer
) -> None:
    emails = [email("ada@example.com", "task-a"), email("bob@example.com", "task-b")]
    first = await batch(emails, {"idempotency_key": "digest-42"})
    again = await batch(emails, {"idempotency_key": "digest-42"})

    assert again["data"] == first["data"]
    assert len(await sim.messages("resend")) == 2
    assert (await sim.stats())["resend"]["replays"] == 1


async def test_get_reads_back_the_email(resend_sdk: Any, sim: SimulatorServer) -> None:
    sent = await asyncio.to_thread(
        resend.Emails.send,
        cast(resend.Emails.SendParams, email(
            "ada@example.com", cc=["cc@example.com"], reply_to="help@example.com", text="Hi"
        )),
    )

    found = await get(sent["id"])

    assert found["object"] == "email"
    assert found["id"] == sent["id"]
    assert found["to"] == ["ada@example.com"]
    assert found["from"] == "Notifkit <noreply@example.com>"
    assert found["subject"] == "Hello ada@example.com"
    assert found["html"] == "<p>Hi</p>"
    assert found["text"] == "Hi"
    assert found["cc"] == ["cc@example.com"]
    assert found["bcc"] is None
    assert found["reply_to"] == ["help@example.com"]
    assert found["created_at"].endswith("+00:00")
    # Without receipts configured the simulated provider simply delivers.
    assert found["last_event"] == "delivered"


async def test_get_reads_a_batched_email_and_a_test_address_fate(
    resend_sdk: Any, sim: SimulatorServer
) -> None:
    sent = await batch([email("ada@example.com"), email("bounced@resend.dev")])

    events = [(await get(item["id"]))["last_event"] for item in sent["data"]]

    assert events == ["delivered", "bounced"]


async def test_last_event_follows_the_receipts_posted(
    resend_sdk: Any, sim: SimulatorServer, receiver: Any
) -> None:
    await sim.set_receipts(receiver.url, SECRET, delay_ms=300, opened=1)
    sent = await asyncio.to_thread(
        resend.Emails.send, cast(resend.Emails.SendParams, email("ada@example.com"))
    )

    assert (await get(sent["id"]))["last_event"] == "sent"
    await sim.drain_receipts()
    assert (await get(sent["id"]))["last_event"] == "opened"


async def test_get_unknown_email_is_resend_404(resend_sdk: Any, sim: SimulatorServer) -> None:
    with pytest.raises(exceptions.ResendError) as caught:
        await get("4ef9a417-02e9-4d39-ad75-9611e0fcc33c")

    assert caught.value.code == 404
    assert caught.value.error_type == "not_found"
    assert caught.value.message == "Email not found"


async def test_get_without_key_is_401(resend_sdk: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resend, "api_key", "")
    with pytest.raises(exceptions.MissingApiKeyError):
        await get("4ef9a417-02e9-4d39-ad75-9611e0fcc33c")


async def list_emails(params: dict[str, Any] | None = None) -> Any:
    return await asyncio.to_thread(
        resend.Emails.list, cast(resend.Emails.ListParams | None, params)
    )


async def test_list_is_newest_first_and_pages_by_cursor(
    resend_sdk: Any, sim: SimulatorServer
) -> None:
    sent = await batch([email(f"user{i}@example.com") for i in range(5)])
    ids = [item["id"] for item in sent["data"]][::-1]  # newest first

    everything = await list_emails()
    first = await list_emails({"limit": 2})
    second = await list_emails({"limit": 2, "after": first["data"][-1]["id"]})
    back = await list_emails({"limit": 2, "before": second["data"][0]["id"]})

    assert everything["object"] == "list"
    assert [e["id"] for e in everything["data"]] == ids
    assert everything["has_more"] is False
    assert everything["data"][0]["last_event"] == "delivered"
    assert everything["data"][0]["to"] == ["user4@example.com"]
    assert ([e["id"] for e in first["data"]], first["has_more"]) == (ids[:2], True)
    assert ([e["id"] for e in second["data"]], second["has_more"]) == (ids[2:4], True)
    assert ([e["id"] for e in back["data"]], back["has_more"]) == (ids[:2], False)


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 101}, "limit"),
        # int() reads both, a web API's number parsing neither.
        ({"limit": "\uff15"}, "limit"),
        ({"limit": "1_0"}, "limit"),
        ({"after": "4ef9a417-02e9-4d39-ad75-9611e0fcc33c"}, "after"),
        ({"after": "a", "before": "b"}, "before"),
    ],
)
async def test_bad_list_parameters_are_422_naming_them(
    resend_sdk: Any, params: dict[str, Any], named: str
) -> None:
    with pytest.raises(exceptions.ValidationError) as caught:
        await list_emails(params)
    assert caught.value.code == 422
    assert f"`{named}`" in caught.value.message


async def test_an_email_scheduled_for_later_reads_as_scheduled_until_then(
    resend_sdk: Any, sim: SimulatorServer, receiver: Any
) -> None:
    # An email scheduled for 2099 read as delivered the moment it was accepted, and its
    # receipts were posted at once.
    later = await asyncio.to_thread(resend.Emails.send, cast(
        resend.Emails.SendParams, email("ada@example.com", scheduled_at="2099-01-01T00:00:00Z")))
    past = await asyncio.to_thread(resend.Emails.send, cast(
        resend.Emails.SendParams, email("bob@example.com", scheduled_at="2020-01-01T00:00:00Z")))

    assert (await get(later["id"]))["last_event"] == "scheduled"
    assert (await get(past["id"]))["last_event"] == "delivered"

    await sim.set_receipts(receiver.url, SECRET)
    soon = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
    sent = await asyncio.to_thread(resend.Emails.send, cast(
        resend.Emails.SendParams, email("cy@example.com", scheduled_at=soon)))
    await asyncio.sleep(0.5)
    assert receiver.requests == []
    assert (await get(sent["id"]))["last_event"] == "scheduled"
    await receiver.wait_for(1)
    assert (await get(sent["id"]))["last_event"] == "delivered"


async def test_a_scheduled_at_that_is_no_string_is_422(
    resend_sdk: Any, sim: SimulatorServer
) -> None:
    with pytest.raises(exceptions.ResendError) as caught:
        await asyncio.to_thread(resend.Emails.send, cast(
            resend.Emails.SendParams, email("ada@example.com", scheduled_at=1893456000)))
    assert "scheduled_at" in str(caught.value)
    assert await sim.messages("resend") == []
