"""Settings: one frozen dataclass built once from the environment and passed down.

Nothing else in notifkit reads ``os.environ``. Every value can also be given in code
(``Settings(...)`` or ``Settings.from_env(overrides)``). Invalid values raise
:class:`ConfigError`, whose message names the variable; the CLI turns it into one line on
stderr and exit status 2.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
import ipaddress
import logging
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from email.utils import parseaddr
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import unquote, unquote_plus, urlsplit

from notifkit.text import is_utf8

if TYPE_CHECKING:
    from notifkit.transports.fcm import ServiceAccount

log = logging.getLogger("notifkit.config")

SERVICES: tuple[str, ...] = (
    "api",
    "enricher",
    "engine",
    "delivery",
    "scheduler",
    "ai",
    "workflow",
    "events",
)
EMAIL_TRANSPORTS = ("resend", "sendgrid", "smtp")
LOG_FORMATS = ("json", "text")
# Test-only: guarantees the scenario suite breaks on purpose (NOTIFKIT_FAULT_INJECTION) to show
# that each scenario notices. Off unless that variable names them; never set it in production.
FAULT_INJECTIONS: dict[str, str] = {
    "ack_before_process": "the worker acks an entry as soon as it reads it, before processing",
    "skip_reclaim": "the reclaim sweep never takes over idle entries",
    "drop_idempotency_key": "transports send no idempotency key to the provider",
    "skip_failed_event": "dead-lettering emits no notification:failed event",
    "retry_malformed": "a malformed entry stays pending instead of being acked",
    "ignore_retry_after": "a 429's Retry-After is ignored: parked tasks come back at once",
    "keep_invalid_contacts": "contacts the provider calls invalid are not disabled",
    "skip_fallback": "a failed channel is retried instead of falling back to the next one",
    "ignore_priority": "workers fill their slots from the lowest-priority stream first",
    "unbounded_reads": "workers read far more than their free capacity",
    "scheduler_lock_forever": "the scheduler poll lock never expires, so no other scheduler "
                              "takes over from a dead one",
    "ignore_quiet_hours": "the engine sends at once into a user's quiet hours",
    "ignore_workflow_events": "custom events resolve no waiting workflow step",
    "ignore_workflow_locks": "a workflow instance's lock is taken even while another process "
                             "holds it",
    "unpublished_key_revocations": "a revoked key is dropped only by the API process that "
                                   "revoked it, not announced to the others",
    "ignore_outages": "a try that met a PostgreSQL outage counts against the entry's attempts "
                      "and the worker goes on reading and reclaiming, as after any failure",
}
# Every environment variable Settings.from_env reads: processes that start notifkit for a
# purpose of their own (scenarios, benchmarks) set these themselves and inherit none.
VARIABLES: Final = frozenset({
    "API_RATE_BURST", "API_RATE_PER_SECOND", "AUTO_MIGRATE", "DATABASE_URL",
    "DB_MAX_CONNECTIONS", "DB_SCHEMA", "EMAIL_FROM", "EMAIL_TRANSPORT",
    "ENRICHER_MAX_ATTEMPTS", "FCM_ACCESS_TOKEN", "FCM_BASE_URL", "FCM_CREDENTIALS_FILE",
    "FCM_PROJECT_ID", "FCM_WEBHOOK_SECRET", "HEARTBEAT_INTERVAL_SECONDS", "HOST",
    "IDEMPOTENCY_TTL_SECONDS", "LOG_FORMAT", "LOG_LEVEL", "MAX_ATTEMPTS", "MAX_BODY_BYTES",
    "NOTIFKIT_ADMIN_KEY", "NOTIFKIT_FAULT_INJECTION", "NOTIFKIT_NAMESPACE",
    "NOTIFKIT_PUBLIC_URL", "NOTIFKIT_SECRET", "NOTIFKIT_SERVICES", "NOTIFKIT_SIMULATOR_SMTP",
    "NOTIFKIT_SIMULATOR_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_MODEL", "PORT",
    "PROVIDER_RATE_LIMITS", "PROVIDER_TIMEOUT_SECONDS", "QUEUE_MAX_LEN",
    "RECLAIM_INTERVAL_SECONDS", "RECLAIM_MIN_IDLE_SECONDS", "RECONCILE_GRACE_SECONDS",
    "REDIS_URL", "RESEND_API_KEY",
    "RESEND_BASE_URL", "RESEND_WEBHOOK_SECRET", "SCHEDULER_LOCK_TTL_SECONDS",
    "SCHEDULER_POLL_INTERVAL_SECONDS", "SENDGRID_API_KEY", "SENDGRID_BASE_URL",
    "SENDGRID_WEBHOOK_PUBLIC_KEY", "SENDGRID_WEBHOOK_SECRET", "SHUTDOWN_GRACE_SECONDS",
    "SMTP_URL", "SMTP_WEBHOOK_SECRET",
    "THROTTLE_LIMIT", "THROTTLE_WINDOW_SECONDS", "TWILIO_ACCOUNT_SID", "TWILIO_AUTH_TOKEN",
    "TWILIO_BASE_URL", "TWILIO_FROM", "WEBHOOK_ALLOW_PRIVATE_NETWORKS", "WORKER_CONCURRENCY",
    "WORKFLOW_LOCK_TTL_SECONDS",
})
# NOTIFKIT_SECRET unset: fine against the simulators, public everywhere else.
DEVELOPMENT_SECRET: Final = "notifkit-development-secret"
# The longest admin key: one longer than the API reads in a header line (64 KiB) was taken at
# start, and every request sending it was refused as malformed. Common proxies stop at 8 KiB.
ADMIN_KEY_MAX_BYTES: Final = 4096
MAX_DURATION_S: Final = 10 * 365 * 24 * 3600
# Below this RECLAIM_MIN_IDLE_SECONDS a worker keeps no entry it works on from going idle, so
# every sweep (of any process) takes over what the others are working on.
KEEP_ALIVE_MIN_RECLAIM_IDLE_S: Final = 0.03
MAX_REDIS_INT: Final = 2**63 - 1
MIN_PROVIDER_RATE: Final = 0.001
# Upper bounds for sizes that are allocated or sent to Redis as counts: beyond them a value is a
# typo, and it would fail only later (XREADGROUP refuses a COUNT past 64 bits, so every worker
# logs a failed read forever; asyncpg sets up every slot of a pool when it creates it).
MAX_WORKER_CONCURRENCY: Final = 1_000_000
# An entry retried this often has long been a poison message: the retry cycle is one reclaim
# a minute by default, and a larger limit only keeps it from the DLQ (and people) longer.
MAX_ATTEMPTS_LIMIT: Final = 1_000
MAX_DB_CONNECTIONS: Final = 10_000
# The API holds a whole body in memory, decoded too; and past 2**63 bytes zlib cannot be told
# how much to inflate, so every compressed request failed with a 500.
MAX_BODY_BYTES_LIMIT: Final = 1024**3
# A worker's health key lives this many heartbeat intervals (at least the 30 s default).
HEARTBEAT_TTL_BEATS: Final = 4
_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}\Z")
_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_.:-]{0,64}\Z")
_PATH_SEGMENT_RE = re.compile(r"^(?!\.\.?\Z)[A-Za-z0-9_.-]+\Z")
# host:port, the host a name or a bracketed IPv6 address; the port in ASCII digits, since the
# value becomes SMTP_URL, whose port takes no others.
_HOST_PORT_RE = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[^:\s\[\]/@]+):(?P<port>[0-9]{1,5})\Z")


# Every setting with an environment variable that code may give too (``Settings(...)``,
# ``NotifkitServer(...)``): its variable, and for numbers the type and least value the
# environment allows, so a value given in code is refused by the same rules, naming the same
# variable (a string where a number belongs raised a bare TypeError; "false" for a flag was
# taken as true).
_NUMBERS: Final[dict[str, tuple[str, type, float]]] = {
    "worker_concurrency": ("WORKER_CONCURRENCY", int, 1),
    "queue_max_len": ("QUEUE_MAX_LEN", int, 1),
    "idempotency_ttl_s": ("IDEMPOTENCY_TTL_SECONDS", int, 1),
    "reclaim_interval_s": ("RECLAIM_INTERVAL_SECONDS", float, 0.01),
    "reclaim_min_idle_s": ("RECLAIM_MIN_IDLE_SECONDS", float, 0.0),
    "max_attempts": ("MAX_ATTEMPTS", int, 1),
    "enricher_max_attempts": ("ENRICHER_MAX_ATTEMPTS", int, 1),
    "db_max_connections": ("DB_MAX_CONNECTIONS", int, 1),
    "port": ("PORT", int, 0),
    "provider_timeout_s": ("PROVIDER_TIMEOUT_SECONDS", float, 0.001),
    "max_body_bytes": ("MAX_BODY_BYTES", int, 1),
    "api_rate_per_second": ("API_RATE_PER_SECOND", float, 0.001),
    "api_rate_burst": ("API_RATE_BURST", int, 1),
    "throttle_limit": ("THROTTLE_LIMIT", int, 0),
    "throttle_window_s": ("THROTTLE_WINDOW_SECONDS", int, 1),
    "scheduler_poll_interval_s": ("SCHEDULER_POLL_INTERVAL_SECONDS", float, 0.01),
    "scheduler_lock_ttl_s": ("SCHEDULER_LOCK_TTL_SECONDS", int, 1),
    "reconcile_grace_s": ("RECONCILE_GRACE_SECONDS", float, 1.0),
    "workflow_lock_ttl_s": ("WORKFLOW_LOCK_TTL_SECONDS", int, 1),
    "heartbeat_interval_s": ("HEARTBEAT_INTERVAL_SECONDS", float, 0.1),
    "shutdown_grace_s": ("SHUTDOWN_GRACE_SECONDS", float, 0.0),
}
# Whole numbers no variable sets, since their defaults serve every deployment, that code may
# still give: named by their field, with the least and most each takes.
_CODE_NUMBERS: Final[dict[str, tuple[int, int]]] = {
    "caller_idempotency_ttl_s": (1, MAX_DURATION_S),
    "attempts_ttl_s": (1, MAX_DURATION_S),
    "heartbeat_ttl_s": (1, MAX_DURATION_S),
    # XREADGROUP's BLOCK: 0 would wait for an entry forever, deaf to a stop.
    "read_block_ms": (1, MAX_DURATION_S * 1000),
}
_TEXTS: Final = {
    "redis_url": "REDIS_URL", "database_url": "DATABASE_URL",
    "namespace": "NOTIFKIT_NAMESPACE", "db_schema": "DB_SCHEMA", "host": "HOST",
    "secret": "NOTIFKIT_SECRET", "public_url": "NOTIFKIT_PUBLIC_URL",
    "log_format": "LOG_FORMAT", "log_level": "LOG_LEVEL",
}
_FLAGS: Final = {
    "auto_migrate": "AUTO_MIGRATE",
    "webhook_allow_private_networks": "WEBHOOK_ALLOW_PRIVATE_NETWORKS",
}
_OPTIONAL_TEXTS: Final = {
    "admin_key": "NOTIFKIT_ADMIN_KEY", "simulator_url": "NOTIFKIT_SIMULATOR_URL",
    "simulator_smtp": "NOTIFKIT_SIMULATOR_SMTP",
}


class ConfigError(ValueError):
    """A setting is missing or invalid; ``variable`` names it as the environment spells it."""

    def __init__(self, variable: str, problem: str) -> None:
        super().__init__(f"{variable}: {problem}")
        self.variable = variable
        self.problem = problem


# Where the address the api binds comes from, said in a failure to bind it.
ADDRESS_SETTINGS: Final = "(HOST:PORT)"


def port_given_as(exc: ConfigError, option: str) -> ConfigError:
    """``exc``, about PORT, for a port given as ``option`` (``--port``): named so, and without
    saying the address came from HOST:PORT, since PORT, which the user may never have set, did
    not take part."""
    if option == "PORT":
        return exc
    return ConfigError(option, exc.problem.replace(f" {ADDRESS_SETTINGS}", ""))


class UnknownArgument(ConfigError, TypeError):
    """A keyword argument that names no setting: a ``ConfigError`` naming it, and still the
    ``TypeError`` Python raises for any function's unknown keyword."""


