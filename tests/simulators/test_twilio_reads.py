"""The official `twilio` SDK reads messages back from the simulator: `messages(sid).fetch()`
and `messages.list()` / `.page()` answer from what was sent, for the account in the path only,
with Twilio's paging fields and its 404 (code 20404)."""

from __future__ import annotations

import asyncio
import base64
from datetime import UTC, datetime, time, timedelta
from typing import Any

import aiohttp
import pytest
from twilio.base.exceptions import TwilioException, TwilioRestException
from twilio.http.http_client import TwilioHttpClient
from twilio.rest import Client

from simulators import SimulatorServer

ACCOUNT_SID = "AC" + "0" * 32
OTHER_ACCOUNT_SID = "AC" + "1" * 32
AUTH_TOKEN = "twilio-test-token"
SENDER = "+15017122661"
SECRET = "whsec_" + base64.b64encode(b"notifkit-twilio-reads").decode()


def client(sim: SimulatorServer, account_sid: str = ACCOUNT_SID) -> Client:
    twilio = Client(account_sid, AUTH_TOKEN, http_client=TwilioHttpClient(timeout=5))
    twilio.api.base_url = sim.base_url
    return twilio


async def send(twilio: Client, to: str, body: str = "Your code is 123456") -> Any:
    return await asyncio.to_thread(twilio.messages.create, to=to, from_=SENDER, body=body)


async def test_fetch_reads_back_the_message(sim: SimulatorServer) -> None:
    twilio = client(sim)
    sent = await send(twilio, "+15558675310")

    fetched = await asyncio.to_thread(twilio.messages(sent.sid).fetch)

    assert fetched.sid == sent.sid
    assert fetched.account_sid == ACCOUNT_SID
    assert fetched.to == "+15558675310"
    assert fetched.from_ == SENDER
    assert fetched.body == "Your code is 123456"
    assert fetched.direction == "outbound-api"
    assert fetched.date_created == sent.date_created
    assert fetched.date_sent is not None
    # Without receipts configured the simulated carrier delivers.
    assert fetched.status == "delivered"
    assert fetched.error_code is None


async def test_fetch_status_follows_the_receipts(sim: SimulatorServer, receiver: Any) -> None:
    await sim.set_receipts(receiver.url, SECRET, delay_ms=300, bounced=1)
    twilio = client(sim)
    sent = await send(twilio, "+15558675310")

    assert (await asyncio.to_thread(twilio.messages(sent.sid).fetch)).status == "sent"
    await sim.drain_receipts()
    fetched = await asyncio.to_thread(twilio.messages(sent.sid).fetch)
    assert fetched.status == "undelivered"
    assert fetched.error_code == 30003


async def test_fetch_unknown_or_other_accounts_message_is_20404(sim: SimulatorServer) -> None:
    sent = await send(client(sim), "+15558675310")

    for twilio, sid in (
        (client(sim), "SM" + "f" * 32),
        (client(sim, OTHER_ACCOUNT_SID), sent.sid),
    ):
        with pytest.raises(TwilioRestException) as caught:
            await asyncio.to_thread(twilio.messages(sid).fetch)
        assert caught.value.status == 404
        assert caught.value.code == 20404
        assert "was not found" in caught.value.msg


async def test_list_is_newest_first_and_limited(sim: SimulatorServer) -> None:
    twilio = client(sim)
    sids = [(await send(twilio, f"+1555867531{i}")).sid for i in range(3)]
    await send(client(sim, OTHER_ACCOUNT_SID), "+15558675319")

    listed = await asyncio.to_thread(twilio.messages.list, limit=2)

    assert [m.sid for m in listed] == [sids[2], sids[1]]
    everything = await asyncio.to_thread(twilio.messages.list)
    assert [m.sid for m in everything] == sids[::-1]


async def test_list_filters_by_to_and_from(sim: SimulatorServer) -> None:
    twilio = client(sim)
    await send(twilio, "+15558675310")
    wanted = await send(twilio, "+15558675311")

    by_to = await asyncio.to_thread(twilio.messages.list, to="+15558675311")
    by_from = await asyncio.to_thread(twilio.messages.list, from_="+15550000000")

    assert [m.sid for m in by_to] == [wanted.sid]
    assert by_from == []


