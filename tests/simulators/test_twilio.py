"""The official `twilio` SDK, with its API domain's base URL set to the simulator, sends SMS
(201 Message resource) and gets Twilio's errors as `TwilioRestException` with Twilio's codes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import requests
from twilio.base.exceptions import TwilioRestException
from twilio.http.http_client import TwilioHttpClient
from twilio.rest import Client

from simulators import SimulatorServer
from simulators.providers.twilio import _segments

ACCOUNT_SID = "AC" + "0" * 32
AUTH_TOKEN = "twilio-test-token"
SHORT_TIMEOUT_S = 0.5


def client(sim: SimulatorServer, *, timeout_s: float = 5.0, token: str = AUTH_TOKEN) -> Client:
    twilio = Client(ACCOUNT_SID, token, http_client=TwilioHttpClient(timeout=timeout_s))
    # The only change from production: where the Api domain lives.
    twilio.api.base_url = sim.base_url
    return twilio


async def send(
    twilio: Client, to: str = "+15558675310", from_: str = "+15017122661",
    body: str = "Your code is 123456", **extra: Any
) -> Any:
    return await asyncio.to_thread(
        twilio.messages.create, to=to, from_=from_, body=body, **extra
    )


async def test_send_is_201_message_resource(sim: SimulatorServer) -> None:
    message = await send(client(sim))

    assert message.sid.startswith("SM")
    assert len(message.sid) == 34
    assert message.status == "queued"
    assert message.to == "+15558675310"
    assert message.account_sid == ACCOUNT_SID
    assert message.direction == "outbound-api"
    [record] = await sim.messages("twilio")
    assert record["id"] == message.sid
    assert record["content"]["body"] == "Your code is 123456"


async def test_task_id_from_status_callback_query(sim: SimulatorServer) -> None:
    callback = "https://notifkit.example.com/webhooks/twilio?notifkit_task_id=task-9"
    await send(client(sim), status_callback=callback)
    [record] = await sim.messages("twilio")
    assert record["taskId"] == "task-9"


@pytest.mark.parametrize(
    "callback",
    ["not a url", "/relative/path", "ftp://example.com/x", "http://[", "http://example.com:99999/x",
     "http://:8080/x"],
)
async def test_invalid_status_callback_is_21609(sim: SimulatorServer, callback: str) -> None:
    """Twilio refuses a StatusCallback it could never post to, before sending anything."""
    with pytest.raises(TwilioRestException) as caught:
        await send(client(sim), status_callback=callback)
    assert (caught.value.status, caught.value.code) == (400, 21609)
    assert await sim.messages("twilio") == []


@pytest.mark.parametrize("period", [0, 36001, "ten", "1.5"])
async def test_a_validity_period_twilio_refuses_is_21624(
        sim: SimulatorServer, period: object) -> None:
    """Twilio takes a ValidityPeriod of 1 to 36,000 whole seconds only; the simulator sent
    whatever it was given."""
    with pytest.raises(TwilioRestException) as caught:
        await send(client(sim), validity_period=period)
    assert (caught.value.status, caught.value.code) == (400, 21624)
    assert await sim.messages("twilio") == []


async def test_a_validity_period_in_range_is_sent(sim: SimulatorServer) -> None:
    await send(client(sim), validity_period=600)
    assert len(await sim.messages("twilio")) == 1


async def test_invalid_media_url_is_21620(sim: SimulatorServer) -> None:
    with pytest.raises(TwilioRestException) as caught:
        await send(client(sim), media_url=["https://example.com/a.png", "not-a-url"])
    assert (caught.value.status, caught.value.code) == (400, 21620)
    assert await sim.messages("twilio") == []


async def test_a_body_of_1600_characters_is_sent_and_one_longer_is_21617(
    sim: SimulatorServer,
) -> None:
    """Twilio's limit is 1,600 characters: a body of exactly that many is sent, one more is
    refused before anything is sent."""
    twilio = client(sim)
    sent = await send(twilio, body="a" * 1600)

    with pytest.raises(TwilioRestException) as caught:
        await send(twilio, body="a" * 1601)

    assert (caught.value.status, caught.value.code) == (400, 21617)
    assert [m["id"] for m in await sim.messages("twilio")] == [sent.sid]


async def test_an_error_answer_is_twilios_code_message_more_info_and_status(
    sim: SimulatorServer,
) -> None:
    """Twilio's error body is exactly these four fields; its SDKs and clients' logs link an
    error to its documentation page by more_info."""
    twilio = client(sim)
    with pytest.raises(TwilioRestException):
        await send(twilio, to="12345")

    last = twilio.http_client._test_only_last_response  # the SDK's hook for exactly this
    assert last is not None
    assert json.loads(last.text) == {
        "code": 21211,
        "message": "The 'To' number 12345 is not a valid phone number.",
        "more_info": "https://www.twilio.com/docs/errors/21211",
        "status": 400,
    }


async def test_invalid_number_is_21211(sim: SimulatorServer) -> None:
    with pytest.raises(TwilioRestException) as caught:
        await send(client(sim), to="12345")
    assert (caught.value.status, caught.value.code) == (400, 21211)


@pytest.mark.parametrize(
    ("number", "code"),
    [("+15005550001", 21211), ("+15005550002", 21612), ("+15005550004", 21610),
     ("+15005550009", 21614)],
)
async def test_magic_test_numbers(sim: SimulatorServer, number: str, code: int) -> None:
    with pytest.raises(TwilioRestException) as caught:
        await send(client(sim), to=number)
    assert caught.value.code == code
    assert await sim.messages("twilio") == []


@pytest.mark.parametrize(
    ("sender", "code"),
    [
        ("12-34", 21212),
        ("Notifkit-Alerts-Team", 21212),
        ("+15005550001", 21212),
        ("+15005550007", 21606),
        ("+15005550008", 21611),
    ],
)
async def test_unusable_from_is_refused(sim: SimulatorServer, sender: str, code: int) -> None:
    """Twilio refuses a From that is no phone number, short code or alphanumeric sender ID
    (21212), and its test credentials' magic From numbers answer their documented codes."""
    with pytest.raises(TwilioRestException) as caught:
        await send(client(sim), from_=sender)
    assert (caught.value.status, caught.value.code) == (400, code)
    assert await sim.messages("twilio") == []


