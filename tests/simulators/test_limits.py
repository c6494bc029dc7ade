"""Provider-side token buckets: per key, refilled at the configured rate, never more than
`burst` at once, and a Retry-After that is always a usable header value."""

from __future__ import annotations

import gzip
import json
import re

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulators import ControlError, SimulatorServer
from simulators.kinds import Provider
from simulators.limits import RateLimits, retry_after_header


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def test_burst_then_rate() -> None:
    clock = Clock()
    limits = RateLimits(clock=clock)
    limits.set({"provider": "resend", "ratePerSecond": 2, "burst": 3})

    granted = [limits.check(Provider.RESEND, "key") is None for _ in range(4)]
    assert granted == [True, True, True, False]

    wait_s = limits.check(Provider.RESEND, "key")
    assert wait_s == pytest.approx(0.5)
    clock.now_s += 0.5
    assert limits.check(Provider.RESEND, "key") is None
    # Other keys and other providers are not affected.
    assert limits.check(Provider.RESEND, "other") is None
    assert limits.check(Provider.TWILIO, "key") is None


def test_star_sets_every_provider_and_burst_defaults_to_rate() -> None:
    limits = RateLimits()
    items = limits.set({"provider": "*", "ratePerSecond": 2.5})
    assert len(items) == len(Provider)
    assert {item["burst"] for item in items} == {3}


@pytest.mark.parametrize("rate", [0, -1, 1e-9, 1e9, "fast", None])
def test_unusable_rates_are_refused(rate: object) -> None:
    with pytest.raises(ControlError, match="ratePerSecond"):
        RateLimits().set({"provider": "fcm", "ratePerSecond": rate})


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(min_value=0.001, max_value=1e6),
    burst=st.integers(min_value=1, max_value=1000),
    gaps=st.lists(st.floats(min_value=0, max_value=1e5), min_size=1, max_size=60),
)
def test_never_more_than_burst_plus_refill(rate: float, burst: int, gaps: list[float]) -> None:
    """Whatever the timing, grants never exceed what the bucket could have held, and every
    refusal carries a Retry-After a client can parse."""
    clock = Clock()
    limits = RateLimits(clock=clock)
    limits.set({"provider": "sendgrid", "ratePerSecond": rate, "burst": burst})
    started = clock.now_s
    granted = 0
    for gap in gaps:
        clock.now_s += gap
        wait_s = limits.check(Provider.SENDGRID, "k")
        if wait_s is None:
            granted += 1
        else:
            assert wait_s > 0
            header = retry_after_header(wait_s)
            assert header.isdigit()
            assert 1 <= int(header) <= 86_400
        assert granted <= burst + (clock.now_s - started) * rate + 1e-6


@pytest.mark.parametrize(
    ("seconds", "header"), [(0.01, "1"), (1.2, "2"), (float("inf"), "86400"), (0.0, "0")]
)
def test_retry_after_rounds_up(seconds: float, header: str) -> None:
    assert retry_after_header(seconds) == header


EMAIL = {"from": "a@example.com", "to": "x@example.com", "subject": "s", "text": "t"}
GRID = {"personalizations": [{"to": [{"email": "x@example.com"}]}],
        "from": {"email": "a@example.com"}, "subject": "s",
        "content": [{"type": "text/plain", "value": "t"}]}
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}


async def second_answer(sim: SimulatorServer, path: str, body: object
                        ) -> tuple[int, dict[str, str], str]:
    """The answer to a second request at once, after the first took the only token."""
    headers = {"Authorization": "Bearer key-1"}
    async with aiohttp.ClientSession() as http:
        for _ in range(2):
            async with http.post(sim.base_url + path, json=body, headers=headers) as response:
                answer = response.status, dict(response.headers), await response.text()
    return answer


async def test_a_configured_limit_s_429_states_that_limit(sim: SimulatorServer) -> None:
    """A 429 from a configured limit states that limit, in each provider's own header and
    message, as the real provider states the account's: a client sizing its pace from them
    must not read another rate than the one it is refused at."""
    await sim.set_limit("*", 0.5, 1)
    status, headers, text = await second_answer(sim, "/emails", EMAIL)
    assert status == 429
    assert headers["ratelimit-limit"] == "1"
    assert "You can only make 0.5 requests per second." in json.loads(text)["message"]

    status, headers, _ = await second_answer(sim, "/v3/mail/send", GRID)
    assert (status, headers["X-RateLimit-Limit"]) == (429, "30")  # a minute's worth

    status, headers, text = await second_answer(sim, "/v1/chat/completions", CHAT)
    assert (status, headers["x-ratelimit-limit-requests"]) == (429, "30")
    assert "(RPM): Limit 30, Used 30, Requested 1." in json.loads(text)["error"]["message"]


LIMITED_CHAT = "/v1/chat/completions"