async def test_list_pages_with_twilio_paging_fields(sim: SimulatorServer) -> None:
    twilio = client(sim)
    sids = [(await send(twilio, f"+1555867531{i}")).sid for i in range(5)]

    first = await asyncio.to_thread(twilio.messages.page, page_size=2)
    second = await asyncio.to_thread(first.next_page)
    third = await asyncio.to_thread(second.next_page)
    back = await asyncio.to_thread(second.previous_page)

    assert [m.sid for m in first] == [sids[4], sids[3]]
    assert [m.sid for m in second] == [sids[2], sids[1]]
    assert [m.sid for m in third] == [sids[0]]
    assert [m.sid for m in back] == [sids[4], sids[3]]
    payload = first._payload
    base = f"/2010-04-01/Accounts/{ACCOUNT_SID}/Messages.json"
    assert payload["page"] == 0
    assert payload["page_size"] == 2
    assert (payload["start"], payload["end"]) == (0, 1)
    assert payload["uri"] == f"{base}?PageSize=2&Page=0"
    assert payload["first_page_uri"] == f"{base}?PageSize=2&Page=0"
    assert payload["previous_page_uri"] is None
    assert payload["next_page_uri"] == f"{base}?PageSize=2&Page=1&PageToken=PA{sids[3]}"
    assert (third._payload["start"], third._payload["end"]) == (4, 4)
    assert third._payload["next_page_uri"] is None


async def test_page_size_over_1000_is_20007(sim: SimulatorServer) -> None:
    with pytest.raises(TwilioException) as caught:
        await asyncio.to_thread(client(sim).messages.list, page_size=1001)
    assert "20007" in str(caught.value)


@pytest.mark.parametrize("query", [
    "PageSize=0", "PageSize=ten", "Page=-1", "DateSent=soon",
    # int() reads other scripts' digits and digit separators: a full-width 5 was a page of 5.
    "PageSize=%EF%BC%95", "PageSize=1_0", "Page=%EF%BC%91",
])
async def test_bad_list_query_is_400_naming_it(sim: SimulatorServer, query: str) -> None:
    url = f"{sim.base_url}/2010-04-01/Accounts/{ACCOUNT_SID}/Messages.json?{query}"
    credentials = base64.b64encode(f"{ACCOUNT_SID}:{AUTH_TOKEN}".encode()).decode()
    headers = {"Authorization": f"Basic {credentials}"}
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as response:
        assert response.status == 400
        body = await response.json()
    assert body["status"] == 400
    assert query.split("=")[0] in body["message"]


async def test_reads_need_credentials(sim: SimulatorServer) -> None:
    url = f"{sim.base_url}/2010-04-01/Accounts/{ACCOUNT_SID}/Messages.json"
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        assert response.status == 401
        assert (await response.json())["code"] == 20003


async def test_list_filters_by_date_sent(sim: SimulatorServer) -> None:
    twilio = client(sim)
    sent = await send(twilio, "+15558675310")
    hour_ago = datetime.now(UTC) - timedelta(hours=1)

    after = await asyncio.to_thread(twilio.messages.list, date_sent_after=hour_ago)
    before = await asyncio.to_thread(twilio.messages.list, date_sent_before=hour_ago)

    assert [m.sid for m in after] == [sent.sid]
    assert before == []


async def test_list_filters_by_the_day_sent_as_the_sdk_sends_it(sim: SimulatorServer) -> None:
    # Twilio's DateSent is a GMT date, and the SDK writes a date as midnight
    # (DateSent=2026-12-04T00:00:00Z): read as that one second, the day's messages were not
    # found.
    twilio = client(sim)
    sent = await send(twilio, "+15558675310")
    day = sent.date_created.astimezone(UTC).date()

    on_the_day = await asyncio.to_thread(twilio.messages.list, date_sent=day)
    at_noon = await asyncio.to_thread(
        twilio.messages.list, date_sent=datetime.combine(day, time(12), UTC))
    the_day_before = await asyncio.to_thread(
        twilio.messages.list, date_sent=day - timedelta(days=1))

    assert [m.sid for m in on_the_day] == [sent.sid]
    assert [m.sid for m in at_noon] == [sent.sid]
    assert the_day_before == []


@pytest.mark.parametrize("query", ["DateSent%3C=9999-12-31", "DateSent%3E=0001-01-01"])
async def test_date_sent_at_the_ends_of_time_is_answered(sim: SimulatorServer, query: str) -> None:
    await send(client(sim), "+15558675310")
    url = f"{sim.base_url}/2010-04-01/Accounts/{ACCOUNT_SID}/Messages.json?{query}"
    credentials = base64.b64encode(f"{ACCOUNT_SID}:{AUTH_TOKEN}".encode()).decode()
    headers = {"Authorization": f"Basic {credentials}"}
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as response:
        assert response.status == 200
        assert len((await response.json())["messages"]) == 1


SERVICE_SID = "MG" + "0" * 32