@pytest.mark.parametrize("sender", ["+15005550006", "Notifkit", "12345", "whatsapp:+15017122661"])
async def test_usable_senders_are_accepted(sim: SimulatorServer, sender: str) -> None:
    message = await send(client(sim), from_=sender)
    assert message.status == "queued"


async def test_bad_credentials_are_401_20003(sim: SimulatorServer) -> None:
    with pytest.raises(TwilioRestException) as caught:
        await send(client(sim, token=""))
    assert (caught.value.status, caught.value.code) == (401, 20003)


async def test_another_accounts_sid_as_user_is_401_20003(sim: SimulatorServer) -> None:
    """An account SID authenticates its own account only: Twilio answers 401 (20003) when the
    Basic-auth user is an account SID other than the one in the URL."""
    sent = await send(client(sim))
    other = Client("AC" + "1" * 32, AUTH_TOKEN, account_sid=ACCOUNT_SID,
                   http_client=TwilioHttpClient(timeout=5.0))
    other.api.base_url = sim.base_url
    with pytest.raises(TwilioRestException) as caught:
        await send(other)
    assert (caught.value.status, caught.value.code) == (401, 20003)
    with pytest.raises(TwilioRestException) as caught:
        await asyncio.to_thread(other.messages(sent.sid).fetch)
    assert (caught.value.status, caught.value.code) == (401, 20003)
    assert [m["id"] for m in await sim.messages("twilio")] == [sent.sid]


async def test_an_api_key_sends_for_the_account_in_the_url(sim: SimulatorServer) -> None:
    """With an API key (SK...) as the user, the account is the URL's."""
    keyed = Client("SK" + "2" * 32, "api-key-secret", account_sid=ACCOUNT_SID,
                   http_client=TwilioHttpClient(timeout=5.0))
    keyed.api.base_url = sim.base_url
    message = await send(keyed)
    assert (message.status, message.account_sid) == ("queued", ACCOUNT_SID)
    [listed] = await asyncio.to_thread(keyed.messages.list)
    assert listed.sid == message.sid


