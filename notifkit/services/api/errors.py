"""The API's one error shape and the middleware that guarantees it.

Every failure leaves the API as::

    {"error": {"code": "<snake_case>", "message": "<sentence>", "details": [{"field", "message"}]}}

Handlers raise :class:`ApiError` (or one of the helpers below). The middleware also turns
aiohttp's own HTTP exceptions (unknown route, wrong method, body over the limit) into the same
shape, maps a Redis or PostgreSQL that cannot serve (unreachable, out of memory, read-only,
out of connections) to 503, and, as a last resort only, logs any
other exception and answers 500. Validation is what keeps 500s away; the last resort is there so
that a bug still answers in the documented shape. A request aiohttp's parser refuses never
reaches the middleware: :class:`ApiRunner` serves connections that answer it in the same shape.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypedDict

import asyncpg
from aiohttp import web
from aiohttp.http_exceptions import ContentEncodingError
from redis.exceptions import RedisError

from notifkit import codec
from notifkit.db.availability import (
    UNAVAILABLE_SQLSTATE_CLASSES,
    lock_wait,
    rolled_back_for_another,
)
from notifkit.refusals import Refusal, RefusingRunner, quiet_refusals
from notifkit.services.api.state import PRINCIPAL, SETTINGS
from notifkit.text import escape_control_chars

log = logging.getLogger("notifkit.api")

# Ids a handler learned that the record of its failure should carry: the event id a send
# minted (its caller got a 503, yet the notification's rows may stay for the reconciliation
# and it may still go out), so the caller's failed request and the notification can be tied.
LOG_FIELDS: web.RequestKey[dict[str, str]] = web.RequestKey("log_fields")


def note_log_fields(request: web.Request, **fields: str) -> None:
    """Name ``fields`` in any record the middleware writes about ``request``."""
    if LOG_FIELDS not in request:
        request[LOG_FIELDS] = {}
    request[LOG_FIELDS].update(fields)


def _request_fields(request: web.Request) -> dict[str, str]:
    fields = {"path": request.path, "method": request.method}
    who = request.get(PRINCIPAL)
    if who is not None and who.project_id is not None:
        fields["project_id"] = who.project_id
    fields.update(request.get(LOG_FIELDS, {}))
    return fields


class Detail(TypedDict):
    field: str
    message: str


class ApiError(Exception):
    """An error answer: HTTP status, a stable snake_case code, a sentence and field details."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        details: Sequence[Detail] = (),
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = list(details)
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        # Messages and field paths quote what the request sent (a key, an id): its control
        # characters are shown escaped, as they would otherwise reach logs and UIs raw.
        return {"error": {"code": self.code, "message": escape_control_chars(self.message),
                          "details": [{"field": escape_control_chars(d["field"]),
                                       "message": escape_control_chars(d["message"])}
                                      for d in self.details]}}


def detail(field: str, message: str) -> Detail:
    return {"field": field, "message": message}


def invalid(details: Sequence[Detail], message: str | None = None) -> ApiError:
    """400 validation_error naming every offending field."""
    if message is None:
        fields = ", ".join(dict.fromkeys(d["field"] for d in details))
        message = f"The request has invalid fields: {fields}."
    return ApiError(400, "validation_error", message, details)


def invalid_field(field: str, message: str) -> ApiError:
    return invalid([detail(field, message)])


def not_found(what: str, ident: str | None = None) -> ApiError:
    shown = f" {ident!r}" if ident is not None and len(ident) <= 200 else ""
    return ApiError(404, f"{what.replace(' ', '_')}_not_found",
                    f"No {what}{shown} exists in this project.")


def json_response(
    body: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=codec.dumps(body), status=status, content_type="application/json",
        headers=headers,
    )


def error_response(error: ApiError) -> web.Response:
    response = json_response(error.body(), error.status, error.headers)
    if error.headers.get("Connection", "").lower() == "close":
        # The header alone does not stop aiohttp from keeping the connection and draining a
        # body it was told not to wait for.
        response.force_close()
    return response


def body_too_large(limit: int) -> ApiError:
    """413 naming body. Sent before the body is read, so the connection is closed rather than
    left to a client that may still be sending it."""
    message = f"The request body is larger than {limit} bytes."
    return ApiError(413, "payload_too_large", message, [detail("body", message)],
                    headers={"Connection": "close"})


