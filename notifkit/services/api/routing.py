"""Operations: a route plus everything the auth middleware and the OpenAPI document need.

Each resource module declares its routes on an :class:`Operations` table::

    ops = Operations("users")

    @ops.route("PUT", "/v1/users/{userId}", "Create or update a user",
               body=schemas.USER_PUT, responses={200: schemas.USER, 201: schemas.USER})
    async def put_user(request: web.Request) -> web.Response: ...

``create_app`` mounts every table, the middleware reads ``access``/``roles`` from the matched
route, and openapi.py builds the document from the same objects, so the router and the
document cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web

Schema = dict[str, Any]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# public:  no key (health, metrics, the OpenAPI document, provider webhooks, unsubscribe)
# admin:   the admin key only (projects and keys)
# project: a project key, or the admin key naming a project
# ops:     the admin key (naming a project or not) or a full project key
Access = Literal["public", "admin", "project", "ops"]
FULL: frozenset[str] = frozenset({"full"})
SEND: frozenset[str] = frozenset({"full", "send"})


@dataclass(frozen=True)
class Param:
    name: str
    where: Literal["query", "header"]
    schema: Schema
    description: str = ""
    required: bool = False


# The list parameters every list route shares.
LIMIT = Param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 500},
              "Page size (default 50).")
CURSOR = Param("cursor", "query",
               {"type": "string", "maxLength": 512, "pattern": "^[A-Za-z0-9_-]*$"},
               "The nextCursor of the previous page.")


@dataclass(frozen=True)
class Reply:
    """One documented response. ``schema`` None = no body."""

    schema: Schema | None
    description: str = ""
    content_type: str = "application/json"
    headers: Mapping[str, Schema] = field(default_factory=dict)


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    handler: Handler
    summary: str
    tag: str
    access: Access
    roles: frozenset[str]
    body: Schema | None
    body_required: bool
    body_types: tuple[str, ...]
    responses: Mapping[int, Reply]
    query: tuple[Param, ...]
    headers: tuple[Param, ...]
    errors: tuple[int, ...]
    description: str

    @property
    def operation_id(self) -> str:
        head, *rest = self.handler.__name__.split("_")
        return head + "".join(part.title() for part in rest)


class Operations:
    def __init__(self, tag: str) -> None:
        self.tag = tag
        self._ops: list[Operation] = []

    def __iter__(self) -> Iterator[Operation]:
        return iter(self._ops)

    def route(
        self,
        method: str,
        path: str,
        summary: str,
        *,
        access: Access = "project",
        roles: frozenset[str] = FULL,
        body: Schema | None = None,
        body_required: bool = True,
        body_types: Sequence[str] = ("application/json",),
        responses: Mapping[int, Reply | Schema | None],
        query: Sequence[Param] = (),
        headers: Sequence[Param] = (),
        errors: Sequence[int] = (),
        description: str = "",
    ) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            replies = {
                status: value if isinstance(value, Reply) else Reply(value)
                for status, value in responses.items()
            }
            self._ops.append(Operation(
                method=method, path=path, handler=handler, summary=summary, tag=self.tag,
                access=access, roles=roles, body=body, body_required=body_required,
                body_types=tuple(body_types), responses=replies, query=tuple(query),
                headers=tuple(headers), errors=tuple(errors), description=description,
            ))
            return handler

        return register
