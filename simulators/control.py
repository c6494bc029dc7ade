"""The control API under `/_sim/`: operations on the simulator state and their HTTP routes.

Each operation takes the decoded request (JSON body or query) and returns the JSON answer,
raising `ControlError` for bad input. The HTTP handlers and `SimulatorServer`'s Python
methods call the same operations, so both check input identically.

    POST   /_sim/faults           add a rule               -> 201 {"id", ...rule}
    GET    /_sim/faults           list rules               -> {"items": [rule]}
    DELETE /_sim/faults           remove all rules         -> 204
    DELETE /_sim/faults/{id}      remove one rule          -> 204, also when already gone
    GET    /_sim/messages         ?provider=&to=&taskId=&limit=, newest first -> {"items"}
    GET    /_sim/stats            per-provider counters
    POST   /_sim/limits           {"provider", "ratePerSecond", "burst"?} -> {"items"}
    GET    /_sim/limits           -> {"items"};   DELETE /_sim/limits -> 204
    POST   /_sim/receipts         {"url", "secret", "delayMs"?, probabilities...}
    GET    /_sim/receipts         configuration and delivery counters
    DELETE /_sim/receipts         stop sending receipts -> 204
    POST   /_sim/reset            {"seed"?} clear messages, faults, limits, counters
    GET    /_sim/health           {"ok": true, "seed"}
    GET    /_sim/                 the HTML page
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl, unquote

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from simulators.bodies import (
    InflatedTooLarge,
    UndecodableBody,
    UnsupportedEncoding,
    read_body,
    unsupported_message,
)
from simulators.faults import FaultItem
from simulators.jsondepth import MAX_JSON_DEPTH, too_deep
from simulators.kinds import Provider
from simulators.limits import LimitItem
from simulators.page import render_page
from simulators.receipts import ReceiptsItem
from simulators.records import MAX_TASK_ID_CHARS, MessageItem, has_lone_surrogate
from simulators.state import STATE, SimState
from simulators.stats import ProviderStatsItem
from simulators.validation import ControlError, get_int, reject_unknown, require_object, show

MAX_LIMIT = 100_000
DEFAULT_LIMIT = 1000
MESSAGE_QUERY = ("provider", "to", "taskId", "limit")
MAX_SEED = 2**63
_TOO_DEEP = f"request body is nested too deeply (more than {MAX_JSON_DEPTH} levels)"
# Rendered email HTML sits in sandboxed iframes (which inherit this policy): no script runs
# anywhere on the page and no remote resource (tracking pixels included) is fetched.
_PAGE_POLICY = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-src 'self'"


def add_fault(state: SimState, payload: object) -> FaultItem:
    return state.faults.add(payload).to_item()


def list_faults(state: SimState) -> dict[str, list[FaultItem]]:
    return {"items": [rule.to_item() for rule in state.faults.rules]}


def delete_fault(state: SimState, rule_id: str) -> None:
    # Idempotent, as SIMULATORS.md gives only 204: a test tearing down a rule that a
    # `times` limit or a reset already removed should not fail on it.
    state.faults.remove(rule_id)


def clear_faults(state: SimState) -> None:
    state.faults.clear()


def list_messages(state: SimState, query: Mapping[str, str]) -> dict[str, list[MessageItem]]:
    reject_unknown(query, MESSAGE_QUERY, "messages query")
    provider_name = query.get("provider") or None
    provider: Provider | None = None
    if provider_name is not None:
        try:
            provider = Provider(provider_name)
        except ValueError:
            names = ", ".join(p.value for p in Provider)
            raise ControlError(
                f"'provider' must be one of: {names}; got {show(provider_name)}"
            ) from None
    limit = DEFAULT_LIMIT
    raw_limit = query.get("limit")
    if raw_limit:
        # ASCII digits only, as in the notifkit API: int() also reads a fullwidth "\uff15",
        # "1_0", " 5" and "+5", none of them the number the caller typed.
        if not (raw_limit.isascii() and raw_limit.isdigit()):
            raise ControlError(
                f"'limit' must be a whole number from 1 to {MAX_LIMIT}, got {show(raw_limit)}"
            )
        # Any number past 9 digits is too big, and past 4,300 int() will not read one at all.
        digits = raw_limit.lstrip("0") or "0"
        limit = int(digits) if len(digits) <= 9 else MAX_LIMIT + 1
        if not 1 <= limit <= MAX_LIMIT:
            raise ControlError(f"'limit' must be between 1 and {MAX_LIMIT}, got {show(raw_limit)}")
    # A task id as records keep it (stripped, cut to MAX_TASK_ID_CHARS); one given but blank
    # names no record's task, so it matches nothing rather than every message.
    task_id = query.get("taskId")
    if task_id and not task_id.strip():
        return {"items": []}
    records = state.messages.query(
        provider=provider,
        to=query.get("to") or None,
        task_id=task_id.strip()[:MAX_TASK_ID_CHARS] if task_id else None,
        limit=limit,
    )
    return {"items": [record.to_item() for record in records]}


def stats(state: SimState) -> dict[str, ProviderStatsItem]:
    return state.stats.to_items()


def set_limit(state: SimState, payload: object) -> dict[str, list[LimitItem]]:
    state.limits.set(payload)
    return {"items": state.limits.items()}


def list_limits(state: SimState) -> dict[str, list[LimitItem]]:
    return {"items": state.limits.items()}


def clear_limits(state: SimState) -> None:
    state.limits.clear()


def set_receipts(state: SimState, payload: object) -> ReceiptsItem:
    return state.receipts.configure(payload)


def get_receipts(state: SimState) -> ReceiptsItem:
    return state.receipts.item()


def disable_receipts(state: SimState) -> None:
    state.receipts.disable()


def reset(state: SimState, payload: object) -> dict[str, int]:
    body = require_object(payload if payload is not None else {}, "reset")
    reject_unknown(body, ("seed",), "reset")
    seed = get_int(body, "seed", minimum=0, maximum=MAX_SEED)
    state.reset(seed)
    return {"seed": state.seed}


def health(state: SimState) -> dict[str, Any]:
    return {"ok": True, "seed": state.seed, "messages": len(state.messages), **state.endpoints}


# HTTP ------------------------------------------------------------------------------------


def _json(payload: Any, status: int = 200) -> web.Response:
    # Whatever was stored, the answer is written: a string that is not valid Unicode is
    # escaped rather than failing the whole listing.
    body = json.dumps(payload, ensure_ascii=False).encode("utf-8", "backslashreplace")
    return web.Response(body=body, status=status, content_type="application/json")


async def _raw_body(request: web.Request) -> bytes:
    limit = request.app[STATE].settings.max_body_bytes
    try:
        return await read_body(request, limit)
    except UnsupportedEncoding as exc:
        raise ControlError(unsupported_message(exc.coding), status=415) from None
    except (UndecodableBody, RequestPayloadError):
        raise ControlError("request body does not match its Content-Encoding") from None
    except InflatedTooLarge:
        raise ControlError(f"request body is larger than {limit} bytes once decoded",
                           status=413) from None


class _RepeatedKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose key comes twice is refused: the last one would silently win, so
    `{"provider": "resend", ..., "provider": "sendgrid"}` would be a sendgrid rule."""
    value: dict[str, Any] = {}
    for key, item in pairs:
        if key in value:
            raise _RepeatedKey(key)
        value[key] = item
    return value


