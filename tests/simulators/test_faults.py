"""Fault rules: order, recipient patterns, counts, probabilities, and seeded replay."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator

import aiohttp
import pytest

from simulators import ControlError, SimulatorServer
from simulators.faults import FaultTable
from simulators.kinds import FaultKind, Provider


def decisions(seed: int, count: int = 200) -> list[str | None]:
    table = FaultTable(seed)
    table.add({"provider": "resend", "kind": "error", "probability": 0.3})
    table.add({"provider": "*", "kind": "latency", "probability": 0.5, "delayMs": [10, 500]})
    sequence: list[str | None] = []
    for _ in range(count):
        decision = table.decide(Provider.RESEND, ["a@example.com"])
        sequence.append(None if decision is None else f"{decision.kind}:{decision.delay_s:.4f}")
    return sequence


def test_same_seed_same_decisions() -> None:
    """A scenario that fails under seed N must fail the same way when rerun with seed N."""
    assert decisions(42) == decisions(42)
    assert decisions(42) != decisions(43)


def test_probability_is_roughly_honoured() -> None:
    errors = sum(1 for d in decisions(1, 2000) if d and d.startswith("error"))
    assert 500 < errors < 700  # 30% of 2000


def test_rules_match_in_order_and_times_runs_out() -> None:
    table = FaultTable(0)
    table.add({"provider": "twilio", "kind": "rate_limit", "times": 2})
    table.add({"provider": "*", "kind": "error"})
    kinds = [table.decide(Provider.TWILIO, ["+1555"]) for _ in range(3)]
    assert [d.kind if d else None for d in kinds] == [
        FaultKind.RATE_LIMIT,
        FaultKind.RATE_LIMIT,
        FaultKind.ERROR,
    ]
    assert table.rules[0].remaining == 0
    assert [rule.id for rule in table.active()] == ["f_2"]


def test_recipient_glob_is_case_insensitive_and_matches_any_recipient() -> None:
    table = FaultTable(0)
    table.add({"provider": "*", "kind": "invalid_token", "to": "*@Bounce.example.com"})
    assert table.decide(Provider.RESEND, ["ok@example.com", "X@bounce.EXAMPLE.com"]) is not None
    assert table.decide(Provider.RESEND, ["ok@example.com"]) is None


def test_recipient_glob_keeps_the_case_of_tokens_and_models() -> None:
    """Only e-mail addresses are case-insensitive: FCM tokens are case-sensitive ids, so a
    rule aimed at one device must not hit another whose token differs only in case."""
    table = FaultTable(0)
    table.add({"provider": "*", "kind": "invalid_token", "to": "dTok:APA91b*"})
    assert table.decide(Provider.FCM, ["dtok:apa91bXYZ"]) is None
    assert table.decide(Provider.FCM, ["dTok:APA91bXYZ"]) is not None
    table.clear()
    table.add({"provider": "openai", "kind": "invalid_token", "to": "GPT-4o"})
    assert table.decide(Provider.OPENAI, ["gpt-4o"]) is None


def test_provider_must_match() -> None:
    table = FaultTable(0)
    table.add({"provider": "fcm", "kind": "error"})
    assert table.decide(Provider.RESEND, ["x"]) is None
    assert table.decide(Provider.FCM, ["x"]) is not None


RESEND = {"provider": "resend"}


@pytest.mark.parametrize(
    ("rule", "named"),
    [
        ({"kind": "error"}, "'provider' is required"),
        (RESEND, "'kind' is required"),
        ({**RESEND, "kind": "explode"}, "'kind' must be one of"),
        ({"kind": "error", "provider": "pigeon"}, "'provider' must be one of"),
        ({**RESEND, "kind": "error", "probability": 1.5}, "'probability'"),
        ({**RESEND, "kind": "error", "probability": True}, "'probability' must be a number"),
        ({**RESEND, "kind": "error", "times": 0}, "'times'"),
        ({**RESEND, "kind": "error", "status": 200}, "'status'"),
        ({**RESEND, "kind": "latency", "status": 500}, "'status' does not apply"),
        ({**RESEND, "kind": "error", "delayMs": 5}, "'delayMs' does not apply"),
        ({**RESEND, "kind": "latency", "delayMs": [5, 1]}, "min <= max"),
        ({**RESEND, "kind": "latency", "delayMs": "slow"}, "'delayMs' must be an integer"),
        ({**RESEND, "kind": "latency", "delayMs": 2.5}, "'delayMs' must be an integer"),
        ({**RESEND, "kind": "error", "times": 1.5}, "'times' must be an integer"),
        ({**RESEND, "kind": "error", "probabilty": 0.5}, "unknown field(s) 'probabilty'"),
        ({"kind": "error", "provider": "smtp", "status": 250}, "SMTP failure reply code"),
        # RFC 5321's second digit is 0-5: no server answers 599 or 463.
        ({"kind": "error", "provider": "smtp", "status": 599}, "SMTP failure reply code"),
        ({"kind": "rate_limit", "provider": "smtp", "status": 463}, "SMTP failure reply code"),
        # An SMTP `malformed` reply is no SMTP line at all, so a code would be ignored.
        ({"kind": "malformed", "provider": "smtp", "status": 451}, "no SMTP reply"),
        ([], "must be a JSON object"),
    ],
)
def test_bad_rules_name_the_problem(rule: object, named: str) -> None:
    with pytest.raises(ControlError) as caught:
        FaultTable(0).add(rule)
    assert named in caught.value.message
    assert caught.value.status == 400


def test_whole_numbers_written_as_json_decimals_are_taken() -> None:
    """`2.0` is the JSON number 2 (Python's json writes a computed `seconds * 1000` so)."""
    rule = FaultTable(0).add(
        {"kind": "latency", "times": 2.0, "delayMs": [10.0, 20.0], "provider": "resend"}
    ).to_item()
    assert (rule["times"], rule["delayMs"]) == (2, [10, 20])
    assert type(rule["times"]) is int
    error = FaultTable(0).add({"provider": "*", "kind": "error", "status": 503.0}).to_item()
    assert error["status"] == 503
    assert type(error["status"]) is int
    timeout = {"provider": "*", "kind": "timeout", "delayMs": 250.0}
    assert FaultTable(0).add(timeout).to_item()["delayMs"] == 250


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def run_scenario(seed: int) -> list[int]:
    """Thirty Resend sends through a 40% error rule; the statuses they got."""
    statuses = []
    async with SimulatorServer(seed=seed, smtp_port=None) as sim, aiohttp.ClientSession() as http:
        await sim.add_fault("error", "resend", probability=0.4)
        body = {"from": "a@example.com", "to": "b@example.com", "subject": "s", "text": "t"}
        for _ in range(30):
            async with http.post(
                f"{sim.base_url}/emails", json=body, headers={"Authorization": "Bearer re_1"}
            ) as response:
                statuses.append(response.status)
    return statuses


async def test_seeded_run_replays_identically_end_to_end() -> None:
    first, again, other = await run_scenario(9), await run_scenario(9), await run_scenario(10)
    assert first == again
    assert set(first) == {200, 500}
    assert first != other


async def test_reset_restarts_the_random_sequence(sim: SimulatorServer) -> None:
    async def draw() -> list[bool]:
        await sim.add_fault("error", "fcm", probability=0.5)
        table = sim.state.faults
        return [table.decide(Provider.FCM, ["t"]) is not None for _ in range(20)]

    first = await draw()
    await sim.reset()
    assert await draw() == first



RATE_LIMITED_SENDS = [
    (
        "resend",
        "/emails",
        {"from": "a@example.com", "to": "b@example.com", "subject": "s", "text": "t"},
    ),
    ("fcm", "/v1/projects/p/messages:send", {"message": {"token": "t"}}),
    (
        "openai",
        "/v1/chat/completions",
        {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]},
    ),
]


