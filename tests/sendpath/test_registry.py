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
