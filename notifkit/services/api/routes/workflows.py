"""Workflow definitions, triggers and instances. The api only stores and enqueues; the
workflow service runs instances from ``workflow:inbound``.

Definitions are validated by :func:`notifkit.workflow_defs.validate_steps`, the rules the
workflow service runs by, plus a check that every template they name exists.

A trigger creates the ``workflow_instances`` row (status ``pending``, the definition's steps
copied so later edits never change a running instance) and XADDs
``{"type": "trigger", "projectId", "workflowId", "instanceId", "userId", "data"}``.
Under an ``x-idempotency-key`` the same key within 24 h answers with the instance it started
(from the key's record in Redis, else from the row that holds the key), as a send's key does;
after that it starts a new instance, which takes the key over.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg
from aiohttp import web

from notifkit.db import workflows as workflows_db
from notifkit.ids import uuid7
from notifkit.services.api.errors import ApiError, detail, json_response, not_found
from notifkit.services.api.idempotency import (
    HEADER,
    REPLAY_HEADER,
    IdempotencyKey,
    header_key,
    key_reused,
    replay_earlier,
)
from notifkit.services.api.middleware import project_id
from notifkit.services.api.routes.notifications import IDEMPOTENCY_PARAM, REPLAY_REPLY_HEADERS
from notifkit.services.api.routing import CURSOR, LIMIT, SEND, Operations, Reply
from notifkit.services.api.schemas import ref
from notifkit.services.api.state import DB, KEYS, REDIS, SETTINGS
from notifkit.services.api.validation import (
    Fields,
    id_page,
    id_page_query,
    iso,
    lookup_id,
    path_id,
    read_json,
    uuid_id,
)
from notifkit.streams import xadd
from notifkit.text import identifier_problem
from notifkit.workflow_defs import BRANCHES, MAX_DEPTH, validate_steps

log = logging.getLogger("notifkit.api")

ops = Operations("workflows")

@ops.route("PUT", "/v1/workflows/{workflowId}", "Create or replace a workflow",
           body=ref("WorkflowPut"), responses={200: ref("Workflow"), 201: ref("Workflow")},
           description="Errors name the step by its path, e.g. steps[2].then[0].template.")
async def put_workflow(request: web.Request) -> web.Response:
    project = project_id(request)
    workflow_id = path_id(request, "workflowId")
    fields = Fields(await read_json(request))
    fields.only(("steps",))
    if "steps" not in fields.body:
        fields.fail("steps", "is required")
    else:
        # Compiling every branch expression of a large definition takes seconds: in a thread,
        # the event loop goes on answering other requests meanwhile.
        problems = await asyncio.to_thread(validate_steps, fields.body["steps"])
        fields.errors.extend(detail(e["field"], e["message"]) for e in problems)
    steps: Any = fields.body.get("steps")
    faulted = {error["field"] for error in fields.errors}
    templates: dict[str, list[str]] = {}
    # Even when other steps are at fault: one detail per problem, the unknown template
    # included, so a caller fixes the definition in one round. Not when the list as a whole
    # is refused (no list, or more steps than a definition holds): no template is looked up
    # for a body that size.
    if isinstance(steps, list) and "steps" not in faulted:
        _templates(steps, "steps", templates, MAX_DEPTH)
    pool = request.app[DB]
    # As POST /v1/notifications: the template must exist; a channel it has no content for
    # gets generic content when the step sends.
    known = {r["id"] for r in await pool.fetch(
        "SELECT id FROM templates WHERE project_id = $1 AND id = ANY($2::text[])",
        project, list(templates),
    )} if templates else set()
    for template, uses in templates.items():
        for path in uses:
            if template not in known and f"{path}.template" not in faulted:
                fields.errors.append(
                    detail(f"{path}.template", "no template with this id exists in this project"))
    fields.raise_if_invalid()
    row = await pool.fetchrow(
        "INSERT INTO workflow_definitions (project_id, id, steps) VALUES ($1, $2, $3) "
        "ON CONFLICT (project_id, id) DO UPDATE SET steps = EXCLUDED.steps, updated_at = now() "
        "RETURNING (xmax = 0) AS created, id, steps, created_at, updated_at",
        project, workflow_id, steps,
    )
    return json_response(workflow_json(row), 201 if row["created"] else 200)


@ops.route("GET", "/v1/workflows/{workflowId}", "Get a workflow",
           responses={200: ref("Workflow")})
async def get_workflow(request: web.Request) -> web.Response:
    workflow_id = lookup_id(request, "workflowId", "workflow")
    row = await request.app[DB].fetchrow(
        "SELECT id, steps, created_at, updated_at FROM workflow_definitions "
        "WHERE project_id = $1 AND id = $2",
        project_id(request), workflow_id,
    )
    if row is None:
        raise not_found("workflow", workflow_id)
    return json_response(workflow_json(row))


@ops.route("GET", "/v1/workflows", "The project's workflows, by id",
           query=(LIMIT, CURSOR), responses={200: ref("WorkflowList")})
async def list_workflows(request: web.Request) -> web.Response:
    limit, after = id_page_query(request)
    rows = await request.app[DB].fetch(
        "SELECT id, steps, created_at, updated_at FROM workflow_definitions "
        "WHERE project_id = $1 AND ($2::text IS NULL OR id > $2) ORDER BY id LIMIT $3",
        project_id(request), after, limit + 1,
    )
    return json_response(id_page(request, rows, limit, workflow_json))


@ops.route("DELETE", "/v1/workflows/{workflowId}", "Delete a workflow",
           responses={204: Reply(None, "The workflow can no longer be triggered; instances "
                                       "already started run to their end.")})
async def delete_workflow(request: web.Request) -> web.Response:
    workflow_id = lookup_id(request, "workflowId", "workflow")
    # Instances carry their own copy of the steps, so they need nothing from this row.
    deleted = await request.app[DB].fetchval(
        "DELETE FROM workflow_definitions WHERE project_id = $1 AND id = $2 RETURNING true",
        project_id(request), workflow_id,
    )
    if not deleted:
        raise not_found("workflow", workflow_id)
    return web.Response(status=204)


@ops.route("POST", "/v1/workflows/{workflowId}/trigger", "Start a workflow for a user",
           roles=SEND, body=ref("TriggerRequest"), headers=(IDEMPOTENCY_PARAM,),
           responses={202: Reply(ref("TriggerAccepted"), "The instance is queued.",
                                 headers=REPLAY_REPLY_HEADERS)},
           errors=(409,))
async def trigger_workflow(request: web.Request) -> web.Response:
    project = project_id(request)
    workflow_id = lookup_id(request, "workflowId", "workflow")
    key = header_key(request)
    route = f"POST /v1/workflows/{workflow_id}/trigger"
    app = request.app
    body = await read_json(request)
    fields = Fields(body)
    fields.only(("userId", "data"))
    user_id = fields.identifier("userId", required=True)
    data = fields.obj("data", nullable=True) or {}
    fields.raise_if_invalid()
    assert user_id is not None
    # Before the definition is read: a workflow deleted since does not take a retry's answer.
    if (earlier := await replay_earlier(request, project, key, route)) is not None:
        return earlier
    steps = await workflows_db.get_definition(app[DB], project, workflow_id)
    if steps is None:
        # Redis lost the key's record (else replay_earlier answered): the instance row still
        # holds the key for its 24 h, and the instance runs on its own copy of the steps.
        if key is not None and (existing := await workflows_db.keyed_instance(
                app[DB], project, key, app[SETTINGS].caller_idempotency_ttl_s)) is not None \
                and existing.workflow_id == workflow_id:
            await _requeue_if_pending(request, project, existing)
            return json_response({"instanceId": existing.id}, 202, {REPLAY_HEADER: "true"})
        raise not_found("workflow", workflow_id)
    if key is None:
        instance_id, _ = await _start(request, project, workflow_id, user_id, data, steps, None)
        return json_response({"instanceId": instance_id}, 202)
    # No PostgreSQL lookup after Redis lost the key: the instance's unique key arbitrates.
    idem = IdempotencyKey(
        app[REDIS], app[KEYS].api_idempotency(project, key), route, body,
        app[SETTINGS].caller_idempotency_ttl_s, app[KEYS].api_idempotency_since,
    )
    replay = await idem.claim()
    if replay is not None:
        return json_response(replay.body, replay.status, {REPLAY_HEADER: "true"})
    try:
        instance_id, created = await _start(request, project, workflow_id, user_id, data,
                                            steps, key)
    except BaseException:
        await idem.release()
        raise
    await idem.finish(202, {"instanceId": instance_id})
    headers = None if created else {REPLAY_HEADER: "true"}
    return json_response({"instanceId": instance_id}, 202, headers)


@ops.route("GET", "/v1/workflow-instances/{instanceId}", "A workflow instance and its steps",
           responses={200: ref("WorkflowInstance")})
async def get_instance(request: web.Request) -> web.Response:
    project = project_id(request)
    instance_id = uuid_id(request, "instanceId", "workflow instance")
    body = await instance_body(request.app[DB], project, instance_id)
    if body is None:
        raise not_found("workflow instance", instance_id)
    return json_response(body)


@ops.route("POST", "/v1/workflow-instances/{instanceId}/cancel", "Cancel a workflow instance",
           responses={200: Reply(ref("WorkflowInstance"), "The instance after the cancel, as "
                                 "GET shows it: status canceled, the step it was on canceled."),
                      409: Reply(ref("Error"), "The instance had finished already, other "
                                               "than canceled (nothing_to_cancel).")},
           description=(
               "Ends an instance that has not finished, wherever it is: pending, between "
               "steps, or sleeping in a wait, a waitForEvent or a digest window. Nothing of it "
               "runs afterwards: its events and timers wake nothing, and a digest window it "
               "collects is closed unsent, with the triggers merged into it. A send already "
               "handed on when the cancel lands is not taken back. Canceling again "
               "answers 200."))
async def cancel_instance(request: web.Request) -> web.Response:
    project = project_id(request)
    instance_id = uuid_id(request, "instanceId", "workflow instance")
    pool = request.app[DB]
    async with pool.acquire() as conn:
        canceled = await workflows_db.cancel_instance(conn, project, instance_id)
    body = await instance_body(pool, project, instance_id)
    if body is None:
        raise not_found("workflow instance", instance_id)
    if not canceled and body["status"] != "canceled":  # canceling again answers 200
        raise ApiError(409, "nothing_to_cancel",
                       f"The workflow instance has finished already (status "
                       f"{body['status']}); there is nothing left to cancel.")
    if canceled:
        log.info("Canceled a workflow instance.",
                 extra={"instance_id": instance_id, "project_id": project})
    return json_response(body)


async def instance_body(
    pool: asyncpg.Pool, project: str, instance_id: str
) -> dict[str, Any] | None:
    """What GET /v1/workflow-instances/{instanceId} answers; None for no such instance."""
    row = await pool.fetchrow(
        "SELECT id, workflow_id, user_id, status, current_step, created_at, updated_at, "
        "dead_letter->>'error' AS error FROM workflow_instances WHERE id = $1 AND project_id = $2",
        instance_id, project,
    )
    if row is None:
        return None
    steps = await pool.fetch(
        "SELECT step_index, path, type, status, output, "
        "coalesce(finished_at, started_at) AS at "
        "FROM workflow_steps WHERE instance_id = $1 AND project_id = $2 ORDER BY step_index",
        instance_id, project,
    )
    body: dict[str, Any] = {
        "id": str(row["id"]), "workflowId": row["workflow_id"], "userId": row["user_id"],
        "status": row["status"], "currentStep": row["current_step"],
        "steps": [{"index": s["step_index"], "path": s["path"], "type": s["type"],
                   "status": s["status"], "output": s["output"], "at": iso(s["at"])}
                  for s in steps],
        "createdAt": iso(row["created_at"]), "updatedAt": iso(row["updated_at"]),
    }
    if row["status"] == "failed" and row["error"] is not None:
        body["error"] = row["error"]  # an entry of it was dead-lettered
    return body


# ---------------------------------------------------------------------------------------------


async def _start(
    request: web.Request, project: str, workflow_id: str, user_id: str, data: dict[str, Any],
    steps: list[Any], key: str | None,
) -> tuple[str, bool]:
    """Create the instance and enqueue it; (instance id, False) if the key already made one
    within its 24 h."""
    app = request.app
    instance_id = uuid7()
    pool = app[DB]
    inserted = await workflows_db.insert_triggered(
        pool, instance_id=instance_id, project_id=project, workflow_id=workflow_id,
        user_id=user_id, steps=steps, data=data, idempotency_key=key,
        key_window_s=app[SETTINGS].caller_idempotency_ttl_s,
    )
    if not inserted:
        assert key is not None
        # The key's record in Redis is gone (Redis lost it, or the request that made the
        # instance died before answering) but the instance it made within the key's 24 h is
        # on record.
        existing = await workflows_db.keyed_instance(pool, project, key)
        # None: the instance was deleted in between (its maker failed), or its 24 h ended
        # just now and another trigger took the key over.
        if existing is None:
            raise ApiError(409, "idempotency_key_in_use",
                           "A request with this idempotency key failed just now; retry.",
                           [{"field": HEADER, "message": "is in use by a request in progress"}],
                           headers={"Retry-After": "1"})
        if existing.workflow_id != workflow_id:
            # The key's Redis record, which would have said so, is gone; the row still knows
            # the key started another workflow, and that instance is not this trigger's answer.
            raise key_reused()
        await _requeue_if_pending(request, project, existing)
        return existing.id, False
    payload = {"type": "trigger", "projectId": project, "workflowId": workflow_id,
               "instanceId": instance_id, "userId": user_id, "data": data}
    try:
        await xadd(app[REDIS], app[KEYS].workflow_inbound, payload, app[SETTINGS].queue_max_len)
    except BaseException:
        log.warning("Enqueueing a workflow trigger failed; deleting the instance so nothing is "
                    "left half-started.", extra={"instance_id": instance_id})
        await pool.execute("DELETE FROM workflow_instances WHERE id = $1 AND project_id = $2",
                           instance_id, project)
        raise
    log.info("Started workflow %r and queued the instance for the workflow service.",
             workflow_id, extra={"instance_id": instance_id, "project_id": project})
    return instance_id, True


async def _requeue_if_pending(request: web.Request, project: str,
                              existing: workflows_db.Instance) -> None:
    """Enqueue again a keyed instance a replay answers with, if nothing has run it yet."""
    if existing.status != "pending":
        return
    # The request that created it may have died between the INSERT and the XADD, or the
    # entry went with Redis's data. Enqueueing it again is harmless (the workflow service
    # runs an instance from its own state, under its lock) and means it is never stranded.
    app = request.app
    await xadd(app[REDIS], app[KEYS].workflow_inbound, {
        "type": "trigger", "projectId": project, "workflowId": existing.workflow_id,
        "instanceId": existing.id, "userId": existing.user_id, "data": existing.trigger_data,
    }, app[SETTINGS].queue_max_len)


def workflow_json(row: asyncpg.Record) -> dict[str, Any]:
    return {"id": row["id"], "steps": row["steps"], "createdAt": iso(row["created_at"]),
            "updatedAt": iso(row["updated_at"])}


def _templates(steps: list[Any], path: str, found: dict[str, list[str]], depth: int) -> None:
    """Template id -> the steps naming it, over every send and digest step, branches
    included (``depth`` more levels of them). The definition may be at fault elsewhere:
    anything not shaped like a step, or no template id, is passed over, as validation has
    named it already."""
    for index, step in enumerate(steps):
        if not isinstance(step, dict):
            continue
        where = f"{path}[{index}]"
        template = step.get("template")
        if step.get("type") in ("send", "digest") and isinstance(template, str) \
                and identifier_problem(template) is None:
            found.setdefault(template, []).append(where)
        if step.get("type") != "branch" or depth <= 0:
            continue
        for arm in BRANCHES:
            children = step.get(arm)
            if isinstance(children, list):
                _templates(children, f"{where}.{arm}", found, depth - 1)