# aiohttp's own exceptions, renamed into the contract's vocabulary.
_HTTP_CODES: dict[int, tuple[str, str]] = {
    400: ("bad_request", "The request could not be understood."),
    404: ("not_found", "No such route; see GET /openapi.json for the API's routes."),
    405: ("method_not_allowed", "This route does not accept that method."),
    413: ("payload_too_large", "The request body is larger than the server accepts."),
    415: ("unsupported_media_type", "Send the request body as application/json."),
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code, message = _HTTP_CODES.get(
            exc.status, (_snake(exc.reason), f"{exc.reason}.")
        )
        if exc.status == 413:
            max_bytes = request.app[SETTINGS].max_body_bytes
            message = f"The request body is larger than {max_bytes} bytes."
        headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        # Name what was wrong, as every other 4xx does.
        details = ([detail("body", message)] if exc.status == 413
                   else [detail("Content-Type", "must be application/json")]
                   if exc.status == 415 else [])
        return error_response(ApiError(exc.status, code, message, details, headers=headers))
    except web.RequestPayloadError as exc:
        # The body could not be read: a Content-Encoding it is not in, or a chunked body cut
        # short. The client's mistake, raised only once a handler reads the body.
        return error_response(unreadable_body(exc))
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        if isinstance(exc, ConnectionResetError) and _client_gone(request):
            # The client hung up before its body was read: nothing happened, and nobody is
            # left to answer. Not a store outage, whatever OSError says.
            log.info("The client closed the connection before its request was read; nothing "
                     "was done.", extra={"path": request.path, "method": request.method})
            return error_response(unreadable_body(web.RequestPayloadError("Connection lost")))
        if not store_unavailable(exc):
            log.exception("An unexpected error escaped a handler; answering 500. This is a bug: "
                          "the request should have been rejected by validation.",
                          extra=_request_fields(request))
            return error_response(ApiError(500, "internal_error",
                                           "The server failed to handle the request."))
        log.warning("A request failed because a backing store is unreachable or refused the "
                    "command (%s: %s); the client is told to retry.", type(exc).__name__, exc,
                    extra=_request_fields(request))
        return error_response(ApiError(
            503, "service_unavailable",
            "Redis or PostgreSQL cannot serve the request right now; retry it shortly.",
            headers={"Retry-After": "1"},
        ))


def store_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` means Redis or PostgreSQL cannot serve right now (answer 503, retry),
    as opposed to a bug in the request's handling (500).

    Every Redis error counts: the API's own commands are well formed, so a refusal is the
    server's state (out of memory, a read-only replica after a failover, a key of the wrong
    type left by an operator), and the request itself may well succeed once that is fixed.
    """
    if isinstance(exc, RedisError | OSError | TimeoutError | asyncpg.InterfaceError):
        return True
    if lock_wait(exc):
        # A lock another session held (a migration, an operator's LOCK TABLE) outlasted the
        # query's wait: the request was fine, and will be once the lock is released.
        return True
    if rolled_back_for_another(exc):
        # A deadlock with a concurrent writer (another request, a service) that PostgreSQL
        # broke by ending this transaction: nothing of it was kept, and a retry goes through.
        return True
    if isinstance(exc, asyncpg.PostgresError):
        return str(getattr(exc, "sqlstate", "") or "")[:2] in UNAVAILABLE_SQLSTATE_CLASSES
    return False


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


def undecodable_body() -> ApiError:
    return ApiError(400, "unreadable_body", "The request body is not in its Content-Encoding.",
                    [detail("Content-Encoding", "does not match the body, which does not "
                                                "decode")])


def unreadable_body(exc: web.RequestPayloadError) -> ApiError:
    if isinstance(exc.__cause__, ContentEncodingError):
        return undecodable_body()
    return ApiError(400, "unreadable_body", "The request body is malformed or was cut short.",
                    [detail("body", "could not be read")])


def _snake(reason: str) -> str:
    return "_".join(reason.lower().replace("-", " ").split()) or "error"


def quiet_malformed_requests() -> None:
    """One WARNING line, no traceback, for each request aiohttp's parser refuses."""
    quiet_refusals(logging.getLogger("aiohttp.server"))


def protocol_error(refused: Refusal) -> ApiError:
    """The error for a request aiohttp refused before any handler saw it (a byte outside
    ASCII in the URL, a malformed header, a Content-Length that is not a number)."""
    if refused.status >= 500:
        return ApiError(refused.status, "internal_error",
                        "The server failed to handle the request.")
    return ApiError(refused.status, "malformed_request",
                    f"The HTTP request is malformed ({refused.said}); nothing was done.",
                    [detail(refused.part, refused.said)])


class ApiRunner(RefusingRunner):
    """An AppRunner whose connections answer unparseable requests in the error shape too."""

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        super().__init__(app, answer=lambda refused: error_response(protocol_error(refused)),
                         **kwargs)