async def test_invalid_token_fault_is_21211(sim: SimulatorServer) -> None:
    await sim.add_fault("invalid_token", "twilio", to="+1555*")
    with pytest.raises(TwilioRestException) as caught:
        await send(client(sim))
    assert (caught.value.status, caught.value.code) == (400, 21211)
    assert "+15558675310" in caught.value.msg


async def test_rate_limit_fault_is_429_20429(sim: SimulatorServer) -> None:
    await sim.add_fault("rate_limit", "twilio")
    with pytest.raises(TwilioRestException) as caught:
        await send(client(sim))
    assert (caught.value.status, caught.value.code) == (429, 20429)


async def test_error_fault_is_5xx(sim: SimulatorServer) -> None:
    await sim.add_fault("error", "twilio", status=503)
    with pytest.raises(TwilioRestException) as caught:
        await send(client(sim))
    assert (caught.value.status, caught.value.code) == (503, 20503)


async def test_malformed_fault_cannot_be_parsed(sim: SimulatorServer) -> None:
    await sim.add_fault("malformed", "twilio")
    with pytest.raises(ValueError, match=r"Expecting|Unterminated"):
        await send(client(sim))
    assert len(await sim.messages("twilio")) == 1


async def test_lost_response_is_recorded_and_client_times_out(sim: SimulatorServer) -> None:
    await sim.add_fault("lost_response", "twilio")
    with pytest.raises(requests.exceptions.Timeout):
        await send(client(sim, timeout_s=SHORT_TIMEOUT_S))
    assert len(await sim.messages("twilio")) == 1
    assert (await sim.stats())["twilio"]["accepted"] == 1


async def test_provider_rate_limit_is_20429_with_retry_after(sim: SimulatorServer) -> None:
    await sim.set_limit("twilio", 1, burst=1)
    twilio = client(sim)
    await send(twilio)
    with pytest.raises(TwilioRestException) as caught:
        await send(twilio)
    assert caught.value.code == 20429
    last = twilio.http_client._test_only_last_response  # the SDK's hook for exactly this
    assert last is not None
    assert int(last.headers["Retry-After"]) >= 1


async def test_provider_rate_limit_meters_the_account_not_the_api_key(
    sim: SimulatorServer,
) -> None:
    """Requests for one account share its budget whichever API key signs them."""
    await sim.set_limit("twilio", 0.01, burst=1)
    first = Client("SK" + "1" * 32, "secret-1", ACCOUNT_SID)
    second = Client("SK" + "2" * 32, "secret-2", ACCOUNT_SID)
    for twilio in (first, second):
        twilio.api.base_url = sim.base_url

    await send(first)
    with pytest.raises(TwilioRestException) as caught:
        await send(second)

    assert caught.value.code == 20429


async def test_error_fault_400_is_unsubscribed_recipient(sim: SimulatorServer) -> None:
    await sim.add_fault("error", "twilio", status=400, to="+15558675310")
    with pytest.raises(TwilioRestException) as caught:
        await send(client(sim))
    assert (caught.value.status, caught.value.code) == (400, 21610)


@pytest.mark.parametrize(("body", "segments"), [
    ("a" * 160, 1), ("a" * 161, 2),           # GSM-7: 160, then 153 a part
    ("[" * 80, 1), ("[" * 81, 2),             # extension characters take two septets
    ("日" * 70, 1), ("日" * 71, 2),           # UCS-2: 70, then 67 a part
    ("\N{GRINNING FACE}" * 100, 3),           # an emoji is two UTF-16 units
])
def test_segments_are_counted_by_encoding(body: str, segments: int) -> None:
    assert _segments(body) == segments


@pytest.mark.parametrize(("to", "from_", "code"), [
    ("+15558675310", "+15558675310", 21266),
    ("whatsapp:+15558675310", "whatsapp:+15558675310", 63031),
])
async def test_a_message_from_a_number_to_itself_is_refused(
    sim: SimulatorServer, to: str, from_: str, code: int
) -> None:
    """Twilio refuses an SMS whose To is its From (a channel message its own code); the
    simulator sent it."""
    with pytest.raises(TwilioRestException) as refused:
        await send(client(sim), to=to, from_=from_)

    assert (refused.value.status, refused.value.code) == (400, code)
    assert await sim.messages("twilio") == []
