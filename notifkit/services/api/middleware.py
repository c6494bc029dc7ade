"""Authentication, authorisation and the per-project rate limit, in one middleware.

The matched route's :class:`~notifkit.services.api.routing.Operation` says who may call it;
the order of checks is the contract's: no or unknown key 401, wrong role 403, admin key without
a project 400 (unknown project 404), over the project's API rate 429 with Retry-After.
"""

from __future__ import annotations

import contextlib
import math
import time
from urllib.parse import unquote_to_bytes

import asyncpg
from aiohttp import web
from redis.exceptions import RedisError

from notifkit import codec
from notifkit.inbox_token import QUERY_PARAM as INBOX_TOKEN
from notifkit.inbox_token import InvalidInboxToken, verify_inbox_token
from notifkit.services.api.admission import ProjectMissing
from notifkit.services.api.auth import (
    Principal,
    bearer_key,
    forbidden,
    hash_key,
    is_admin_key,
    named_project,
    project_key_hash,
    project_not_found,
    unauthorized,
)
from notifkit.services.api.errors import ApiError, Handler, detail, invalid
from notifkit.services.api.idempotency import HEADER as IDEMPOTENCY_HEADER
from notifkit.services.api.routing import Operation
from notifkit.services.api.state import (
    ADMISSION,
    DB,
    HUB,
    KEY_CACHE,
    OPERATIONS,
    PRINCIPAL,
    SETTINGS,
)
from notifkit.services.api.validation import read_raw

PROJECT_HEADER = "x-project-id"
PROJECT_QUERY = "projectId"
# Headers that decide who acts, for which project, or whether a send is new. Sent twice they
# are ambiguous (a proxy may read the last where this server reads the first): refused.
SINGLE_HEADERS = ("Authorization", PROJECT_HEADER, IDEMPOTENCY_HEADER)


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    route = request.match_info.route
    op = request.app[OPERATIONS].get(route.name or "")
    if op is None or op.access == "public":
        # Unknown routes fall through to aiohttp's 404/405. Public routes are called by
        # browsers, mail clients and providers that may add parameters of their own.
        return await handler(request)
    _reject_repeated_headers(request)
    request[PRINCIPAL] = await authenticate(request, op)
    await require_project(request)
    _reject_unknown_query(request, op)
    if op.body is None and request.body_exists:
        await _reject_body(request)
    try:
        return await handler(request)
    except (asyncpg.ForeignKeyViolationError, ProjectMissing):
        gone = await _project_gone(request)
        if gone is None:
            raise
        raise gone from None
    except ApiError as error:
        # Nothing is found in a project deleted while the caller's key sat in the key cache:
        # the key, not the thing it named, is what is wrong. Asked only on a 404, so found
        # things cost nothing.
        if error.status != 404 or principal(request).is_admin:
            raise
        gone = await _project_gone(request)
        if gone is None:
            raise
        raise gone from None


async def _project_gone(request: web.Request) -> ApiError | None:
    """A write refused for naming no project: the caller's project was deleted after the
    request was authenticated, or while its key sat in the key cache (deleting a project
    deletes its keys, and nothing publishes that). The admin key gets the 404 it gets for any
    unknown project; a project key is refused (``_forget_key``). Any other foreign-key failure
    is a bug and stays one."""
    who = principal(request)
    project = who.project_id
    if project is None or await request.app[DB].fetchval(
            "SELECT 1 FROM projects WHERE id = $1", project):
        return None
    if who.is_admin:
        return project_not_found()
    return await _forget_key(request, who)


def gives_inbox_token(request: web.Request, op: Operation) -> bool:
    """Whether the request authenticates with an inbox token: ``?token=`` on a route that
    takes one. An empty one is the parameter left out, as every optional one is."""
    return bool(request.query.get(INBOX_TOKEN)) and any(p.name == INBOX_TOKEN
                                                         for p in op.query)