async def test_a_message_scheduled_for_later_reads_as_scheduled_until_then(
    sim: SimulatorServer
) -> None:
    """Twilio answers a message scheduled for later (ScheduleType fixed, SendAt) as
    "scheduled", not sent, and it reads so until its time; the simulator answered it as
    queued and read it as delivered at once."""
    twilio = client(sim)
    send_at = (datetime.now(UTC) + timedelta(days=1)).replace(microsecond=0)

    created = await asyncio.to_thread(
        twilio.messages.create, to="+15558675310", messaging_service_sid=SERVICE_SID,
        body="Tomorrow", schedule_type="fixed", send_at=send_at)
    fetched = await asyncio.to_thread(twilio.messages(created.sid).fetch)

    assert created.status == "scheduled"
    assert (fetched.status, fetched.date_sent) == ("scheduled", None)
    [record] = await sim.messages("twilio")
    assert record["content"]["send_at"] == send_at.isoformat().replace("+00:00", "Z")


def test_a_scheduled_message_gets_its_receipts_once_its_time_has_come() -> None:
    """Nothing happens to a scheduled SMS before it is sent, as to a scheduled e-mail."""
    from simulators.kinds import Provider
    from simulators.receipts import due_in_s
    from simulators.records import MessageRecord

    now = datetime.now(UTC)
    later = MessageRecord(
        id="SM1", provider=Provider.TWILIO, recipients=["+15558675310"], task_id=None,
        idempotency_key=None, received_at=now, content={},
        meta={"send_at": (now + timedelta(hours=1)).isoformat()})
    past = MessageRecord(
        id="SM2", provider=Provider.TWILIO, recipients=["+15558675310"], task_id=None,
        idempotency_key=None, received_at=now, content={},
        meta={"send_at": (now - timedelta(hours=1)).isoformat()})

    assert 3500 < due_in_s(later) <= 3600
    assert due_in_s(past) == 0.0


@pytest.mark.parametrize(("fields", "code"), [
    ({"ScheduleType": "fixed", "MessagingServiceSid": SERVICE_SID}, 35111),
    ({"ScheduleType": "fixed", "SendAt": "2099-01-01T00:00:00Z", "From": SENDER}, 35118),
    ({"ScheduleType": "later", "SendAt": "2099-01-01T00:00:00Z",
      "MessagingServiceSid": SERVICE_SID}, 35126),
    ({"ScheduleType": "fixed", "SendAt": "tomorrow", "MessagingServiceSid": SERVICE_SID},
     35114),
    ({"ScheduleType": "fixed", "SendAt": "2020-01-01T00:00:00Z",
      "MessagingServiceSid": SERVICE_SID}, 35114),
    # Twilio schedules up to 35 days ahead.
    ({"ScheduleType": "fixed", "SendAt": "9999-12-31T23:59:59-23:59",
      "MessagingServiceSid": SERVICE_SID}, 35114),
], ids=["no-send-at", "no-messaging-service", "not-fixed", "send-at-no-time", "send-at-past",
        "send-at-past-35-days"])
async def test_a_schedule_twilio_cannot_take_is_its_400(
    sim: SimulatorServer, fields: dict[str, str], code: int
) -> None:
    credentials = base64.b64encode(f"{ACCOUNT_SID}:{AUTH_TOKEN}".encode()).decode()
    headers = {"Authorization": f"Basic {credentials}"}
    url = f"{sim.base_url}/2010-04-01/Accounts/{ACCOUNT_SID}/Messages.json"
    form = {"To": "+15558675310", "Body": "Later", **fields}
    async with aiohttp.ClientSession() as http, http.post(url, headers=headers,
                                                          data=form) as reply:
        status, body = reply.status, await reply.json()

    assert (status, body["code"]) == (400, code)
    assert await sim.messages("twilio") == []


async def test_a_message_not_sent_yet_has_no_date_sent_to_be_found_by(
    sim: SimulatorServer
) -> None:
    """A scheduled message waiting for its time has not been sent: a DateSent filter does not
    find it (its date_sent is null), while the plain list does."""
    twilio = client(sim)
    send_at = (datetime.now(UTC) + timedelta(days=1)).replace(microsecond=0)
    scheduled = await asyncio.to_thread(
        twilio.messages.create, to="+15558675310", messaging_service_sid=SERVICE_SID,
        body="Tomorrow", schedule_type="fixed", send_at=send_at)
    hour_ago = datetime.now(UTC) - timedelta(hours=1)

    everything = await asyncio.to_thread(twilio.messages.list)
    sent_since = await asyncio.to_thread(twilio.messages.list, date_sent_after=hour_ago)
    created_on = scheduled.date_created.astimezone(UTC).date()
    sent_that_day = await asyncio.to_thread(twilio.messages.list, date_sent=created_on)

    assert [m.sid for m in everything] == [scheduled.sid]
    assert sent_since == []
    assert sent_that_day == []