@dataclass(frozen=True)
class EmailSettings:
    transport: str | None = None  # resend | sendgrid | smtp; None = email disabled
    from_addr: str = "notifkit <no-reply@notifkit.local>"
    resend_api_key: str | None = None
    resend_base_url: str = "https://api.resend.com"
    sendgrid_api_key: str | None = None
    sendgrid_base_url: str = "https://api.sendgrid.com"
    smtp_url: str | None = None


@dataclass(frozen=True)
class SmsSettings:
    account_sid: str | None = None
    auth_token: str | None = None
    from_number: str | None = None
    base_url: str = "https://api.twilio.com"

    @property
    def enabled(self) -> bool:
        return bool(self.account_sid and self.auth_token)


@dataclass(frozen=True)
class PushSettings:
    project_id: str | None = None
    access_token: str | None = None
    credentials_file: str | None = None
    base_url: str = "https://fcm.googleapis.com"

    @property
    def enabled(self) -> bool:
        return bool(self.project_id and (self.access_token or self.credentials_file))

    @functools.cached_property
    def account(self) -> ServiceAccount | None:
        """The service account in ``credentials_file``, read, parsed and made to sign on first
        use only: the settings are validated again on every copy (``Settings.replace``), which
        keeps this object, and the FCM transport takes the same account. A file that cannot
        serve is a ConfigError naming FCM_CREDENTIALS_FILE, and stays unremembered."""
        if not self.credentials_file:
            return None
        from notifkit.transports.fcm import ServiceAccount

        return ServiceAccount.load(self.credentials_file)


@dataclass(frozen=True)
class AiSettings:
    api_key: str | None = None
    base_url: str = "https://api.openai.com/v1"
    model: str = "gpt-4o-mini"

    @property
    def enabled(self) -> bool:
        return bool(self.api_key)


@dataclass(frozen=True)
class WebhookSecrets:
    """Secrets that verify provider callbacks (``POST /v1/webhooks/{provider}/{projectId}``)."""

    resend: str | None = None
    sendgrid: str | None = None
    fcm: str | None = None
    smtp: str | None = None
    twilio_auth_token: str | None = None
    # SendGrid's own Signed Event Webhook (ECDSA): its verification key, base64 or PEM.
    sendgrid_public_key: str | None = None


# The settings that group a transport's variables: given in code, each must be its class (an
# int or a dict failed later with an AttributeError that named nothing).
_SECTIONS: Final[dict[str, type]] = {"email": EmailSettings, "sms": SmsSettings,
                                     "push": PushSettings, "ai": AiSettings,
                                     "webhooks": WebhookSecrets}


# Each section field's variable: a value of the wrong type given in code is named by it (an int
# for OPENAI_MODEL was an AttributeError that named nothing; one for TWILIO_FROM failed every
# send).
_SECTION_VARIABLES: Final[dict[str, dict[str, str]]] = {
    "email": {"transport": "EMAIL_TRANSPORT", "from_addr": "EMAIL_FROM",
              "resend_api_key": "RESEND_API_KEY", "resend_base_url": "RESEND_BASE_URL",
              "sendgrid_api_key": "SENDGRID_API_KEY", "sendgrid_base_url": "SENDGRID_BASE_URL",
              "smtp_url": "SMTP_URL"},
    "sms": {"account_sid": "TWILIO_ACCOUNT_SID", "auth_token": "TWILIO_AUTH_TOKEN",
            "from_number": "TWILIO_FROM", "base_url": "TWILIO_BASE_URL"},
    "push": {"project_id": "FCM_PROJECT_ID", "access_token": "FCM_ACCESS_TOKEN",
             "credentials_file": "FCM_CREDENTIALS_FILE", "base_url": "FCM_BASE_URL"},
    "ai": {"api_key": "OPENAI_API_KEY", "base_url": "OPENAI_BASE_URL", "model": "OPENAI_MODEL"},
    "webhooks": {"resend": "RESEND_WEBHOOK_SECRET", "sendgrid": "SENDGRID_WEBHOOK_SECRET",
                 "fcm": "FCM_WEBHOOK_SECRET", "smtp": "SMTP_WEBHOOK_SECRET",
                 "twilio_auth_token": "TWILIO_AUTH_TOKEN",
                 "sendgrid_public_key": "SENDGRID_WEBHOOK_PUBLIC_KEY"},
}


def _check_sections(values: Mapping[str, Any]) -> None:
    for name, cls in _SECTIONS.items():
        if name not in values:
            continue
        section = values[name]
        if not isinstance(section, cls):
            raise ConfigError(name, f"must be an instance of {cls.__name__}, got {section!r}")
        for member in dataclasses.fields(cls):
            value = getattr(section, member.name)
            # A field whose default is None may be left unset; the others are always text.
            if not (isinstance(value, str) or (value is None and member.default is None)):
                variable = _SECTION_VARIABLES[name].get(member.name, f"{name}.{member.name}")
                raise ConfigError(variable, f"must be a string, got {value!r}")


# The Svix-signed providers' secrets, by the variable that sets each.
SVIX_SECRET_VARIABLES = {"resend": "RESEND_WEBHOOK_SECRET", "sendgrid": "SENDGRID_WEBHOOK_SECRET",
                         "fcm": "FCM_WEBHOOK_SECRET", "smtp": "SMTP_WEBHOOK_SECRET"}