async def _body(request: web.Request) -> object:
    raw = await _raw_body(request)
    if not raw.strip():
        return None
    try:
        value = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
    except _RepeatedKey as exc:
        raise ControlError(
            f"request body gives the key {show(exc.key)} more than once in one object"
        ) from None
    except UnicodeDecodeError:
        raise ControlError("request body must be valid UTF-8 JSON") from None
    except json.JSONDecodeError as exc:
        raise ControlError(
            f"request body must be valid UTF-8 JSON: {exc.msg} at line {exc.lineno} "
            f"column {exc.colno}"
        ) from None
    except RecursionError:
        # The parser gave up before the end, so whether the JSON was valid is unknown.
        raise ControlError(_TOO_DEEP) from None
    except ValueError:  # an integer past Python's digit limit for int()
        raise ControlError("request body holds a number too long to read") from None
    if too_deep(raw, value):
        raise ControlError(_TOO_DEEP)
    if has_lone_surrogate(value):
        raise ControlError("request body must be valid Unicode (a string holds a lone "
                           "surrogate escape)")
    return value


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _no_query(request: web.Request) -> None:
    """Only `GET /_sim/messages` filters. Elsewhere a query would be ignored, and on a DELETE
    that is destructive: `DELETE /_sim/faults?provider=resend` would clear every provider's
    rules, not resend's."""
    if request.query:
        names = ", ".join(sorted({show(name) for name in request.query}))
        raise ControlError(
            f"{request.method} {request.path} takes no query parameters; got {names}"
        )


