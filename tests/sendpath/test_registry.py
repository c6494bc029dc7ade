"""Which transports a delivery process gets from its configuration."""

from __future__ import annotations

from typing import Any

import pytest

from notifkit.config import Settings
from notifkit.transports.base import Message, Outcome, SendResult, TransportContext
from notifkit.transports.fcm import FcmTransport
from notifkit.transports.registry import build_transports
from notifkit.transports.resend import ResendTransport
from notifkit.transports.sendgrid import SendgridTransport
from notifkit.transports.smtp import SmtpTransport
from notifkit.transports.twilio import TwilioTransport


class Pigeon:
    channel = "sms"
    provider = "pigeon"
    idempotent = False
    rate_per_s: float | None = 1.0

    async def open(self, ctx: TransportContext) -> None: ...

    async def close(self) -> None: ...

    async def send(self, message: Message) -> SendResult:
        return SendResult(Outcome.SENT, "coo")


def test_one_simulator_url_configures_every_provider() -> None:
    settings = Settings.from_env({"NOTIFKIT_SIMULATOR_URL": "http://sim:8025"})
    built = build_transports(settings)
    assert set(built) == {"email", "sms", "push", "webhook", "inapp"}
    assert isinstance(built["email"], ResendTransport)
    assert built["email"].base_url == "http://sim:8025"
    assert isinstance(built["sms"], TwilioTransport)
    assert isinstance(built["push"], FcmTransport)


@pytest.mark.parametrize(("env", "cls"), [
    ({"SENDGRID_API_KEY": "SG.x", "SENDGRID_BASE_URL": "http://sg"}, SendgridTransport),
    ({"SMTP_URL": "smtp://user:pass@mail:2525"}, SmtpTransport),
    ({"EMAIL_TRANSPORT": "resend", "RESEND_API_KEY": "re_x"}, ResendTransport),
])
def test_the_email_transport_follows_the_configuration(env: dict[str, str], cls: type) -> None:
    built = build_transports(Settings.from_env(env))
    assert isinstance(built["email"], cls)
    assert "sms" not in built
    assert "push" not in built


def test_a_transport_given_in_code_replaces_the_configured_one() -> None:
    settings = Settings.from_env({"NOTIFKIT_SIMULATOR_URL": "http://sim:8025"})
    pigeon = Pigeon()
    assert build_transports(settings, [pigeon])["sms"] is pigeon
    with pytest.raises(TypeError, match="not a notifkit transport"):
        build_transports(settings, [object()])


def test_smtp_url_parts() -> None:
    smtp: Any = build_transports(Settings.from_env({"SMTP_URL": "smtps://a%40b:p%3Aw@mx:465"}))[
        "email"]
    assert (smtp.hostname, smtp.port, smtp.use_tls) == ("mx", 465, True)
    assert (smtp.username, smtp.password) == ("a@b", "p:w")


def test_real_providers_get_their_documented_rate_and_simulators_none() -> None:
    real = build_transports(Settings.from_env({
        "RESEND_API_KEY": "re_1", "EMAIL_FROM": "a@example.com",
        "FCM_PROJECT_ID": "p", "FCM_ACCESS_TOKEN": "t",
        "TWILIO_ACCOUNT_SID": "AC1", "TWILIO_AUTH_TOKEN": "x", "TWILIO_FROM": "+15550000000"}))
    assert (real["email"].rate_per_s, real["push"].rate_per_s) == (2.0, 10_000.0)
    assert real["sms"].rate_per_s is None  # Twilio publishes no account-wide rate
    simulated = build_transports(Settings.from_env({"NOTIFKIT_SIMULATOR_URL": "http://sim:8025"}))
    assert {t.rate_per_s for t in simulated.values()} == {None}


def test_provider_rate_limits_override_every_default() -> None:
    settings = Settings.from_env({
        "NOTIFKIT_SIMULATOR_URL": "http://sim:8025",
        "RESEND_API_KEY": "re_1", "RESEND_BASE_URL": "https://api.resend.com",
        "PROVIDER_RATE_LIMITS": "resend=0, twilio=5",
    })
    built = build_transports(settings, [Pigeon()])
    assert built["email"].rate_per_s is None  # 0 = no bucket, even towards Resend itself
    assert built["sms"].rate_per_s == 1.0  # Pigeon's own rate: the setting names twilio
    assert build_transports(settings)["sms"].rate_per_s == 5.0
