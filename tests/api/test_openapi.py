"""GET /openapi.json matches the server: the same routes, and schemathesis finds no 500 and no
response that breaks the document.

schemathesis drives the app over real HTTP (aiohttp is not ASGI), so the app runs on a free
port in a thread with its own event loop while the generated requests are sent from the test.
Examples per operation are few and shrinking is off, which bounds the run's time.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import schemathesis
from aiohttp import web
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.result import Ok

from notifkit.config import Settings
from notifkit.services.api.app import create_app, operations
from notifkit.services.api.errors import ApiRunner
from notifkit.services.api.state import HUB
from tests.api.conftest import ADMIN, Api, Project

EXAMPLES_PER_OPERATION = 15
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, response_headers_conformance]


@schemathesis.check
def rejects_invalid_data(ctx: Any, response: Any, case: Any) -> bool | None:
    """negative_data_rejection, counting 413 (a body over the limit) as the rejection it is."""
    if response.status_code == 413:
        return None
    result: bool | None = negative_data_rejection(ctx, response, case)
    return result


# Keyed routes also reject what their schema rejects (unknown query parameters included).
# Public routes are called by browsers, mail clients and providers that add parameters of
# their own, so there only the checks above apply.
STRICT_CHECKS = [*CHECKS, rejects_invalid_data]
# An endless stream: schemathesis would wait on it forever (it is tested in test_inbox.py).
SKIPPED = {"inboxStream"}


def test_every_route_is_documented_and_every_documented_route_exists() -> None:
    from notifkit.services.api.openapi import document

    app = create_app(Settings())
    mounted = {(route.method, route.resource.canonical) for route in app.router.routes()
               if route.resource is not None}
    # HEAD comes with GET (as HTTP has it), so the document lists only the GET.
    heads = {(method, path) for method, path in mounted if method == "HEAD"}
    assert heads <= {("HEAD", path) for method, path in mounted if method == "GET"}
    served = mounted - heads
    doc = document(operations())
    documented = {(method.upper(), path) for path, item in doc["paths"].items()
                  for method in item}
    assert served == documented
    ids = [op["operationId"] for item in doc["paths"].values() for op in item.values()]
    assert len(ids) == len(set(ids))


def test_an_inbox_route_that_takes_a_token_documents_it_as_a_credential() -> None:
    """A user's browser calls the inbox routes with ?token= and no key: the document says a
    key or the token will do there, and a key elsewhere."""
    from notifkit.services.api.openapi import document

    doc = document(operations())
    assert doc["components"]["securitySchemes"]["inboxToken"] == {
        "type": "apiKey", "in": "query", "name": "token",
        "description": doc["components"]["securitySchemes"]["inboxToken"]["description"]}
    either: list[dict[str, list[str]]] = [{"bearer": []}, {"inboxToken": []}]
    by_token = {(method, path) for path, item in doc["paths"].items()
                for method, op in item.items() if op["security"] == either}
    assert by_token == {("get", "/v1/users/{userId}/inbox"),
                        ("post", "/v1/users/{userId}/inbox/{messageId}/read"),
                        ("get", "/v1/users/{userId}/inbox/stream")}
    # Minting a token takes a key.
    assert doc["paths"]["/v1/users/{userId}/inbox/token"]["post"]["security"] == [{"bearer": []}]


def test_every_route_that_takes_a_project_header_documents_the_query_parameter_too() -> None:
    """The server reads the project from ``x-project-id`` or ``projectId`` on every such
    route (DLQ replay and the stream listing included), so the document says so."""
    from notifkit.services.api.openapi import document

    doc = document(operations())
    for path, item in doc["paths"].items():
        for method, op in item.items():
            names = {p["name"] for p in op.get("parameters", [])}
            if "x-project-id" in names:
                assert "projectId" in names, f"{method.upper()} {path}"


def test_every_answer_that_sends_retry_after_documents_it() -> None:
    """The server sends Retry-After with every 503 (a store that cannot serve) and with the 409
    of an idempotency key still in progress, as with a 429, so a client generated from the
    document knows to read it; /health's 503 is a health report and sends none."""
    from notifkit.services.api.openapi import document

    doc = document(operations())
    for path, item in doc["paths"].items():
        for method, op in item.items():
            label = f"{method.upper()} {path}"
            responses = op["responses"]
            if path != "/health":
                assert "Retry-After" in responses["503"].get("headers", {}), label
            names = {p["name"] for p in op.get("parameters", [])}
            if "x-idempotency-key" in names:
                assert "Retry-After" in responses["409"].get("headers", {}), label
                assert "another route" in responses["409"]["description"], label


