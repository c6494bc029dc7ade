"""The aiohttp application: every HTTP provider on one port, plus the control API.

POST /emails, POST /emails/batch, GET /emails[/{id}]  Resend
POST /v3/mail/send                                   SendGrid
POST, GET /2010-04-01/Accounts/{sid}/Messages.json   Twilio send, list
GET /2010-04-01/Accounts/{sid}/Messages/{sid}.json   Twilio fetch
POST /v1/projects/{project}/messages:send            FCM HTTP v1
POST /token                                          OAuth2 token endpoint for FCM clients
POST /v1/chat/completions, GET /v1/models[/{id}]     OpenAI
/_sim/...                                            control API and page (see control.py)
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from notifkit.refusals import Refusal
from simulators import control
from simulators.pipeline import HttpProvider, handle_send
from simulators.providers.fcm import Fcm
from simulators.providers.oauth_token import token_endpoint
from simulators.providers.openai import OpenAI, get_model, list_models
from simulators.providers.resend import Resend, ResendBatch
from simulators.providers.resend_reads import get_email, list_emails
from simulators.providers.sendgrid import SendGrid
from simulators.providers.twilio import Twilio
from simulators.providers.twilio_reads import fetch_message, list_messages
from simulators.providers.twilio_update import update_message
from simulators.state import STATE, SimState
from simulators.validation import ControlError

log = logging.getLogger("simulators")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _send(provider: HttpProvider) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await handle_send(request, provider)

    return handler


# A path under a provider's prefix that no route serves is answered in that provider's own
# error format, as the real provider answers it; other paths get the simulator's own JSON.
_PREFIXES: tuple[tuple[str, HttpProvider], ...] = (
    ("/emails/", Resend()),
    ("/v3/", SendGrid()),
    ("/2010-04-01/", Twilio()),
    ("/v1/projects/", Fcm()),
    ("/v1/", OpenAI()),
)


def _provider_at(path: str) -> HttpProvider | None:
    for prefix, provider in _PREFIXES:
        if path.startswith(prefix) or path == prefix.rstrip("/"):
            return provider
    return None


def _no_route(request: web.Request, status: int) -> web.Response:
    # The raw (percent-encoded) path: it is always writable, whatever bytes it names.
    path = request.rel_url.raw_path
    provider = _provider_at(path)
    if provider is None:
        return _error_json(status, f"no route for {request.method} {request.path}")
    return provider.no_route(request.method, path, status).response()


def answer_refusal(refused: Refusal) -> web.StreamResponse:
    """The answer to a request aiohttp's parser refused before any route saw it: a JSON 400
    saying what is wrong, in the format of the provider its path addresses when the request
    line could be read, else the simulator's own. (aiohttp answers through the same seam
    an exception that escaped every handler, with a 5xx: errors_middleware leaves it none.)"""
    message = (f"The HTTP request is malformed ({refused.said}, in its {refused.part}); "
               "nothing was recorded." if refused.status < 500
               else "internal simulator error (logged)")
    provider = _provider_at(refused.target) if refused.target is not None else None
    if provider is None:
        return _error_json(refused.status, message)
    return provider.malformed_request(refused.status, message).response()


def _error_json(status: int, message: str) -> web.Response:
    return web.Response(
        status=status,
        text=json.dumps({"error": message}, ensure_ascii=False),
        content_type="application/json",
    )


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """No input may crash the simulator or leak a traceback: every failure becomes JSON."""
    try:
        return await handler(request)
    except ControlError as exc:
        return _error_json(exc.status, exc.message)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if exc.status in (404, 405):
            response = _no_route(request, exc.status)
        else:
            response = _error_json(exc.status, exc.reason)
        if "Allow" in exc.headers:  # a 405 must say which methods the path does take
            response.headers["Allow"] = exc.headers["Allow"]
        return response
    except Exception:
        log.exception(
            "Unexpected error handling %s %s; answered 500.", request.method, request.path
        )
        return _error_json(500, "internal simulator error (logged)")


def create_app(state: SimState) -> web.Application:
    app = web.Application(
        middlewares=[errors_middleware],
        client_max_size=state.settings.max_body_bytes,
        # Routes decode bodies themselves (simulators/bodies.py), so that a coding aiohttp
        # cannot decode is answered in the provider's format, not in aiohttp's plain text.
        handler_args={"auto_decompress": False},
    )
    app[STATE] = state
    app.router.add_routes(
        [
            web.post("/emails", _send(Resend())),
            web.get("/emails", list_emails),
            web.post("/emails/batch", _send(ResendBatch())),
            web.get("/emails/{id}", get_email),
            web.post("/v3/mail/send", _send(SendGrid())),
            web.post("/2010-04-01/Accounts/{sid}/Messages.json", _send(Twilio())),
            web.get("/2010-04-01/Accounts/{sid}/Messages.json", list_messages),
            web.get("/2010-04-01/Accounts/{sid}/Messages/{message_sid}.json", fetch_message),
            web.post("/2010-04-01/Accounts/{sid}/Messages/{message_sid}.json", update_message),
            web.post("/v1/projects/{project}/messages:send", _send(Fcm())),
            web.post("/token", token_endpoint),
            web.post("/v1/chat/completions", _send(OpenAI())),
            web.get("/v1/models", list_models),
            web.get("/v1/models/{model}", get_model),
            *control.routes(),
        ]
    )
    app.cleanup_ctx.append(_receipts_ctx)
    return app


async def _receipts_ctx(app: web.Application) -> AsyncIterator[None]:
    yield
    await app[STATE].receipts.close()
