"""The official `twilio` SDK updates messages on the simulator: `messages(sid).update(
status="canceled")` cancels a scheduled message, `update(body="")` redacts a sent one, with
Twilio's refusals (30409, 20009) for the rest. The route answered 405 before."""

from __future__ import annotations

import asyncio
import base64
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest
from twilio.base.exceptions import TwilioRestException
from twilio.rest import Client

from simulators import SimulatorServer

from .conftest import Receiver
from .test_twilio_reads import ACCOUNT_SID, AUTH_TOKEN, SECRET, SERVICE_SID, client, send


async def schedule(twilio: Client, seconds: float = 86_400, to: str = "+15558675310") -> Any:
    send_at = (datetime.now(UTC) + timedelta(seconds=seconds)).replace(microsecond=0)
    return await asyncio.to_thread(
        twilio.messages.create, to=to, messaging_service_sid=SERVICE_SID, body="Later",
        schedule_type="fixed", send_at=send_at)


async def post_update(sim: SimulatorServer, sid: str, form: dict[str, str]
                      ) -> tuple[int, dict[str, Any]]:
    credentials = base64.b64encode(f"{ACCOUNT_SID}:{AUTH_TOKEN}".encode()).decode()
    url = f"{sim.base_url}/2010-04-01/Accounts/{ACCOUNT_SID}/Messages/{sid}.json"
    async with aiohttp.ClientSession() as http, http.post(
            url, headers={"Authorization": f"Basic {credentials}"}, data=form) as reply:
        return reply.status, await reply.json()


async def test_a_scheduled_message_is_canceled_and_reads_canceled(sim: SimulatorServer) -> None:
    twilio = client(sim)
    scheduled = await schedule(twilio)

    canceled = await asyncio.to_thread(twilio.messages(scheduled.sid).update, status="canceled")
    fetched = await asyncio.to_thread(twilio.messages(scheduled.sid).fetch)
    again = await asyncio.to_thread(twilio.messages(scheduled.sid).update, status="canceled")

    assert (canceled.sid, canceled.status, canceled.date_sent) == (scheduled.sid, "canceled",
                                                                   None)
    assert (fetched.status, fetched.date_sent) == ("canceled", None)
    assert again.status == "canceled"  # a second cancel changes nothing


async def test_a_message_that_was_sent_cannot_be_canceled(sim: SimulatorServer) -> None:
    twilio = client(sim)
    sent = await send(twilio, "+15558675310")

    with pytest.raises(TwilioRestException) as refused:
        await asyncio.to_thread(twilio.messages(sent.sid).update, status="canceled")

    assert (refused.value.status, refused.value.code) == (400, 30409)
    assert (await asyncio.to_thread(twilio.messages(sent.sid).fetch)).status == "delivered"


async def test_a_canceled_message_gets_no_receipt(sim: SimulatorServer,
                                                  receiver: Receiver) -> None:
    await sim.set_receipts(receiver.url, SECRET, delay_ms=0)
    twilio = client(sim)
    kept = await schedule(twilio, seconds=2, to="+15558675310")
    dropped = await schedule(twilio, seconds=2, to="+15558675311")

    await asyncio.to_thread(twilio.messages(dropped.sid).update, status="canceled")
    await sim.drain_receipts()

    posted = [r.body.decode() for r in receiver.requests]
    assert len(posted) == 1
    assert kept.sid in posted[0]
    assert (await asyncio.to_thread(twilio.messages(dropped.sid).fetch)).status == "canceled"


async def test_a_sent_messages_body_is_redacted(sim: SimulatorServer) -> None:
    twilio = client(sim)
    sent = await send(twilio, "+15558675310", body="Your code is 123456")

    redacted = await asyncio.to_thread(twilio.messages(sent.sid).update, body="")

    assert redacted.body == ""
    assert (await asyncio.to_thread(twilio.messages(sent.sid).fetch)).body == ""


@pytest.mark.parametrize(("form", "code"), [
    ({"Status": "delivered"}, 20001),
    ({"Body": "Another text"}, 20001),
    ({}, 20001),
], ids=["other-status", "new-body", "nothing"])
async def test_an_update_twilio_does_not_take_is_its_400(
    sim: SimulatorServer, form: dict[str, str], code: int
) -> None:
    sent = await send(client(sim), "+15558675310")

    status, body = await post_update(sim, sent.sid, form)

    assert (status, body["code"]) == (400, code)
    assert body["message"]


async def test_a_scheduled_messages_body_cannot_be_redacted(sim: SimulatorServer) -> None:
    scheduled = await schedule(client(sim))

    status, body = await post_update(sim, scheduled.sid, {"Body": ""})

    assert (status, body["code"]) == (400, 20009)


async def test_an_unknown_message_is_20404(sim: SimulatorServer) -> None:
    status, body = await post_update(sim, "SM" + "f" * 32, {"Status": "canceled"})

    assert (status, body["code"]) == (404, 20404)