def svix_key(secret: str) -> bytes:
    """The HMAC key of a Svix-style webhook secret: the base64 after ``whsec_``, else the
    secret's own bytes. ValueError for a ``whsec_`` secret that does not go on in base64."""
    if not secret.startswith("whsec_"):
        return secret.encode()
    try:
        key = base64.b64decode(secret[len("whsec_"):], validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if not key:
        raise ValueError("must go on in base64 after whsec_, as a Svix secret does")
    return key


def svix_keys(secret: str) -> list[bytes]:
    """The keys a signature made with `secret` may use: ``svix_key``'s, and for a secret
    without ``whsec_`` also its base64 reading, since the official svix libraries (which a
    sender may sign with) base64-decode a secret whether or not it has the prefix."""
    keys = [svix_key(secret)]
    if not secret.startswith("whsec_"):
        try:
            decoded = base64.b64decode(secret)  # lenient, as the svix libraries decode
        except (binascii.Error, ValueError):
            decoded = b""
        if decoded and decoded != keys[0]:
            keys.append(decoded)
    return keys


@dataclass(frozen=True)
class Settings:
    redis_url: str = "redis://127.0.0.1:6379/0"
    database_url: str = "postgresql://postgres@127.0.0.1:5432/postgres"
    services: tuple[str, ...] = SERVICES
    namespace: str = ""
    worker_concurrency: int = 50
    queue_max_len: int = 10_000_000
    idempotency_ttl_s: int = 3600
    caller_idempotency_ttl_s: int = 24 * 3600
    reclaim_interval_s: float = 60.0
    reclaim_min_idle_s: float = 60.0
    max_attempts: int = 3
    enricher_max_attempts: int = 5
    attempts_ttl_s: int = 2 * 3600
    heartbeat_interval_s: float = 5.0
    heartbeat_ttl_s: int = 30
    read_block_ms: int = 1000
    shutdown_grace_s: float = 10.0
    db_max_connections: int = 2
    db_schema: str = "public"
    auto_migrate: bool = True
    host: str = "0.0.0.0"
    port: int = 8080
    admin_key: str | None = None
    secret: str = DEVELOPMENT_SECRET
    public_url: str = "http://127.0.0.1:8080"
    provider_timeout_s: float = 10.0
    max_body_bytes: int = 1024 * 1024
    api_rate_per_second: float = 100.0
    api_rate_burst: int = 200
    throttle_limit: int = 0  # 0 = no per-user throttle unless a project sets one
    throttle_window_s: int = 3600
    scheduler_poll_interval_s: float = 0.5
    scheduler_lock_ttl_s: int = 30
    # How long a notification may stay accepted with nothing more on its timeline before the
    # poll lock holder checks its stream for it (notifkit/reconcile.py).
    reconcile_grace_s: float = 300.0
    workflow_lock_ttl_s: int = 60
    # provider -> sends per second across every delivery process (PROVIDER_RATE_LIMITS); 0 = no
    # bucket. Unset providers use their documented rate (transports/registry.py).
    provider_rates: Mapping[str, float] = field(default_factory=dict)
    simulator_url: str | None = None
    simulator_smtp: str | None = None
    log_format: str = "json"
    log_level: str = "INFO"
    email: EmailSettings = field(default_factory=EmailSettings)
    sms: SmsSettings = field(default_factory=SmsSettings)
    push: PushSettings = field(default_factory=PushSettings)
    ai: AiSettings = field(default_factory=AiSettings)
    webhooks: WebhookSecrets = field(default_factory=WebhookSecrets)
    # Off, webhook contacts may reach only public addresses (notifkit/destinations.py): a
    # tenant's URL must not make notifkit call the deployment's own network.
    webhook_allow_private_networks: bool = False
    # Test-only (see FAULT_INJECTIONS): names of guarantees to break on purpose. Empty = none.
    fault_injection: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        _validate(self)

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    def derive(self, **changes: Any) -> Settings:
        """:meth:`replace`, then derived as :meth:`from_env` derives its values: a simulator
        given here points the transports not otherwise configured at it, and a port given here
        moves the links' URL when it was the default one of the old port."""
        if ("port" in changes and "public_url" not in changes
                and self.public_url == _local_url(self.port)):
            changes["public_url"] = _local_url(changes["port"] or Settings.port)
        settings = self.replace(**changes)
        if "simulator_url" in changes or "simulator_smtp" in changes:
            settings = _apply_simulator(settings, {})
        return settings

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, **overrides: Any
    ) -> Settings:
        """Build settings from ``env`` (default ``os.environ``); ``overrides`` win."""
        import os

        source = os.environ if env is None else env
        values = _read_env(source)
        values.update(overrides)
        _check_sections(values)  # before _simulated_email reads the email section
        if "public_url" not in values and values.get("port"):
            # Unset, links point at this machine's API, on the port it was told to listen on:
            # PORT, or the port given in code or as --port, which wins over PORT.
            values["public_url"] = _local_url(values["port"])
        values["email"] = _simulated_email(values, source)
        return _apply_simulator(cls(**values), source)

    def injects(self, fault: str) -> bool:
        """Whether the test-only fault ``fault`` (a FAULT_INJECTIONS name) is switched on."""
        return fault in self.fault_injection

    def max_attempts_for(self, service: str) -> int:
        return self.enricher_max_attempts if service == "enricher" else self.max_attempts


def _local_url(port: int) -> str:
    """The links' URL when NOTIFKIT_PUBLIC_URL is unset: this machine's API on ``port``."""
    return f"http://127.0.0.1:{port}"


# Addresses that listen on every interface: this machine reaches them on its loopback.
WILDCARD_HOSTS: Final = frozenset({"0.0.0.0", "::", ""})


def local_url(host: str, port: int) -> str:
    """Where this machine reaches an API listening on ``host``:``port`` (an IPv6 address in
    brackets); one listening on every interface on 127.0.0.1."""
    dial = "127.0.0.1" if host in WILDCARD_HOSTS else host
    return f"http://[{dial}]:{port}" if ":" in dial else f"http://{dial}:{port}"


# ---------------------------------------------------------------------------
# Reading the environment


# Settings whose value may be any bytes: a file name is the file system's, not text.
_BYTES_ALLOWED = frozenset({"FCM_CREDENTIALS_FILE"})


