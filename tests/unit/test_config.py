"""Settings.from_env: the defaults of CONTRACT §9, parsing, and errors that name the variable.

A deployment learns about a typo from the first line of output at start, so every invalid
value must raise ConfigError naming the environment variable as the operator spelled it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from notifkit.config import (
    SERVICES,
    SIMULATOR_PLACEHOLDER_KEY,
    ConfigError,
    DatabaseDsn,
    Settings,
    database_dsn,
    parse_services,
    uses_development_secret,
)
from notifkit.transports.smtp import SmtpTransport


def test_defaults_match_the_contract() -> None:
    s = Settings.from_env({})
    assert s.redis_url == "redis://127.0.0.1:6379/0"
    assert s.services == SERVICES
    assert set(SERVICES) == {
        "api", "enricher", "engine", "delivery", "scheduler", "ai", "workflow", "events"
    }
    assert s.namespace == ""
    assert s.queue_max_len == 10_000_000
    assert s.idempotency_ttl_s == 3600
    assert s.caller_idempotency_ttl_s == 24 * 3600
    assert s.reclaim_interval_s == 60
    assert s.reclaim_min_idle_s == 60
    assert s.max_attempts == 3
    assert s.enricher_max_attempts == 5
    assert s.max_attempts_for("enricher") == 5
    assert s.max_attempts_for("delivery") == 3
    assert s.attempts_ttl_s == 2 * 3600
    assert s.db_max_connections == 2
    assert s.db_schema == "public"
    assert s.auto_migrate is True
    assert s.port == 8080
    assert s.provider_timeout_s == 10
    assert s.scheduler_lock_ttl_s == 30
    assert s.reconcile_grace_s == 300
    assert s.workflow_lock_ttl_s == 60
    assert s.max_body_bytes == 1024 * 1024
    assert s.webhook_allow_private_networks is False
    # No transport is enabled unless configured.
    assert s.email.transport is None
    assert not s.sms.enabled
    assert not s.push.enabled
    assert not s.ai.enabled


def test_values_are_read_from_the_environment() -> None:
    s = Settings.from_env({
        "REDIS_URL": "redis://cache:6380/2",
        "DATABASE_URL": "postgresql://app:pw@db:5432/notifkit",
        "NOTIFKIT_SERVICES": "delivery, api",
        "NOTIFKIT_NAMESPACE": "staging",
        "WORKER_CONCURRENCY": "25",
        "QUEUE_MAX_LEN": "1000",
        "IDEMPOTENCY_TTL_SECONDS": "60",
        "RECLAIM_INTERVAL_SECONDS": "0.5",
        "RECLAIM_MIN_IDLE_SECONDS": "1.5",
        "DB_MAX_CONNECTIONS": "4",
        "DB_SCHEMA": "notifkit",
        "AUTO_MIGRATE": "false",
        "PORT": "9090",
        "NOTIFKIT_ADMIN_KEY": "admin-key-0123456789",
        "NOTIFKIT_SECRET": "secret-0123456789abcdef",
        "PROVIDER_TIMEOUT_SECONDS": "2.5",
        "RECONCILE_GRACE_SECONDS": "90",
        "WEBHOOK_ALLOW_PRIVATE_NETWORKS": "true",
    })
    assert s.redis_url == "redis://cache:6380/2"
    assert s.database_url == "postgresql://app:pw@db:5432/notifkit"
    assert s.services == ("api", "delivery")  # canonical order
    assert s.namespace == "staging"
    assert s.worker_concurrency == 25
    assert s.queue_max_len == 1000
    assert s.idempotency_ttl_s == 60
    assert (s.reclaim_interval_s, s.reclaim_min_idle_s) == (0.5, 1.5)
    assert s.db_max_connections == 4
    assert s.db_schema == "notifkit"
    assert s.auto_migrate is False
    assert s.port == 9090
    assert s.admin_key == "admin-key-0123456789"
    assert s.secret == "secret-0123456789abcdef"
    assert s.provider_timeout_s == 2.5
    assert s.reconcile_grace_s == 90
    assert s.webhook_allow_private_networks is True


def test_code_overrides_win_over_the_environment() -> None:
    s = Settings.from_env({"WORKER_CONCURRENCY": "7", "DB_SCHEMA": "env"},
                          worker_concurrency=9, db_schema="code")
    assert (s.worker_concurrency, s.db_schema) == (9, "code")


@pytest.mark.parametrize("raw", ["all", " ALL "])
def test_all_means_every_service(raw: str) -> None:
    assert parse_services(raw) == SERVICES


@pytest.mark.parametrize("raw", ["api,all", "all,delivery", "ALL, api"])
def test_all_with_other_services_is_refused(raw: str) -> None:
    # api,all ran every service without a word, whatever the other name was meant to say.
    with pytest.raises(ConfigError, match="'all' with other services") as info:
        parse_services(raw)
    assert info.value.variable == "NOTIFKIT_SERVICES"


@pytest.mark.parametrize("raw", ["api,,delivery", "api,", ",api", "api, ,delivery"])
def test_an_empty_service_entry_is_refused(raw: str) -> None:
    # api,$UNSET,delivery ran api and delivery alone without a word.
    with pytest.raises(ConfigError, match="empty entry") as info:
        parse_services(raw, "--services")
    assert info.value.variable == "--services"


@pytest.mark.parametrize("raw", ["api,api", "api, delivery ,Api", "all,all"])
def test_a_service_named_twice_is_refused(raw: str) -> None:
    with pytest.raises(ConfigError, match="twice") as info:
        parse_services(raw)
    assert info.value.variable == "NOTIFKIT_SERVICES"


def test_a_service_given_twice_in_code_is_refused() -> None:
    with pytest.raises(ConfigError, match="'api' twice") as info:
        Settings(services=("api", "api"))
    assert info.value.variable == "NOTIFKIT_SERVICES"


@pytest.mark.parametrize("services", [5, "api", b"api", ("api", 5), None])
def test_services_of_the_wrong_kind_in_code_are_refused_naming_them(services: Any) -> None:
    # 5 raised a bare TypeError ('int' object is not iterable); "api" was taken letter by
    # letter and refused as "unknown service 'a'".
    with pytest.raises(ConfigError, match="must be a tuple of service names") as info:
        Settings().replace(services=services)
    assert info.value.variable == "NOTIFKIT_SERVICES"


@pytest.mark.parametrize("url", [
    # libpq's forms for a server on a Unix socket: no host, or the socket directory as host.
    "postgresql:///notifkit?host=/var/run/postgresql&user=app",
    "postgres:///notifkit",
    "postgresql://app@/notifkit?host=/var/run/postgresql",
])
def test_a_database_url_may_name_no_host(url: str) -> None:
    assert Settings.from_env({"DATABASE_URL": url}).database_url == url


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"WORKER_CONCURRENCY": "abc"}, "WORKER_CONCURRENCY"),
        ({"WORKER_CONCURRENCY": "0"}, "WORKER_CONCURRENCY"),
        ({"QUEUE_MAX_LEN": "1e3"}, "QUEUE_MAX_LEN"),
        ({"REDIS_URL": "foo"}, "REDIS_URL"),
        ({"DATABASE_URL": "mysql://db/app"}, "DATABASE_URL"),
        ({"DATABASE_URL": "postgresql:notifkit"}, "DATABASE_URL"),
        ({"DB_SCHEMA": "Bad-Name"}, "DB_SCHEMA"),
        ({"DB_SCHEMA": "1abc"}, "DB_SCHEMA"),
        ({"DB_MAX_CONNECTIONS": "-1"}, "DB_MAX_CONNECTIONS"),
        # asyncpg sets up every slot of a pool at once: this one never finished starting.
        ({"DB_MAX_CONNECTIONS": "99999999999999999"}, "DB_MAX_CONNECTIONS"),
        # Past 64 bits Redis refuses XREADGROUP's COUNT, and every worker logged it forever.
        ({"WORKER_CONCURRENCY": "99999999999999999999999"}, "WORKER_CONCURRENCY"),
        ({"DB_SCHEMA": "pg_catalog"}, "DB_SCHEMA"),
        ({"DB_SCHEMA": "pg_notifkit"}, "DB_SCHEMA"),
        # PostgreSQL's own, which pg_dump leaves out: a backup would hold none of the data.
        ({"DB_SCHEMA": "information_schema"}, "DB_SCHEMA"),
        # urlsplit raises on an unclosed IPv6 bracket; that was a traceback, not a message.
        ({"REDIS_URL": "redis://[::1"}, "REDIS_URL"),
        ({"REDIS_URL": "unix://[sock"}, "REDIS_URL"),
        ({"DATABASE_URL": "postgresql://[::1/app"}, "DATABASE_URL"),
        ({"NOTIFKIT_PUBLIC_URL": "http://[oops"}, "NOTIFKIT_PUBLIC_URL"),
        ({"NOTIFKIT_SERVICES": "api,nope"}, "NOTIFKIT_SERVICES"),
        ({"NOTIFKIT_SERVICES": "all,nope"}, "NOTIFKIT_SERVICES"),
        ({"NOTIFKIT_SERVICES": ","}, "NOTIFKIT_SERVICES"),
        ({"REDIS_URL": "redis://127.0.0.1:6379/0?socket_timeout=abc"}, "REDIS_URL"),
        ({"REDIS_URL": "redis://127.0.0.1:6379/0?no_such_option=1"}, "REDIS_URL"),
        ({"REDIS_URL": "rediss://127.0.0.1:6379/0?ssl_cert_reqs=junk"}, "REDIS_URL"),
        ({"REDIS_URL": "unix:///tmp/redis.sock?protocol=9"}, "REDIS_URL"),
        # The client takes these, then fails its first command: "cannot convert float NaN to
        # integer" naming no setting, or a timeout (status 1) as if Redis were slow.
        ({"REDIS_URL": "redis://127.0.0.1:6379/0?socket_timeout=nan"}, "REDIS_URL"),
        ({"REDIS_URL": "redis://127.0.0.1:6379/0?socket_timeout=-1"}, "REDIS_URL"),
        ({"REDIS_URL": "redis://127.0.0.1:6379/0?socket_timeout=0"}, "REDIS_URL"),
        ({"REDIS_URL": "redis://127.0.0.1:6379/0?socket_connect_timeout=0"}, "REDIS_URL"),
        ({"REDIS_URL": "unix:///tmp/redis.sock?socket_connect_timeout=-2"}, "REDIS_URL"),
        ({"REDIS_URL": "redis://127.0.0.1:6379/0?health_check_interval=-5"}, "REDIS_URL"),
        ({"REDIS_URL": "redis://127.0.0.1:6379/0?health_check_interval=nan"}, "REDIS_URL"),
        ({"NOTIFKIT_NAMESPACE": "has space"}, "NOTIFKIT_NAMESPACE"),
        ({"AUTO_MIGRATE": "maybe"}, "AUTO_MIGRATE"),
        ({"WEBHOOK_ALLOW_PRIVATE_NETWORKS": "maybe"}, "WEBHOOK_ALLOW_PRIVATE_NETWORKS"),
        ({"PORT": "70000"}, "PORT"),
        ({"PORT": "http"}, "PORT"),
        ({"RECLAIM_INTERVAL_SECONDS": "nan"}, "RECLAIM_INTERVAL_SECONDS"),
        ({"RECLAIM_MIN_IDLE_SECONDS": "-1"}, "RECLAIM_MIN_IDLE_SECONDS"),
        ({"IDEMPOTENCY_TTL_SECONDS": "0"}, "IDEMPOTENCY_TTL_SECONDS"),
        ({"PROVIDER_TIMEOUT_SECONDS": "0"}, "PROVIDER_TIMEOUT_SECONDS"),
        ({"RECONCILE_GRACE_SECONDS": "0.5"}, "RECONCILE_GRACE_SECONDS"),
        ({"RECONCILE_GRACE_SECONDS": "soon"}, "RECONCILE_GRACE_SECONDS"),
        ({"NOTIFKIT_SECRET": "short"}, "NOTIFKIT_SECRET"),
        ({"NOTIFKIT_ADMIN_KEY": "short"}, "NOTIFKIT_ADMIN_KEY"),
        ({"LOG_FORMAT": "xml"}, "LOG_FORMAT"),
        ({"EMAIL_TRANSPORT": "pigeon"}, "EMAIL_TRANSPORT"),
        ({"EMAIL_TRANSPORT": "resend"}, "RESEND_API_KEY"),
        ({"EMAIL_TRANSPORT": "sendgrid"}, "SENDGRID_API_KEY"),
        ({"EMAIL_TRANSPORT": "smtp"}, "SMTP_URL"),
        ({"SMTP_URL": "http://mail:25"}, "SMTP_URL"),
        ({"RESEND_API_KEY": "k", "RESEND_BASE_URL": "resend.local"}, "RESEND_BASE_URL"),
        ({"TWILIO_ACCOUNT_SID": "AC1"}, "TWILIO_AUTH_TOKEN"),
        # Refused only when delivery built its transports: migrations had run and the API was
        # listening by then, and the record carried no `setting`.
        ({"TWILIO_ACCOUNT_SID": "AC1", "TWILIO_AUTH_TOKEN": "t"}, "TWILIO_FROM"),
        ({"TWILIO_ACCOUNT_SID": "AC1", "TWILIO_AUTH_TOKEN": "t",
          "NOTIFKIT_SIMULATOR_URL": "http://sim:8025"}, "TWILIO_FROM"),
        ({"TWILIO_BASE_URL": "ftp://twilio"}, "TWILIO_BASE_URL"),
        # With no e-mail transport configured these went unchecked (TWILIO_BASE_URL and the
        # other providers' are checked either way): the process started on a malformed value.
        ({"RESEND_BASE_URL": "resend.local"}, "RESEND_BASE_URL"),
        ({"SENDGRID_BASE_URL": "0"}, "SENDGRID_BASE_URL"),
        ({"EMAIL_FROM": "no-reply"}, "EMAIL_FROM"),
        ({"FCM_PROJECT_ID": "p"}, "FCM_ACCESS_TOKEN"),
        # A Svix secret is whsec_ and base64; cut short or mistyped, it verified no webhook
        # (every one a 401) with nothing at start to say why.
        ({"RESEND_WEBHOOK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS"},
         "RESEND_WEBHOOK_SECRET"),
        ({"SENDGRID_WEBHOOK_SECRET": "whsec_not base64!"}, "SENDGRID_WEBHOOK_SECRET"),
        ({"FCM_WEBHOOK_SECRET": "whsec_"}, "FCM_WEBHOOK_SECRET"),
        ({"SMTP_WEBHOOK_SECRET": "whsec_@@@@"}, "SMTP_WEBHOOK_SECRET"),
        # Push credentials without the project they belong to were ignored without a word
        # (with the simulators configured, push quietly went there instead).
        ({"FCM_CREDENTIALS_FILE": "/run/secrets/fcm.json"}, "FCM_PROJECT_ID"),
        ({"FCM_ACCESS_TOKEN": "ya29.token"}, "FCM_PROJECT_ID"),
        ({"FCM_CREDENTIALS_FILE": "/run/secrets/fcm.json",
          "NOTIFKIT_SIMULATOR_URL": "http://sim:8025"}, "FCM_PROJECT_ID"),
        ({"OPENAI_BASE_URL": "openai"}, "OPENAI_BASE_URL"),
        ({"NOTIFKIT_SIMULATOR_URL": "ftp://sim"}, "NOTIFKIT_SIMULATOR_URL"),
        ({"NOTIFKIT_SIMULATOR_SMTP": "nohost"}, "NOTIFKIT_SIMULATOR_SMTP"),
        ({"PROVIDER_RATE_LIMITS": "resend"}, "PROVIDER_RATE_LIMITS"),
        ({"PROVIDER_RATE_LIMITS": "resend=fast"}, "PROVIDER_RATE_LIMITS"),
        ({"PROVIDER_RATE_LIMITS": "resend=-1"}, "PROVIDER_RATE_LIMITS"),
        ({"PROVIDER_RATE_LIMITS": "resend=inf"}, "PROVIDER_RATE_LIMITS"),
        ({"PROVIDER_RATE_LIMITS": "pigeon=3"}, "PROVIDER_RATE_LIMITS"),
        # The second value used to win silently; a rate near 0 overflowed a parked due time.
        ({"PROVIDER_RATE_LIMITS": "resend=1,twilio=5,resend=2"}, "PROVIDER_RATE_LIMITS"),
        ({"PROVIDER_RATE_LIMITS": "resend=1e-300"}, "PROVIDER_RATE_LIMITS"),
        ({"PROVIDER_RATE_LIMITS": "twilio=0.0001"}, "PROVIDER_RATE_LIMITS"),
        # A URL naming no host, or with white space in it, started the process, and every
        # send (or every link followed) failed on it.
        ({"RESEND_API_KEY": "k", "RESEND_BASE_URL": "http://:8025"}, "RESEND_BASE_URL"),
        ({"SENDGRID_API_KEY": "k", "SENDGRID_BASE_URL": "https://user@"}, "SENDGRID_BASE_URL"),
        ({"TWILIO_BASE_URL": "http://twi lio.example"}, "TWILIO_BASE_URL"),
        ({"FCM_BASE_URL": "https://:443/"}, "FCM_BASE_URL"),
        ({"OPENAI_BASE_URL": "https://api.open ai.com/v1"}, "OPENAI_BASE_URL"),
        ({"NOTIFKIT_SIMULATOR_URL": "http://:8025"}, "NOTIFKIT_SIMULATOR_URL"),
        ({"NOTIFKIT_PUBLIC_URL": "https://notifkit.example/a\tb"}, "NOTIFKIT_PUBLIC_URL"),
        ({"SMTP_URL": "smtp://user:pass@"}, "SMTP_URL"),
        ({"REDIS_URL": "redis://:secret@/0"}, "REDIS_URL"),
        # Sent as it is in every completion request, as a template's model is (a 400 there).
        ({"OPENAI_API_KEY": "k", "OPENAI_MODEL": "gpt-4o\nmini"}, "OPENAI_MODEL"),
        # Four beats of it overflowed to an infinite TTL: an OverflowError, not a message.
        ({"HEARTBEAT_INTERVAL_SECONDS": "1e308"}, "HEARTBEAT_INTERVAL_SECONDS"),
        # Accepted, it failed every compressed request with a 500: zlib takes no limit that
        # large.
        ({"MAX_BODY_BYTES": str(2**64)}, "MAX_BODY_BYTES"),
        ({"MAX_BODY_BYTES": "1073741825"}, "MAX_BODY_BYTES"),
        # Sent in an Authorization header, which aiohttp refuses with a control character in
        # it: every send through the provider failed (and no client could send the admin key).
        # Found only when the api bound it, after the migrations, in a message broken over
        # two lines.
        # Nothing is reached on port 0: accepted, every send through the URL failed to connect.
        ({"RESEND_API_KEY": "k", "RESEND_BASE_URL": "http://127.0.0.1:0"}, "RESEND_BASE_URL"),
        ({"OPENAI_BASE_URL": "https://api.openai.com:0/v1"}, "OPENAI_BASE_URL"),
        ({"SMTP_URL": "smtp://mail.example:0"}, "SMTP_URL"),
        ({"NOTIFKIT_SIMULATOR_URL": "http://127.0.0.1:0"}, "NOTIFKIT_SIMULATOR_URL"),
        ({"NOTIFKIT_SIMULATOR_SMTP": "127.0.0.1:0"}, "NOTIFKIT_SIMULATOR_SMTP"),
        ({"NOTIFKIT_PUBLIC_URL": "https://[::1]:00/"}, "NOTIFKIT_PUBLIC_URL"),
        ({"REDIS_URL": "redis://127.0.0.1:0/0"}, "REDIS_URL"),
        ({"DATABASE_URL": "postgresql://postgres@127.0.0.1:0/test"}, "DATABASE_URL"),
        # Paths are appended to these: a query or fragment came before the path, and every
        # request or link built on it went astray.
        ({"NOTIFKIT_PUBLIC_URL": "https://notifkit.example/?ref=mail"}, "NOTIFKIT_PUBLIC_URL"),
        ({"RESEND_API_KEY": "k", "RESEND_BASE_URL": "https://api.resend.com#x"},
         "RESEND_BASE_URL"),
        ({"NOTIFKIT_SIMULATOR_URL": "http://127.0.0.1:8025/?a=1"}, "NOTIFKIT_SIMULATOR_URL"),
        ({"OPENAI_BASE_URL": "https://api.openai.com/v1?"}, "OPENAI_BASE_URL"),
        # Put as they are into every request's path: a '#' or '/' sent each one elsewhere.
        ({"TWILIO_ACCOUNT_SID": "AC12#x", "TWILIO_AUTH_TOKEN": "t", "TWILIO_FROM": "+15005550006"},
         "TWILIO_ACCOUNT_SID"),
        ({"TWILIO_ACCOUNT_SID": "..", "TWILIO_AUTH_TOKEN": "t", "TWILIO_FROM": "+15005550006"},
         "TWILIO_ACCOUNT_SID"),
        ({"FCM_PROJECT_ID": "my-app/../other", "FCM_ACCESS_TOKEN": "ya29.t"}, "FCM_PROJECT_ID"),
        ({"FCM_PROJECT_ID": "my app", "FCM_ACCESS_TOKEN": "ya29.t"}, "FCM_PROJECT_ID"),
        ({"HOST": "127.0.0.1\n::1"}, "HOST"),
        ({"HOST": "my host"}, "HOST"),
        ({"RESEND_API_KEY": "re_abc\ndef"}, "RESEND_API_KEY"),
        ({"SENDGRID_API_KEY": "SG.abc\x00def"}, "SENDGRID_API_KEY"),
        ({"OPENAI_API_KEY": "sk-abc\rdef"}, "OPENAI_API_KEY"),
        ({"FCM_PROJECT_ID": "p", "FCM_ACCESS_TOKEN": "ya29.a\x1bb"}, "FCM_ACCESS_TOKEN"),
        ({"NOTIFKIT_ADMIN_KEY": "admin-key-0123456789\x7f"}, "NOTIFKIT_ADMIN_KEY"),
        # Its port in other digits than 0-9 passed, and the refusal named SMTP_URL, which the
        # operator never set.
        ({"NOTIFKIT_SIMULATOR_SMTP": "127.0.0.1:\u0662\u0665\u0662\u0665"},
         "NOTIFKIT_SIMULATOR_SMTP"),
        # A user without a password logged in with an empty one (every send refused by the
        # server), and a password without a user was dropped: the mail went unauthenticated.
        ({"SMTP_URL": "smtp://mailer@mail.example:587"}, "SMTP_URL"),
        ({"SMTP_URL": "smtp://mailer:@mail.example:587"}, "SMTP_URL"),
        ({"SMTP_URL": "smtp://:secret@mail.example:587"}, "SMTP_URL"),
        # Options in the query or path were ignored without a word (no STARTTLS switch, no
        # HELO name): the transport reads the scheme, login, host and port alone.
        ({"SMTP_URL": "smtp://u:p@mail.example:587?starttls=false"}, "SMTP_URL"),
        ({"SMTP_URL": "smtp://u:p@mail.example:587/relay"}, "SMTP_URL"),
        # Set while another transport sends e-mail, it went unchecked, unlike every other
        # provider's settings.
        ({"EMAIL_TRANSPORT": "resend", "RESEND_API_KEY": "k", "SMTP_URL": "mail.example:25"},
         "SMTP_URL"),
        # Python's int() and float() read any script's digits: PORT=\uff18\uff10 (full-width,
        # pasted from a document) listened on port 80, where URLs' ports take only 0-9.
        ({"PORT": "\uff18\uff10\uff18\uff10"}, "PORT"),
        ({"WORKER_CONCURRENCY": "\u0665\u0660"}, "WORKER_CONCURRENCY"),
        ({"PROVIDER_TIMEOUT_SECONDS": "\u0661.\u0665"}, "PROVIDER_TIMEOUT_SECONDS"),
        ({"PROVIDER_RATE_LIMITS": "resend=\uff12"}, "PROVIDER_RATE_LIMITS"),
        ({"REDIS_URL": "redis://127.0.0.1:6379/\uff10"}, "REDIS_URL"),
        ({"DATABASE_URL": "postgresql://db/app?connect_timeout=\uff15"}, "DATABASE_URL"),
    ],
)
def test_invalid_values_name_the_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(env)
    assert caught.value.variable == variable
    assert str(caught.value).startswith(f"{variable}: ")


def test_a_base_url_may_have_a_path() -> None:
    s = Settings.from_env({"NOTIFKIT_PUBLIC_URL": "https://example.com/notifkit/",
                           "OPENAI_BASE_URL": "https://gateway.example/openai/v1"})
    assert (s.public_url, s.ai.base_url) == ("https://example.com/notifkit/",
                                             "https://gateway.example/openai/v1")


def test_redis_timeouts_that_work_are_kept() -> None:
    url = ("redis://127.0.0.1:6379/0?socket_timeout=2.5&socket_connect_timeout=1"
           "&health_check_interval=0")
    assert Settings.from_env({"REDIS_URL": url}).redis_url == url


def test_provider_rates_keep_zero_and_small_sane_rates() -> None:
    rates = Settings.from_env({"PROVIDER_RATE_LIMITS": "resend=0,twilio=0.001,fcm=1e6"})
    assert dict(rates.provider_rates) == {"resend": 0.0, "twilio": 0.001, "fcm": 1e6}


def test_invalid_values_given_in_code_name_the_variable_too() -> None:
    with pytest.raises(ConfigError, match=r"^DB_SCHEMA: "):
        Settings(db_schema="Bad-Name")
    with pytest.raises(ConfigError, match=r"^WORKER_CONCURRENCY: "):
        Settings.from_env({}, worker_concurrency=0)


@pytest.mark.parametrize(
    ("override", "variable"),
    [
        # Wrong types: a string compared with a number raised TypeError, and a truthy string
        # for a flag was taken as true (AUTO_MIGRATE="false" migrated).
        ({"worker_concurrency": "5"}, "WORKER_CONCURRENCY"),
        ({"worker_concurrency": True}, "WORKER_CONCURRENCY"),
        ({"db_max_connections": 0.5}, "DB_MAX_CONNECTIONS"),
        ({"queue_max_len": 1e6}, "QUEUE_MAX_LEN"),
        ({"reclaim_min_idle_s": "60"}, "RECLAIM_MIN_IDLE_SECONDS"),
        ({"provider_timeout_s": None}, "PROVIDER_TIMEOUT_SECONDS"),
        ({"auto_migrate": "false"}, "AUTO_MIGRATE"),
        ({"auto_migrate": 0}, "AUTO_MIGRATE"),
        ({"webhook_allow_private_networks": "true"}, "WEBHOOK_ALLOW_PRIVATE_NETWORKS"),
        ({"redis_url": None}, "REDIS_URL"),
        ({"db_schema": 5}, "DB_SCHEMA"),
        # A trailing newline is no part of a name (the environment's values are stripped).
        ({"db_schema": "notifkit\n"}, "DB_SCHEMA"),
        ({"namespace": "staging\n"}, "NOTIFKIT_NAMESPACE"),
        ({"admin_key": 12345678901234567}, "NOTIFKIT_ADMIN_KEY"),
        # Values the environment refuses, given in code.
        ({"throttle_limit": -1}, "THROTTLE_LIMIT"),
        ({"api_rate_burst": 0}, "API_RATE_BURST"),
        ({"max_body_bytes": 0}, "MAX_BODY_BYTES"),
        ({"heartbeat_interval_s": 0.0}, "HEARTBEAT_INTERVAL_SECONDS"),
        ({"shutdown_grace_s": -1.0}, "SHUTDOWN_GRACE_SECONDS"),
        ({"scheduler_poll_interval_s": 0.0}, "SCHEDULER_POLL_INTERVAL_SECONDS"),
        ({"scheduler_lock_ttl_s": 0}, "SCHEDULER_LOCK_TTL_SECONDS"),
        ({"reconcile_grace_s": float("inf")}, "RECONCILE_GRACE_SECONDS"),
        ({"reclaim_interval_s": float("nan")}, "RECLAIM_INTERVAL_SECONDS"),
    ],
)
def test_values_given_in_code_are_checked_as_the_environment_checks_them(
    override: dict[str, Any], variable: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings(**override)
    assert caught.value.variable == variable
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({}, **override)
    assert caught.value.variable == variable


def test_numbers_given_in_code_may_be_ints_where_fractions_are_allowed() -> None:
    s = Settings(reclaim_min_idle_s=0, provider_timeout_s=2, heartbeat_interval_s=1)
    assert (s.reclaim_min_idle_s, s.provider_timeout_s, s.heartbeat_interval_s) == (0, 2, 1)


def test_the_largest_sizes_still_accepted() -> None:
    s = Settings.from_env({"WORKER_CONCURRENCY": "1000000", "DB_MAX_CONNECTIONS": "10000",
                           "MAX_BODY_BYTES": "1073741824"})
    assert (s.worker_concurrency, s.db_max_connections, s.max_body_bytes) == (
        1_000_000, 10_000, 1024**3)


def test_empty_values_count_as_unset() -> None:
    assert Settings.from_env({"WORKER_CONCURRENCY": "", "DB_SCHEMA": "  "}) == Settings()


def test_simulator_url_configures_every_unconfigured_transport() -> None:
    s = Settings.from_env({"NOTIFKIT_SIMULATOR_URL": "http://sim:9000/"})
    assert s.email.transport == "resend"
    assert s.email.resend_base_url == "http://sim:9000"
    assert s.email.resend_api_key == SIMULATOR_PLACEHOLDER_KEY
    assert s.sms.enabled
    assert s.sms.base_url == "http://sim:9000"
    assert s.push.enabled
    assert s.push.base_url == "http://sim:9000"
    assert s.ai.enabled
    assert s.ai.base_url == "http://sim:9000/v1"


def test_simulator_url_leaves_configured_transports_alone() -> None:
    s = Settings.from_env({
        "NOTIFKIT_SIMULATOR_URL": "http://sim:9000",
        "EMAIL_TRANSPORT": "sendgrid",
        "SENDGRID_API_KEY": "real-key",
        "TWILIO_ACCOUNT_SID": "ACreal",
        "TWILIO_AUTH_TOKEN": "real-token",
        "TWILIO_FROM": "+15550001234",
    })
    assert (s.email.transport, s.email.sendgrid_api_key) == ("sendgrid", "real-key")
    assert s.email.sendgrid_base_url == "https://api.sendgrid.com"
    assert (s.sms.account_sid, s.sms.base_url) == ("ACreal", "https://api.twilio.com")
    assert s.push.base_url == "http://sim:9000"  # still unconfigured, so simulated


def test_simulator_smtp_takes_email_when_it_is_unconfigured() -> None:
    s = Settings.from_env({
        "NOTIFKIT_SIMULATOR_URL": "http://sim:9000",
        "NOTIFKIT_SIMULATOR_SMTP": "sim:2525",
    })
    assert (s.email.transport, s.email.smtp_url) == ("smtp", "smtp://sim:2525")
    assert s.sms.base_url == "http://sim:9000"


def test_email_transport_is_inferred_from_the_credential_set() -> None:
    assert Settings.from_env({"RESEND_API_KEY": "k"}).email.transport == "resend"
    assert Settings.from_env({"SENDGRID_API_KEY": "k"}).email.transport == "sendgrid"
    assert Settings.from_env({"SMTP_URL": "smtp://u:p@mail:25"}).email.transport == "smtp"


def test_fault_injection_is_off_by_default_and_names_are_checked() -> None:
    """The scenario suite's test-only faults: none unless NOTIFKIT_FAULT_INJECTION names them,
    and a misspelt one is an error rather than a silently unbroken guarantee."""
    from notifkit.config import ConfigError, Settings

    assert Settings.from_env({}).fault_injection == frozenset()
    settings = Settings.from_env({"NOTIFKIT_FAULT_INJECTION": "skip_reclaim, ack_before_process"})
    assert settings.injects("skip_reclaim")
    assert settings.injects("ack_before_process")
    assert not settings.injects("drop_idempotency_key")
    with pytest.raises(ConfigError, match="NOTIFKIT_FAULT_INJECTION"):
        Settings.from_env({"NOTIFKIT_FAULT_INJECTION": "skip_reclaims"})


def test_a_from_address_that_is_no_address_is_named() -> None:
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({"RESEND_API_KEY": "re_x", "EMAIL_FROM": "no-reply"})
    assert raised.value.variable == "EMAIL_FROM"
    named = Settings.from_env({"RESEND_API_KEY": "re_x", "EMAIL_FROM": "Acme <hi@acme.example>"})
    assert named.email.from_addr == "Acme <hi@acme.example>"


@pytest.mark.parametrize("from_addr", ["hi@acme.example\r\nBcc: all@victim.example",
                                       "Acme <hi@acme.example>\nX-Extra: 1",
                                       "Acme\x1b[2J <hi@acme.example>",
                                       "Acme\x00 <hi@acme.example>"])
@pytest.mark.parametrize("credential", [{"RESEND_API_KEY": "re_x"},
                                        {"SMTP_URL": "smtp://mail.example:25"},
                                        {"NOTIFKIT_SIMULATOR_URL": "http://127.0.0.1:8025"}])
def test_a_from_address_with_a_control_character_is_named(
    from_addr: str, credential: dict[str, str]
) -> None:
    # Its first line parses as an address, but every send with it would fail.
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({**credential, "EMAIL_FROM": from_addr})
    assert raised.value.variable == "EMAIL_FROM"


def test_a_slow_heartbeat_keeps_its_health_key_alive_between_beats() -> None:
    # Given beats a minute apart, the health key must outlive the gap between two of them
    slow = Settings.from_env({"HEARTBEAT_INTERVAL_SECONDS": "60"})
    assert slow.heartbeat_ttl_s > 2 * slow.heartbeat_interval_s
    assert Settings.from_env({"HEARTBEAT_INTERVAL_SECONDS": "1"}).heartbeat_ttl_s == 30
    with pytest.raises(ConfigError) as raised:
        Settings(heartbeat_interval_s=45.0)
    assert raised.value.variable == "HEARTBEAT_INTERVAL_SECONDS"


@pytest.mark.parametrize("transport", ["resend", "sendgrid"])
def test_an_email_transport_named_without_its_key_uses_the_simulator(transport: str) -> None:
    # Given only the simulator and the choice of provider
    s = Settings.from_env({"NOTIFKIT_SIMULATOR_URL": "http://127.0.0.1:8025/",
                           "EMAIL_TRANSPORT": transport})
    # Then that provider talks to the simulator with the placeholder key
    assert s.email.transport == transport
    key = s.email.resend_api_key if transport == "resend" else s.email.sendgrid_api_key
    base = s.email.resend_base_url if transport == "resend" else s.email.sendgrid_base_url
    assert key == SIMULATOR_PLACEHOLDER_KEY
    assert base == "http://127.0.0.1:8025"


def test_smtp_named_without_a_url_uses_the_smtp_simulator() -> None:
    s = Settings.from_env({"NOTIFKIT_SIMULATOR_SMTP": "127.0.0.1:2525", "EMAIL_TRANSPORT": "smtp"})
    assert (s.email.transport, s.email.smtp_url) == ("smtp", "smtp://127.0.0.1:2525")


def test_the_smtp_simulator_may_be_an_ipv6_address() -> None:
    s = Settings.from_env({"NOTIFKIT_SIMULATOR_SMTP": "[::1]:2525"})
    assert (s.email.transport, s.email.smtp_url) == ("smtp", "smtp://[::1]:2525")
    transport = SmtpTransport(url=s.email.smtp_url or "", from_addr=s.email.from_addr)
    assert (transport.hostname, transport.port) == ("::1", 2525)


def test_smtp_credentials_may_be_percent_encoded() -> None:
    s = Settings.from_env({"SMTP_URL": "smtp://us%40er:p%3As%2Fs@[::1]:2525"})
    transport = SmtpTransport(url=s.email.smtp_url or "", from_addr=s.email.from_addr)
    assert (transport.username, transport.password) == ("us@er", "p:s/s")
    assert (transport.hostname, transport.port) == ("::1", 2525)


def test_without_a_simulator_a_named_transport_still_needs_its_key() -> None:
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({"EMAIL_TRANSPORT": "sendgrid"})
    assert raised.value.variable == "SENDGRID_API_KEY"


def test_log_format_and_level_take_any_case() -> None:
    settings = Settings.from_env({"LOG_FORMAT": "TEXT", "LOG_LEVEL": "warning"})
    assert settings.log_format == "text"
    assert settings.log_level.upper() == "WARNING"


def test_links_follow_the_port_unless_a_public_url_is_set() -> None:
    assert Settings.from_env({}).public_url == "http://127.0.0.1:8080"
    assert Settings.from_env({"PORT": "18780"}).public_url == "http://127.0.0.1:18780"
    assert Settings.from_env({"PORT": "18780", "NOTIFKIT_PUBLIC_URL": "https://n.example.com"}
                             ).public_url == "https://n.example.com"
    # A port given in code or as --port wins over PORT, for the links too (they used to keep
    # pointing at 8080, or at PORT, while the API listened elsewhere)
    assert Settings.from_env({}, port=9080).public_url == "http://127.0.0.1:9080"
    assert Settings.from_env({"PORT": "7000"}, port=9080).public_url == "http://127.0.0.1:9080"
    assert Settings.from_env({"NOTIFKIT_PUBLIC_URL": "https://n.example.com"}, port=9080
                             ).public_url == "https://n.example.com"


def test_the_development_secret_is_flagged_outside_a_simulator_deployment() -> None:
    assert uses_development_secret(Settings.from_env({}))
    assert not uses_development_secret(
        Settings.from_env({"NOTIFKIT_SIMULATOR_URL": "http://127.0.0.1:8025"}))
    assert not uses_development_secret(
        Settings.from_env({"NOTIFKIT_SECRET": "a-real-secret-0123456789"}))


def test_a_usable_fcm_credentials_file_is_accepted_and_an_unusable_one_refused(
    tmp_path: Path,
) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"client_email": "n@p.iam.gserviceaccount.com",
                                "private_key": pem}))
    s = Settings.from_env({"FCM_PROJECT_ID": "p", "FCM_CREDENTIALS_FILE": str(good)})
    assert s.push.credentials_file == str(good)
    # Given in code too, not only through the environment.
    with pytest.raises(ConfigError) as refused:
        s.replace(push=dataclasses.replace(s.push, credentials_file=str(tmp_path / "none")))
    assert refused.value.variable == "FCM_CREDENTIALS_FILE"


@pytest.mark.parametrize("token_uri", ["https://", "https://:443/token", "oauth2.example/token",
                                       "https://[::1/token"])
def test_a_credentials_file_whose_token_uri_names_no_host_is_refused(
    tmp_path: Path, token_uri: str
) -> None:
    # "https://" passed (its scheme was all that was checked), and every push then failed to
    # fetch a token, retried until dead-lettered.
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    path = tmp_path / "fcm.json"
    path.write_text(json.dumps({"client_email": "n@p.iam.gserviceaccount.com",
                                "private_key": pem, "token_uri": token_uri}))
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"FCM_PROJECT_ID": "p", "FCM_CREDENTIALS_FILE": str(path)})
    assert refused.value.variable == "FCM_CREDENTIALS_FILE"
    assert "token_uri" in refused.value.problem


@pytest.mark.parametrize(("url", "expected"), [
    # What asyncpg reads itself, or sends to the server as a setting it knows, stays as given.
    ("postgresql://u:p%3Fw@db/app?sslmode=require&application_name=x&options=-c%20a%3Db",
     DatabaseDsn("postgresql://u:p%3Fw@db/app?sslmode=require&application_name=x"
                 "&options=-c%20a%3Db")),
    ("postgresql://db/app?connect_timeout=5", DatabaseDsn("postgresql://db/app", 5.0)),
    ("postgresql:///app?host=/run/pg&connect_timeout=0&sslmode=disable",
     DatabaseDsn("postgresql:///app?host=/run/pg&sslmode=disable", 0.0)),
    # libpq: zero or less waits for ever; the last of a repeated parameter counts.
    ("postgresql://db/app?connect_timeout=3&connect_timeout=-1", DatabaseDsn(
        "postgresql://db/app", 0.0)),
    ("postgresql://db/app?gssencmode=prefer&fallback_application_name=psql&channel_binding"
     "=disable", DatabaseDsn("postgresql://db/app")),
])
def test_libpq_parameters_become_what_asyncpg_understands(url: str,
                                                          expected: DatabaseDsn) -> None:
    assert database_dsn(url) == expected


@pytest.mark.parametrize("query", [
    "connect_timeout=", "connect_timeout=nan", "keepalives=0", "sslmode=require&hostaddr=::1",
    "gssencmode=require", "replication=true", "sslcrldir=/etc/crl",
])
def test_libpq_parameters_asyncpg_cannot_honour_are_refused(query: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"DATABASE_URL": f"postgresql://db/app?{query}"})
    assert refused.value.variable == "DATABASE_URL"
    assert query.rpartition("&")[2].partition("=")[0] in refused.value.problem


@pytest.mark.parametrize("query", [
    "sslmode=bogus", "sslmode=REQUIRE", "target_session_attrs=bogus",
    "sslmode=require&target_session_attrs=primary&target_session_attrs=writable",
])
def test_a_libpq_parameter_with_a_value_asyncpg_refuses_is_invalid_configuration(
    query: str,
) -> None:
    # Found only when connecting, these stopped the process as an unreachable PostgreSQL would
    # (status 1), one with "one of <built-in method values of mappingproxy object ...>".
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"DATABASE_URL": f"postgresql://db/app?{query}"})
    assert refused.value.variable == "DATABASE_URL"
    name, _, value = query.rpartition("&")[2].partition("=")
    assert f"{name}={value}" in refused.value.problem
    assert "built-in" not in refused.value.problem


@pytest.mark.parametrize("query", [
    "sslmode=disable", "sslmode=allow", "sslmode=prefer", "sslmode=require",
    "sslmode=verify-ca", "sslmode=verify-full", "sslmode=verify_full", "sslmode=",
    "target_session_attrs=any",
    "target_session_attrs=primary", "target_session_attrs=standby",
    "target_session_attrs=read-write", "target_session_attrs=read-only",
    "target_session_attrs=prefer-standby",
])
def test_every_value_asyncpg_takes_for_a_libpq_parameter_is_accepted(query: str) -> None:
    url = f"postgresql://db/app?{query}"
    assert Settings.from_env({"DATABASE_URL": url}).database_url == url


def test_several_email_providers_without_email_transport_take_resend_and_say_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Refusing the start here would stop deployments that set every provider's credentials
    # and have always run on the first; a warning names the setting that chooses.
    with caplog.at_level(logging.WARNING, logger="notifkit.config"):
        s = Settings.from_env({"RESEND_API_KEY": "re_k", "SENDGRID_API_KEY": "SG.k"})
    assert s.email.transport == "resend"
    [warning] = caplog.records
    assert warning.getMessage().startswith(
        "EMAIL_TRANSPORT is not set and RESEND_API_KEY and SENDGRID_API_KEY are: e-mail goes "
        "through resend")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="notifkit.config"):
        Settings.from_env({"EMAIL_TRANSPORT": "sendgrid", "RESEND_API_KEY": "re_k",
                           "SENDGRID_API_KEY": "SG.k"})
    assert caplog.records == []


def test_an_access_token_beside_a_credentials_file_is_used_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    path = tmp_path / "fcm.json"
    path.write_text(json.dumps({"client_email": "n@p.iam.gserviceaccount.com",
                                "private_key": pem}))
    with caplog.at_level(logging.WARNING, logger="notifkit.config"):
        s = Settings.from_env({"FCM_PROJECT_ID": "p", "FCM_ACCESS_TOKEN": "ya29.token",
                               "FCM_CREDENTIALS_FILE": str(path)})
    assert s.push.access_token == "ya29.token"
    assert any("FCM_ACCESS_TOKEN and FCM_CREDENTIALS_FILE are both set" in r.getMessage()
               for r in caplog.records)


def test_a_scheduler_poll_interval_past_the_lock_ttl_starts_with_a_warning_naming_both(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The lock is renewed only by a poll: polled less often than it lives, it lapses.
    with caplog.at_level(logging.WARNING, logger="notifkit.config"):
        s = Settings.from_env({"SCHEDULER_POLL_INTERVAL_SECONDS": "60",
                               "SCHEDULER_LOCK_TTL_SECONDS": "5"})
    assert s.scheduler_poll_interval_s == 60
    [warning] = caplog.records
    assert warning.getMessage().startswith(
        "SCHEDULER_POLL_INTERVAL_SECONDS (60.0) is not shorter than SCHEDULER_LOCK_TTL_SECONDS "
        "(5)")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="notifkit.config"):
        Settings.from_env({"SCHEDULER_POLL_INTERVAL_SECONDS": "4.9",
                           "SCHEDULER_LOCK_TTL_SECONDS": "5"})
    assert caplog.records == []


@pytest.mark.parametrize("path", ["/dev/zero", "big"])
def test_a_credentials_file_past_a_mebibyte_is_refused_unread(tmp_path: Path, path: str) -> None:
    # /dev/zero (or a log file named by mistake) was read whole at start, without end.
    if path == "big":
        big = tmp_path / "big.json"
        big.write_text(" " * (1024 * 1024) + "{}")
        path = str(big)
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"FCM_PROJECT_ID": "p", "FCM_CREDENTIALS_FILE": path})
    assert refused.value.variable == "FCM_CREDENTIALS_FILE"
    assert "larger than 1024 KiB" in refused.value.problem


def test_smtp_without_an_smtp_url_names_the_simulators_variable_too() -> None:
    # Beside NOTIFKIT_SIMULATOR_URL, which points every HTTP provider at the simulators, the
    # SMTP simulator needs a variable of its own; the message named only SMTP_URL.
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"EMAIL_TRANSPORT": "smtp",
                           "NOTIFKIT_SIMULATOR_URL": "http://127.0.0.1:8025"})
    assert refused.value.variable == "SMTP_URL"
    assert "NOTIFKIT_SIMULATOR_SMTP=host:port" in refused.value.problem


@pytest.mark.parametrize(("variable", "url"), [
    ("DATABASE_URL", "postgresql://app:s3cr3t-pw@db.example:99999/app"),
    ("DATABASE_URL", "mysql://app:s3cr3t-pw@db.example:5432/app"),
    ("DATABASE_URL", "postgresql://app:s3cr3t-pw@db.example:5432/a b"),
    ("DATABASE_URL", "postgresql://app:s3cr3t-pw@[::1/app"),
    ("DATABASE_URL", "postgresql://app@db.example:0/app?password=s3cr3t-pw&sslmode=require"),
    ("REDIS_URL", "redis://:s3cr3t-pw@cache.example:99999/0"),
    ("REDIS_URL", "redis://user:s3cr3t-pw@cache.example:6379/0?socket_timeout=-1"),
    ("REDIS_URL", "redis://user:s3cr3t-pw@cache.example:6379/0?bogus=1"),
    ("REDIS_URL", "http://user:s3cr3t-pw@cache.example:6379/0"),
    ("SMTP_URL", "smtp://mailer:s3cr3t-pw@mail.example:0"),
])
def test_a_refused_url_is_shown_without_its_password(variable: str, url: str) -> None:
    # The message is the process's one line at start, in every log collector: the URL it
    # shows must not carry the password the operator put in it.
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({variable: url})
    message = str(caught.value)
    assert message.startswith(variable)
    assert "s3cr3t-pw" not in message
    assert "***" in message


def test_a_password_with_a_slash_is_hidden_too() -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"DATABASE_URL": "postgresql://app:s3c/r#3t@db.example:99999/app"})
    assert "s3c" not in str(caught.value)
    assert "r#3t" not in str(caught.value)
    # A URL without a password is shown as given, port and all.
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"REDIS_URL": "redis://cache.example:99999/0"})
    assert "'redis://cache.example:99999/0'" in str(caught.value)


# Bytes that are no UTF-8, as os.environ hands them over (lone surrogates).
NOT_UTF8 = "abcdefghijklmnopqrs\udcff\udcfe"


@pytest.mark.parametrize(("variable", "extra"), [
    ("NOTIFKIT_SECRET", {}),
    ("TWILIO_AUTH_TOKEN", {"TWILIO_ACCOUNT_SID": "AC123", "TWILIO_FROM": "+15005550006"}),
    ("TWILIO_FROM", {"TWILIO_ACCOUNT_SID": "AC123", "TWILIO_AUTH_TOKEN": "token"}),
    ("RESEND_WEBHOOK_SECRET", {}),
    ("NOTIFKIT_ADMIN_KEY", {}),
    ("OPENAI_MODEL", {}),
])
def test_a_setting_holding_bytes_that_are_no_utf8_is_refused_naming_it(
        variable: str, extra: dict[str, str]) -> None:
    # NOTIFKIT_SECRET and the Twilio settings were taken as they were: every unsubscribe
    # link, outgoing webhook or SMS then failed on encoding them, after a silent start.
    with pytest.raises(ConfigError, match="not UTF-8") as info:
        Settings.from_env({variable: NOT_UTF8, **extra})
    assert info.value.variable == variable
    assert "\udcff" not in str(info.value)  # a secret is not shown, nor unprintable text


def test_a_credentials_file_name_may_hold_any_bytes() -> None:
    # A file name is the file system's bytes: refused because there is no such file, not for
    # its encoding.
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"FCM_PROJECT_ID": "p", "FCM_CREDENTIALS_FILE": "/nonexistent-\udcff"})
    assert info.value.variable == "FCM_CREDENTIALS_FILE"
    assert "UTF-8" not in str(info.value)


def test_a_secret_given_in_code_that_cannot_be_encoded_is_refused() -> None:
    with pytest.raises(ConfigError, match="UTF-8") as info:
        Settings(secret=NOT_UTF8)
    assert info.value.variable == "NOTIFKIT_SECRET"


def test_an_admin_key_longer_than_a_header_carries_is_refused() -> None:
    # 100,000 characters started, and every request sending the key was a 400 (the API reads
    # header lines up to 64 KiB): an admin key no client could use.
    Settings.from_env({"NOTIFKIT_ADMIN_KEY": "k" * 4096})
    with pytest.raises(ConfigError, match="at most 4,096 bytes") as info:
        Settings.from_env({"NOTIFKIT_ADMIN_KEY": "k" * 100_000})
    assert info.value.variable == "NOTIFKIT_ADMIN_KEY"
    with pytest.raises(ConfigError, match="at most 4,096 bytes"):
        Settings(admin_key="é" * 2049)  # 4,098 bytes in UTF-8


@pytest.mark.parametrize(("host", "hint"), [
    ("[::1]", "without brackets (::1)"),
    ("0.0.0.0:8080", "no port"),
    ("localhost:80", "no port"),
])
def test_a_host_in_url_form_is_refused_at_start(host: str, hint: str) -> None:
    # It started, migrated the schema, then failed at the bind as a name that does not
    # resolve: "cannot listen on [[::1]]:8080".
    with pytest.raises(ConfigError, match=re.escape(hint)) as info:
        Settings.from_env({"HOST": host})
    assert info.value.variable == "HOST"


@pytest.mark.parametrize("host", ["::1", "::", "fe80::1%lo", "0.0.0.0", "localhost"])
def test_a_bare_host_or_ipv6_address_is_taken(host: str) -> None:
    assert Settings.from_env({"HOST": host}).host == host


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0?db=-1",
                                 "redis://127.0.0.1:6379/?db=99999999999",
                                 "redis://127.0.0.1:6379/99999999999"])
def test_a_redis_database_number_no_redis_takes_is_refused_at_start(url: str) -> None:
    # The path form's -1 was refused at start, but ?db=-1 (and any number past what SELECT
    # takes) started and failed at the connection, with status 1 as if Redis were away.
    with pytest.raises(ConfigError, match="database number") as info:
        Settings.from_env({"REDIS_URL": url})
    assert info.value.variable == "REDIS_URL"


def test_a_redis_database_number_in_the_query_is_taken() -> None:
    assert Settings.from_env({"REDIS_URL": "redis://127.0.0.1:6379/?db=3"}).redis_url.endswith(
        "?db=3")
