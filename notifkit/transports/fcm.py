"""Push through Firebase Cloud Messaging's HTTP v1 API
(``POST /v1/projects/{project}/messages:send``, Bearer token).

The token is ``FCM_ACCESS_TOKEN`` as given, or one obtained from the service-account file
``FCM_CREDENTIALS_FILE`` (a signed JWT exchanged at the file's ``token_uri``, refreshed before
it expires). FCM has no idempotency key; the task id travels in ``data.notifkit_task_id``.
``UNREGISTERED`` (and ``INVALID_ARGUMENT`` about the token) disables the device token.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from notifkit.config import ConfigError, check_credential, check_path_segment
from notifkit.transports.base import (
    METADATA_FIELD,
    HttpReply,
    HttpTransport,
    Message,
    Outcome,
    SendResult,
    classify_status,
    error_detail,
)

FCM_SCOPE = "https://www.googleapis.com/auth/firebase.messaging"

# FCM refuses a whole message whose data uses one of these keys (400 INVALID_ARGUMENT).
RESERVED_DATA_KEYS = frozenset({"from", "message_type"})
RESERVED_DATA_PREFIXES = ("google", "gcm")


def reserved_data_key(key: str) -> bool:
    """Whether FCM reserves ``key`` in a message's ``data``."""
    return key in RESERVED_DATA_KEYS or key.startswith(RESERVED_DATA_PREFIXES)


class FcmTransport(HttpTransport):
    channel: str = "push"
    provider: str = "fcm"
    idempotent: bool = False

    def __init__(self, *, project_id: str, access_token: str | None = None,
                 credentials_file: str | None = None, account: ServiceAccount | None = None,
                 base_url: str = "https://fcm.googleapis.com", **options: Any) -> None:
        """``account``: the service account already loaded from ``credentials_file`` (the
        settings' ``push.account``), so the file is not read and its key not tried again."""
        super().__init__(base_url=base_url, **options)
        if not access_token and not credentials_file and account is None:
            raise ValueError("FCM needs an access token or a credentials file")
        self.project_id = project_id
        self._static_token = access_token
        if account is None and credentials_file:
            account = ServiceAccount.load(credentials_file)
        self._account = account
        self._token: tuple[str, float] | None = None  # (token, expires at, monotonic)
        self._token_lock = asyncio.Lock()

    def check_arguments(self) -> None:
        super().check_arguments()
        check_path_segment(self.argument("project_id"), self.project_id)
        if self._static_token is not None:
            check_credential(self.argument("access_token"), self._static_token)

    async def _send(self, message: Message) -> SendResult:
        content = message.content
        data = {str(k): v if isinstance(v, str) else json.dumps(v)
                for k, v in (content.get("data") or {}).items()}
        data[METADATA_FIELD] = message.task_id
        body = {"message": {
            "token": message.to,
            "notification": {"title": str(content.get("title") or ""),
                             "body": str(content.get("body") or "")},
            "data": data,
        }}
        try:
            token = await self._bearer()
        except (RuntimeError, ValueError, KeyError) as exc:
            return SendResult(Outcome.RETRY, detail=f"no FCM access token: {exc}")
        reply = await self._request(
            "POST", f"{self.base_url}/v1/projects/{self.project_id}/messages:send",
            task_id=message.task_id, json_body=body,
            headers={"Authorization": f"Bearer {token}"},
        )
        if reply.status == 401 and self._account is not None:
            self._token = None  # revoked or expired early: the next attempt fetches a new one
        return classify(reply)

    async def _bearer(self) -> str:
        if self._static_token:
            return self._static_token
        assert self._account is not None
        async with self._token_lock:
            if self._token is None or self._token[1] <= time.monotonic():
                token, lifetime_s = await self._account.fetch_token(self._request)
                self._token = (token, time.monotonic() + max(60.0, lifetime_s - 120.0))
            return self._token[0]


def classify(reply: HttpReply) -> SendResult:
    payload = reply.json()
    detail = error_detail(reply)
    if reply.ok:
        name = payload.get("name") if isinstance(payload, dict) else None
        return SendResult(Outcome.SENT, name if isinstance(name, str) else None, "accepted",
                          reply.status)
    error = payload.get("error") if isinstance(payload, dict) else None
    error = error if isinstance(error, dict) else {}
    codes = {str(error.get("status") or "")}
    for item in error.get("details") or []:
        if isinstance(item, dict) and item.get("errorCode"):
            codes.add(str(item["errorCode"]))
    text = str(error.get("message") or "").lower()
    # FCM answers a bad token with INVALID_ARGUMENT too, but so it answers any malformed
    # request ("Exactly one of token, topic or condition must be set"): only its message about
    # the registration token says the address is bad and the contact may be disabled.
    if "UNREGISTERED" in codes or (
        "INVALID_ARGUMENT" in codes and "registration token" in text
    ):
        return SendResult(Outcome.INVALID_RECIPIENT, None, detail, reply.status)
    if "QUOTA_EXCEEDED" in codes:
        return SendResult(Outcome.RATE_LIMITED, None, detail, reply.status,
                          retry_after_s=reply.retry_after_s)
    return classify_status(reply, detail)