def _get(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    if value is None:
        return None
    value = value.strip()
    if name not in _BYTES_ALLOWED and not is_utf8(value):
        # Python keeps bytes that are no UTF-8 as lone surrogates, which every later
        # .encode() refuses: NOTIFKIT_SECRET or TWILIO_AUTH_TOKEN failed each signing or send
        # that used them, long after a start that said nothing. The value is not shown: it
        # may be a secret, and it cannot be printed as it is.
        raise ConfigError(name, "holds bytes that are not UTF-8 text (set it in UTF-8, or "
                          "in ASCII)")
    return value or None


def _is_ipv6_address(host: str) -> bool:
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return False
    return True


def _int(env: Mapping[str, str], name: str, minimum: int = 0) -> int | None:
    raw = _get(env, name)
    if raw is None:
        return None
    try:
        # int() and float() read any script's digits (full-width '８０' is 80); a URL's port
        # takes only 0-9, and so does every number here.
        # int() also reads "5_0" as 50 and "+5" as 5: digits 0-9 only (a minus is read, to
        # be refused as below the least value).
        if not raw.isascii() or "_" in raw or raw.startswith("+"):
            raise ValueError(raw)
        value = int(raw)
    except ValueError:
        raise ConfigError(name, f"must be a whole number, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(name, f"must be at least {minimum}, got {value}")
    return value


def _float(env: Mapping[str, str], name: str, minimum: float = 0.0) -> float | None:
    raw = _get(env, name)
    if raw is None:
        return None
    try:
        if not raw.isascii() or "_" in raw or raw.startswith("+"):  # as in _int
            raise ValueError(raw)
        value = float(raw)
    except ValueError:
        raise ConfigError(name, f"must be a number, got {raw!r}") from None
    if not math.isfinite(value):  # inf would overflow every timer that takes milliseconds
        raise ConfigError(name, f"must be a finite number, got {raw!r}")
    if not value >= minimum:  # also rejects NaN
        raise ConfigError(name, f"must be at least {minimum}, got {raw}")
    return value


def _bool(env: Mapping[str, str], name: str) -> bool | None:
    raw = _get(env, name)
    if raw is None:
        return None
    lowered = raw.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigError(name, f"must be true or false, got {raw!r}")


def parse_services(raw: str, variable: str = "NOTIFKIT_SERVICES") -> tuple[str, ...]:
    """``"all"`` or a comma-separated list of service names, in canonical order."""
    parts = [part.strip().lower() for part in raw.split(",")]
    names = [part for part in parts if part]
    if not names:
        raise ConfigError(variable, "names no service; use 'all' or e.g. 'api,delivery'")
    # An empty entry (api,,delivery or a trailing comma) is most likely a name left out, a
    # variable that expanded to nothing, say: running the others alone would say nothing.
    if len(names) < len(parts):
        raise ConfigError(variable, f"has an empty entry in {raw.strip()!r}; give the names "
                          "separated by single commas")
    # A name given twice is most likely a slip for another service (api,api for api,engine):
    # running the one once would leave the other unrun without a word.
    twice = _named_twice(names)
    if twice is not None:
        raise ConfigError(variable, f"names {twice!r} twice")
    unknown = [name for name in names if name not in SERVICES and name != "all"]
    if unknown:
        raise ConfigError(
            variable,
            f"unknown service {unknown[0]!r}; choose from all, {', '.join(SERVICES)}",
        )
    if "all" in names:
        if len(names) > 1:
            # api,all ran every service without a word, whatever the other names meant
            # (all but those, say): all names each service already, so it stands alone.
            raise ConfigError(variable, "names 'all' with other services; 'all' already "
                              "runs every service: give it alone, or list the services")
        return SERVICES
    return tuple(name for name in SERVICES if name in names)


def _named_twice(names: Iterable[str]) -> str | None:
    """The first name that comes again in ``names``, else None."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            return name
        seen.add(name)
    return None


def _read_env(env: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}

    def put(key: str, value: Any) -> None:
        if value is not None:
            values[key] = value

    put("redis_url", _get(env, "REDIS_URL"))
    put("database_url", _get(env, "DATABASE_URL"))
    services = _get(env, "NOTIFKIT_SERVICES")
    if services is not None:
        values["services"] = parse_services(services)
    namespace = env.get("NOTIFKIT_NAMESPACE")
    if namespace is not None:
        values["namespace"] = namespace.strip()
    put("worker_concurrency", _int(env, "WORKER_CONCURRENCY", 1))
    put("queue_max_len", _int(env, "QUEUE_MAX_LEN", 1))
    put("idempotency_ttl_s", _int(env, "IDEMPOTENCY_TTL_SECONDS", 1))
    put("reclaim_interval_s", _float(env, "RECLAIM_INTERVAL_SECONDS", 0.01))
    put("reclaim_min_idle_s", _float(env, "RECLAIM_MIN_IDLE_SECONDS", 0.0))
    put("max_attempts", _int(env, "MAX_ATTEMPTS", 1))
    put("enricher_max_attempts", _int(env, "ENRICHER_MAX_ATTEMPTS", 1))
    put("db_max_connections", _int(env, "DB_MAX_CONNECTIONS", 1))
    put("db_schema", _get(env, "DB_SCHEMA"))
    put("auto_migrate", _bool(env, "AUTO_MIGRATE"))
    put("webhook_allow_private_networks", _bool(env, "WEBHOOK_ALLOW_PRIVATE_NETWORKS"))
    put("host", _get(env, "HOST"))
    put("port", _int(env, "PORT", 0))
    put("admin_key", _get(env, "NOTIFKIT_ADMIN_KEY"))
    put("secret", _get(env, "NOTIFKIT_SECRET"))
    put("public_url", _get(env, "NOTIFKIT_PUBLIC_URL"))
    put("provider_timeout_s", _float(env, "PROVIDER_TIMEOUT_SECONDS", 0.001))
    put("max_body_bytes", _int(env, "MAX_BODY_BYTES", 1))
    put("api_rate_per_second", _float(env, "API_RATE_PER_SECOND", 0.001))
    put("api_rate_burst", _int(env, "API_RATE_BURST", 1))
    put("throttle_limit", _int(env, "THROTTLE_LIMIT", 0))
    put("throttle_window_s", _int(env, "THROTTLE_WINDOW_SECONDS", 1))
    put("scheduler_poll_interval_s", _float(env, "SCHEDULER_POLL_INTERVAL_SECONDS", 0.01))
    put("scheduler_lock_ttl_s", _int(env, "SCHEDULER_LOCK_TTL_SECONDS", 1))
    put("reconcile_grace_s", _float(env, "RECONCILE_GRACE_SECONDS", 1.0))
    put("workflow_lock_ttl_s", _int(env, "WORKFLOW_LOCK_TTL_SECONDS", 1))
    heartbeat_interval_s = _float(env, "HEARTBEAT_INTERVAL_SECONDS", 0.1)
    if heartbeat_interval_s is not None:
        values["heartbeat_interval_s"] = heartbeat_interval_s
        # The health key must outlive the gap between two beats, or a live worker vanishes
        # from /health between them: a few beats, never less than the default. Past the
        # longest duration the interval is refused by _validate, naming it; four beats of
        # 1e308 s were an infinite TTL, and ceil() of it an OverflowError traceback.
        if heartbeat_interval_s <= MAX_DURATION_S:
            values["heartbeat_ttl_s"] = max(
                Settings.heartbeat_ttl_s, math.ceil(HEARTBEAT_TTL_BEATS * heartbeat_interval_s))
    put("shutdown_grace_s", _float(env, "SHUTDOWN_GRACE_SECONDS", 0.0))
    put("simulator_url", _get(env, "NOTIFKIT_SIMULATOR_URL"))
    put("simulator_smtp", _get(env, "NOTIFKIT_SIMULATOR_SMTP"))
    log_format = _get(env, "LOG_FORMAT")
    if log_format is not None:
        values["log_format"] = log_format.lower()  # as LOG_LEVEL, whatever the case
    put("log_level", _get(env, "LOG_LEVEL"))
    rates = _get(env, "PROVIDER_RATE_LIMITS")
    if rates is not None:
        values["provider_rates"] = _provider_rates(rates)
    faults = _get(env, "NOTIFKIT_FAULT_INJECTION")
    if faults is not None:
        values["fault_injection"] = frozenset(
            part.strip() for part in faults.split(",") if part.strip())

    email = EmailSettings()
    values["email"] = dataclasses.replace(
        email,
        transport=_email_transport(env),
        from_addr=_get(env, "EMAIL_FROM") or email.from_addr,
        resend_api_key=_get(env, "RESEND_API_KEY"),
        resend_base_url=_get(env, "RESEND_BASE_URL") or email.resend_base_url,
        sendgrid_api_key=_get(env, "SENDGRID_API_KEY"),
        sendgrid_base_url=_get(env, "SENDGRID_BASE_URL") or email.sendgrid_base_url,
        smtp_url=_get(env, "SMTP_URL"),
    )
    sms = SmsSettings()
    values["sms"] = SmsSettings(
        account_sid=_get(env, "TWILIO_ACCOUNT_SID"),
        auth_token=_get(env, "TWILIO_AUTH_TOKEN"),
        from_number=_get(env, "TWILIO_FROM"),
        base_url=_get(env, "TWILIO_BASE_URL") or sms.base_url,
    )
    push = PushSettings()
    values["push"] = PushSettings(
        project_id=_get(env, "FCM_PROJECT_ID"),
        access_token=_get(env, "FCM_ACCESS_TOKEN"),
        credentials_file=_get(env, "FCM_CREDENTIALS_FILE"),
        base_url=_get(env, "FCM_BASE_URL") or push.base_url,
    )
    ai = AiSettings()
    values["ai"] = AiSettings(
        api_key=_get(env, "OPENAI_API_KEY"),
        base_url=_get(env, "OPENAI_BASE_URL") or ai.base_url,
        model=_get(env, "OPENAI_MODEL") or ai.model,
    )
    values["webhooks"] = WebhookSecrets(
        resend=_get(env, "RESEND_WEBHOOK_SECRET"),
        sendgrid=_get(env, "SENDGRID_WEBHOOK_SECRET"),
        fcm=_get(env, "FCM_WEBHOOK_SECRET"),
        smtp=_get(env, "SMTP_WEBHOOK_SECRET"),
        twilio_auth_token=_get(env, "TWILIO_AUTH_TOKEN"),
        sendgrid_public_key=_get(env, "SENDGRID_WEBHOOK_PUBLIC_KEY"),
    )
    return values


def _email_transport(env: Mapping[str, str]) -> str | None:
    """EMAIL_TRANSPORT, else inferred from whichever provider credential is set."""
    explicit = _get(env, "EMAIL_TRANSPORT")
    if explicit is not None:
        return explicit.lower()
    given = [(variable, name) for variable, name in (
        ("RESEND_API_KEY", "resend"), ("SENDGRID_API_KEY", "sendgrid"), ("SMTP_URL", "smtp"))
        if _get(env, variable) is not None]
    if len(given) > 1:
        # The first in a fixed order is taken, as before, but not without a word: the operator
        # may have meant another. (A start refused here would stop deployments that set every
        # provider's credentials and always ran on Resend.)
        log.warning("EMAIL_TRANSPORT is not set and %s are: e-mail goes through %s; set "
                    "EMAIL_TRANSPORT (resend, sendgrid or smtp) to choose.",
                    " and ".join(v for v, _ in given), given[0][1],
                    extra={"setting": "EMAIL_TRANSPORT"})
    return given[0][1] if given else None


SIMULATOR_PLACEHOLDER_KEY = "sim-placeholder-key"


def _simulated_email(values: Mapping[str, Any], env: Mapping[str, str]) -> EmailSettings:
    """An EMAIL_TRANSPORT chosen without its credential talks to the simulators when they are
    configured (before validation, which would otherwise demand the credential)."""
    email: EmailSettings = values.get("email") or EmailSettings()
    base = values.get("simulator_url")
    smtp = values.get("simulator_smtp")
    if base and email.transport == "resend" and not email.resend_api_key:
        return dataclasses.replace(
            email, resend_api_key=SIMULATOR_PLACEHOLDER_KEY,
            resend_base_url=_get(env, "RESEND_BASE_URL") or str(base).rstrip("/"))
    if base and email.transport == "sendgrid" and not email.sendgrid_api_key:
        return dataclasses.replace(
            email, sendgrid_api_key=SIMULATOR_PLACEHOLDER_KEY,
            sendgrid_base_url=_get(env, "SENDGRID_BASE_URL") or str(base).rstrip("/"))
    if smtp and email.transport == "smtp" and not email.smtp_url:
        return dataclasses.replace(email, smtp_url=f"smtp://{smtp}")
    return email


def _apply_simulator(settings: Settings, env: Mapping[str, str]) -> Settings:
    """Point every transport that is not otherwise configured at the simulators.

    An explicitly set ``*_BASE_URL`` still wins, so one provider can be real while the rest
    are simulated.
    """
    base = settings.simulator_url
    smtp = settings.simulator_smtp
    if not base and not smtp:
        return settings
    email, sms, push, ai = settings.email, settings.sms, settings.push, settings.ai
    webhooks = settings.webhooks

    def url(variable: str, default: str) -> str:
        return _get(env, variable) or default

    if base:
        base = base.rstrip("/")
        if email.transport is None and not email.smtp_url and not smtp:
            email = dataclasses.replace(
                email,
                transport="resend",
                resend_api_key=email.resend_api_key or SIMULATOR_PLACEHOLDER_KEY,
                resend_base_url=url("RESEND_BASE_URL", base),
            )
        if not sms.enabled:
            sms = SmsSettings(
                account_sid="AC" + "0" * 32,
                auth_token=SIMULATOR_PLACEHOLDER_KEY,
                from_number=sms.from_number or "+15005550006",
                base_url=url("TWILIO_BASE_URL", base),
            )
            # Twilio signs status callbacks with the auth token: the simulator's too.
            if webhooks.twilio_auth_token is None:
                webhooks = dataclasses.replace(
                    webhooks, twilio_auth_token=SIMULATOR_PLACEHOLDER_KEY
                )
        if not push.enabled:
            push = PushSettings(
                project_id="notifkit-sim",
                access_token=SIMULATOR_PLACEHOLDER_KEY,
                base_url=url("FCM_BASE_URL", base),
            )
        if not ai.enabled:
            ai = AiSettings(api_key=SIMULATOR_PLACEHOLDER_KEY,
                            base_url=url("OPENAI_BASE_URL", base + "/v1"), model=ai.model)
    if smtp and email.transport is None:
        email = dataclasses.replace(email, transport="smtp", smtp_url=f"smtp://{smtp}")
    return settings.replace(email=email, sms=sms, push=push, ai=ai, webhooks=webhooks)


# ---------------------------------------------------------------------------
# Validation: every message names the environment variable.


# A URL's password, in its user part or as libpq's ``password=`` parameter.
_QUERY_PASSWORD = re.compile(r"([?&](?:ssl)?password=)[^&#]*", re.IGNORECASE)


def _shown(value: str) -> str:
    """``value`` quoted for an error message, its password replaced by ``***``: the message is
    the process's one line at start and lands in every log collector, and an operator who
    mistyped DATABASE_URL's port must not publish its password with it. Done on the raw
    text, since the URLs shown here are often ones ``urlsplit`` refuses."""
    scheme, sep, rest = value.partition("://")
    if sep:
        # The user part ends at the last '@' before the path, query or fragment; a password
        # holding an unescaped '/', '?' or '#' (the usual typo) ends it at the last '@' of all.
        end = len(rest)
        for stop in "/?#":
            if stop in rest:
                end = min(end, rest.index(stop))
        at = rest.rfind("@", 0, end)
        if at < 0:
            at = rest.rfind("@")
        user, colon, _password = rest[:at].partition(":")
        if at >= 0 and colon:
            rest = f"{user}:***{rest[at:]}"
        value = scheme + sep + rest
    return repr(_QUERY_PASSWORD.sub(r"\1***", value))


def _check_url(variable: str, value: str | None, schemes: tuple[str, ...], *,
               hostless: bool = False) -> None:
    """``hostless``: the URL may name no host (libpq's ``postgresql:///db?host=/run/pg``
    reaches the server over a Unix socket)."""
    if value is None:
        return
    try:
        parts = urlsplit(value)
    except ValueError as exc:  # e.g. an unclosed IPv6 bracket: "redis://[::1"
        raise ConfigError(variable, f"is not a valid URL ({exc}): {_shown(value)}") from None
    if parts.scheme not in schemes or not (parts.netloc or (hostless and "://" in value)):
        raise ConfigError(
            variable,
            # "an http://", "an smtp://": the article goes by the letter's sound.
            f"must be {'an' if schemes[0][0] in 'hs' else 'a'} "
            f"{' or '.join(s + '://' for s in schemes)} URL, got {_shown(value)}",
        )
    # urlsplit takes both, and the process started: 'http://:8025' or 'https://user@' then
    # failed every call made with it, and white space every link or request line built on it.
    if not hostless and not parts.hostname:
        raise ConfigError(variable, f"names no host: {_shown(value)}")
    if any(char.isspace() or not char.isprintable() for char in value):
        raise ConfigError(variable, f"must not hold white space or control characters: "
                          f"{_shown(value)}")
    try:
        port = parts.port
    except ValueError:
        port = 0
    # Every URL here is one to connect to, and nothing can be reached on port 0: a provider's
    # base URL on it passed, and then every send through it failed to connect.
    if port == 0 and not _names_no_port(parts.netloc):
        raise ConfigError(
            variable, f"has no valid port (a number from 1 to 65535): {_shown(value)}"
        ) from None


def _names_no_port(netloc: str) -> bool:
    """Whether a URL's ``host[:port]`` gives no port (the scheme's own is used), as against
    one that does not parse or is 0."""
    host = netloc.rpartition("@")[2]
    return not host.rpartition("]")[2].partition(":")[1]


def _check_base_url(variable: str, value: str | None) -> None:
    """An http(s) URL that paths are appended to (``/emails``, ``/v1/unsubscribe?token=``):
    a query or fragment in it ended up before the path, and every request or link built on it
    went astray (``https://api.resend.com?x/emails``)."""
    _check_url(variable, value, ("http", "https"))
    if value is not None and ("?" in value or "#" in value):
        raise ConfigError(variable, f"must not hold a query or fragment ('?' or '#'): paths "
                          f"are appended to it, got {_shown(value)}")


# DATABASE_URL's libpq parameters that asyncpg does not read itself: it sends every query
# parameter it does not know to the server as a setting, which the server refuses
# ("unrecognized configuration parameter"). asyncpg reads host, port, user, password, passfile,
# database/dbname, service, sslmode, sslcert, sslkey, sslrootcert, sslcrl, sslpassword,
# sslnegotiation, ssl_min/max_protocol_version, target_session_attrs, krbsrvname and gsslib;
# application_name, options, client_encoding and any server setting reach the server as meant.
#
# Dropped from the URL because asyncpg does what they ask, with these values (None: any):
# notifkit names every connection itself, which makes libpq ignore fallback_application_name
# too; asyncpg never encrypts with GSSAPI nor binds SCRAM to the channel, which "disable" asks
# and "prefer" allows.
_LIBPQ_HONOURED: Final[dict[str, frozenset[str] | None]] = {
    "fallback_application_name": None,
    "gssencmode": frozenset({"disable", "prefer"}),
    "channel_binding": frozenset({"disable", "prefer"}),
}
# Refused: asyncpg has no equivalent, and the server would refuse each as a setting. Some say
# what to use instead.
_LIBPQ_UNSUPPORTED: Final[dict[str, str]] = {
    "hostaddr": "put the address in the URL's host",
    "requiressl": "use sslmode=require",
    "sslcrldir": "use sslcrl with a file",
    "keepalives": "", "keepalives_idle": "", "keepalives_interval": "", "keepalives_count": "",
    "sslcompression": "", "sslcertmode": "", "sslsni": "", "require_auth": "",
    "requirepeer": "", "load_balance_hosts": "", "replication": "", "gssdelegation": "",
}
# Read by asyncpg only when it connects, where a value outside these stopped the process as an
# unreachable PostgreSQL would; libpq takes the same values, spelt exactly so.
_LIBPQ_CHOICES: Final[dict[str, tuple[str, ...]]] = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "target_session_attrs": ("any", "primary", "standby", "prefer-standby", "read-write",
                             "read-only"),
}
CONNECT_TIMEOUT: Final = "connect_timeout"


@dataclass(frozen=True)
class DatabaseDsn:
    """DATABASE_URL as asyncpg takes it (:func:`database_dsn`)."""

    url: str  # without the libpq parameters below, which asyncpg would send to the server
    # libpq's connect_timeout in seconds: None when not given (asyncpg's 60 s), 0 for no limit
    # (libpq's meaning of zero or less).
    connect_timeout_s: float | None = None


def database_dsn(url: str) -> DatabaseDsn:
    """``url`` with its libpq parameters turned into what asyncpg understands; a parameter
    asyncpg cannot honour is a ConfigError naming DATABASE_URL and the parameter."""
    base, sep, rest = url.partition("?")
    query, hash_, fragment = rest.partition("#")
    kept: list[str] = []
    timeout_s: float | None = None
    dropped = False
    for pair in query.split("&") if sep else []:
        raw_name, _, raw_value = pair.partition("=")
        name, value = unquote_plus(raw_name), unquote_plus(raw_value)
        if name == CONNECT_TIMEOUT:
            timeout_s = _connect_timeout_s(value)
        elif name in _LIBPQ_HONOURED:
            allowed = _LIBPQ_HONOURED[name]
            if allowed is not None and value not in allowed:
                raise ConfigError("DATABASE_URL", f"{name}={value} cannot be honoured: asyncpg "
                                  f"(notifkit's PostgreSQL client) supports only "
                                  f"{' or '.join(sorted(allowed))}")
        elif name in _LIBPQ_UNSUPPORTED:
            hint = _LIBPQ_UNSUPPORTED[name]
            raise ConfigError("DATABASE_URL", f"{name} is a libpq parameter that asyncpg "
                              "(notifkit's PostgreSQL client) cannot apply; remove it"
                              + (f" or {hint}" if hint else ""))
        else:
            choices = _LIBPQ_CHOICES.get(name)
            # A blank value is as good as none: asyncpg skips it. It also reads verify_ca for
            # verify-ca, which a URL that works today may hold.
            if (choices is not None and value
                    and (value if name != "sslmode" else value.replace("_", "-")) not in choices):
                raise ConfigError("DATABASE_URL", f"{name}={value} is not one of "
                                  f"{', '.join(choices)}")
            kept.append(pair)
            continue
        dropped = True
    if not dropped:  # the URL as given, byte for byte
        return DatabaseDsn(url)
    return DatabaseDsn(base + ("?" + "&".join(kept) if kept else "") + hash_ + fragment,
                       timeout_s)


def _connect_timeout_s(value: str) -> float:
    try:
        seconds = float(value) if value.isascii() else math.nan  # 0-9, as in _int
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds):
        raise ConfigError("DATABASE_URL", f"{CONNECT_TIMEOUT} must be a number of seconds "
                          f"(0 for no limit), got {_shown(value)}")
    return max(seconds, 0.0)


