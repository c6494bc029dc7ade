"""Webhooks: a JSON POST to the user's https URL, signed with ``NOTIFKIT_SECRET``.

    POST <contact target>
    Content-Type: application/json
    X-Notifkit-Task-Id: <task id>            (the same on every retry: deduplicate on it)
    X-Notifkit-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>

    {"id": taskId, "type": "notification", "eventId", "projectId", "userId", "template",
     "topic", "campaignId", "createdAt", "body": <the rendered body: parsed if it is
     strict JSON (no NaN or Infinity) Python can parse and write again, else the text>}

A receiver verifies by recomputing the HMAC over the timestamp and the raw body, comparing in
constant time and rejecting old timestamps. 2xx is sent; 410 Gone disables the URL; 429 parks;
408 and 5xx retry; any other 4xx, and a redirect (never followed), is a permanent failure.

Unless ``WEBHOOK_ALLOW_PRIVATE_NETWORKS`` is set, a URL whose host is, or resolves only to, a
loopback, private, link-local or otherwise non-public address (:mod:`notifkit.destinations`) is
a permanent failure, and nothing is sent. The addresses are checked where the connector gets
them, so the one connected to is one that was checked: a name that resolved to a public address
when the contact was added and to an internal one now (DNS rebinding) is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import time
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from notifkit.destinations import host_address, refused_host, refused_kind
from notifkit.transports.base import (
    HttpTransport,
    Message,
    Outcome,
    SendResult,
    classify_status,
    error_detail,
)

SIGNATURE_HEADER = "X-Notifkit-Signature"


def _parsed(rendered: Any) -> Any:
    """The rendered body as JSON when it is strict JSON, else the text itself. ``NaN`` and
    ``Infinity`` are not JSON (a receiver's parser refuses them), and JSON nested deeper than
    Python can parse or write again is sent as the text it is."""
    if not isinstance(rendered, str):
        return rendered
    try:
        return json.loads(rendered, parse_constant=_not_json)
    except (ValueError, RecursionError):
        return rendered


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _encode(document: dict[str, Any]) -> bytes:
    return json.dumps(document, ensure_ascii=False, separators=(",", ":"),
                      allow_nan=False).encode()


def sign(secret: str, body: bytes, timestamp_s: int) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp_s}.".encode() + body, hashlib.sha256)
    return f"t={timestamp_s},v1={mac.hexdigest()}"


def verify(secret: str, body: bytes, header: str, *, tolerance_s: int = 300,
           now_s: float | None = None) -> bool:
    """Check a signature header the way a receiver should (used by tests and examples)."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    now = time.time() if now_s is None else now_s
    if abs(now - timestamp) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret, body, timestamp), header)


class RefusedDestination(OSError):
    """A webhook's host resolves to no address it may reach."""


class GuardedResolver(AbstractResolver):
    """Resolves with ``inner`` and keeps only the public addresses; none left is a
    :class:`RefusedDestination`. The connector connects only to what this answers."""

    def __init__(self, inner: AbstractResolver) -> None:
        self.inner = inner

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        kept: list[ResolveResult] = []
        kinds: list[str] = []
        for result in await self.inner.resolve(host, port, family):
            address = host_address(result["host"])
            kind = "unreadable" if address is None else refused_kind(address)
            if kind is None:
                kept.append(result)
            elif kind not in kinds:
                kinds.append(kind)
        if kept:
            return kept
        if not kinds:  # a lookup failure like any other, retried (aiohttp asserts on none)
            raise socket.gaierror(socket.EAI_NONAME, f"no address found for {host}")
        # The addresses themselves are not named: they are the deployment's own DNS answers,
        # not something the tenant who owns the URL should learn.
        raise RefusedDestination(f"{host} resolves only to {' and '.join(kinds)} addresses")

    async def close(self) -> None:
        await self.inner.close()


class WebhookTransport(HttpTransport):
    channel: str = "webhook"
    provider: str = "webhook"
    idempotent: bool = False
    has_base_url = False

    def __init__(self, *, secret: str, allow_private_networks: bool = False,
                 resolver: AbstractResolver | None = None, **options: Any) -> None:
        """``resolver`` looks host names up (aiohttp's default when None); unless
        ``allow_private_networks``, what it answers is checked before any connection."""
        super().__init__(**options)
        self.secret = secret
        self.allow_private_networks = allow_private_networks
        self._inner_resolver = resolver
        self._guarded: GuardedResolver | None = None

    def _resolver(self) -> AbstractResolver | None:
        if self.allow_private_networks:
            return self._inner_resolver
        self._guarded = GuardedResolver(self._inner_resolver or aiohttp.DefaultResolver())
        return self._guarded

    async def close(self) -> None:
        await super().close()
        # The connector closes only a resolver it made itself.
        if self._guarded is not None:
            await self._guarded.close()
            self._guarded = None

    async def _send(self, message: Message) -> SendResult:
        rendered = message.content.get("body")
        document = {
            "id": message.task_id, "type": "notification", "eventId": message.event_id,
            "projectId": message.project_id, "userId": message.user_id,
            "template": message.template, "topic": message.topic,
            "campaignId": message.campaign_id, "createdAt": message.created_at,
            "body": _parsed(rendered),
        }
        try:
            raw = _encode(document)
        except (ValueError, RecursionError):
            document["body"] = rendered if isinstance(rendered, str) else str(rendered)
            raw = _encode(document)
        if not self.allow_private_networks:
            # An address in the URL is connected to as it is, never looked up.
            refused = refused_host(URL(message.to).host or "")
            if refused is not None:
                return _refused(refused)
        try:
            reply = await self._request(
                "POST", message.to, task_id=message.task_id, body=raw,
                headers={"Content-Type": "application/json",
                         SIGNATURE_HEADER: sign(self.secret, raw, int(time.time()))},
            )
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, RefusedDestination):
                return _refused(str(exc.os_error))
            raise
        if reply.status == 410:
            return SendResult(Outcome.INVALID_RECIPIENT, None, error_detail(reply), 410)
        return classify_status(reply, "accepted" if reply.ok else error_detail(reply))


def _refused(reason: str) -> SendResult:
    return SendResult(Outcome.PERMANENT, detail=f"destination refused: {reason}; webhooks reach "
                      "only public addresses (WEBHOOK_ALLOW_PRIVATE_NETWORKS)")