MAX_CREDENTIALS_BYTES = 1024 * 1024


class ServiceAccount:
    """A Google service account: exchanges a signed JWT for an OAuth2 access token."""

    def __init__(self, client_email: str, private_key_pem: str, token_uri: str) -> None:
        self.client_email = client_email
        self.private_key_pem = private_key_pem
        self.token_uri = token_uri

    @classmethod
    def load(cls, path: str) -> ServiceAccount:
        """Read a service-account JSON file; a file that cannot serve is a ConfigError naming
        ``FCM_CREDENTIALS_FILE``."""
        try:
            with Path(path).open("rb") as file:
                # A service-account file is a few KiB; /dev/zero or a log file named by
                # mistake would otherwise be read whole before the start could refuse it.
                raw = file.read(MAX_CREDENTIALS_BYTES + 1)
            if len(raw) > MAX_CREDENTIALS_BYTES:
                raise ConfigError("FCM_CREDENTIALS_FILE",
                                  f"{path!r} is larger than {MAX_CREDENTIALS_BYTES // 1024} KiB; "
                                  "a service-account file is a few KiB")
            info = json.loads(raw.decode("utf-8"))
        except OSError as exc:
            raise ConfigError("FCM_CREDENTIALS_FILE",
                              f"cannot read {path!r}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise ConfigError("FCM_CREDENTIALS_FILE",
                              f"{path!r} is not a JSON service-account file: {exc}") from None
        if not isinstance(info, dict) or not all(
            isinstance(info.get(field), str) for field in ("client_email", "private_key")
        ):
            raise ConfigError("FCM_CREDENTIALS_FILE",
                              f"{path!r} has no client_email and private_key")
        token_uri = info.get("token_uri") or "https://oauth2.googleapis.com/token"
        # A host too: "https://" alone passed, and every push then failed to fetch a token.
        if not isinstance(token_uri, str) or not _http_host(token_uri):
            raise ConfigError("FCM_CREDENTIALS_FILE",
                              f"{path!r} has a token_uri that is not an http(s) URL naming a "
                              "host")
        account = cls(info["client_email"], info["private_key"], token_uri)
        try:
            # Signed once now: a key that cannot sign would otherwise fail every push later,
            # each retried until it is dead-lettered.
            account.assertion()
        except (ValueError, TypeError) as exc:
            raise ConfigError("FCM_CREDENTIALS_FILE",
                              f"{path!r} holds a private_key that cannot sign: {exc}") from None
        except RuntimeError as exc:
            raise ConfigError("FCM_CREDENTIALS_FILE", str(exc)) from None
        return account

    def assertion(self, now_s: int | None = None) -> str:
        try:
            from cryptography.hazmat.primitives import hashes, serialization
            from cryptography.hazmat.primitives.asymmetric import padding, rsa
        except ImportError as exc:  # pragma: no cover - depends on the installation
            raise RuntimeError("needs the 'cryptography' package (the fcm extra); install "
                               "it or set FCM_ACCESS_TOKEN instead") from exc
        now = int(time.time()) if now_s is None else now_s
        header = {"alg": "RS256", "typ": "JWT"}
        claims = {"iss": self.client_email, "scope": FCM_SCOPE, "aud": self.token_uri,
                  "iat": now, "exp": now + 3600}
        signing_input = f"{_b64(json.dumps(header))}.{_b64(json.dumps(claims))}".encode()
        key = serialization.load_pem_private_key(self.private_key_pem.encode(), password=None)
        if not isinstance(key, rsa.RSAPrivateKey):
            raise ValueError("the service account's private key is not an RSA key")
        signature = key.sign(signing_input, padding.PKCS1v15(), hashes.SHA256())
        return f"{signing_input.decode()}.{_b64(signature)}"

    async def fetch_token(self, request: Any) -> tuple[str, float]:
        reply: HttpReply = await request(
            "POST", self.token_uri, task_id="oauth-token",
            data={"grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer",
                  "assertion": self.assertion()},
        )
        payload = reply.json()
        if not reply.ok or not isinstance(payload, dict) or "access_token" not in payload:
            raise RuntimeError(f"the FCM token exchange failed: {error_detail(reply)}")
        return str(payload["access_token"]), float(payload.get("expires_in", 3600))


def _http_host(url: str) -> str | None:
    """The host an http(s) URL names, else None."""
    try:
        parts = urlsplit(url)
        return parts.hostname if parts.scheme in ("http", "https") else None
    except ValueError:  # an unclosed IPv6 bracket
        return None


def _b64(value: str | bytes) -> str:
    raw = value.encode() if isinstance(value, str) else value
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