# The largest database index Redis's SELECT takes (a signed 32-bit number).
REDIS_MAX_DB: Final = 2**31 - 1


def _check_redis_url(value: str) -> None:
    if value.startswith("unix://"):
        try:
            parts = urlsplit(value)
        except ValueError as exc:
            raise ConfigError("REDIS_URL", f"is not a valid URL ({exc}): {_shown(value)}") from None
        if not parts.path:
            raise ConfigError("REDIS_URL", f"must name a socket path, got {_shown(value)}")
        _check_redis_options(value)
        return
    _check_url("REDIS_URL", value, ("redis", "rediss"))
    database = urlsplit(value).path.strip("/")
    if database and not (database.isascii() and database.isdigit()):
        raise ConfigError(
            "REDIS_URL", f"the path must be a database number (e.g. /0), got {'/' + database!r}"
        )
    _check_redis_options(value)


def _check_redis_options(value: str) -> None:
    """The URL's query options (``?socket_timeout=2``), checked as the client reads them by
    building one connection object, which opens nothing: a junk option would otherwise
    surface at the first command, as an error that names no setting."""
    from redis.asyncio.connection import ConnectionPool
    from redis.exceptions import RedisError

    try:
        connection = ConnectionPool.from_url(value).make_connection()  # type: ignore[no-untyped-call]
    except (ValueError, TypeError, RedisError) as exc:
        # An unknown option reaches the connection's constructor, whose complaint names
        # the client's internals ("__init__() got an unexpected keyword argument 'bogus'").
        unknown = re.search(r"unexpected keyword argument '([^']*)'", str(exc))
        why = f"unknown option {unknown.group(1)!r}" if unknown else str(exc)
        raise ConfigError("REDIS_URL", f"has an option the client cannot use ({why}): "
                          f"{_shown(value)}") from None
    # ?db=-1 or ?db=99999999999 (which the path form refuses) failed only at the connection,
    # with status 1 as if Redis were away. Past the server's own count of databases (16 by
    # default) it is still refused there: only the server knows that count.
    db = getattr(connection, "db", 0)
    if isinstance(db, int) and not 0 <= db <= REDIS_MAX_DB:
        raise ConfigError("REDIS_URL", f"db must be a database number from 0 to "
                          f"{REDIS_MAX_DB}, got {db}: {_shown(value)}")
    # The client takes any float for these and fails only at the first command, with a
    # timeout that reads as a slow Redis, or with an error naming no setting (NaN).
    for option, least, inclusive in (("socket_timeout", 0.0, False),
                                     ("socket_connect_timeout", 0.0, False),
                                     ("health_check_interval", 0.0, True)):
        given = getattr(connection, option, None)
        if given is None:
            continue
        seconds = float(given)
        if math.isnan(seconds) or seconds < least or (seconds == least and not inclusive):
            bound = "0 or more" if inclusive else "more than 0"
            raise ConfigError("REDIS_URL", f"{option} must be a number of seconds ({bound}), "
                              f"got {given!r}: {_shown(value)}")