async def test_every_query_parameter_documented_as_taking_an_empty_value_takes_one(
    api: Api, project: Project
) -> None:
    """The document marks the optional query parameters ``allowEmptyValue``, since the server
    reads ``?status=`` as the parameter left out: each list route, asked with every such
    parameter given empty, answers its first page (as without them), and ``projectId``, which
    names who acts, is not among them."""
    from notifkit.services.api.openapi import document

    await api.call("PUT", "/v1/users/u", key=project.full, json={})
    await api.call("PUT", "/v1/templates/t", key=project.full,
                   json={"channels": {"email": {"subject": "s", "text": "t"}}})
    sent = await api.call("POST", "/v1/notifications", key=project.send,
                          json={"to": "u", "template": "t"})
    values = {**_PATH_VALUES, "eventId": sent.body["id"]}
    doc = document(operations())
    asked = 0
    for path, item in doc["paths"].items():
        for method, op in item.items():
            params = op.get("parameters", [])
            empty = [p["name"] for p in params if p.get("allowEmptyValue")]
            assert "projectId" not in empty, f"{method.upper()} {path}"
            if method != "get":
                # Only an inbox token stands in for the key there, and is read as left out.
                assert empty in ([], ["token"]), f"{method.upper()} {path}"
                continue
            if not empty or op["operationId"] in SKIPPED:
                continue
            url = re.sub(r"{(\w+)}", lambda m: values[m.group(1)], path)
            reply = await api.call("GET", url + "?" + "&".join(f"{n}=" for n in empty),
                                   key=project.full)
            plain = await api.call("GET", url, key=project.full)
            assert (reply.status, reply.body) == (plain.status, plain.body), (path, reply.body)
            assert reply.status == 200, (path, reply.body)
            asked += 1
    assert asked >= 8


# A value for each path parameter that is no UUID, so every route is reached (whether it
# names anything is not asked: these answers come before any handler runs).
_PATH_VALUES = {"provider": "resend", "entryId": "1-0", "userId": "u", "templateId": "t",
                "workflowId": "w"}
_UUID = "00000000-0000-7000-8000-000000000000"


async def _status(api: Api, project: Project, method: str, path: str, extra: bytes) -> int:
    """The status of a request to ``path`` whose headers end with ``extra`` and whose body is
    never sent, as a client waiting for 100 Continue would."""
    server = api.client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\n".encode()
                     + b"Authorization: Bearer " + project.full.encode() + b"\r\n" + extra
                     + b"\r\n")
        await writer.drain()
        line = await reader.readline()
    finally:
        writer.close()
    return int(line.split()[1])


async def test_every_route_documents_its_answers_to_an_expect_header(
    api: Api, project: Project,
) -> None:
    """Every route answers an Expect other than 100-continue with a 417, and a 100-continue
    announcing a body over the limit with a 413 (a route taking no body too), before any
    handler runs: the document lists both for each, so a client generated from it knows them."""
    from notifkit.services.api.openapi import document

    doc = document(operations())
    too_long = str(api.settings.max_body_bytes + 1).encode()
    for op in operations():
        path = re.sub(r"{(\w+)}", lambda m: _PATH_VALUES.get(m[1], _UUID), op.path)
        documented = doc["paths"][op.path][op.method.lower()]["responses"]
        for extra, expected in ((b"Expect: teapot\r\nContent-Length: 2\r\n", 417),
                                (b"Expect: 100-continue\r\nContent-Length: " + too_long
                                 + b"\r\n", 413)):
            label = f"{op.method} {op.path}"
            assert await _status(api, project, op.method, path, extra) == expected, label
            assert str(expected) in documented, label