@pytest.mark.parametrize(("provider", "path", "body"), RATE_LIMITED_SENDS)
async def test_rate_limit_with_another_status_still_says_when_to_retry(
    http: aiohttp.ClientSession,
    sim: SimulatorServer,
    provider: str,
    path: str,
    body: dict[str, object],
) -> None:
    """`rate_limit` answers with Retry-After even when its rule picks a status other than 429."""
    await sim.add_fault("rate_limit", provider, status=503)
    headers = {"Authorization": "Bearer k_1"}
    async with http.post(sim.base_url + path, json=body, headers=headers) as response:
        assert response.status == 503
        assert response.headers["Retry-After"] == "1"


async def test_rate_limit_answers_the_retry_after_its_rule_names(
    http: aiohttp.ClientSession, sim: SimulatorServer
) -> None:
    """`retryAfter` is sent as given, 0 included; only fractions are rounded up."""
    body = {"from": "a@example.com", "to": "b@example.com", "subject": "s", "text": "t"}
    headers = {"Authorization": "Bearer k_1"}
    for retry_after, expected in ((0, "0"), (2.4, "3"), (7, "7")):
        await sim.clear_faults()
        await sim.add_fault("rate_limit", "resend", retry_after_s=retry_after)
        async with http.post(f"{sim.base_url}/emails", json=body, headers=headers) as response:
            assert response.status == 429
            assert response.headers["Retry-After"] == expected


SMTP_ONLY = [450, 452, 550, 551, 552, 553, 554]


@pytest.mark.parametrize("status", SMTP_ONLY)
@pytest.mark.parametrize(
    ("kind", "expected"), [("error", 500), ("invalid_token", 422), ("rate_limit", 429)]
)
async def test_an_smtp_only_status_in_a_rule_for_every_provider_leaves_http_its_default(
    http: aiohttp.ClientSession, sim: SimulatorServer, kind: str, status: int, expected: int
) -> None:
    """`{"provider": "*", "status": 550}` is written for SMTP: Resend answers the kind as it
    would without a status, never an HTTP 550."""
    await sim.add_fault(kind, "*", status=status)
    body = {"from": "a@example.com", "to": "b@example.com", "subject": "s", "text": "t"}
    headers = {"Authorization": "Bearer k_1"}
    async with http.post(f"{sim.base_url}/emails", json=body, headers=headers) as response:
        assert response.status == expected


async def test_an_smtp_only_status_in_a_malformed_rule_leaves_http_its_200(
    http: aiohttp.ClientSession, sim: SimulatorServer
) -> None:
    await sim.add_fault("malformed", "*", status=554)
    body = {"from": "a@example.com", "to": "b@example.com", "subject": "s", "text": "t"}
    headers = {"Authorization": "Bearer k_1"}
    async with http.post(f"{sim.base_url}/emails", json=body, headers=headers) as response:
        assert response.status == 200


@pytest.mark.parametrize("status", [503, 421, 451])
async def test_an_http_status_in_a_rule_for_every_provider_reaches_http_unchanged(
    http: aiohttp.ClientSession, sim: SimulatorServer, status: int
) -> None:
    await sim.add_fault("error", "*", status=status)
    form = {"To": "+15558675310", "From": "+15005550006", "Body": "hi"}
    auth = {"Authorization": "Basic " + base64.b64encode(b"AC1:token").decode()}
    async with http.post(f"{sim.base_url}/2010-04-01/Accounts/AC1/Messages.json", data=form,
                         headers=auth) as response:
        assert response.status == status