PROVIDERS: Final = ("resend", "sendgrid", "smtp", "twilio", "fcm", "webhook", "openai")


def _provider_rates(raw: str) -> dict[str, float]:
    """``resend=2,twilio=50``: sends per second per provider (0 = no bucket)."""
    rates: dict[str, float] = {}
    for part in raw.split(","):
        if not part.strip():
            continue
        name, sep, value = part.partition("=")
        name = name.strip()
        try:
            rate = float(value) if sep and value.isascii() else -1.0  # 0-9, as in _int
        except ValueError:
            rate = -1.0
        if not sep or not math.isfinite(rate) or rate < 0:
            raise ConfigError("PROVIDER_RATE_LIMITS",
                              f"takes provider=sends-per-second pairs separated by commas "
                              f"(e.g. resend=2,twilio=50), got {part.strip()!r}")
        # A rate near 0 makes a send wait so long that its parked due time is past any date
        # the scheduler can store (every such batch then fails); the floor is
        # API_RATE_PER_SECOND's.
        if 0 < rate < MIN_PROVIDER_RATE:
            raise ConfigError("PROVIDER_RATE_LIMITS",
                              f"{name}: a rate must be 0 (no limit) or at least "
                              f"{MIN_PROVIDER_RATE:g} sends per second, got {value.strip()}")
        if name in rates:  # which of two rates was meant cannot be told
            raise ConfigError("PROVIDER_RATE_LIMITS", f"names {name!r} twice")
        rates[name] = rate
    return rates