class LiveApi:
    """The app on 127.0.0.1:<free port>, served from a thread with its own event loop."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.port = 0
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LiveApi:
        self._thread.start()
        if not self._ready.wait(30) or self._error is not None:
            raise RuntimeError(f"the API did not start: {self._error!r}")
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        try:
            app = create_app(self.settings)
            runner = ApiRunner(app, access_log=None, shutdown_timeout=1)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = runner.addresses[0][1]
            await asyncio.wait_for(app[HUB].live.wait(), 10)
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            raise
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()


@pytest.fixture
def live(settings: Settings) -> Iterator[LiveApi]:
    fast = settings.replace(api_rate_per_second=100_000.0, api_rate_burst=100_000)
    with LiveApi(fast) as api:
        yield api


def _project(base: str) -> tuple[str, str]:
    admin = {"Authorization": f"Bearer {ADMIN}"}
    project = requests.post(f"{base}/v1/projects", json={"name": "fuzz"}, headers=admin,
                            timeout=10).json()["id"]
    key = requests.post(f"{base}/v1/projects/{project}/keys", json={"role": "full"},
                        headers=admin, timeout=10).json()["key"]
    # A template and a user, so some generated sends and previews get past "unknown".
    full = {"Authorization": f"Bearer {key}"}
    requests.put(f"{base}/v1/templates/t", json={"channels": {"sms": {"text": "hi"}}},
                 headers=full, timeout=10)
    requests.put(f"{base}/v1/users/u", json={}, headers=full, timeout=10)
    return project, key


# A hang guard, not a time limit: some 1,800 requests, a few minutes on a slow, busy machine.
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_schemathesis_finds_no_server_error_and_no_schema_violation(live: LiveApi) -> None:
    _project_id, key = _project(live.url)
    schema = schemathesis.openapi.from_url(f"{live.url}/openapi.json")
    failures: list[str] = []
    session = requests.Session()
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result.err()
        operation = result.ok()
        operation_id = operation.definition.raw.get("operationId")
        if operation_id in SKIPPED:
            continue
        admin_only = "admin" in operation.definition.raw.get("tags", [])
        public = operation.definition.raw.get("security") == []
        headers = {"Authorization": f"Bearer {ADMIN if admin_only else key}"}
        checks = CHECKS if public else STRICT_CHECKS
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                _fuzz(operation, mode, live.url, headers, session, checks)
            except Unsatisfiable:
                continue  # nothing to negate (no parameters, no body)
            except Exception as exc:  # one report per failing operation, then carry on
                failures.append(f"{operation.label} [{mode.value}]: {_described(exc)}")
    assert not failures, "\n\n".join(failures)


def _described(exc: Exception) -> str:
    """The failure and, for Hypothesis's "inconsistent results", what failed the first time."""
    if isinstance(exc, ExceptionGroup):
        return "; ".join([str(exc), *(f"{type(e).__name__}: {e}" for e in exc.exceptions)])
    return str(exc)


def _fuzz(operation: Any, mode: GenerationMode, base_url: str, headers: dict[str, str],
          session: requests.Session, checks: list[Any]) -> None:
    @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate], database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        if case.query:
            # requests drops a parameter whose value is None or an empty list/object, so the
            # server would never see the unknown parameter a negative case added: send it.
            case.query = {k: "" if v is None or v == [] or v == {} else v
                          for k, v in case.query.items()}
        sent = dict(case.headers or {})
        sent.setdefault("Authorization", headers["Authorization"])
        # Generous: a request that outwaits a busy machine's scheduler once and not on replay
        # would read as an inconsistent result, not as the server's fault.
        case.call_and_validate(base_url=base_url, session=session, headers=sent, checks=checks,
                               timeout=60)

    run()


def test_the_workflow_step_schema_requires_what_the_server_requires() -> None:
    """Given the document's WorkflowStep schema, a step the server accepts validates and a step
    missing what the server requires (a send without its template, a wait without seconds)
    does not, so clients and generators built from the document send runnable steps."""
    import jsonschema_rs

    from notifkit.services.api.openapi import document
    from notifkit.workflow_defs import validate_steps

    doc = document(operations())
    validator = jsonschema_rs.Draft202012Validator(
        {**doc, "$ref": "#/components/schemas/WorkflowPut"})
    runnable = [
        {"type": "send", "template": "welcome", "channels": ["email"], "priority": None},
        {"type": "wait", "seconds": 1.5},
        {"type": "waitForEvent", "event": "paid", "timeoutSeconds": 60, "onTimeout": "stop"},
        {"type": "branch", "if": "data.plan == 'pro'",
         "then": [{"type": "digest", "windowSeconds": 60, "template": "welcome"}], "else": None},
    ]
    assert validate_steps(runnable) == []
    assert validator.is_valid({"steps": runnable})
    for step in ({"type": "send"}, {"type": "wait"}, {"type": "digest", "template": "t"},
                 {"type": "waitForEvent", "event": "paid"}, {"type": "branch"},
                 {"type": "wait", "seconds": 1, "template": "t"}, {"type": "pause"},
                 {"type": "waitForEvent", "event": "e" * 201, "timeoutSeconds": 60},
                 {"type": "branch", "if": "x" * 2001}):
        assert validate_steps([step]), step
        assert not validator.is_valid({"steps": [step]}), step