def _inbox_principal(request: web.Request) -> Principal:
    """The caller of an inbox route with ``?token=``: the token's user, on that user's own
    inbox only."""
    if request.headers.get("Authorization") is not None:
        raise invalid([detail(INBOX_TOKEN, "give either this token or an Authorization "
                                           "header, not both")])
    if len(request.query.getall(INBOX_TOKEN)) > 1:
        raise invalid([detail(INBOX_TOKEN, "must be given once")])
    try:
        grant = verify_inbox_token(request.app[SETTINGS].secret, request.query[INBOX_TOKEN],
                                   time.time())
    except InvalidInboxToken as exc:
        raise ApiError(401, "invalid_token",
                       f"The inbox token is not valid ({exc}); ask your backend for a new "
                       "one.") from None
    if request.match_info.get("userId") != grant.user_id:
        raise forbidden("The inbox token is for another user's inbox.")
    return Principal("full", grant.project_id, user_id=grant.user_id,
                     expires_at_s=grant.expires_at_s, user_created_us=grant.user_created_us)


async def require_project(request: web.Request) -> None:
    """A project key whose project was deleted while the key sat in the key cache is refused
    and forgotten as on a write, whatever the route: a read would otherwise list an empty
    project, and ``POST /v1/events`` writes nothing to PostgreSQL that would fail. The
    project is checked at most once a second per process (``KeyCache.project_exists``). The
    admin key's project is read at every request already."""
    who = principal(request)
    if who.is_admin or who.project_id is None:
        return
    if not await request.app[KEY_CACHE].project_exists(who.project_id):
        if who.user_id is not None:
            raise ApiError(401, "invalid_token", "The inbox token's project no longer exists.")
        raise await _forget_key(request, who)


async def _forget_key(request: web.Request, who: Principal) -> ApiError:
    """A project key whose project is gone is no key any more: 401, and every API process
    forgets it at once, as after a revocation."""
    key = bearer_key(request.headers.get("Authorization"))
    request.app[KEY_CACHE].drop(hash_key(key))
    with contextlib.suppress(RedisError, OSError):  # the others' caches drop it within 60 s
        await request.app[HUB].publish_revocation(hash_key(key), who.key_id or "")
    return unauthorized("invalid_api_key", "The API key's project no longer exists.")


async def _reject_body(request: web.Request) -> None:
    """A route that takes no body does not ignore one: whoever sent fields expected them to
    count. Nothing, white space, ``{}`` and ``null`` say nothing and pass."""
    raw = (await read_raw(request)).strip()
    if raw in (b"", b"{}", b"null"):
        return
    try:
        if codec.loads(raw) in ({}, None):
            return
    except ValueError:
        pass
    raise invalid([detail("body", "must be empty: this route takes no request body")])


def _reject_repeated_headers(request: web.Request) -> None:
    repeated = [name for name in SINGLE_HEADERS if len(request.headers.getall(name, ())) > 1]
    if repeated:
        raise invalid([detail(name, "must be sent once") for name in repeated])


def _reject_unknown_query(request: web.Request, op: Operation) -> None:
    """A misspelt filter (``?userid=``) must not silently widen a list: unknown query
    parameters are a 400 naming them, and so are parameters given more than once."""
    allowed = {p.name for p in op.query} | {PROJECT_QUERY}
    names = list(dict.fromkeys(request.query))
    unknown = [name for name in names if name not in allowed]
    if unknown:
        raise invalid([detail(name[:100], "is not a query parameter of this route")
                       for name in unknown[:20]])
    # Every parameter takes one value: ?userId=a&userId=b must not quietly mean only a.
    repeated = [name for name in names if len(request.query.getall(name)) > 1]
    if repeated:
        raise invalid([detail(name, "must be given once") for name in repeated])
    raw_query = request.rel_url.raw_query_string
    if "%" in raw_query:
        # The decoder leaves escapes that are not UTF-8 (?userId=%FF) as the literal text
        # '%FF', which would filter on an id no client meant: refused, naming the parameter.
        garbled = [name for name, value in _raw_pairs(raw_query)
                   if not _decodes(name) or not _decodes(value)]
        if garbled:
            raise invalid([detail(name[:100], "must be valid UTF-8 once percent-decoded")
                           for name in garbled[:20]])