def _check_types(s: Settings) -> None:
    """Types and least values of what code may give, checked as the environment checks them."""
    _check_sections({name: getattr(s, name) for name in _SECTIONS})
    for name, variable in _TEXTS.items():
        if not isinstance(getattr(s, name), str):
            raise ConfigError(variable, f"must be a string, got {getattr(s, name)!r}")
    for name, variable in _OPTIONAL_TEXTS.items():
        if not isinstance(getattr(s, name), str | None):
            raise ConfigError(variable, f"must be a string, got {getattr(s, name)!r}")
    for name, variable in _FLAGS.items():
        if not isinstance(getattr(s, name), bool):
            raise ConfigError(variable, f"must be True or False, got {getattr(s, name)!r}")
    for name, (variable, kind, least) in _NUMBERS.items():
        value = getattr(s, name)
        allowed = (int, float) if kind is float else (int,)
        # bool is an int to Python, never a count or a duration to an operator.
        if isinstance(value, bool) or not isinstance(value, allowed):
            what = "a number" if kind is float else "a whole number"
            raise ConfigError(variable, f"must be {what}, got {value!r}")
        if not value >= least:  # also refuses NaN
            raise ConfigError(variable, f"must be at least {least}, got {value}")
    for name, (least, most) in _CODE_NUMBERS.items():
        value = getattr(s, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(name, f"must be a whole number, got {value!r}")
        if not least <= value <= most:
            raise ConfigError(name, f"must be from {least} to {most:,}, got {value}")


def warn_of_risky_settings(s: Settings) -> None:
    """Warnings, once per process, for settings that work but give up a guarantee."""
    if s.reclaim_min_idle_s < KEEP_ALIVE_MIN_RECLAIM_IDLE_S:
        # Taken, since tests and a lone process per service use it to retry at once.
        log.warning("RECLAIM_MIN_IDLE_SECONDS is %g: every reclaim sweep takes over the "
                    "entries other processes are still working on, so with more than one "
                    "process per service a send may go out twice; keep it above the longest "
                    "a batch takes (the default is 60).", s.reclaim_min_idle_s,
                    extra={"setting": "RECLAIM_MIN_IDLE_SECONDS"})


def _validate(s: Settings) -> None:
    _check_types(s)
    _check_redis_url(s.redis_url)
    _check_url("DATABASE_URL", s.database_url, ("postgresql", "postgres"), hostless=True)
    database_dsn(s.database_url)
    # A string is iterable too, and was taken letter by letter ("unknown service 'a'").
    if not (isinstance(s.services, tuple | list)
            and all(isinstance(name, str) for name in s.services)):
        raise ConfigError("NOTIFKIT_SERVICES", f"must be a tuple of service names, got "
                          f"{s.services!r}")
    if not s.services:
        raise ConfigError("NOTIFKIT_SERVICES", "names no service")
    unknown = [name for name in s.services if name not in SERVICES]
    if unknown:
        raise ConfigError("NOTIFKIT_SERVICES", f"unknown service {unknown[0]!r}")
    twice = _named_twice(s.services)
    if twice is not None:
        raise ConfigError("NOTIFKIT_SERVICES", f"names {twice!r} twice")
    if not _NAMESPACE_RE.match(s.namespace):
        raise ConfigError(
            "NOTIFKIT_NAMESPACE", "may hold only letters, digits and _ . : - (64 at most)"
        )
    if not _SCHEMA_RE.match(s.db_schema):
        raise ConfigError(
            "DB_SCHEMA", f"must be a lower-case SQL identifier, got {s.db_schema!r}"
        )
    if s.db_schema.startswith("pg_"):
        # PostgreSQL reserves the prefix: CREATE SCHEMA refuses it, and pg_catalog, pg_temp and
        # pg_toast are its own.
        raise ConfigError("DB_SCHEMA", f"must not start with pg_ (PostgreSQL reserves it), "
                          f"got {s.db_schema!r}")
    if s.db_schema == "information_schema":
        # PostgreSQL's own too: a superuser may create tables in it, but pg_dump leaves the
        # schema out, so a backup would hold none of notifkit's data.
        raise ConfigError("DB_SCHEMA", "must not be information_schema (PostgreSQL's own)")
    if not math.isfinite(s.api_rate_per_second):
        raise ConfigError("API_RATE_PER_SECOND",
                          f"must be a finite number, got {s.api_rate_per_second}")
    # Redis refuses TTLs and idle times past its 64-bit millisecond range, and asyncio timers
    # overflow long before: a duration beyond ten years is a typo, not a setting.
    durations = {
        "IDEMPOTENCY_TTL_SECONDS": s.idempotency_ttl_s,
        "RECLAIM_INTERVAL_SECONDS": s.reclaim_interval_s,
        "RECLAIM_MIN_IDLE_SECONDS": s.reclaim_min_idle_s,
        "PROVIDER_TIMEOUT_SECONDS": s.provider_timeout_s,
        "HEARTBEAT_INTERVAL_SECONDS": s.heartbeat_interval_s,
        "SHUTDOWN_GRACE_SECONDS": s.shutdown_grace_s,
        "SCHEDULER_POLL_INTERVAL_SECONDS": s.scheduler_poll_interval_s,
        "SCHEDULER_LOCK_TTL_SECONDS": s.scheduler_lock_ttl_s,
        "RECONCILE_GRACE_SECONDS": s.reconcile_grace_s,
        "WORKFLOW_LOCK_TTL_SECONDS": s.workflow_lock_ttl_s,
        "THROTTLE_WINDOW_SECONDS": s.throttle_window_s,
    }
    for variable, duration in durations.items():
        if not (math.isfinite(duration) and duration <= MAX_DURATION_S):
            raise ConfigError(variable, f"must be a finite number of seconds up to "
                              f"{MAX_DURATION_S} (ten years), got {duration}")
    bounded = {
        "WORKER_CONCURRENCY": (s.worker_concurrency, MAX_WORKER_CONCURRENCY),
        "DB_MAX_CONNECTIONS": (s.db_max_connections, MAX_DB_CONNECTIONS),
        "MAX_BODY_BYTES": (s.max_body_bytes, MAX_BODY_BYTES_LIMIT),
        "MAX_ATTEMPTS": (s.max_attempts, MAX_ATTEMPTS_LIMIT),
        "ENRICHER_MAX_ATTEMPTS": (s.enricher_max_attempts, MAX_ATTEMPTS_LIMIT),
    }
    for variable, (value, most) in bounded.items():
        if value > most:
            raise ConfigError(variable, f"must be at most {most:,}, got {value}")
    if s.queue_max_len > MAX_REDIS_INT:
        raise ConfigError("QUEUE_MAX_LEN", f"must be at most {MAX_REDIS_INT}")
    if s.scheduler_poll_interval_s >= s.scheduler_lock_ttl_s:
        # Not refused (it still works: the move script checks the lock's token), but the
        # holder renews its lock only when it polls, so the lock lapses between polls and the
        # poll-lock holder's chores (reconciliation) may briefly run in two schedulers.
        log.warning("SCHEDULER_POLL_INTERVAL_SECONDS (%s) is not shorter than "
                    "SCHEDULER_LOCK_TTL_SECONDS (%s): the poller's lock lapses between polls, "
                    "and another scheduler may take polling over each time; make the interval "
                    "shorter than the lock's TTL.", s.scheduler_poll_interval_s,
                    s.scheduler_lock_ttl_s, extra={"setting": "SCHEDULER_POLL_INTERVAL_SECONDS"})
    if not s.heartbeat_ttl_s > s.heartbeat_interval_s:
        raise ConfigError("HEARTBEAT_INTERVAL_SECONDS",
                          f"must be shorter than the health key's TTL ({s.heartbeat_ttl_s} s), "
                          f"got {s.heartbeat_interval_s}")
    if not 0 <= s.port <= 65535:
        raise ConfigError("PORT", f"must be a TCP port (0-65535), got {s.port}")
    # Looked up only when the api binds, after the migrations: white space made that failure a
    # message broken over several lines, and no name or address holds any.
    if any(char.isspace() or not char.isprintable() for char in s.host):
        raise ConfigError("HOST", f"must be a host name or address, without white space or "
                          f"control characters, got {s.host!r}")
    # [::1] (as a URL writes it) or 0.0.0.0:8080 failed only at the bind, after the
    # migrations, as a name that does not resolve ("cannot listen on [[::1]]:8080").
    if ":" in s.host and not _is_ipv6_address(s.host):
        bare = s.host[1:-1] if s.host.startswith("[") and s.host.endswith("]") else None
        hint = (f"an IPv6 address without brackets ({bare})" if bare is not None
                and _is_ipv6_address(bare) else "no port (PORT or --port sets it)")
        raise ConfigError("HOST", f"must be a host name or address, with {hint}, "
                          f"got {s.host!r}")
    if s.log_format not in LOG_FORMATS:
        raise ConfigError("LOG_FORMAT", f"must be json or text, got {s.log_format!r}")
    if s.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(
            "LOG_LEVEL", f"must be DEBUG, INFO, WARNING or ERROR, got {s.log_level!r}"
        )
    if not isinstance(s.provider_rates, Mapping):
        raise ConfigError("PROVIDER_RATE_LIMITS", f"must map providers to sends per second, "
                          f"got {s.provider_rates!r}")
    for provider, rate in s.provider_rates.items():
        # Given in code, a rate that is no number failed in math.isfinite with a TypeError
        # naming nothing; one under the floor passed, which the variable refuses.
        if isinstance(rate, bool) or not isinstance(rate, (int, float)):
            raise ConfigError("PROVIDER_RATE_LIMITS",
                              f"{provider}: must be a number of sends per second, got {rate!r}")
        if 0 < rate < MIN_PROVIDER_RATE:
            raise ConfigError("PROVIDER_RATE_LIMITS",
                              f"{provider}: a rate must be 0 (no limit) or at least "
                              f"{MIN_PROVIDER_RATE:g} sends per second, got {rate}")
        if provider not in PROVIDERS:
            raise ConfigError("PROVIDER_RATE_LIMITS", f"unknown provider {provider!r}; "
                              f"known: {', '.join(PROVIDERS)}")
        if not (math.isfinite(rate) and rate >= 0):
            raise ConfigError("PROVIDER_RATE_LIMITS",
                              f"{provider}: must be a number of sends per second >= 0")
    if (not isinstance(s.fault_injection, (set, frozenset))
            or not all(isinstance(name, str) for name in s.fault_injection)):
        # A string was taken letter by letter ("unknown fault 'a'"), a number failed with a
        # TypeError naming nothing.
        raise ConfigError("NOTIFKIT_FAULT_INJECTION",
                          f"must be a set of fault names, got {s.fault_injection!r}")
    unknown_faults = sorted(s.fault_injection - FAULT_INJECTIONS.keys())
    if unknown_faults:
        raise ConfigError("NOTIFKIT_FAULT_INJECTION",
                          f"unknown fault {unknown_faults[0]!r}; choose from "
                          f"{', '.join(FAULT_INJECTIONS)}")
    if len(s.secret) < 16:
        raise ConfigError("NOTIFKIT_SECRET", "must be at least 16 characters")
    # Given in code, as from the environment (see _get): each is encoded at every use.
    for variable, text in (("NOTIFKIT_SECRET", s.secret), ("TWILIO_AUTH_TOKEN", s.sms.auth_token),
                           ("TWILIO_AUTH_TOKEN", s.webhooks.twilio_auth_token),
                           ("TWILIO_FROM", s.sms.from_number)):
        if isinstance(text, str) and not is_utf8(text):
            raise ConfigError(variable, "holds characters that cannot be UTF-8 encoded "
                              "(lone surrogates)")
    if s.admin_key is not None and len(s.admin_key) < 16:
        raise ConfigError("NOTIFKIT_ADMIN_KEY", "must be at least 16 characters")
    if s.admin_key is not None and is_utf8(s.admin_key) and len(
            s.admin_key.encode()) > ADMIN_KEY_MAX_BYTES:
        raise ConfigError("NOTIFKIT_ADMIN_KEY", f"must be at most {ADMIN_KEY_MAX_BYTES:,} "
                          "bytes (in UTF-8), which an Authorization header can carry")
    # Each goes out (the admin key comes in) as an Authorization header, which may hold no
    # control character: aiohttp refuses to send one, so every send through that provider
    # failed, and no client could send the admin key. The value itself is a secret, not shown.
    for variable, credential in (("NOTIFKIT_ADMIN_KEY", s.admin_key),
                                 ("RESEND_API_KEY", s.email.resend_api_key),
                                 ("SENDGRID_API_KEY", s.email.sendgrid_api_key),
                                 ("FCM_ACCESS_TOKEN", s.push.access_token),
                                 ("OPENAI_API_KEY", s.ai.api_key)):
        if credential is not None and not credential.isprintable():
            raise ConfigError(variable, "must not hold control characters (a line break, "
                              "say), which no HTTP header may carry")
    for provider, variable in SVIX_SECRET_VARIABLES.items():
        secret = getattr(s.webhooks, provider)
        if secret is None:
            continue
        try:
            svix_key(secret)
        except ValueError as exc:
            # Taken as it was, it verified no webhook: each a 401, nothing saying why.
            raise ConfigError(variable, str(exc)) from None
    if s.webhooks.sendgrid_public_key is not None:
        from notifkit.sendgrid_signature import load_public_key

        try:
            load_public_key(s.webhooks.sendgrid_public_key)
        except (ValueError, RuntimeError) as exc:
            # Taken as it was, every signed event post would be a 401 saying nothing of why.
            raise ConfigError("SENDGRID_WEBHOOK_PUBLIC_KEY", str(exc)) from None
    _check_base_url("NOTIFKIT_SIMULATOR_URL", s.simulator_url)
    _check_base_url("NOTIFKIT_PUBLIC_URL", s.public_url)
    simulator_smtp = None if s.simulator_smtp is None else _HOST_PORT_RE.match(s.simulator_smtp)
    if s.simulator_smtp is not None and not (
        simulator_smtp and 1 <= int(simulator_smtp["port"]) <= 65535
    ):
        raise ConfigError("NOTIFKIT_SIMULATOR_SMTP", f"must be host:port ([address]:port for "
                          f"IPv6, port 1-65535), got {s.simulator_smtp!r}")
    _validate_email(s.email)
    _check_base_url("TWILIO_BASE_URL", s.sms.base_url)
    _check_base_url("FCM_BASE_URL", s.push.base_url)
    _check_base_url("OPENAI_BASE_URL", s.ai.base_url)
    # The model goes out as it is in every completion request, as a template's does, which the
    # API refuses with a control character in it: each AI send would fail on it.
    if not s.ai.model.isprintable():
        raise ConfigError("OPENAI_MODEL", f"must not hold control characters: {s.ai.model!r}")
    if s.push.project_id and not (s.push.access_token or s.push.credentials_file):
        raise ConfigError("FCM_ACCESS_TOKEN", "is required with FCM_PROJECT_ID "
                          "(or set FCM_CREDENTIALS_FILE)")
    if not s.push.project_id and (s.push.access_token or s.push.credentials_file):
        given = "FCM_ACCESS_TOKEN" if s.push.access_token else "FCM_CREDENTIALS_FILE"
        raise ConfigError("FCM_PROJECT_ID", f"is required with {given} (the Firebase "
                          "project the messages are sent through)")
    if s.push.access_token and s.push.credentials_file:
        # The static token is used, as before, but not without a word: once it expires
        # (Google's last an hour) push fails, though the file would have renewed it.
        log.warning("FCM_ACCESS_TOKEN and FCM_CREDENTIALS_FILE are both set: push uses the "
                    "access token, which expires; unset it to have the credentials file renew "
                    "tokens.", extra={"setting": "FCM_ACCESS_TOKEN"})
    # Read (and its key made to sign) now, as a setting: found only when delivery built its
    # transports, the file failed the start after migrations had run and the api listened.
    _ = s.push.account
    # Each goes as it is into the path of every request to its provider: a '#', '?' or '/'
    # sent each one elsewhere (…/Accounts/AC#x/Messages.json reached …/Accounts/AC).
    for variable, name in (("TWILIO_ACCOUNT_SID", s.sms.account_sid),
                           ("FCM_PROJECT_ID", s.push.project_id)):
        if name is not None and not _PATH_SEGMENT_RE.match(name):
            raise ConfigError(variable, f"may hold only letters, digits and . _ - (it goes "
                              f"into the path of every request), got {name!r}")
    if bool(s.sms.account_sid) != bool(s.sms.auth_token):
        missing = "TWILIO_AUTH_TOKEN" if s.sms.account_sid else "TWILIO_ACCOUNT_SID"
        raise ConfigError(missing, "is required when the other Twilio credential is set")
    if s.sms.enabled and not s.sms.from_number:
        raise ConfigError("TWILIO_FROM", "is required when Twilio is configured")


def check_from_address(variable: str, value: object) -> None:
    """A sender as EMAIL_FROM takes it: ``no-reply@acme.example`` or ``Acme <...>``."""
    if not isinstance(value, str):
        raise ConfigError(variable, f"must be an e-mail address, got {value!r}")
    _name, address = parseaddr(value)
    local, at, domain = address.rpartition("@")
    # parseaddr stops at a line break, so 'a@b.example\r\nBcc: x@y' looked valid here and
    # then failed every send: the SMTP transport refuses a header with a line break, and a
    # provider API rejects it as a sender. A tab is folding white space, allowed in a header.
    control = any((ord(char) < 32 and char != "\t") or ord(char) == 127 for char in value)
    if control or not (at and local and domain and " " not in address):
        raise ConfigError(variable, "must be an e-mail address, e.g. "
                          f"'Acme <no-reply@acme.example>', got {value!r}")


def check_base_url(variable: str, value: object) -> None:
    """A provider's base URL given in code, by the rules its variable follows."""
    if not isinstance(value, str):
        raise ConfigError(variable, f"must be an http(s) URL, got {value!r}")
    _check_base_url(variable, value)


def check_credential(variable: str, value: object) -> None:
    """A key or token that goes out in a header: text, not empty, no control character."""
    if not isinstance(value, str):
        raise ConfigError(variable, f"must be a string, got {type(value).__name__}")
    if not value:
        raise ConfigError(variable, "must not be empty")
    if not value.isprintable():
        raise ConfigError(variable, "must not hold control characters (a line break, say), "
                          "which no HTTP header may carry")


def check_path_segment(variable: str, value: object) -> None:
    """An id that goes as it is into the path of every request (an account or project)."""
    if not isinstance(value, str) or not _PATH_SEGMENT_RE.match(value):
        raise ConfigError(variable, f"may hold only letters, digits and . _ - (it goes "
                          f"into the path of every request), got {value!r}")


def check_timeout(variable: str, value: object) -> None:
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not (math.isfinite(value) and 0 < value <= MAX_DURATION_S)):
        raise ConfigError(variable, f"must be a number of seconds above 0, got {value!r}")


