"""The transports a delivery process uses, one per channel, built from Settings.

    email    EMAIL_TRANSPORT: resend | sendgrid | smtp (with its key, base URL, EMAIL_FROM)
    sms      Twilio when TWILIO_ACCOUNT_SID and TWILIO_AUTH_TOKEN are set
    push     FCM when FCM_PROJECT_ID and a token (or credentials file) are set
    webhook  always (signs with NOTIFKIT_SECRET)
    inapp    always (PostgreSQL + Redis pub/sub)

``NOTIFKIT_SIMULATOR_URL`` fills in every provider left unset (see notifkit.config). Transports
given in code (``NotifkitServer(transports=[...])``) replace the configured one of their channel.
A channel without a transport is not an error at start: its tasks fail permanently with a
message naming the variables to set (and move on to their fallback chain's next channel, if
they have one).
"""

from __future__ import annotations

from collections.abc import Iterable

from notifkit.config import Settings
from notifkit.transports.base import Transport
from notifkit.transports.fcm import FcmTransport
from notifkit.transports.inapp import InAppTransport
from notifkit.transports.resend import ResendTransport
from notifkit.transports.sendgrid import SendgridTransport
from notifkit.transports.smtp import SmtpTransport
from notifkit.transports.twilio import TwilioTransport
from notifkit.transports.webhook import WebhookTransport

MISSING: dict[str, str] = {
    "email": "EMAIL_TRANSPORT with RESEND_API_KEY, SENDGRID_API_KEY or SMTP_URL",
    "sms": "TWILIO_ACCOUNT_SID and TWILIO_AUTH_TOKEN",
    "push": "FCM_PROJECT_ID and FCM_ACCESS_TOKEN (or FCM_CREDENTIALS_FILE)",
}


# The providers that publish a default sending rate: (their API's URL, sends per second).
# Resend: 2 requests per second per team; FCM HTTP v1: 600,000 messages per minute per
# project. SendGrid and Twilio publish none that holds for every account: they answer 429,
# and the task is parked until their Retry-After.
DOCUMENTED_RATES: dict[str, tuple[str, float]] = {
    "resend": ("https://api.resend.com", 2.0),
    "fcm": ("https://fcm.googleapis.com", 10_000.0),
}


def build_transports(
    settings: Settings, extra: Iterable[object] = ()
) -> dict[str, Transport]:
    """channel -> transport. ``extra`` are transports registered in code; they win."""
    timeout_s = settings.provider_timeout_s
    # One connection per message in flight is the most a delivery process can use.
    connections = max(1, settings.worker_concurrency)
    built: dict[str, Transport] = {}
    email = settings.email
    if email.transport == "resend" and email.resend_api_key:
        built["email"] = ResendTransport(
            api_key=email.resend_api_key, from_addr=email.from_addr,
            base_url=email.resend_base_url, timeout_s=timeout_s, connections=connections,
        )
    elif email.transport == "sendgrid" and email.sendgrid_api_key:
        built["email"] = SendgridTransport(
            api_key=email.sendgrid_api_key, from_addr=email.from_addr,
            base_url=email.sendgrid_base_url, timeout_s=timeout_s, connections=connections,
        )
    elif email.transport == "smtp" and email.smtp_url:
        built["email"] = SmtpTransport(url=email.smtp_url, from_addr=email.from_addr,
                                       timeout_s=timeout_s)
    sms = settings.sms
    if sms.account_sid and sms.auth_token and sms.from_number:  # Settings requires the number
        built["sms"] = TwilioTransport(
            account_sid=sms.account_sid, auth_token=sms.auth_token, from_number=sms.from_number,
            base_url=sms.base_url, public_url=settings.public_url, timeout_s=timeout_s,
            connections=connections,
        )
    push = settings.push
    if push.enabled and push.project_id:
        built["push"] = FcmTransport(
            project_id=push.project_id, access_token=push.access_token,
            credentials_file=push.credentials_file, account=push.account,
            base_url=push.base_url,
            timeout_s=timeout_s, connections=connections,
        )
    built["webhook"] = WebhookTransport(
        secret=settings.secret, allow_private_networks=settings.webhook_allow_private_networks,
        timeout_s=timeout_s, connections=connections,
    )
    built["inapp"] = InAppTransport()
    for transport in extra:
        if not isinstance(transport, Transport):
            raise TypeError(f"{transport!r} is not a notifkit transport (channel, provider, "
                            "idempotent, rate_per_s, open, close, send)")
        built[transport.channel] = transport
    for transport in built.values():
        transport.rate_per_s = send_rate(settings, transport)
    return built


def send_rate(settings: Settings, transport: Transport) -> float | None:
    """The sends per second notifkit allows itself towards ``transport``'s provider, across
    every delivery process (None = no bucket): ``PROVIDER_RATE_LIMITS`` first, else the rate
    the transport was built with, else the provider's documented rate when the transport
    talks to the provider itself (a simulator or proxy sets its own limits and answers 429)."""
    configured = settings.provider_rates.get(transport.provider)
    if configured is not None:
        return configured or None
    if transport.rate_per_s:
        return transport.rate_per_s
    documented = DOCUMENTED_RATES.get(transport.provider)
    if documented is not None and getattr(transport, "base_url", None) == documented[0]:
        return documented[1]
    return None