def _raw_pairs(query: str) -> list[tuple[str, str]]:
    pairs = []
    for part in query.split("&"):
        name, _, value = part.partition("=")
        pairs.append((name, value))
    return pairs


def _decodes(raw: str) -> bool:
    try:
        unquote_to_bytes(raw.replace("+", " ")).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


async def authenticate(request: web.Request, op: Operation) -> Principal:
    app = request.app
    if gives_inbox_token(request, op):
        return _inbox_principal(request)
    key = bearer_key(request.headers.get("Authorization"))
    if is_admin_key(key, app[SETTINGS].admin_key):
        return await _admin(request, op, _named_project(request, op))
    record = await app[KEY_CACHE].lookup(project_key_hash(key))
    if record is None:
        raise unauthorized("invalid_api_key", "The API key is unknown or has been revoked.")
    if op.access == "admin":
        raise forbidden("Only the admin key may call this route.")
    if record.role not in op.roles:
        raise forbidden(
            f"A '{record.role}' key may not call this route; it needs a "
            f"{' or '.join(sorted(op.roles))} key."
        )
    # Read only now: who is calling, and whether they may, comes before what they asked for.
    named = _named_project(request, op)
    if named is not None and named != record.project_id:
        # Acting for the key's own project instead would write or read where the caller
        # did not mean to; whether the named project exists is not this key's to learn.
        # A key not allowed to act there: 403, as API.md has it for a call the key may not
        # make, for any project but its own, existing or not.
        raise ApiError(403, "forbidden", "This API key belongs to another project.",
                       [detail(naming_field(request), "names another project than the API "
                                                      "key's")])
    wait_s = await app[ADMISSION].rate_wait_s(record.project_id)
    if wait_s > 0:
        retry_after_s = max(1, math.ceil(wait_s))
        raise ApiError(
            429, "rate_limited",
            f"This project is over its API rate; retry in {retry_after_s} s.",
            headers={"Retry-After": str(retry_after_s)},
        )
    return Principal(record.role, record.project_id, record.key_id)


def _named_project(request: web.Request, op: Operation) -> str | None:
    if op.access not in ("project", "ops"):
        return None
    return named_project(request.headers.get(PROJECT_HEADER), request.query.get(PROJECT_QUERY))


async def _admin(request: web.Request, op: Operation, project_id: str | None) -> Principal:
    if op.access == "admin":
        # The admin routes' project is in their path (or they act on none); a header naming
        # one says which project the caller means, which the route holds to (projects.py).
        return Principal("admin", named_project(request.headers.get(PROJECT_HEADER),
                                                request.query.get(PROJECT_QUERY)))
    if project_id is None:
        if op.access == "ops":
            return Principal("admin", None)
        raise ApiError(
            400, "project_required",
            "The admin key acts for a project only when it names one: send the "
            "x-project-id header or the projectId query parameter.",
            [{"field": PROJECT_HEADER, "message": "is required with the admin key"}],
        )
    exists = await request.app[DB].fetchval("SELECT 1 FROM projects WHERE id = $1", project_id)
    if not exists:
        raise project_not_found()
    return Principal("admin", project_id)


def naming_field(request: web.Request) -> str:
    """Where the request names its project: the header if sent, else the query parameter."""
    return PROJECT_HEADER if request.headers.get(PROJECT_HEADER) else PROJECT_QUERY


def principal(request: web.Request) -> Principal:
    who: Principal = request[PRINCIPAL]
    return who


def project_id(request: web.Request) -> str:
    """The caller's project; project-scoped routes always have one."""
    who: Principal = request[PRINCIPAL]
    return who.project()