def check_connections(variable: str, value: object) -> None:
    """A connection pool's size: 0 would leave every send waiting for a connection."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(variable, f"must be a whole number of at least 1, got {value!r}")


def check_sender_number(variable: str, value: object) -> None:
    """A sender's phone number or alphanumeric id, sent in every message's form body."""
    if not isinstance(value, str) or not value.strip() or not value.isprintable():
        raise ConfigError(variable, f"must be the sender's number (or id), without control "
                          f"characters, got {value!r}")


def check_smtp_url(variable: str, value: object) -> None:
    if not isinstance(value, str):
        raise ConfigError(variable, f"must be an smtp:// or smtps:// URL, got {value!r}")
    _check_url(variable, value, ("smtp", "smtps"))
    _check_smtp_url(value, variable)


def _validate_email(e: EmailSettings) -> None:
    # Checked with no e-mail transport configured too, as the other providers' settings are: a
    # malformed value set is a mistake whether or not e-mail is on yet.
    check_from_address("EMAIL_FROM", e.from_addr)
    if e.transport is not None and e.transport not in EMAIL_TRANSPORTS:
        raise ConfigError(
            "EMAIL_TRANSPORT", f"must be resend, sendgrid or smtp, got {e.transport!r}"
        )
    _check_base_url("RESEND_BASE_URL", e.resend_base_url)
    _check_base_url("SENDGRID_BASE_URL", e.sendgrid_base_url)
    if e.transport == "resend" and not e.resend_api_key:
        raise ConfigError("RESEND_API_KEY", "is required when EMAIL_TRANSPORT=resend")
    if e.transport == "sendgrid" and not e.sendgrid_api_key:
        raise ConfigError("SENDGRID_API_KEY", "is required when EMAIL_TRANSPORT=sendgrid")
    if e.transport == "smtp" and not e.smtp_url:
        raise ConfigError("SMTP_URL", "is required when EMAIL_TRANSPORT=smtp (or, to send "
                          "through the SMTP simulator, NOTIFKIT_SIMULATOR_SMTP=host:port)")
    # Checked while another transport sends e-mail too, as RESEND_BASE_URL is.
    _check_url("SMTP_URL", e.smtp_url, ("smtp", "smtps"))
    _check_smtp_url(e.smtp_url)


def _check_smtp_url(url: str | None, variable: str = "SMTP_URL") -> None:
    """A user and a password, or neither. With a user alone the transport logged in with an
    empty password, which the server refused at every send; a password alone was dropped and
    the mail went unauthenticated. The message leaves the password out. The transport reads
    nothing else: a path, query or fragment (``?starttls=false``) was ignored without a word."""
    if url is None:
        return
    parts = urlsplit(url)
    if parts.path not in ("", "/") or parts.query or parts.fragment or "?" in url:
        raise ConfigError(variable, "takes no path, query or fragment: "
                          "smtp://user:password@host:port, or smtps:// for TLS from the start")
    if parts.username and not parts.password:
        raise ConfigError(variable, f"names the user {unquote(parts.username)!r} but no "
                          "password: smtp://user:password@host:port (percent-encode '@', "
                          "':', '/', '?' and '#' in either)")
    if parts.password and not parts.username:
        raise ConfigError(variable, "gives a password but no user: "
                          "smtp://user:password@host:port")


def uses_development_secret(s: Settings) -> bool:
    """True when links and webhooks are signed with the public development secret outside a
    deployment that talks only to the simulators."""
    return s.secret == DEVELOPMENT_SECRET and s.simulator_url is None
