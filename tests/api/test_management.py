"""The management routes: GET and POST /v1/suppressions, DELETE /v1/suppressions/{id},
GET /v1/templates and DELETE /v1/templates/{id}, each scoped to the caller's project."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from notifkit.config import Settings
from notifkit.services.api.state import ADMISSION
from notifkit.services.api.validation import list_scope, scoped_cursor
from tests.api.conftest import ADMIN, Api, Project, start_api
from tests.support.waiting import until

EMAIL = {"channels": {"email": {"subject": "Hi", "text": "Welcome"}}}


async def suppress(db: asyncpg.Pool, project: str, channel: str, target: str,
                   reason: str = "bounce", minutes_ago: int = 0) -> str:
    """A suppression row as the events service writes it; its id."""
    at = datetime.now(UTC) - timedelta(minutes=minutes_ago)
    return str(await db.fetchval(
        "INSERT INTO suppressions (project_id, channel, target, reason, detail, created_at) "
        "VALUES ($1, $2, $3, $4, 'from a test', $5) RETURNING id",
        project, channel, target, reason, at))


# -- suppressions ---------------------------------------------------------------------------


async def test_suppressions_are_listed_newest_first_page_by_page_and_filtered(
    api: Api, project: Project, db: asyncpg.Pool,
) -> None:
    old = await suppress(db, project.id, "email", "old@example.com", minutes_ago=30)
    sms = await suppress(db, project.id, "sms", "+15550000001", "complaint", minutes_ago=20)
    new = await suppress(db, project.id, "email", "new@example.com", "unsubscribe",
                         minutes_ago=10)
    other = await api.project("other")
    await suppress(db, other.id, "email", "old@example.com")

    first = await api.call("GET", "/v1/suppressions?limit=2", key=project.full)
    assert first.status == 200, first.body
    assert [s["id"] for s in first.body["items"]] == [new, sms]
    assert first.body["items"][0] == {
        "id": new, "channel": "email", "target": "new@example.com", "reason": "unsubscribe",
        "detail": "from a test", "createdAt": first.body["items"][0]["createdAt"]}
    rest = await api.call("GET", "/v1/suppressions", key=project.full,
                          params={"limit": "2", "cursor": first.body["nextCursor"]})
    assert rest.status == 200, rest.body
    assert ([s["id"] for s in rest.body["items"]], rest.body["nextCursor"]) == ([old], None)

    emails = await api.call("GET", "/v1/suppressions?channel=email", key=project.full)
    assert [s["id"] for s in emails.body["items"]] == [new, old]
    one = await api.call("GET", "/v1/suppressions", key=project.full,
                         params={"channel": "email", "target": "old@example.com"})
    assert [s["id"] for s in one.body["items"]] == [old]
    # Filters left empty (a URL template not filled in) are no filters.
    unfilled = await api.call("GET", "/v1/suppressions?channel=&target=&limit=",
                              key=project.full)
    assert [s["id"] for s in unfilled.body["items"]] == [new, sms, old]
    # The admin key naming the project sees the project's rows, as on every project route.
    admin = await api.call("GET", "/v1/suppressions", key=ADMIN, project=project.id)
    assert [s["id"] for s in admin.body["items"]] == [new, sms, old]


@pytest.mark.parametrize(("query", "fields"), [
    ({"channel": "pigeon"}, ["channel"]),
    ({"channel": "inapp"}, ["channel"]),  # in-app messages have no address to suppress
    ({"target": "x" * 1025}, ["target"]),
    ({"limit": "0"}, ["limit"]),
    ({"limit": "501"}, ["limit"]),
    ({"cursor": "nonsense"}, ["cursor"]),
    # a cursor's form, not its content
    ({"cursor": scoped_cursor(list_scope("/v1/suppressions", {}), "x", 1)}, ["cursor"]),
    ({"cursor": scoped_cursor(list_scope("/v1/suppressions", {}), "2030-01-01T00:00:00+00:00",
                              "x")}, ["cursor"]),
    ({"channel": "pigeon", "limit": "x"}, ["limit", "channel"]),
    ({"status": "bounce"}, ["status"]),
])
async def test_bad_suppression_filters_are_400s_naming_the_parameter(
    api: Api, project: Project, query: dict[str, str], fields: list[str],
) -> None:
    reply = await api.call("GET", "/v1/suppressions", key=project.full, params=query)
    assert reply.status == 400, reply.body
    assert reply.fields == fields


async def test_a_suppression_is_deleted_once_and_only_by_its_project(
    api: Api, project: Project, db: asyncpg.Pool,
) -> None:
    mine = await suppress(db, project.id, "email", "ada@example.com")
    other = await api.project("other")
    for key, named in ((other.full, None), (ADMIN, other.id)):
        reply = await api.call("DELETE", f"/v1/suppressions/{mine}", key=key, project=named)
        assert (reply.status, reply.error["code"]) == (404, "suppression_not_found")
    assert (await api.call("DELETE", f"/v1/suppressions/{mine}", key=project.send)).status == 403
    assert await db.fetchval("SELECT count(*) FROM suppressions") == 1

    assert (await api.call("DELETE", f"/v1/suppressions/{mine}", key=project.full)).status == 204
    assert await db.fetchval("SELECT count(*) FROM suppressions") == 0
    gone = await api.call("DELETE", f"/v1/suppressions/{mine}", key=project.full)
    assert (gone.status, gone.error["code"]) == (404, "suppression_not_found")
    listed = await api.call("GET", "/v1/suppressions", key=project.full)
    assert listed.body == {"items": [], "nextCursor": None}


async def test_a_suppression_is_added_by_hand_once_whatever_its_spelling(
    api: Api, project: Project, db: asyncpg.Pool,
) -> None:
    added = await api.call("POST", "/v1/suppressions", key=project.full, json={
        "channel": "email", "target": "Ada@Example.COM", "detail": "asked by phone"})
    assert added.status == 201, added.body
    # Stored as contacts are: the e-mail domain lower-cased, so it matches the user's address.
    assert added.body == {
        "id": added.body["id"], "channel": "email", "target": "Ada@example.com",
        "reason": "manual", "detail": "asked by phone", "createdAt": added.body["createdAt"]}
    listed = await api.call("GET", "/v1/suppressions", key=project.full)
    assert listed.body["items"] == [added.body]

    # Adding it again changes nothing and answers with the suppression already there,
    again = await api.call("POST", "/v1/suppressions", key=project.full,
                           json={"channel": "email", "target": "Ada@example.com"})
    assert (again.status, again.body) == (200, added.body)
    # as it does for one a bounce recorded: its reason stays.
    bounced = await suppress(db, project.id, "sms", "+15550000001")
    kept = await api.call("POST", "/v1/suppressions", key=project.full,
                          json={"channel": "sms", "target": "+15550000001"})
    assert (kept.status, kept.body["id"], kept.body["reason"]) == (200, bounced, "bounce")
    assert await db.fetchval("SELECT count(*) FROM suppressions") == 2

    # Another project's list is its own; the send key may not add one.
    other = await api.project("other")
    assert (await api.call("GET", "/v1/suppressions", key=other.full)).body["items"] == []
    refused = await api.call("POST", "/v1/suppressions", key=project.send,
                             json={"channel": "email", "target": "bob@example.com"})
    assert refused.status == 403
    admin = await api.call("POST", "/v1/suppressions", key=ADMIN, project=other.id,
                           json={"channel": "push", "target": "device-token-1"})
    assert (admin.status, admin.body["target"]) == (201, "device-token-1")
    assert await db.fetchval("SELECT count(*) FROM suppressions WHERE project_id = $1",
                             other.id) == 1


@pytest.mark.parametrize("channel", [None, "email", "webhook"])
async def test_the_target_filter_finds_a_suppression_in_any_spelling_it_was_added_in(
    api: Api, project: Project, channel: str | None,
) -> None:
    """"Is this address suppressed?" asked with the spelling the POST took (and stored
    normalised) must not answer no."""
    added = {}
    for kind, target in (("email", "Ada@Example.COM"),
                         ("webhook", "HTTPS://Hooks.Example.com:443/In")):
        reply = await api.call("POST", "/v1/suppressions", key=project.full,
                               json={"channel": kind, "target": target})
        assert reply.status == 201, reply.body
        added[target] = reply.body
    for target, suppression in added.items():
        if channel is not None and suppression["channel"] != channel:
            continue
        query = {"target": target} if channel is None else {"target": target,
                                                             "channel": channel}
        listed = await api.call("GET", "/v1/suppressions", key=project.full, params=query)
        assert (listed.status, listed.body["items"]) == (200, [suppression]), target
    # A spelling of another address still finds nothing.
    other = await api.call("GET", "/v1/suppressions", key=project.full,
                           params={"target": "ada@example.com"})
    assert other.body["items"] == []


@pytest.mark.parametrize(("body", "fields"), [
    ({}, ["channel", "target"]),
    ({"channel": "inapp", "target": "ada"}, ["channel"]),
    ({"channel": "email", "target": "not an address"}, ["target"]),
    ({"channel": "sms", "target": "0151 123"}, ["target"]),
    ({"channel": "push", "target": "has space"}, ["target"]),
    ({"channel": "webhook", "target": "http://example.com/hook"}, ["target"]),
    ({"channel": "email", "target": 5}, ["target"]),
    ({"channel": "email", "target": "a@b.co", "detail": "x" * 1001}, ["detail"]),
    ({"channel": "email", "target": "a@b.co", "reason": "bounce"}, ["reason"]),
])
async def test_a_suppression_added_by_hand_is_checked_as_a_contact_is(
    api: Api, project: Project, db: asyncpg.Pool, body: dict[str, object], fields: list[str],
) -> None:
    reply = await api.call("POST", "/v1/suppressions", key=project.full, json=body)
    assert (reply.status, reply.fields) == (400, fields), reply.body
    assert await db.fetchval("SELECT count(*) FROM suppressions") == 0


# -- templates ------------------------------------------------------------------------------


async def test_templates_are_listed_by_id_page_by_page_with_their_summaries(
    api: Api, project: Project,
) -> None:
    await api.call("PUT", "/v1/templates/c", key=project.full, json=EMAIL)
    await api.call("PUT", "/v1/templates/a", key=project.full, json={
        "topic": "billing", "fallback": ["sms", "email"],
        "channels": {"sms": {"text": "{{ data.x }}"},
                     "email": {"subject": "S", "text": "T" * 50_000}}})
    await api.call("PUT", "/v1/templates/b", key=project.full, json={
        "channels": {"email": {"subject": "", "text": ""}},
        "ai": {"model": "gpt-4o-mini", "prompt": "Say hi", "channels": ["email"]}})
    other = await api.project("other")
    await api.call("PUT", "/v1/templates/z", key=other.full, json=EMAIL)

    first = await api.call("GET", "/v1/templates?limit=2", key=project.full)
    assert first.status == 200, first.body
    a, b = first.body["items"]
    full = await api.call("GET", "/v1/templates/a", key=project.full)
    assert a == {**full.body, "channels": ["email", "sms"]}
    assert (a["topic"], a["fallback"], a["ai"]) == ("billing", ["sms", "email"], None)
    # The summary carries no content: neither the channels' nor the AI prompt.
    assert (b["id"], b["ai"]) == ("b", {"model": "gpt-4o-mini", "channels": ["email"]})
    rest = await api.call("GET", "/v1/templates", key=project.full,
                          params={"limit": "2", "cursor": first.body["nextCursor"]})
    assert ([t["id"] for t in rest.body["items"]], rest.body["nextCursor"]) == (["c"], None)
    theirs = await api.call("GET", "/v1/templates", key=other.full)
    assert [t["id"] for t in theirs.body["items"]] == ["z"]
    assert (await api.call("GET", "/v1/templates", key=project.send)).status == 403
    bad = await api.call("GET", "/v1/templates?limit=0&cursor=nonsense", key=project.full)
    assert (bad.status, bad.fields) == (400, ["limit", "cursor"])


async def test_a_deleted_template_is_refused_to_new_sends_at_once(
    api: Api, project: Project,
) -> None:
    await api.call("PUT", "/v1/users/ada", key=project.full, json={
        "contacts": [{"channel": "email", "target": "ada@example.com"}]})
    await api.call("PUT", "/v1/templates/welcome", key=project.full, json=EMAIL)
    # A send first: this process now remembers that the template exists.
    sent = await api.call("POST", "/v1/notifications", key=project.send,
                          json={"to": "ada", "template": "welcome"})
    assert sent.status == 202, sent.body

    other = await api.project("other")
    assert (await api.call("DELETE", "/v1/templates/welcome", key=other.full)).status == 404
    assert (await api.call("DELETE", "/v1/templates/welcome", key=project.send)).status == 403
    assert (await api.call("DELETE", "/v1/templates/welcome", key=project.full)).status == 204
    assert (await api.call("GET", "/v1/templates/welcome", key=project.full)).status == 404
    again = await api.call("DELETE", "/v1/templates/welcome", key=project.full)
    assert (again.status, again.error["code"]) == (404, "template_not_found")

    refused = await api.call("POST", "/v1/notifications", key=project.send,
                             json={"to": "ada", "template": "welcome"})
    assert (refused.status, refused.fields) == (400, ["template"])
    # Saving it again makes it usable again, at once.
    await api.call("PUT", "/v1/templates/welcome", key=project.full, json=EMAIL)
    back = await api.call("POST", "/v1/notifications", key=project.send,
                          json={"to": "ada", "template": "welcome"})
    assert back.status == 202, back.body


async def test_deleting_a_template_named_by_a_workflow_leaves_the_workflow(
    api: Api, project: Project,
) -> None:
    await api.call("PUT", "/v1/templates/welcome", key=project.full, json=EMAIL)
    saved = await api.call("PUT", "/v1/workflows/onboarding", key=project.full,
                           json={"steps": [{"type": "send", "template": "welcome"}]})
    assert saved.status == 201, saved.body
    assert (await api.call("DELETE", "/v1/templates/welcome", key=project.full)).status == 204
    # The workflow stays (its send step fails when it runs); saving it again is refused.
    assert (await api.call("GET", "/v1/workflows/onboarding", key=project.full)).status == 200
    resaved = await api.call("PUT", "/v1/workflows/onboarding", key=project.full,
                             json={"steps": [{"type": "send", "template": "welcome"}]})
    assert (resaved.status, resaved.fields) == (400, ["steps[0].template"])


async def test_a_template_deleted_through_one_api_process_is_refused_by_the_others(
    api: Api, project: Project, api_settings: Settings,
) -> None:
    """Each process remembers the templates it found for a minute; the deletion is published
    so that another process forgets it as soon as the message arrives."""
    _server, client = await start_api(api_settings)
    other = Api(client, api_settings)
    try:
        await api.call("PUT", "/v1/users/ada", key=project.full, json={})
        await api.call("PUT", "/v1/templates/welcome", key=project.full, json=EMAIL)
        sent = await other.call("POST", "/v1/notifications", key=project.send,
                                json={"to": "ada", "template": "welcome"})
        assert sent.status == 202, sent.body  # the other process now remembers it
        admission = client.app[ADMISSION]  # type: ignore[index]
        assert await admission.template_exists(project.id, "welcome")

        assert (await api.call("DELETE", "/v1/templates/welcome", key=project.full)).status \
            == 204
        # Not a timing assertion: the wait ends when the message has been handled.
        await until(lambda: (project.id, "welcome") not in admission._known_templates)
        refused = await other.call("POST", "/v1/notifications", key=project.send,
                                   json={"to": "ada", "template": "welcome"})
        assert (refused.status, refused.fields) == (400, ["template"])
    finally:
        await client.close()


@pytest.mark.parametrize(("path", "code"), [
    # Suppression ids are UUIDs notifkit made: anything else names none.
    *((f"/v1/suppressions/{ident}", "suppression_not_found")
      for ident in ("not-a-uuid", "1", "%FF", "%20", str(uuid.uuid4()) + "0")),
    # Template ids are caller-chosen: one no template could have names none either.
    *((f"/v1/templates/{ident}", "template_not_found")
      for ident in ("%20x", "%FF", "x%0A", "x" * 256)),
])
async def test_an_id_nothing_could_have_is_a_404_not_a_400_or_500(
    api: Api, project: Project, path: str, code: str,
) -> None:
    reply = await api.call("DELETE", path, key=project.full)
    assert (reply.status, reply.error["code"]) == (404, code)
