"""Fixtures for the API tests: the app on aiohttp's test server, against the real Redis and
PostgreSQL of the root conftest (one namespace and one schema per test).

``api`` is a small client that knows the admin key; ``api.project()`` creates a project with a
full and a send key through the admin API, as a user would.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from multidict import CIMultiDictProxy

from notifkit.config import Settings
from notifkit.services.api.app import create_app
from notifkit.services.api.state import HUB

ADMIN = "test-admin-key-0123456789"

ApiClient = TestClient[web.Request, web.Application]


@dataclass
class Reply:
    status: int
    body: Any
    headers: CIMultiDictProxy[str]

    @property
    def error(self) -> dict[str, Any]:
        assert isinstance(self.body, dict), self.body
        assert "error" in self.body, self.body
        error: dict[str, Any] = self.body["error"]
        return error

    @property
    def fields(self) -> list[str]:
        return [d["field"] for d in self.error["details"]]


@dataclass
class Project:
    id: str
    full: str
    send: str


class Api:
    def __init__(self, client: ApiClient, settings: Settings) -> None:
        self.client = client
        self.settings = settings

    async def call(
        self, method: str, path: str, *, key: str | None = None, json: Any = None,
        data: bytes | str | None = None, headers: Mapping[str, str] | None = None,
        project: str | None = None, params: Mapping[str, str] | None = None,
    ) -> Reply:
        sent = dict(headers or {})
        if key is not None:
            sent["Authorization"] = f"Bearer {key}"
        if project is not None:
            sent["x-project-id"] = project
        async with self.client.request(method, path, json=json, data=data, headers=sent,
                                       params=params) as response:
            raw = await response.read()
            body: Any = None
            if raw and response.content_type == "application/json":
                body = await response.json()
            elif raw:
                body = raw.decode()
            return Reply(response.status, body, response.headers)

    async def admin(self, method: str, path: str, **kwargs: Any) -> Reply:
        return await self.call(method, path, key=ADMIN, **kwargs)

    async def project(self, name: str = "acme", **settings: Any) -> Project:
        created = await self.admin("POST", "/v1/projects",
                                   json={"name": name, **({"settings": settings}
                                                          if settings else {})})
        assert created.status == 201, created.body
        project_id = created.body["id"]
        keys = []
        for role in ("full", "send"):
            made = await self.admin("POST", f"/v1/projects/{project_id}/keys",
                                    json={"role": role, "name": f"{role} key"})
            assert made.status == 201, made.body
            keys.append(made.body["key"])
        return Project(project_id, keys[0], keys[1])


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    """The root settings with an API rate high enough never to get in a test's way."""
    return settings.replace(api_rate_per_second=10_000.0, api_rate_burst=10_000,
                            public_url="http://127.0.0.1:8080")


async def start_api(settings: Settings, **options: Any) -> tuple[TestServer, ApiClient]:
    app = create_app(settings, sse_heartbeat_s=options.pop("sse_heartbeat_s", 0.2), **options)
    server = TestServer(app)
    client = TestClient(server)
    await client.start_server()
    # The revocation subscription is up before the first request, as in a started service.
    await asyncio.wait_for(app[HUB].live.wait(), 10)
    return server, client


@contextlib.asynccontextmanager
async def running_api(settings: Settings, **options: Any) -> AsyncIterator[Api]:
    """An API process on ``settings`` for the length of the block."""
    _server, client = await start_api(settings, **options)
    try:
        yield Api(client, settings)
    finally:
        await client.close()


@pytest.fixture
async def api(api_settings: Settings) -> AsyncIterator[Api]:
    async with running_api(api_settings) as api:
        yield api


@pytest.fixture
async def project(api: Api) -> Project:
    return await api.project()
