"""NotifkitServer refuses a bad argument when it is built, naming the argument, before it
touches Redis or PostgreSQL: a wrong type surfaced as a TypeError from deep inside (a join, or
the delivery service's start after the schema was migrated), or was taken character by
character (a string of transports)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from notifkit.config import _SECTION_VARIABLES, VARIABLES, ConfigError, Settings
from notifkit.server import NotifkitServer
from notifkit.transports.base import Message, SendResult, TransportContext


class FaxTransport:
    channel = "fax"
    provider = "fax"
    idempotent = False
    rate_per_s: float | None = None

    async def open(self, ctx: TransportContext) -> None:
        return None

    async def close(self) -> None:
        return None

    async def send(self, message: Message) -> SendResult:
        raise AssertionError("never sent")


@pytest.mark.parametrize("services", [5, [1], ["api", None], b"api"],
                         ids=["int", "list-of-int", "none-inside", "bytes"])
def test_services_of_the_wrong_type_are_refused_naming_services(services: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        NotifkitServer(services=services, settings=Settings())
    assert caught.value.variable == "services"


@pytest.mark.parametrize(
    "transports",
    [5, "resend", {"email": object()}, [object()], [{}], ["x", 3], [FaxTransport()]],
    ids=["int", "str", "dict", "object", "empty-dict", "garbage", "unknown-channel"])
def test_bad_transports_are_refused_naming_transports(transports: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        NotifkitServer(services=["api"], settings=Settings(), transports=transports)
    assert caught.value.variable == "transports"


def test_a_tuple_of_transports_is_taken() -> None:
    server = NotifkitServer(services=["api"], settings=Settings(), transports=())
    assert server.transports == []


def _clear_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    prefixes = ("NOTIFKIT_", "EMAIL_", "RESEND_", "SENDGRID_", "SMTP_", "TWILIO_", "FCM_",
                "OPENAI_", "PORT", "REDIS_URL", "DATABASE_URL", "DB_", "AUTO_MIGRATE")
    for name in list(os.environ):
        if name.startswith(prefixes):
            monkeypatch.delenv(name)


def test_settings_given_in_code_are_derived_as_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # NOTIFKIT_SIMULATOR_URL and PORT given as arguments were stored but not applied: no
    # transport pointed at the simulators (every e-mail dead-lettered for want of one), and
    # links still named port 8080.
    _clear_environment(monkeypatch)
    server = NotifkitServer(services=["delivery"], simulator_url="http://127.0.0.1:9",
                            port=9123)
    from_env = Settings.from_env({"NOTIFKIT_SIMULATOR_URL": "http://127.0.0.1:9",
                                  "PORT": "9123"})
    assert server.settings.email == from_env.email
    assert server.settings.email.transport == "resend"
    assert server.settings.email.resend_base_url == "http://127.0.0.1:9"
    assert server.settings.sms == from_env.sms
    assert server.settings.push.base_url == "http://127.0.0.1:9"
    assert server.settings.public_url == "http://127.0.0.1:9123"
    assert server.settings.services == ("delivery",)


def test_arguments_beside_given_settings_are_derived_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # With settings= as well, simulator_url= was stored and applied to nothing: no transport
    # pointed at the simulators (and no warning about the development secret either, since a
    # simulator was configured), and port= left the links on the settings' port.
    _clear_environment(monkeypatch)
    server = NotifkitServer(services=["delivery"], settings=Settings(),
                            simulator_url="http://127.0.0.1:9", port=9123)
    assert server.settings.email.transport == "resend"
    assert server.settings.email.resend_base_url == "http://127.0.0.1:9"
    assert server.settings.sms.enabled
    assert server.settings.sms.base_url == "http://127.0.0.1:9"
    assert server.settings.push.base_url == "http://127.0.0.1:9"
    assert server.settings.ai.base_url == "http://127.0.0.1:9/v1"
    assert server.settings.public_url == "http://127.0.0.1:9123"
    # A public URL the settings chose themselves stays.
    chosen = Settings(public_url="https://notify.example")
    assert NotifkitServer(settings=chosen, port=9123).settings.public_url == \
        "https://notify.example"


async def test_an_unreachable_redis_is_reported_naming_redis_url() -> None:
    # PostgreSQL's was (DATABASE_URL: cannot connect ...); Redis's was redis-py's bare
    # "Error 111 connecting to 127.0.0.1:1", naming no setting.
    server = NotifkitServer(services=["api"], settings=Settings(),
                            redis_url="redis://127.0.0.1:1/0", auto_migrate=False)
    with pytest.raises(RedisConnectionError, match=r"^REDIS_URL: cannot connect to Redis"):
        await server.start()
    assert server.services == {}
    await server.stop()


async def test_an_unreachable_redis_is_the_builtin_connection_error_the_readme_names() -> None:
    # ``except ConnectionError`` caught an unreachable PostgreSQL but not an unreachable Redis,
    # whose error was redis-py's ConnectionError alone.
    server = NotifkitServer(services=["api"], settings=Settings(),
                            redis_url="redis://127.0.0.1:1/0", auto_migrate=False)
    with pytest.raises(ConnectionError, match=r"^REDIS_URL: cannot connect to Redis"):
        await server.start()
    await server.stop()


@pytest.mark.parametrize("settings", [5, "redis://127.0.0.1", {"worker_concurrency": 5}],
                         ids=["int", "str", "dict"])
def test_settings_that_are_no_settings_are_refused_naming_settings(settings: Any) -> None:
    # An AttributeError ('int' object has no attribute 'replace') named nothing.
    with pytest.raises(ConfigError) as caught:
        NotifkitServer(services=["api"], settings=settings)
    assert caught.value.variable == "settings"


@pytest.mark.parametrize("section", ["email", "sms", "push", "ai", "webhooks"])
@pytest.mark.parametrize("value", [5, {}, "resend"], ids=["int", "dict", "str"])
def test_a_transport_section_of_the_wrong_type_is_refused_naming_it(
        section: str, value: Any) -> None:
    # AttributeError: 'int' object has no attribute 'resend_api_key', from deep inside.
    with pytest.raises(ConfigError) as caught:
        NotifkitServer(services=["api"], **{section: value})
    assert caught.value.variable == section
    with pytest.raises(ConfigError) as caught:
        NotifkitServer(services=["api"], settings=Settings(), **{section: value})
    assert caught.value.variable == section


@pytest.mark.parametrize("with_settings", [False, True], ids=["from-env", "settings"])
def test_an_unknown_keyword_is_refused_naming_it_and_the_closest_setting(
        with_settings: bool) -> None:
    # A TypeError about Settings.__init__, a class the caller never named; and env= slipped
    # through to Settings.from_env, whose AttributeError named nothing.
    given: dict[str, Any] = {"settings": Settings()} if with_settings else {}
    with pytest.raises(ConfigError) as caught:
        NotifkitServer(services=["api"], worker_concurency=5, **given)
    assert caught.value.variable == "worker_concurency"
    assert "worker_concurrency" in caught.value.problem
    # Still the TypeError Python gives any function for an unknown keyword.
    assert isinstance(caught.value, TypeError)
    with pytest.raises(ConfigError) as caught:
        NotifkitServer(services=["api"], env=5, **given)
    assert caught.value.variable == "env"


@pytest.mark.parametrize(("name", "value", "variable"), [
    ("provider_rates", 5, "PROVIDER_RATE_LIMITS"),
    ("provider_rates", {"resend": "fast"}, "PROVIDER_RATE_LIMITS"),
    ("provider_rates", {"resend": True}, "PROVIDER_RATE_LIMITS"),
    ("provider_rates", {"resend": 0.0001}, "PROVIDER_RATE_LIMITS"),
    ("fault_injection", 5, "NOTIFKIT_FAULT_INJECTION"),
    ("fault_injection", "skip_reclaim", "NOTIFKIT_FAULT_INJECTION"),
    ("fault_injection", {5}, "NOTIFKIT_FAULT_INJECTION"),
], ids=["rates-int", "rate-str", "rate-bool", "rate-under-floor", "faults-int", "faults-str",
        "faults-of-int"])
def test_rates_and_faults_of_the_wrong_kind_are_refused_naming_the_variable(
        name: str, value: Any, variable: str) -> None:
    # AttributeError ('int' object has no attribute 'items') or a TypeError from math, each
    # naming nothing; a rate under the floor PROVIDER_RATE_LIMITS refuses was taken.
    with pytest.raises(ConfigError) as caught:
        NotifkitServer(services=["api"], **{name: value})
    assert caught.value.variable == variable


def test_rates_and_faults_of_the_right_kind_are_taken() -> None:
    server = NotifkitServer(services=["api"], provider_rates={"resend": 2, "twilio": 0.5},
                            fault_injection=frozenset({"skip_reclaim"}))
    assert server.settings.provider_rates == {"resend": 2, "twilio": 0.5}
    assert server.settings.injects("skip_reclaim")


class _Email(FaxTransport):
    channel = "email"
    provider = "custom"


class _Sms(FaxTransport):
    channel = "sms"
    provider = "custom-sms"


class _FastEmail(_Email):
    rate_per_s = "fast"  # type: ignore[assignment]


class _NegativeEmail(_Email):
    rate_per_s = -1.0


class _NamelessEmail(_Email):
    provider = 5  # type: ignore[assignment]


@pytest.mark.parametrize("transports", [
    [_Email(), _Email()], [_FastEmail()], [_NegativeEmail()], [_NamelessEmail()],
], ids=["two-for-one-channel", "rate-str", "rate-negative", "provider-int"])
def test_transports_that_cannot_serve_are_refused_naming_transports(transports: Any) -> None:
    # Two for one channel: the later replaced the earlier without a word. A rate that is no
    # positive number, or a provider that is no name, failed every send at delivery time.
    with pytest.raises(ConfigError) as caught:
        NotifkitServer(services=["delivery"], settings=Settings(), transports=transports)
    assert caught.value.variable == "transports"


def test_one_transport_per_channel_with_a_rate_is_taken() -> None:
    class Limited(_Email):
        rate_per_s = 5

    server = NotifkitServer(services=["delivery"], settings=Settings(),
                            transports=[Limited(), _Sms()])
    assert [t.channel for t in server.transports] == ["email", "sms"]


# Settings fields no environment variable sets (their defaults serve every deployment), which
# code may still give: each was taken as given, a string or 0 failing only in a running worker
# (XREADGROUP BLOCK -5 refused at every read; an attempts counter given a TTL of 0 deleted at
# once, so no entry ever reached its attempt limit).
CODE_ONLY_NUMBERS = ["read_block_ms", "attempts_ttl_s", "caller_idempotency_ttl_s",
                     "heartbeat_ttl_s"]


@pytest.mark.parametrize("name", CODE_ONLY_NUMBERS)
@pytest.mark.parametrize("value", ["5", True, 1.5, 0, -5, 10**18],
                         ids=["str", "bool", "fraction", "zero", "negative", "past-ten-years"])
def test_a_setting_without_a_variable_is_checked_too_naming_it(name: str, value: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        NotifkitServer(settings=Settings(), **{name: value})
    assert caught.value.variable == name
    with pytest.raises(ConfigError) as caught:
        Settings(**{name: value})
    assert caught.value.variable == name


@pytest.mark.parametrize("name", CODE_ONLY_NUMBERS)
def test_a_setting_without_a_variable_takes_a_sound_value(name: str) -> None:
    # 31 s: more than the heartbeat's default interval, which its TTL must exceed.
    assert getattr(Settings().replace(**{name: 31}), name) == 31


# Every field of a transport section, with the variable that sets it.
SECTION_FIELDS = [(section, field.name, _SECTION_VARIABLES[section].get(field.name, ""))
                  for section in ("email", "sms", "push", "ai", "webhooks")
                  for field in dataclasses.fields(getattr(Settings(), section))]


def test_every_section_field_has_its_variable() -> None:
    for section, name, variable in SECTION_FIELDS:
        assert variable in VARIABLES, f"{section}.{name}"


@pytest.mark.parametrize(("section", "name", "variable"), SECTION_FIELDS,
                         ids=[f"{section}.{name}" for section, name, _ in SECTION_FIELDS])
@pytest.mark.parametrize("value", [5, b"x", ["x"]], ids=["int", "bytes", "list"])
def test_a_section_field_of_the_wrong_type_is_refused_naming_its_variable(
    section: str, name: str, variable: str, value: Any
) -> None:
    # An int for OPENAI_MODEL or RESEND_API_KEY was an AttributeError ('int' object has no
    # attribute 'isprintable'); one for TWILIO_FROM was taken and failed at every send.
    given = dataclasses.replace(getattr(Settings(), section), **{name: value})
    with pytest.raises(ConfigError) as caught:
        NotifkitServer(settings=Settings(), **{section: given})
    assert caught.value.variable == variable


def _built_in_transports() -> dict[str, Any]:
    from notifkit.transports.fcm import FcmTransport
    from notifkit.transports.resend import ResendTransport
    from notifkit.transports.sendgrid import SendgridTransport
    from notifkit.transports.smtp import SmtpTransport
    from notifkit.transports.twilio import TwilioTransport

    return {"resend": ResendTransport, "sendgrid": SendgridTransport, "smtp": SmtpTransport,
            "twilio": TwilioTransport, "fcm": FcmTransport}


GOOD_TRANSPORT_ARGUMENTS: dict[str, dict[str, Any]] = {
    "resend": {"api_key": "re_1", "from_addr": "Acme <a@acme.example>",
               "base_url": "https://api.resend.com"},
    "sendgrid": {"api_key": "SG.1", "from_addr": "a@acme.example"},
    "smtp": {"url": "smtp://user:pw@mail.example:2525", "from_addr": "a@acme.example"},
    "twilio": {"account_sid": "AC1", "auth_token": "t", "from_number": "+15550100"},
    "fcm": {"project_id": "demo", "access_token": "ya29.x"},
}


@pytest.mark.parametrize(("kind", "changed", "named"), [
    ("resend", {"api_key": "re_1\nX-Injected: 1"}, "ResendTransport(api_key)"),
    ("resend", {"from_addr": "nope"}, "ResendTransport(from_addr)"),
    ("resend", {"base_url": "ftp://x"}, "ResendTransport(base_url)"),
    ("resend", {"timeout_s": -1}, "ResendTransport(timeout_s)"),
    ("sendgrid", {"api_key": ""}, "SendgridTransport(api_key)"),
    ("sendgrid", {"connections": 0}, "SendgridTransport(connections)"),
    ("smtp", {"url": "http://127.0.0.1:2525"}, "SmtpTransport(url)"),
    ("smtp", {"url": "smtp://user@mail.example"}, "SmtpTransport(url)"),
    ("smtp", {"from_addr": "nope"}, "SmtpTransport(from_addr)"),
    ("smtp", {"timeout_s": float("nan")}, "SmtpTransport(timeout_s)"),
    ("twilio", {"account_sid": "AC#1"}, "TwilioTransport(account_sid)"),
    ("twilio", {"from_number": ""}, "TwilioTransport(from_number)"),
    ("fcm", {"project_id": "a/b"}, "FcmTransport(project_id)"),
    ("fcm", {"base_url": "https://fcm.example?x=1"}, "FcmTransport(base_url)"),
    ("fcm", {"access_token": "ya29\nx"}, "FcmTransport(access_token)"),
    # A pool of no connection: every send would wait for one forever.
    ("smtp", {"connections": 0}, "SmtpTransport(connections)"),
])
def test_a_built_in_transport_with_an_argument_that_fails_every_send_is_refused_naming_it(
    kind: str, changed: dict[str, Any], named: str
) -> None:
    """Given in the environment these values stop the start; given in code they were taken,
    and every message through the transport went to the DLQ."""
    transport = _built_in_transports()[kind](**{**GOOD_TRANSPORT_ARGUMENTS[kind], **changed})
    with pytest.raises(ConfigError) as caught:
        NotifkitServer(services=["delivery"], settings=Settings(), transports=[transport])
    assert caught.value.variable == named


def test_built_in_transports_with_sound_arguments_are_taken() -> None:
    classes = _built_in_transports()
    for kind, arguments in GOOD_TRANSPORT_ARGUMENTS.items():
        transport = classes[kind](**arguments)
        server = NotifkitServer(services=["delivery"], settings=Settings(),
                                transports=[transport])
        assert server.transports == [transport]


def test_an_http_transport_of_ones_own_that_builds_whole_urls_is_taken() -> None:
    from notifkit.transports.base import HttpTransport

    class Mine(HttpTransport):
        channel = "webhook"
        provider = "mine"

    transport = Mine()
    assert NotifkitServer(services=["delivery"], settings=Settings(),
                          transports=[transport]).transports == [transport]
