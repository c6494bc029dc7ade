"""The control API's exact shapes over HTTP, and `SimulatorClient` driving it from outside."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from yarl import URL

from simulators import ControlError, SimulatorClient, SimulatorServer


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def call(
    http: aiohttp.ClientSession, sim: SimulatorServer, method: str, path: str, **options: Any
) -> tuple[int, Any]:
    async with http.request(method, sim.base_url + path, **options) as response:
        body = await response.read()
        return response.status, (await response.json()) if body else None


async def send_email(http: aiohttp.ClientSession, sim: SimulatorServer, to: str, task: str) -> None:
    body = {"from": "a@example.com", "to": to, "subject": "s", "text": "t"}
    headers = {"Authorization": "Bearer re_1", "X-Notifkit-Task-Id": task}
    status, _ = await call(http, sim, "POST", "/emails", json=body, headers=headers)
    assert status == 200


async def test_fault_lifecycle(http: aiohttp.ClientSession, sim: SimulatorServer) -> None:
    rule = {"provider": "twilio", "kind": "error", "to": "+44*", "probability": 0.5, "times": 3}
    status, created = await call(http, sim, "POST", "/_sim/faults", json={**rule, "status": 503})
    assert status == 201
    assert created["id"]
    assert {key: created[key] for key in rule} == rule
    assert created["status"] == 503

    status, listed = await call(http, sim, "GET", "/_sim/faults")
    assert listed == {"items": [created]}

    assert (await call(http, sim, "DELETE", f"/_sim/faults/{created['id']}"))[0] == 204
    assert (await call(http, sim, "GET", "/_sim/faults"))[1] == {"items": []}
    # Deleting a rule that is already gone is still 204 (SIMULATORS.md lists no other answer).
    assert (await call(http, sim, "DELETE", f"/_sim/faults/{created['id']}"))[0] == 204

    await call(http, sim, "POST", "/_sim/faults", json={"provider": "*", "kind": "timeout"})
    assert (await call(http, sim, "DELETE", "/_sim/faults"))[0] == 204
    assert (await call(http, sim, "GET", "/_sim/faults"))[1] == {"items": []}


async def test_messages_filters_newest_first(
    http: aiohttp.ClientSession, sim: SimulatorServer
) -> None:
    await send_email(http, sim, "ada@example.com", "t1")
    await send_email(http, sim, "bob@example.com", "t2")
    await send_email(http, sim, "ada@example.com", "t1")
    # one task to a second recipient (a push task has one per device) is no duplicate
    await send_email(http, sim, "cy@example.com", "t1")

    _, everything = await call(http, sim, "GET", "/_sim/messages")
    assert [m["taskId"] for m in everything["items"]] == ["t1", "t1", "t2", "t1"]
    assert [m["acceptCount"] for m in everything["items"]] == [1, 2, 1, 1]
    item = everything["items"][0]
    assert set(item) == {
        "id",
        "provider",
        "to",
        "taskId",
        "idempotencyKey",
        "receivedAt",
        "acceptCount",
        "content",
    }
    assert item["receivedAt"].endswith("Z")

    _, for_bob = await call(http, sim, "GET", "/_sim/messages", params={"to": "BOB@example.com"})
    assert [m["taskId"] for m in for_bob["items"]] == ["t2"]
    _, by_task = await call(
        http, sim, "GET", "/_sim/messages", params={"taskId": "t1", "limit": "1"}
    )
    assert len(by_task["items"]) == 1
    _, other = await call(http, sim, "GET", "/_sim/messages", params={"provider": "twilio"})
    assert other == {"items": []}


async def test_a_phone_number_pasted_into_the_messages_url_keeps_its_plus(
    http: aiohttp.ClientSession, sim: SimulatorServer
) -> None:
    """`?to=+15551234567` as curl sends it: form decoding would read the `+` as a space."""
    auth = {"Authorization": "Basic " + base64.b64encode(b"AC1:token").decode()}
    form = {"To": "+15551234567", "From": "+15550000000", "Body": "hi"}
    async with http.post(
        sim.base_url + "/2010-04-01/Accounts/AC1/Messages.json", data=form, headers=auth
    ) as response:
        assert response.status == 201
    for query in ("to=+15551234567&provider=twilio", "to=%2B15551234567"):
        url = URL(f"{sim.base_url}/_sim/messages?{query}", encoded=True)
        async with http.get(url) as response:
            items = (await response.json())["items"]
        assert [item["to"] for item in items] == ["+15551234567"], query


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"provider": "pigeon"}, "'provider'"),
        ({"limit": "many"}, "'limit'"),
        ({"limit": "0"}, "'limit'"),
        # int() reads all of these, none of them is the plain number a caller meant.
        ({"limit": "\uff15"}, "'limit'"),
        ({"limit": "1_0"}, "'limit'"),
        ({"limit": " 5"}, "'limit'"),
        ({"limit": "+5"}, "'limit'"),
        ({"limit": "9" * 5000}, "'limit'"),
        ({"task_id": "x"}, "'task_id'"),
    ],
)
async def test_bad_message_queries_are_400(
    http: aiohttp.ClientSession, sim: SimulatorServer, params: dict[str, str], named: str
) -> None:
    status, body = await call(http, sim, "GET", "/_sim/messages", params=params)
    assert status == 400
    assert named in body["error"]


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("limit=1&limit=abc", "'limit'"),
        ("provider=resend&provider=twilio", "'provider'"),
        ("to=a%40example.com&to=b%40example.com", "'to'"),
        ("to=%FF%FE", "'to'"),
        ("taskId=%C3", "'taskId'"),
    ],
)
async def test_ambiguous_message_queries_are_400_naming_the_parameter(
    http: aiohttp.ClientSession, sim: SimulatorServer, query: str, named: str
) -> None:
    """A repeated parameter, or a value that is not UTF-8 once percent-decoded, is refused as
    the notifkit API refuses it: answering for the first value, or for text with replacement
    characters, would filter on something the caller never asked for."""
    await send_email(http, sim, "a@example.com", "task-q")
    url = URL(f"{sim.base_url}/_sim/messages?{query}", encoded=True)
    async with http.get(url) as response:
        assert response.status == 400
        body = await response.json()
    assert named in body["error"]


async def test_an_over_long_task_id_finds_its_messages_by_the_whole_id(
    http: aiohttp.ClientSession, sim: SimulatorServer
) -> None:
    """A task id is kept to 256 characters; the filter is cut alike, so the id the caller
    sent still finds the message instead of nothing."""
    long_id = "t" * 300 + "-end"
    await send_email(http, sim, "a@example.com", long_id)
    await send_email(http, sim, "b@example.com", "other")
    _, found = await call(http, sim, "GET", "/_sim/messages", params={"taskId": long_id})
    assert [m["to"] for m in found["items"]] == ["a@example.com"]
    assert found["items"][0]["taskId"] == long_id[:256]
    # A blank id names no message's task: nothing, not every message.
    _, blank = await call(http, sim, "GET", "/_sim/messages", params={"taskId": " "})
    assert blank == {"items": []}


async def test_a_key_given_twice_in_a_control_body_is_400_and_adds_nothing(
    http: aiohttp.ClientSession, sim: SimulatorServer
) -> None:
    body = b'{"provider": "resend", "kind": "error", "provider": "sendgrid"}'
    status, answer = await call(http, sim, "POST", "/_sim/faults", data=body)
    assert status == 400
    assert "'provider' more than once" in answer["error"]
    assert (await call(http, sim, "GET", "/_sim/faults"))[1] == {"items": []}


async def test_a_negative_limit_names_the_range(
    http: aiohttp.ClientSession, sim: SimulatorServer
) -> None:
    status, answer = await call(http, sim, "GET", "/_sim/messages", params={"limit": "-1"})
    assert status == 400
    assert "whole number from 1 to 100000" in answer["error"]


async def test_a_probability_of_minus_zero_reads_back_as_zero(
    http: aiohttp.ClientSession, sim: SimulatorServer
) -> None:
    status, created = await call(http, sim, "POST", "/_sim/faults", data=b'{"provider": "*", '
                                 b'"kind": "error", "probability": -0.0}')
    assert status == 201
    assert str(created["probability"]) == "0.0"


async def test_stats_shape(http: aiohttp.ClientSession, sim: SimulatorServer) -> None:
    await call(
        http, sim, "POST", "/_sim/faults", json={"provider": "resend", "kind": "error", "times": 1}
    )
    body = {"from": "a@example.com", "to": "b@example.com", "subject": "s", "text": "t"}
    headers = {"Authorization": "Bearer re_1"}
    assert (await call(http, sim, "POST", "/emails", json=body, headers=headers))[0] == 500
    assert (await call(http, sim, "POST", "/emails", json=body, headers=headers))[0] == 200

    _, stats = await call(http, sim, "GET", "/_sim/stats")

    assert set(stats) == {"resend", "sendgrid", "smtp", "twilio", "fcm", "openai"}
    resend = stats["resend"]
    assert (resend["requests"], resend["accepted"], resend["duplicates"]) == (2, 1, 0)
    assert resend["faults"] == {**NO_FAULTS, "error": 1}


NO_FAULTS = {"timeout": 0, "error": 0, "rate_limit": 0, "invalid_token": 0,
             "lost_response": 0, "latency": 0, "malformed": 0}


async def test_stats_list_every_provider_and_fault_kind_from_the_start(
    http: aiohttp.ClientSession, sim: SimulatorServer
) -> None:
    """The spec's shape, `{"<provider>": {"requests", "accepted", "duplicates", "faults":
    {"<kind>": n}}}`, before any request: a dashboard can read any count without a default."""
    _, stats = await call(http, sim, "GET", "/_sim/stats")
    assert set(stats) == {"resend", "sendgrid", "smtp", "twilio", "fcm", "openai"}
    for item in stats.values():
        assert (item["requests"], item["accepted"], item["duplicates"]) == (0, 0, 0)
        assert item["faults"] == NO_FAULTS


async def test_limits_and_reset(http: aiohttp.ClientSession, sim: SimulatorServer) -> None:
    status, limits = await call(
        http,
        sim,
        "POST",
        "/_sim/limits",
        json={"provider": "resend", "ratePerSecond": 2, "burst": 4},
    )
    assert status == 200
    assert limits == {"items": [{"provider": "resend", "ratePerSecond": 2.0, "burst": 4}]}
    await send_email(http, sim, "ada@example.com", "t1")
    await call(http, sim, "POST", "/_sim/faults", json={"provider": "*", "kind": "error"})

    status, reset = await call(http, sim, "POST", "/_sim/reset")

    assert status == 200
    assert reset == {"seed": 1}
    assert (await call(http, sim, "GET", "/_sim/messages"))[1] == {"items": []}
    assert (await call(http, sim, "GET", "/_sim/faults"))[1] == {"items": []}
    assert (await call(http, sim, "GET", "/_sim/limits"))[1] == {"items": []}
    assert (await call(http, sim, "GET", "/_sim/stats"))[1]["resend"]["requests"] == 0


async def test_whole_numbers_written_as_decimals_are_taken_by_every_control_call(
    http: aiohttp.ClientSession, sim: SimulatorServer
) -> None:
    limit = {"provider": "resend", "ratePerSecond": 2, "burst": 4.0}
    status, limits = await call(http, sim, "POST", "/_sim/limits", json=limit)
    assert (status, limits["items"][0]["burst"]) == (200, 4)
    receipts = {"url": "http://127.0.0.1:9/hooks", "secret": "s", "delayMs": 100.0}
    status, config = await call(http, sim, "POST", "/_sim/receipts", json=receipts)
    assert (status, config["delayMs"]) == (200, 100)
    assert await call(http, sim, "POST", "/_sim/reset", json={"seed": 7.0}) == (200, {"seed": 7})


@pytest.mark.parametrize(
    ("path", "body", "named"),
    [
        ("/_sim/faults", b"{not json", "valid UTF-8 JSON: Expecting property name"),
        ("/_sim/faults", b"[" * 100_000 + b"]" * 100_000, "nested too deeply (more than 64"),
        # Never closed: too deep to read, and not valid JSON either, so not called valid.
        ("/_sim/faults", b"[" * 100_000, "request body is nested too deeply (more than 64"),
        ("/_sim/faults", b"", "JSON object"),
        # `provider` is required ("*" for every provider): a rule must say what it hits.
        ("/_sim/faults", {"kind": "error"}, "'provider' is required"),
        # Past Python's 4300-digit limit for int(): valid JSON, but no number it can read.
        ("/_sim/faults", b'{"kind": "error", "times": ' + b"9" * 5000 + b"}", "number too long"),
        ("/_sim/reset", b'{"seed": ' + b"9" * 5000 + b"}", "number too long"),
        ("/_sim/limits", {"provider": "resend"}, "'ratePerSecond' is required"),
        ("/_sim/limits", {"provider": "resend", "ratePerSecond": 0}, "'ratePerSecond'"),
        ("/_sim/receipts", {"url": "ftp://x", "secret": "s"}, "'url'"),
        ("/_sim/receipts", {"url": "http://x.test/h"}, "'secret' is required"),
        ("/_sim/receipts", {"url": "http://x.test/h", "secret": "s", "opened": 2}, "'opened'"),
        ("/_sim/reset", {"seed": -1}, "'seed'"),
    ],
)
async def test_bad_control_input_is_400_naming_the_problem(
    http: aiohttp.ClientSession, sim: SimulatorServer, path: str, body: Any, named: str
) -> None:
    options = {"data": body} if isinstance(body, bytes) else {"json": body}
    status, answer = await call(http, sim, "POST", path, **options)
    assert status == 400
    assert named in answer["error"]


async def test_a_query_where_none_is_read_is_400_and_changes_nothing(
    http: aiohttp.ClientSession, sim: SimulatorServer
) -> None:
    # Only /_sim/messages filters: a DELETE that ignored its query would clear every
    # provider's rules while the caller meant one provider's.
    await call(http, sim, "POST", "/_sim/faults", json={"provider": "fcm", "kind": "error"})
    await call(http, sim, "POST", "/_sim/limits",
               json={"provider": "fcm", "ratePerSecond": 5})

    for method, path in [("DELETE", "/_sim/faults"), ("DELETE", "/_sim/limits"),
                         ("POST", "/_sim/reset"), ("GET", "/_sim/faults")]:
        status, body = await call(http, sim, method, path + "?provider=resend")
        assert status == 400, (method, path)
        assert "'provider'" in body["error"]

    assert len((await call(http, sim, "GET", "/_sim/faults"))[1]["items"]) == 1
    assert len((await call(http, sim, "GET", "/_sim/limits"))[1]["items"]) == 1
    # A health probe's cache buster is harmless.
    assert (await call(http, sim, "GET", "/_sim/health?ts=1"))[0] == 200


async def test_unknown_paths_and_methods_are_json_404_405(
    http: aiohttp.ClientSession, sim: SimulatorServer
) -> None:
    status, body = await call(http, sim, "GET", "/nowhere")
    assert status == 404
    assert body == {"error": "no route for GET /nowhere"}
    status, body = await call(http, sim, "PUT", "/_sim/faults")
    assert status == 405


async def test_405_names_the_allowed_methods(
    http: aiohttp.ClientSession, sim: SimulatorServer
) -> None:
    async with http.get(f"{sim.base_url}/v3/mail/send") as response:
        assert response.status == 405
        assert response.headers["Allow"] == "POST"


async def test_page_lists_messages_and_escapes_them(
    http: aiohttp.ClientSession, sim: SimulatorServer
) -> None:
    body = {
        "from": "a@example.com",
        "to": "b@example.com",
        "subject": "<script>alert(1)</script>",
        "html": '<p onclick="x()">Hi "there"</p>',
    }
    await call(http, sim, "POST", "/emails", json=body, headers={"Authorization": "Bearer re_1"})
    await call(http, sim, "POST", "/_sim/faults", json={"kind": "latency", "provider": "fcm"})

    async with http.get(sim.base_url + "/_sim/") as response:
        assert response.status == 200
        assert response.content_type == "text/html"
        assert "default-src 'none'" in response.headers["Content-Security-Policy"]
        page = await response.text()

    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert '<iframe sandbox="" srcdoc="&lt;p onclick=&quot;x()&quot;&gt;' in page
    assert 'http-equiv="refresh"' in page
    assert "latency" in page


async def test_simulator_client_over_http(
    sim: SimulatorServer, http: aiohttp.ClientSession
) -> None:
    async with SimulatorClient(sim.base_url) as remote:
        rule = await remote.add_fault("rate_limit", "resend", times=1, retry_after_s=2)
        assert rule["retryAfter"] == 2
        assert await remote.faults() == [rule]
        health = await remote.health()
        assert health["smtpPort"] == sim.smtp_port

        body = {"from": "a@example.com", "to": "b@example.com", "subject": "s", "text": "t"}
        for expected in (429, 200):
            status, _ = await call(
                http, sim, "POST", "/emails", json=body, headers={"Authorization": "Bearer k"}
            )
            assert status == expected
        [message] = await remote.wait_for_messages(1, "resend")
        assert message["to"] == "b@example.com"
        assert (await remote.stats())["resend"]["faults"] == {**NO_FAULTS, "rate_limit": 1}

        with pytest.raises(ControlError) as caught:
            await remote.add_fault("error", probability=3)
        assert caught.value.status == 400
        assert "'probability'" in caught.value.message
        await remote.remove_fault("f_999")  # already gone: still a success

        assert await remote.reset(seed=7) == 7
        assert await remote.messages() == []


async def test_in_process_and_http_answers_are_identical(sim: SimulatorServer) -> None:
    async with SimulatorClient(sim.base_url) as remote:
        local = await sim.add_fault("latency", "*", delay_ms=(5, 10))
        assert await remote.faults() == [local]
        assert await sim.stats() == await remote.stats()
        with pytest.raises(ControlError) as caught:
            await sim.set_limit("nobody", 1)
        assert "'provider'" in caught.value.message


@pytest.mark.parametrize("rule_id", ["f_1#x", "f_1?kind=error", "f_1/x", "f 1%"])
async def test_removing_a_rule_by_any_id_over_http_touches_only_that_id(
    sim: SimulatorServer, rule_id: str
) -> None:
    """The id is one path segment: a `#`, `?` or `/` in it must not cut it short, remove
    another rule or be refused, where the in-process call removes nothing and says nothing."""
    async with SimulatorClient(sim.base_url) as remote:
        kept = await sim.add_fault("error", "resend")
        await remote.remove_fault(rule_id)
        assert await remote.faults() == [kept]


async def test_wait_for_messages_times_out_with_a_clear_message(sim: SimulatorServer) -> None:
    with pytest.raises(TimeoutError, match="expected 1 message"):
        await sim.wait_for_messages(1, "twilio", timeout_s=0.05)


async def test_client_drains_receipts(
    sim: SimulatorServer, http: aiohttp.ClientSession, receiver: Any
) -> None:
    async with SimulatorClient(sim.base_url) as remote:
        await remote.set_receipts(receiver.url, "plain-secret", delay_ms=100)
        await send_email(http, sim, "ada@example.com", "t1")
        assert (await remote.receipts())["pending"] == 1
        await remote.drain_receipts(timeout_s=5)
        assert (await remote.receipts())["sent"] == 1
        assert len(receiver.requests) == 1


async def test_message_ids_never_repeat_across_a_reset(sim: SimulatorServer) -> None:
    """Clients keep ids they were given (receipts resolve by them): a reset must not hand
    the same ones out again, though a run with the same seed and resets still replays."""
    before = [sim.state.ids.uuid4() for _ in range(3)]
    await sim.reset()
    after = [sim.state.ids.uuid4() for _ in range(3)]
    assert not set(before) & set(after)
    async with SimulatorServer(seed=1) as again:
        assert [again.state.ids.uuid4() for _ in range(3)] == before
        await again.reset()
        assert [again.state.ids.uuid4() for _ in range(3)] == after


async def test_simulator_client_names_an_answer_that_is_not_the_simulators() -> None:
    # A proxy's HTML error page in front of a staging simulator surfaced as a JSONDecodeError
    # ("Expecting value: line 1 column 1"), hiding the status and what answered.
    from aiohttp import web

    async def gateway(request: web.Request) -> web.Response:
        return web.Response(status=502, text="<html>Bad Gateway</html>", content_type="text/html")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", gateway)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        async with SimulatorClient(f"http://127.0.0.1:{runner.addresses[0][1]}") as remote:
            with pytest.raises(ControlError) as caught:
                await remote.add_fault("error", "resend")
    finally:
        await runner.cleanup()
    assert caught.value.status == 502
    assert "HTTP 502" in caught.value.message
    assert "Bad Gateway" in caught.value.message