def _with_body(operation: Callable[[SimState, object], Any], status: int = 200) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        _no_query(request)
        payload = await _body(request)
        if payload is None and operation is not reset:
            raise ControlError("request body must be a JSON object")
        return _json(operation(request.app[STATE], payload), status)

    return handler


def _no_body(operation: Callable[[SimState], Any], *, query: bool = False) -> Handler:
    """`query=True` lets a query through unread (health probes may add cache busters)."""
    async def handler(request: web.Request) -> web.StreamResponse:
        if not query:
            _no_query(request)
        result = operation(request.app[STATE])
        return web.Response(status=204) if result is None else _json(result)

    return handler


def _literal_plus_query(raw: str) -> dict[str, str]:
    """The query with a literal `+` kept as `+`.

    Form decoding reads `+` as a space, so `?to=+15551234567` (a phone number pasted into a
    URL, as curl sends it) would look for " 15551234567" and find nothing. No recipient,
    task id or provider name holds a space, while E.164 numbers all start with `+`; a space
    still arrives as `%20`.

    Each name is taken once and each value must be UTF-8 once percent-decoded, as in the
    notifkit API: answering for the first of two values, or for text with replacement
    characters, would filter on something the caller never asked for.
    """
    query: dict[str, str] = {}
    for part in raw.split("&"):
        try:
            pairs = parse_qsl(part.replace("+", "%2B"), keep_blank_values=True,
                              errors="strict")
        except UnicodeDecodeError:
            name = unquote(part.partition("=")[0], errors="replace")
            raise ControlError(
                f"{show(name)} must be valid UTF-8 once percent-decoded"
            ) from None
        for name, value in pairs:
            if name in query:
                raise ControlError(f"{show(name)} must be given once")
            query[name] = value
    return query


async def _messages(request: web.Request) -> web.StreamResponse:
    query = _literal_plus_query(request.rel_url.raw_query_string)
    return _json(list_messages(request.app[STATE], query))


async def _delete_fault(request: web.Request) -> web.StreamResponse:
    _no_query(request)
    delete_fault(request.app[STATE], request.match_info["id"])
    return web.Response(status=204)


async def _page(request: web.Request) -> web.StreamResponse:
    html = render_page(request.app[STATE])
    return web.Response(
        body=html.encode("utf-8", "backslashreplace"),
        content_type="text/html", charset="utf-8",
        headers={
            "Content-Security-Policy": _PAGE_POLICY,
            "X-Content-Type-Options": "nosniff",
        },
    )


async def _redirect_to_page(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound("/_sim/")


def routes() -> list[web.RouteDef]:
    return [
        web.get("/_sim", _redirect_to_page),
        web.get("/_sim/", _page),
        web.get("/_sim/health", _no_body(health, query=True)),
        web.post("/_sim/faults", _with_body(add_fault, status=201)),
        web.get("/_sim/faults", _no_body(list_faults)),
        web.delete("/_sim/faults", _no_body(clear_faults)),
        web.delete("/_sim/faults/{id}", _delete_fault),
        web.get("/_sim/messages", _messages),
        web.get("/_sim/stats", _no_body(stats)),
        web.post("/_sim/limits", _with_body(set_limit)),
        web.get("/_sim/limits", _no_body(list_limits)),
        web.delete("/_sim/limits", _no_body(clear_limits)),
        web.post("/_sim/receipts", _with_body(set_receipts)),
        web.get("/_sim/receipts", _no_body(get_receipts)),
        web.delete("/_sim/receipts", _no_body(disable_receipts)),
        web.post("/_sim/reset", _with_body(reset)),
    ]