@pytest.mark.parametrize(("body", "headers", "named"), [
    (json.dumps(CHAT).encode(), {}, "gpt-4o-mini"),
    # A model the simulator does not know, or arguments it would refuse, are still over the
    # limit first: the 429 names what was asked for, as OpenAI's does.
    (json.dumps({"model": "gpt-nope", "messages": "not a list", "temprature": 1}).encode(), {},
     "gpt-nope"),
    (gzip.compress(json.dumps({**CHAT, "model": "sim-digest"}).encode()),
     {"Content-Encoding": "gzip"}, "sim-digest"),
    # Nothing to name: the 429 all the same, never the 400 such a body gets within the limit.
    (b"{not json", {}, "the model"),
    (b"", {}, "the model"),
    (json.dumps({**CHAT, "model": 7}).encode(), {}, "the model"),
    (json.dumps({**CHAT, "model": ""}).encode(), {}, "the model"),
    (json.dumps([CHAT]).encode(), {}, "the model"),
    (b'{"model": "gpt-4o", "n": NaN}', {}, "the model"),
    (json.dumps(CHAT).encode(), {"Content-Encoding": "gzip"}, "the model"),
    (json.dumps(CHAT).encode(), {"Content-Encoding": "br"}, "the model"),
], ids=["model", "unknown-model-bad-arguments", "gzip", "not-json", "empty", "model-not-a-string",
        "model-empty", "not-an-object", "nan", "not-gzip", "unsupported-encoding"])
async def test_openai_s_limit_names_the_requested_model(
    sim: SimulatorServer, body: bytes, headers: dict[str, str], named: str
) -> None:
    await sim.set_limit("openai", 0.001, 1)
    auth = {"Authorization": "Bearer key-1", "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as http:
        async with http.post(sim.base_url + LIMITED_CHAT, json=CHAT, headers=auth) as first:
            assert first.status == 200
        async with http.post(sim.base_url + LIMITED_CHAT, data=body,
                             headers=auth | headers) as response:
            status, text = response.status, await response.text()

    assert status == 429, text
    error = json.loads(text)["error"]
    assert error["code"] == "rate_limit_exceeded"
    assert error["message"].startswith(
        f"Rate limit reached for {named} in organization org-notifkit-sim on requests per min "
        "(RPM): Limit 1, Used 1, Requested 1.")
    stats = (await sim.stats())["openai"]
    assert (stats["requests"], stats["accepted"], stats["rateLimited"], stats["rejected"]) == (
        2, 1, 1, 0)


async def test_openai_s_limit_is_taken_before_a_fault_or_a_record(sim: SimulatorServer) -> None:
    # Reading the model for the 429 is all a limited request gets: no fault rule is spent on
    # it and nothing is recorded, as before the body was read.
    await sim.set_limit("openai", 0.001, 1)
    auth = {"Authorization": "Bearer key-1"}
    async with aiohttp.ClientSession() as http:
        async with http.post(sim.base_url + LIMITED_CHAT, json=CHAT, headers=auth) as first:
            assert first.status == 200
        await sim.add_fault("error", "openai", times=1)
        async with http.post(sim.base_url + LIMITED_CHAT, json=CHAT, headers=auth) as limited:
            assert limited.status == 429
            assert "Rate limit reached for gpt-4o-mini " in await limited.text()

    [rule] = await sim.faults()
    assert rule["kind"] == "error"
    assert len(await sim.messages("openai")) == 1
    assert sum((await sim.stats())["openai"]["faults"].values()) == 0


async def test_openai_states_a_configured_limit_on_every_answer(sim: SimulatorServer) -> None:
    """OpenAI sends its request limit, what is left of it and when it is full again with
    every answer, not only a 429's, so a client can pace itself before it is refused; the
    simulator states the configured limit the same way (and, unmetered, no limit at all)."""
    auth = {"Authorization": "Bearer key-1"}
    async with aiohttp.ClientSession() as http:
        async with http.post(sim.base_url + LIMITED_CHAT, json=CHAT, headers=auth) as free:
            assert free.status == 200
            assert not [h for h in free.headers if h.lower().startswith("x-ratelimit-")]
        await sim.set_limit("openai", 0.5, 3)
        answers = []
        for _ in range(2):
            async with http.post(sim.base_url + LIMITED_CHAT, json=CHAT, headers=auth) as reply:
                answers.append((reply.status, reply.headers.copy()))
        stream = {**CHAT, "stream": True}
        async with http.post(sim.base_url + LIMITED_CHAT, json=stream, headers=auth) as reply:
            await reply.read()
            answers.append((reply.status, reply.headers.copy()))
        async with http.post(sim.base_url + LIMITED_CHAT, json=CHAT,
                             headers={"Authorization": "Bearer key-2"}) as other:
            answers.append((other.status, other.headers.copy()))

    assert [status for status, _ in answers] == [200, 200, 200, 200]
    assert [h["x-ratelimit-limit-requests"] for _, h in answers] == ["30"] * 4
    # What each key's bucket still holds after the request: three of key-1's, one of key-2's.
    assert [h["x-ratelimit-remaining-requests"] for _, h in answers] == ["2", "1", "0", "2"]
    for _, headers in answers:
        reset = headers["x-ratelimit-reset-requests"]
        assert re.fullmatch(r"(\d+m)?\d+(\.\d+)?s|\d+ms", reset), reset
