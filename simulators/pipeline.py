"""The one path every HTTP provider request takes.

    count -> credentials (401) -> provider rate limit (429; its answer may read the body to
    name what was asked for, nothing more) -> read and validate (4xx)
    -> fault decision -> [timeout: hold, record nothing | error, rate_limit, invalid_token:
       answer the provider's error] -> idempotency (replay / 409) -> [latency: wait]
    -> accept: record (each email of a batch), schedule receipts -> [lost_response: hold,
       never answer | malformed: unparseable 200 | otherwise the provider's success answer]

Providers only describe their wire format (`HttpProvider`); the order above, and therefore
the meaning of every fault, is the same for all of them.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from simulators.bodies import (
    InflatedTooLarge,
    UndecodableBody,
    UnsupportedEncoding,
    read_body,
    unsupported_message,
)
from simulators.faults import FaultDecision
from simulators.idempotency import Lookup, fingerprint
from simulators.kinds import ErrorCase, FaultKind, Provider, case_for_status
from simulators.limits import Limit
from simulators.records import MAX_TASK_ID_CHARS, MessageRecord
from simulators.replies import EVENT_STREAM, Reply, malformed_reply
from simulators.state import STATE, SimState
from simulators.stats import ProviderStats

log = logging.getLogger("simulators")

TASK_ID_HEADER = "X-Notifkit-Task-Id"
IDEMPOTENCY_HEADER = "Idempotency-Key"

# The status each case answers with unless a provider or a fault rule says otherwise.
DEFAULT_STATUS: dict[ErrorCase, int] = {
    ErrorCase.BAD_REQUEST: 400,
    ErrorCase.MISSING_CREDENTIALS: 401,
    ErrorCase.UNAUTHORIZED: 401,
    ErrorCase.FORBIDDEN: 403,
    ErrorCase.NOT_FOUND: 404,
    ErrorCase.CONFLICT: 409,
    ErrorCase.TOO_LARGE: 413,
    ErrorCase.INVALID_RECIPIENT: 400,
    ErrorCase.RATE_LIMITED: 429,
    ErrorCase.QUOTA_EXCEEDED: 429,
    ErrorCase.SERVER_ERROR: 500,
    ErrorCase.UNAVAILABLE: 503,
}
DEFAULT_RETRY_AFTER_S = 1.0
UNREADABLE_BODY = "The request body does not match its Content-Encoding."


class Rejection(Exception):
    """A request the provider refuses; rendered in the provider's own error format."""

    def __init__(
        self,
        case: ErrorCase,
        detail: str = "",
        *,
        status: int | None = None,
        field_name: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(detail or case.value)
        self.case = case
        self.detail = detail
        self.status = status
        self.field_name = field_name
        self.code = code


@dataclass
class Submission:
    """A request that passed validation, described in provider-neutral terms."""

    recipients: list[str]
    content: dict[str, Any]
    task_id: str | None = None
    # Where each recipient sits in the request, in the provider's own terms and in the order
    # of `recipients` (SendGrid "personalizations.1.cc.0.email"), so that an invalid-recipient
    # error names the one a fault rule matched. Empty where the provider names no field.
    recipient_fields: list[str] = field(default_factory=list)
    idempotency_key: str | None = None
    # Raw request payload, for idempotency fingerprints.
    payload: Any = None
    # Facts receipts need (tags, auth token, status callback...).
    meta: dict[str, Any] = field(default_factory=dict)
    # False for validate-only and sandbox requests: answered as success, recorded nowhere.
    deliver: bool = True
    # A batch request (Resend `/emails/batch`): each part is recorded as its own message,
    # while faults, rate limits and idempotency treat the request as one.
    parts: list[Submission] | None = None

    def field_of(self, recipient: str | None) -> str | None:
        """Where ``recipient`` sits in the request (see `recipient_fields`), if known."""
        if recipient is None or recipient not in self.recipients:
            return None
        index = self.recipients.index(recipient)
        return self.recipient_fields[index] if index < len(self.recipient_fields) else None


@dataclass(frozen=True)
class ErrorSpec:
    """Everything a provider needs to render one error answer."""

    case: ErrorCase
    status: int
    detail: str = ""
    field_name: str | None = None
    code: str | None = None
    recipient: str | None = None
    retry_after_s: float | None = None
    # The configured provider limit a 429 answers for; None for a fault rule's 429, which
    # states the provider's usual limit.
    limit: Limit | None = None


class HttpProvider(ABC):
    provider: ClassVar[Provider]
    # Statuses that differ from DEFAULT_STATUS for this provider.
    status_overrides: ClassVar[dict[ErrorCase, int]] = {}
    # Whether the provider honours an Idempotency-Key header (Resend does).
    idempotent: ClassVar[bool] = False
    # What an `error` fault without a status stands for: the provider's usual 5xx.
    default_error_case: ClassVar[ErrorCase] = ErrorCase.SERVER_ERROR

    @abstractmethod
    def credentials(self, request: web.Request) -> str | None:
        """The API key (rate-limit identity), or None if the request is not authenticated."""

    @abstractmethod
    async def parse(self, request: web.Request, body: bytes, state: SimState) -> Submission:
        """Validate the request; raise Rejection with the provider's own reason if invalid."""

    @abstractmethod
    def new_message_id(self, state: SimState, submission: Submission) -> str: ...

    @abstractmethod
    def success(self, record: MessageRecord, submission: Submission, request: web.Request) -> Reply:
        """The provider's answer to an accepted message."""

    def reply(
        self, records: list[MessageRecord], submission: Submission, request: web.Request
    ) -> Reply:
        """The answer to an accepted request; one record unless the request was a batch."""
        return self.success(records[0], submission, request)

    @abstractmethod
    def error(self, spec: ErrorSpec) -> Reply:
        """The provider's error body for `spec`, with Retry-After where it sends one."""

    async def limited_recipient(self, request: web.Request, state: SimState) -> str | None:
        """What a configured limit's 429 names, where the provider names it (OpenAI: the
        model); None for the provider's wording without one. Called once the limit has
        refused the request, so nothing read here gets the request past it."""
        return None

    def quota_headers(self, state: SimState, api_key: str) -> dict[str, str]:
        """Rate-limit headers the provider sends with every answer to an authenticated
        request that its limit let through (Resend's `ratelimit-*`); none by default."""
        return {}

    def unreadable_body(self) -> Rejection:
        """The provider's own 400 for a body it cannot read (one that does not decompress as
        its Content-Encoding says): a bad request, whatever the provider answers to a body
        it reads but refuses (Resend's 422)."""
        return Rejection(ErrorCase.BAD_REQUEST, UNREADABLE_BODY, status=400)

    def unsupported_encoding(self, coding: str) -> Rejection:
        """The provider's own 415 for a body in a Content-Encoding the simulator does not
        decode (br, zstd, ...), as the notifkit API answers one."""
        return Rejection(ErrorCase.BAD_REQUEST, unsupported_message(coding), status=415)

    def no_route(self, method: str, path: str, status: int) -> Reply:
        """The provider's answer to a path under its prefix that it does not serve (404) or a
        method it does not take there (405)."""
        detail = "" if status == 404 else "Method not allowed"
        return self.render(ErrorCase.NOT_FOUND, status=status, detail=detail)

    def malformed_request(self, status: int, detail: str) -> Reply:
        """The provider's answer to a request the HTTP parser refused (a bad header, a
        broken chunked body): a bad request of the provider's own, saying what is wrong."""
        return self.render(case_for_status(status), status=status, detail=detail)

    def status_for(self, case: ErrorCase) -> int:
        return self.status_overrides.get(case, DEFAULT_STATUS[case])

    def render(
        self,
        case: ErrorCase,
        *,
        status: int | None = None,
        detail: str = "",
        field_name: str | None = None,
        code: str | None = None,
        recipient: str | None = None,
        retry_after_s: float | None = None,
        limit: Limit | None = None,
    ) -> Reply:
        spec = ErrorSpec(
            case=case,
            status=status if status is not None else self.status_for(case),
            detail=detail,
            field_name=field_name,
            code=code,
            recipient=recipient,
            retry_after_s=retry_after_s,
            limit=limit,
        )
        return self.error(spec)

    def fault_reply(self, decision: FaultDecision, submission: Submission) -> Reply:
        rule = decision.rule
        rule_status = rule.status_for(self.provider)
        # The recipient the rule matched, which need not be the request's first.
        recipient = rule.matched(submission.recipients)
        field_name: str | None = None
        if rule.kind is FaultKind.RATE_LIMIT:
            case = ErrorCase.RATE_LIMITED
        elif rule.kind is FaultKind.INVALID_TOKEN:
            case = ErrorCase.INVALID_RECIPIENT
            field_name = submission.field_of(recipient)
        else:
            case = case_for_status(rule_status) if rule_status else self.default_error_case
        retry_after_s = rule.retry_after_s
        status = rule_status if rule_status else self.status_for(case)
        # A rate_limit rule means "slow down" whatever status it answers with, so the
        # client always gets the Retry-After it would back off by.
        if retry_after_s is None and (
            status == 429 or case in (ErrorCase.UNAVAILABLE, ErrorCase.RATE_LIMITED)
        ):
            retry_after_s = DEFAULT_RETRY_AFTER_S
        return self.render(case, status=status, recipient=recipient, field_name=field_name,
                           retry_after_s=retry_after_s)

    def malformed(self, decision: FaultDecision, accepted: Reply) -> Reply:
        """``accepted`` is the answer the request would have had, malformed in its format."""
        return malformed_reply(decision.rule.status_for(self.provider) or 200,
                               event_stream=accepted.content_type == EVENT_STREAM)


def header_task_id(request: web.Request) -> str | None:
    value = request.headers.get(TASK_ID_HEADER, "").strip()
    return value[:MAX_TASK_ID_CHARS] or None


def bearer_token(request: web.Request) -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


async def handle_send(request: web.Request, provider: HttpProvider) -> web.StreamResponse:
    state = request.app[STATE]
    stats = state.stats[provider.provider]
    stats.requests += 1
    try:
        response = await _handle(request, provider, state, stats)
    except Rejection as rejection:
        stats.rejected += 1
        log.info(
            "%s refused a request (%s): %s",
            provider.provider.value,
            rejection.code or rejection.case.value,
            rejection.detail or "no detail",
        )
        response = provider.render(
            rejection.case,
            status=rejection.status,
            detail=rejection.detail,
            field_name=rejection.field_name,
            code=rejection.code,
        ).response()
    api_key = provider.credentials(request)
    if api_key and response.status != 429:  # a 429 states its own
        headers = provider.quota_headers(state, api_key)
        if headers and not response.prepared:  # a stream's headers are already written
            response.headers.update(headers)
    return response


async def _handle(
    request: web.Request, provider: HttpProvider, state: SimState, stats: ProviderStats
) -> web.StreamResponse:
    name = provider.provider
    api_key = provider.credentials(request)
    if not api_key:
        raise Rejection(ErrorCase.MISSING_CREDENTIALS)
    wait_s = state.limits.check(name, api_key)
    if wait_s is not None:
        stats.rate_limited += 1
        log.info(
            "%s rate limit: key ...%s answered 429, retry in %.2fs.", name, api_key[-4:], wait_s
        )
        return provider.render(ErrorCase.RATE_LIMITED, retry_after_s=wait_s,
                               limit=state.limits.limit_of(name),
                               recipient=await provider.limited_recipient(request, state)
                               ).response()

    body = await read_request_body(request, provider, state)
    submission = await provider.parse(request, body, state)

    decision = state.faults.decide(name, submission.recipients)
    kind = decision.kind if decision else None
    if decision is not None:
        stats.faults[decision.kind] += 1
        log_fault(name, decision, submission.recipients, submission.task_id)
    if decision is not None and kind is FaultKind.TIMEOUT:
        await state.hold(request, decision.delay_s)
        return _drop(request)
    if decision is not None and kind in (
        FaultKind.ERROR,
        FaultKind.RATE_LIMIT,
        FaultKind.INVALID_TOKEN,
    ):
        return provider.fault_reply(decision, submission).response()

    key = submission.idempotency_key if provider.idempotent else None
    cached: Reply | None = None
    if key is not None:
        lookup, cached = state.idempotency.begin(
            name, api_key, key, fingerprint(submission.payload)
        )
        if lookup is Lookup.MISMATCH:
            raise Rejection(ErrorCase.CONFLICT, code="invalid_idempotent_request")
        if lookup is Lookup.IN_FLIGHT:
            raise Rejection(ErrorCase.CONFLICT, code="concurrent_idempotent_requests")
        if lookup is Lookup.REPLAY:
            stats.replays += 1
            log.info("%s idempotent replay of key %s; nothing sent again.", name, key)
    claimed = key is not None and cached is None
    try:
        if decision is not None and kind is FaultKind.LATENCY:
            await state.pause(decision.delay_s)
        reply = cached or _accept(request, provider, state, stats, submission)
    except BaseException:
        # Not accepted after all (shutdown during the delay): let a retry use the key.
        if claimed and key is not None:
            state.idempotency.abandon(name, api_key, key)
        raise
    if claimed and key is not None:
        state.idempotency.complete(name, api_key, key, reply)

    if decision is not None and kind is FaultKind.LOST_RESPONSE:
        await state.hold(request, decision.delay_s)
        return _drop(request)
    if decision is not None and kind is FaultKind.MALFORMED:
        return provider.malformed(decision, reply).response()
    return reply.response()


def _accept(
    request: web.Request,
    provider: HttpProvider,
    state: SimState,
    stats: ProviderStats,
    submission: Submission,
) -> Reply:
    parts = submission.parts if submission.parts is not None else [submission]
    records = [
        MessageRecord(
            id=provider.new_message_id(state, part),
            provider=provider.provider,
            recipients=part.recipients,
            task_id=part.task_id,
            idempotency_key=part.idempotency_key,
            content=part.content,
            meta=part.meta,
        )
        for part in parts
    ]
    if submission.deliver:
        for record in records:
            accept(state, stats, record)
    return provider.reply(records, submission, request)


def log_fault(provider: Provider, decision: FaultDecision, recipients: Sequence[str],
              task_id: str | None) -> None:
    """One line per fault a request got, in one shape for every provider, SMTP included: the
    scenario harness counts faults by task from these lines (``task_id=None`` when the request
    carried none)."""
    log.info("%s fault %s (rule %s) for to=%s task_id=%s.", provider.value, decision.kind.value,
             decision.rule.id, ",".join(recipients), task_id)


def accept(state: SimState, stats: ProviderStats, record: MessageRecord) -> None:
    """Record an accepted message and schedule its receipts (shared with SMTP)."""
    state.messages.add(record)
    stats.accepted += 1
    if record.accept_count > 1:
        stats.duplicates += 1
    state.receipts.schedule(record)
    log.info(
        "%s accepted message %s to=%s task_id=%s accept_count=%d.",
        record.provider.value,
        record.id,
        ",".join(record.recipients),
        record.task_id,
        record.accept_count,
    )


async def read_request_body(request: web.Request, provider: HttpProvider,
                            state: SimState) -> bytes:
    """The body with its Content-Encoding undone, or the provider's refusal of it."""
    limit = state.settings.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise Rejection(ErrorCase.TOO_LARGE)
    try:
        return await read_body(request, limit)
    except (web.HTTPRequestEntityTooLarge, InflatedTooLarge):
        raise Rejection(ErrorCase.TOO_LARGE) from None
    except UnsupportedEncoding as exc:
        raise provider.unsupported_encoding(exc.coding) from None
    except (UndecodableBody, RequestPayloadError):  # RequestPayloadError: broken chunking
        raise provider.unreadable_body() from None


async def body_if_readable(
    request: web.Request, provider: HttpProvider, state: SimState
) -> bytes | None:
    """The body as a request within the limit reads it, or None where that read refuses it
    (too large, an encoding it cannot undo)."""
    try:
        return await read_request_body(request, provider, state)
    except Rejection:
        return None


def _drop(request: web.BaseRequest) -> web.StreamResponse:
    """Close the connection without an answer: to the client, the response was lost."""
    transport = request.transport
    if transport is not None:
        transport.close()
    return web.Response(status=204)
