"""Users, contacts, preferences and erasure."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable

import asyncpg
import pytest
from redis.asyncio import Redis

from notifkit.config import Settings
from notifkit.keys import Keys, shard_of
from notifkit.services.scheduler import encode_entry
from tests.api.conftest import Api, Project, start_api


async def test_put_creates_then_updates_only_what_is_sent(api: Api, project: Project) -> None:
    created = await api.call("PUT", "/v1/users/u1", key=project.full, json={
        "attributes": {"name": "Ada"}, "timezone": "Europe/Berlin", "locale": "de",
        "segments": ["beta", "vip"],
        "contacts": [{"channel": "email", "target": "ada@Example.COM"},
                     {"channel": "sms", "target": "+4915112345678"}],
    })
    assert created.status == 201
    body = created.body
    assert body["id"] == "u1"
    assert body["segments"] == ["beta", "vip"]
    assert [(c["channel"], c["target"], c["enabled"]) for c in body["contacts"]] == [
        ("email", "ada@example.com", True), ("sms", "+4915112345678", True)]
    assert body["preferences"] == {"channels": {}, "topics": {}, "quietHours": None}

    updated = await api.call("PUT", "/v1/users/u1", key=project.full,
                             json={"locale": None, "segments": ["vip"]})
    assert updated.status == 200
    assert updated.body["locale"] is None
    assert updated.body["timezone"] == "Europe/Berlin"
    assert updated.body["attributes"] == {"name": "Ada"}
    assert updated.body["segments"] == ["vip"]
    assert updated.body["contacts"] == body["contacts"]  # omitted: kept, ids included

    replaced = await api.call("PUT", "/v1/users/u1", key=project.full, json={
        "contacts": [{"channel": "sms", "target": "+4915112345678"}]})
    assert [c["id"] for c in replaced.body["contacts"]] == [body["contacts"][1]["id"]]
    fetched = await api.call("GET", "/v1/users/u1", key=project.full)
    assert fetched.status == 200
    assert fetched.body == replaced.body


async def test_every_invalid_user_field_is_named(api: Api, project: Project) -> None:
    reply = await api.call("PUT", "/v1/users/u1", key=project.full, json={
        "attributes": [], "timezone": "Mars/Olympus", "locale": "not a locale!",
        "segments": ["a", "a", ""], "contacts": [{"channel": "fax", "target": "1"},
                                                 {"channel": "email", "target": "nope"}],
        "colour": "blue",
    })
    assert reply.status == 400
    assert reply.error["code"] == "validation_error"
    assert set(reply.fields) == {
        "attributes", "timezone", "locale", "segments[1]", "segments[2]",
        "contacts[0].channel", "contacts[1].target", "colour"}


@pytest.mark.parametrize(("locale", "status"), [
    ("de", 200), ("de_DE", 200), ("zh-Hant-HK", 200), ("en-US-u-ca-gregory", 200),
    ("sr-Latn-RS-u-nu-latn-x-priv", 200),
    ("en-abcdefgh-abcdefgh-abcdefgh-abcde", 200),  # 35 characters
    ("en-abcdefgh-abcdefgh-abcdefgh-abcdef", 400),  # 36
    ("e", 400), ("en--US", 400), ("en-US-", 400), ("en-toolongsubtag", 400),
])
async def test_a_locale_is_a_language_tag_of_up_to_35_characters(
    api: Api, project: Project, locale: str, status: int
) -> None:
    # Tags with extensions (a calendar, numbering system) have more than three subtags.
    reply = await api.call("PUT", "/v1/users/u1", key=project.full, json={"locale": locale})
    assert reply.status in ((200, 201) if status == 200 else (400,)), reply.body
    if status == 400:
        assert reply.fields == ["locale"]
    else:
        assert reply.body["locale"] == locale


@pytest.mark.parametrize("zone", ["localtime", "Factory", "posixrules"])
async def test_files_of_the_tz_database_that_are_no_place_are_no_timezone(
    api: Api, project: Project, zone: str
) -> None:
    # localtime is whatever the server's clock says; Factory is a placeholder for "unset".
    reply = await api.call("PUT", "/v1/users/u1", key=project.full, json={"timezone": zone})
    assert (reply.status, reply.fields) == (400, ["timezone"])


@pytest.mark.parametrize(("path", "status"), [
    ("/v1/users/%20padded", 400), ("/v1/users/" + "x" * 256, 400), ("/v1/users/tab%09", 400),
    # percent-escapes that are not UTF-8: a lone byte, an encoded surrogate
    ("/v1/users/%FF", 400), ("/v1/users/a%ED%A0%80", 400),
])
async def test_bad_user_ids_are_rejected_on_put(
    api: Api, project: Project, path: str, status: int
) -> None:
    reply = await api.call("PUT", path, key=project.full, json={})
    assert reply.status == status
    assert reply.fields == ["userId"]


@pytest.mark.parametrize("segment", ["%2E%2E", "%2E", ".%2e"])
async def test_a_dot_segment_is_no_user_id(api: Api, project: Project, segment: str) -> None:
    # Clients resolve /v1/users/.. away, so such a user could never be read back. Sent raw:
    # aiohttp's client would resolve the escaped dots itself.
    server = api.client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write((f"PUT /v1/users/{segment} HTTP/1.1\r\nHost: x\r\n"
                  f"Authorization: Bearer {project.full}\r\nContent-Type: application/json\r\n"
                  "Content-Length: 2\r\nConnection: close\r\n\r\n{}").encode())
    raw = await reader.read()
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.split()[1] == b"400", raw
    assert [d["field"] for d in json.loads(body)["error"]["details"]] == ["userId"]


async def test_an_id_that_is_not_utf_8_does_not_alias_its_escaped_spelling(
    api: Api, project: Project,
) -> None:
    """The user "%FF" is /v1/users/%25FF; /v1/users/%FF (the byte 0xFF, not UTF-8) is not
    another way to name it."""
    created = await api.call("PUT", "/v1/users/%25FF", key=project.full, json={})
    assert (created.status, created.body["id"]) == (201, "%FF")
    assert (await api.call("GET", "/v1/users/%25FF", key=project.full)).status == 200
    for method in ("GET", "DELETE"):
        assert (await api.call(method, "/v1/users/%FF", key=project.full)).status == 404
    assert (await api.call("GET", "/v1/users/%25FF", key=project.full)).status == 200


# 254 characters, the most an e-mail address may have: the longest local part (64) at a
# domain of three full labels.
LONGEST_EMAIL = "l" * 64 + "@" + "a" * 63 + "." + "b" * 63 + "." + "c" * 57 + ".com"


@pytest.mark.parametrize(("channel", "target"), [
    ("email", "ada@example.com"), ("email", "a.b+tag@sub.example.co.uk"),
    ("sms", "+14155550100"), ("push", "fcm-token:APA91b-xyz_123"),
    ("webhook", "https://hooks.example.com/notify?x=1"),
    ("webhook", "https://b\u00fccher.example/hook"), ("webhook", "https://example.com./hook"),
    ("webhook", "https://in_bound.example.com/"), ("webhook", "https://93.184.215.14:8443/"),
    ("webhook", "https://" + "a" * 63 + ".example.com/"),
    ("email", LONGEST_EMAIL),
])
async def test_valid_contacts_are_added(
    api: Api, project: Project, channel: str, target: str
) -> None:
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    reply = await api.call("POST", "/v1/users/u1/contacts", key=project.full,
                           json={"channel": channel, "target": target})
    assert reply.status == 201, reply.body
    assert reply.body["channel"] == channel
    assert reply.body["enabled"] is True


@pytest.mark.parametrize(("channel", "target"), [
    ("email", "no-at-sign"), ("email", "a@b"), ("email", "a b@example.com"),
    ("sms", "004915112345678"), ("sms", "+0123456789"), ("sms", "+12"),
    ("push", " token"), ("push", "tok\nen"), ("push", "x" * 1025), ("push", "not a token"),
    ("push", "\u00e9" * 513), ("webhook", "https://example.com/" + "\u00e9" * 503),
    ("push", "tok\u00a0en"),
    ("webhook", "http://example.com/hook"), ("webhook", "https://"),
    ("webhook", "ftp://example.com"),
    # Hosts no lookup can find: the send failed on each attempt (an empty label made the
    # transport raise), so the contact was stored but never reached
    ("webhook", "https://a..example.com/"), ("webhook", "https://.example.com/"),
    ("webhook", "https://%31%32%37.0.0.1/"), ("webhook", "https://exa!mple.com/"),
    ("webhook", "https://" + "a" * 64 + ".example.com/"),
    ("webhook", "https://" + "a." * 127 + "com/"),
    # Valid parts, but one character over the 254 an address may have in all (RFC 5321's path
    # of 256 less its angle brackets): no provider would take it.
    ("email", LONGEST_EMAIL.replace(".com", "c.com")),
])
async def test_invalid_contact_targets_are_400_naming_target(
    api: Api, project: Project, channel: str, target: str
) -> None:
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    reply = await api.call("POST", "/v1/users/u1/contacts", key=project.full,
                           json={"channel": channel, "target": target})
    assert reply.status == 400
    assert reply.fields == ["target"]


INTERNAL_URLS = [
    "https://10.0.0.5/hook", "https://169.254.169.254/latest/meta-data/",
    "https://localhost:5432/", "https://127.0.0.1/", "https://[::1]/", "https://[fe80::1]/",
    "https://[fd00::5]/hook", "https://[::ffff:192.168.1.1]/", "https://100.64.0.1/",
    "https://0.0.0.0/", "https://224.0.0.1/", "https://127.1/", "https://2130706433/",
    "https://api.localhost/",
]


@pytest.mark.parametrize("url", INTERNAL_URLS)
async def test_a_webhook_naming_an_internal_address_is_400_naming_target(
    api: Api, project: Project, url: str
) -> None:
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    reply = await api.call("POST", "/v1/users/u1/contacts", key=project.full,
                           json={"channel": "webhook", "target": url})
    assert (reply.status, reply.fields) == (400, ["target"]), reply.body
    assert "public addresses" in reply.error["details"][0]["message"]
    replaced = await api.call("PUT", "/v1/users/u1", key=project.full, json={
        "contacts": [{"channel": "webhook", "target": url}]})
    assert (replaced.status, replaced.fields) == (400, ["contacts[0].target"])
    got = await api.call("GET", "/v1/users/u1", key=project.full)
    assert got.body["contacts"] == []


async def test_a_webhook_naming_an_internal_address_is_added_when_private_networks_are_allowed(
    api_settings: Settings,
) -> None:
    _server, client = await start_api(api_settings.replace(webhook_allow_private_networks=True))
    try:
        api = Api(client, api_settings)
        project = await api.project()
        await api.call("PUT", "/v1/users/u1", key=project.full, json={})
        for url in INTERNAL_URLS:
            reply = await api.call("POST", "/v1/users/u1/contacts", key=project.full,
                                   json={"channel": "webhook", "target": url})
            assert reply.status == 201, (url, reply.body)
    finally:
        await client.close()


async def test_the_longest_addresses_fit_beside_the_longest_user_id(
    api: Api, project: Project
) -> None:
    # 1,024 bytes of address beside 255 three-byte characters of user id: the unique keys of
    # the user's contacts and of delivery's outbox hold them (a B-tree entry takes 2,704 bytes).
    user = "\u7528" * 255
    token = "t" * 1024
    url = "https://example.com/" + "\u00e9" * 502
    assert len(url.encode()) == 1024
    assert (await api.call("PUT", f"/v1/users/{user}", key=project.full, json={
        "contacts": [{"channel": "webhook", "target": url}]})).status == 201
    reply = await api.call("POST", f"/v1/users/{user}/contacts", key=project.full,
                           json={"channel": "push", "target": token})
    assert reply.status == 201, reply.body
    got = await api.call("GET", f"/v1/users/{user}", key=project.full)
    assert sorted(c["target"] for c in got.body["contacts"]) == sorted([token, url])
    too_long = await api.call("PUT", f"/v1/users/{user}", key=project.full, json={
        "contacts": [{"channel": "push", "target": "t" * 1025}]})
    assert (too_long.status, too_long.fields) == (400, ["contacts[0].target"])


async def test_adding_an_existing_contact_is_idempotent(api: Api, project: Project) -> None:
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    first = await api.call("POST", "/v1/users/u1/contacts", key=project.full,
                           json={"channel": "email", "target": "ada@example.com"})
    again = await api.call("POST", "/v1/users/u1/contacts", key=project.full,
                           json={"channel": "email", "target": "ada@EXAMPLE.com"})
    assert (first.status, again.status) == (201, 200)
    assert again.body == first.body


async def test_a_user_holds_at_most_100_contacts_however_they_are_added(
    api: Api, project: Project
) -> None:
    # PUT refuses more than 100; adding them one at a time must not get round it, or one user
    # could hold addresses without bound (each send loads them all).
    await api.call("PUT", "/v1/users/u1", key=project.full, json={"contacts": [
        {"channel": "push", "target": f"token-{n}"} for n in range(99)]})
    last = await api.call("POST", "/v1/users/u1/contacts", key=project.full,
                          json={"channel": "push", "target": "token-99"})
    again = await api.call("POST", "/v1/users/u1/contacts", key=project.full,
                           json={"channel": "push", "target": "token-99"})
    over = await api.call("POST", "/v1/users/u1/contacts", key=project.full,
                          json={"channel": "email", "target": "ada@example.com"})
    assert (last.status, again.status) == (201, 200)
    assert (over.status, over.body["error"]["code"]) == (409, "too_many_contacts")
    assert over.fields == ["target"]
    got = await api.call("GET", "/v1/users/u1", key=project.full)
    assert len(got.body["contacts"]) == 100
    assert "ada@example.com" not in {c["target"] for c in got.body["contacts"]}


async def test_an_e_mail_address_at_an_international_domain_is_stored_as_sent(
    api: Api, project: Project
) -> None:
    # An internationalised domain (IDNA) is an address like any other: it is stored in the
    # ASCII form providers send to and bounces name, so either spelling is one contact.
    put = await api.call("PUT", "/v1/users/u1", key=project.full, json={"contacts": [
        {"channel": "email", "target": "ada@Bücher.de"},
        {"channel": "email", "target": "ada@xn--bcher-kva.de"}]})
    assert put.status == 201, put.body
    assert [c["target"] for c in put.body["contacts"]] == ["ada@xn--bcher-kva.de"]
    # and a suppression in the other spelling is of the same address
    suppressed = await api.call("POST", "/v1/suppressions", key=project.full,
                                json={"channel": "email", "target": "ada@bücher.de"})
    assert (suppressed.status, suppressed.body["target"]) == (201, "ada@xn--bcher-kva.de")
    for bad in ("ada@bü cher.de", "ada@bücher..de", "ada@bücher", "ü@bücher.de"):
        refused = await api.call("PUT", "/v1/users/u2", key=project.full, json={
            "contacts": [{"channel": "email", "target": bad}]})
        assert (refused.status, refused.fields) == (400, ["contacts[0].target"]), bad


async def test_a_webhook_url_differing_only_in_scheme_or_host_case_is_the_same_contact(
    api: Api, project: Project
) -> None:
    # Scheme and host are case-insensitive (RFC 3986), and an explicit default port or an empty
    # one (":", which RFC 3986 reads as the default) is none: a second spelling of one endpoint
    # as its own contact would get every notification twice.
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    first = await api.call("POST", "/v1/users/u1/contacts", key=project.full,
                           json={"channel": "webhook", "target": "HTTPS://Hooks.Example.COM/In/X?A=B"})
    assert first.status == 201
    assert first.body["target"] == "https://hooks.example.com/In/X?A=B"
    for spelling in ("https://hooks.example.com/In/X?A=B", "https://HOOKS.example.com:443/In/X?A=B",
                     "https://hooks.example.com:/In/X?A=B"):
        again = await api.call("POST", "/v1/users/u1/contacts", key=project.full,
                               json={"channel": "webhook", "target": spelling})
        assert (again.status, again.body) == (200, first.body)
    other_path = await api.call("POST", "/v1/users/u1/contacts", key=project.full,
                                json={"channel": "webhook", "target": "https://hooks.example.com/in/x?A=B"})
    assert other_path.status == 201
    put = await api.call("PUT", "/v1/users/u2", key=project.full, json={"contacts": [
        {"channel": "webhook", "target": "https://user:PW@Example.com:8443/h"},
        {"channel": "webhook", "target": "https://user:PW@example.COM:8443/h"}]})
    assert [c["target"] for c in put.body["contacts"]] == ["https://user:PW@example.com:8443/h"]


async def test_contacts_of_unknown_users_and_unknown_contacts_are_404(
    api: Api, project: Project
) -> None:
    reply = await api.call("POST", "/v1/users/ghost/contacts", key=project.full,
                           json={"channel": "email", "target": "a@example.com"})
    assert reply.status == 404
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    for contact in ("00000000-0000-4000-8000-000000000000", "not-a-uuid"):
        reply = await api.call("DELETE", f"/v1/users/u1/contacts/{contact}", key=project.full)
        assert reply.status == 404


async def test_deleting_a_contact(api: Api, project: Project) -> None:
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    contact = await api.call("POST", "/v1/users/u1/contacts", key=project.full,
                             json={"channel": "sms", "target": "+14155550100"})
    path = f"/v1/users/u1/contacts/{contact.body['id']}"
    assert (await api.call("DELETE", path, key=project.full)).status == 204
    assert (await api.call("DELETE", path, key=project.full)).status == 404
    user = await api.call("GET", "/v1/users/u1", key=project.full)
    assert user.body["contacts"] == []


async def test_preferences_replace_what_is_sent(api: Api, project: Project) -> None:
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    first = await api.call("PUT", "/v1/users/u1/preferences", key=project.full, json={
        "channels": {"email": True, "sms": False}, "topics": {"marketing": False},
        "quietHours": {"start": "22:00", "end": "07:00"}})
    assert first.status == 200
    assert first.body == {"channels": {"email": True, "sms": False},
                          "topics": {"marketing": False},
                          "quietHours": {"start": "22:00", "end": "07:00"}}
    second = await api.call("PUT", "/v1/users/u1/preferences", key=project.full,
                            json={"topics": {"billing": True}, "quietHours": None})
    assert second.body == {"channels": {"email": True, "sms": False},
                           "topics": {"billing": True}, "quietHours": None}
    user = await api.call("GET", "/v1/users/u1", key=project.full)
    assert user.body["preferences"] == second.body


async def test_preferences_read_as_the_put_answered_them(
    api: Api, project: Project
) -> None:
    other_project = await api.project("other")
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    empty = await api.call("GET", "/v1/users/u1/preferences", key=project.full)
    assert (empty.status, empty.body) == (
        200, {"channels": {}, "topics": {}, "quietHours": None})
    put = await api.call("PUT", "/v1/users/u1/preferences", key=project.full, json={
        "channels": {"sms": False}, "topics": {"marketing": False},
        "quietHours": {"start": "22:00", "end": "07:00"}})
    got = await api.call("GET", "/v1/users/u1/preferences", key=project.full)
    assert (got.status, got.body) == (200, put.body)
    for key, user in ((project.full, "nobody"), (other_project.full, "u1")):
        missing = await api.call("GET", f"/v1/users/{user}/preferences", key=key)
        assert (missing.status, missing.body["error"]["code"]) == (404, "user_not_found")


async def test_quiet_hours_may_be_given_to_the_second(api: Api, project: Project) -> None:
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    exact = await api.call("PUT", "/v1/users/u1/preferences", key=project.full, json={
        "quietHours": {"start": "22:00:15", "end": "07:00"}})
    assert (exact.status, exact.body["quietHours"]) == (
        200, {"start": "22:00:15", "end": "07:00"})
    user = await api.call("GET", "/v1/users/u1", key=project.full)
    assert user.body["preferences"]["quietHours"] == {"start": "22:00:15", "end": "07:00"}
    bad = await api.call("PUT", "/v1/users/u1/preferences", key=project.full, json={
        "quietHours": {"start": "22:00:60", "end": "07:00:5"}})
    assert (bad.status, sorted(bad.fields)) == (400, ["quietHours.end", "quietHours.start"])


@pytest.mark.parametrize("spelling", ["1\u0662:00", "22:0\u0665", "22:00\n", "22:00:00\n"])
async def test_a_quiet_hours_time_in_other_digits_or_with_a_newline_is_a_400_and_stores_nothing(
    api: Api, project: Project, spelling: str
) -> None:
    # Only ASCII digits make an HH:MM time; another script's digits, or a line break after the
    # time, are not one the API shows back, so they are refused rather than read or crashed on.
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    reply = await api.call("PUT", "/v1/users/u1/preferences", key=project.full, json={
        "quietHours": {"start": spelling, "end": "07:00"}})
    assert (reply.status, reply.fields) == (400, ["quietHours.start"]), reply.body
    user = await api.call("GET", "/v1/users/u1", key=project.full)
    assert user.body["preferences"]["quietHours"] is None


async def test_invalid_preferences_name_the_field(api: Api, project: Project) -> None:
    await api.call("PUT", "/v1/users/u1", key=project.full, json={})
    reply = await api.call("PUT", "/v1/users/u1/preferences", key=project.full, json={
        "channels": {"fax": True, "email": "yes"}, "topics": {"t": 1},
        "quietHours": {"start": "24:00", "end": "7"}})
    assert reply.status == 400
    assert set(reply.fields) == {"channels.fax", "channels.email", "topics.t",
                                 "quietHours.start", "quietHours.end"}
    same = await api.call("PUT", "/v1/users/u1/preferences", key=project.full,
                          json={"quietHours": {"start": "22:00", "end": "22:00"}})
    assert same.fields == ["quietHours.end"]
    ghost = await api.call("PUT", "/v1/users/ghost/preferences", key=project.full, json={})
    assert ghost.status == 404


async def test_deleting_a_user_erases_everything_about_them(
    api: Api, project: Project, db: asyncpg.Pool
) -> None:
    await api.call("PUT", "/v1/users/u1", key=project.full, json={
        "segments": ["beta"], "contacts": [{"channel": "email", "target": "a@example.com"}]})
    await api.call("PUT", "/v1/users/u1/preferences", key=project.full, json={
        "channels": {"sms": False}, "topics": {"x": False},
        "quietHours": {"start": "22:00", "end": "07:00"}})
    await db.execute(
        "INSERT INTO inapp_messages (project_id, user_id, task_id, event_id, content) "
        "VALUES ($1, 'u1', 't1', gen_random_uuid(), '{}')", project.id)
    assert (await api.call("DELETE", "/v1/users/u1", key=project.full)).status == 204
    for table in ("users", "user_contacts", "user_segments", "user_channel_preferences",
                  "user_topic_preferences", "quiet_hours", "inapp_messages"):
        column = "id" if table == "users" else "user_id"
        count = await db.fetchval(
            f"SELECT count(*) FROM {table} WHERE project_id = $1 AND {column} = 'u1'",
            project.id)
        assert count == 0, table
    assert (await api.call("GET", "/v1/users/u1", key=project.full)).status == 404
    assert (await api.call("DELETE", "/v1/users/u1", key=project.full)).status == 404


async def test_deleting_a_user_cancels_their_unfinished_workflow_instances(
    api: Api, project: Project, db: asyncpg.Pool
) -> None:
    """An erased user's journeys end with them: an instance left running would wake on a
    later event for that id, or send to a user re-created under it."""
    await api.call("PUT", "/v1/templates/welcome", key=project.full,
                   json={"channels": {"email": {"subject": "Hi", "text": "Welcome"}}})
    steps = [{"type": "waitForEvent", "event": "order.paid", "timeoutSeconds": 86400},
             {"type": "send", "template": "welcome"}]
    assert (await api.call("PUT", "/v1/workflows/w", key=project.full,
                           json={"steps": steps})).status == 201
    for user in ("u1", "u2"):
        await api.call("PUT", f"/v1/users/{user}", key=project.full, json={})
    instances: dict[str, list[str]] = {}
    for user in ("u1", "u1", "u2"):
        reply = await api.call("POST", "/v1/workflows/w/trigger", key=project.send,
                               json={"userId": user})
        assert reply.status == 202, reply.body
        instances.setdefault(user, []).append(reply.body["instanceId"])
    # One of u1's instances sleeps in its waitForEvent, as the workflow service leaves it.
    await db.execute("UPDATE workflow_instances SET status = 'waiting' WHERE id = $1",
                     instances["u1"][0])
    await db.execute(
        "INSERT INTO workflow_waiters (instance_id, project_id, user_id, event_name, step_index,"
        " expires_at) VALUES ($1, $2, 'u1', 'order.paid', 0, now() + interval '1 day')",
        instances["u1"][0], project.id)

    assert (await api.call("DELETE", "/v1/users/u1", key=project.full)).status == 204

    for instance_id in instances["u1"]:
        shown = await api.call("GET", f"/v1/workflow-instances/{instance_id}",
                               key=project.full)
        assert shown.body["status"] == "canceled", shown.body
    assert await db.fetchval(
        "SELECT count(*) FROM workflow_waiters WHERE project_id = $1 AND user_id = 'u1' "
        "AND resolved_at IS NULL", project.id) == 0
    other = await api.call("GET", f"/v1/workflow-instances/{instances['u2'][0]}",
                           key=project.full)
    assert other.body["status"] == "pending", other.body


async def test_deleting_a_user_takes_their_waiting_sends_out_of_the_scheduler(
    api: Api, project: Project, db: asyncpg.Pool, redis: Redis
) -> None:
    """A send waiting for its time (sendAt, quiet hours) holds the erased user's address and
    content: it leaves the scheduler with them, and never reaches a user created again under
    the same id."""
    keys = Keys(api.settings.namespace)
    tasks = {}
    for user in ("u1", "u2"):
        await api.call("PUT", f"/v1/users/{user}", key=project.full, json={
            "contacts": [{"channel": "email", "target": f"{user}@example.com"}]})
        event_id = str(uuid.uuid4())
        task_id = f"{event_id}:{user}:email"
        payload = {"taskId": task_id, "eventId": event_id, "projectId": project.id,
                   "userId": user, "channel": "email"}
        await db.execute(
            "INSERT INTO scheduled_payloads (task_id, project_id, due_at, stream, payload) "
            "VALUES ($1, $2, now() + interval '1 hour', $3, $4)",
            task_id, project.id, keys.outbound("normal"), payload)
        shard = shard_of(task_id)
        await redis.hset(keys.scheduled_payloads(shard), task_id,
                         encode_entry(keys.outbound("normal"), project.id, payload))
        await redis.zadd(keys.scheduled_shard(shard), {task_id: 1})
        tasks[user] = (task_id, event_id)

    assert (await api.call("DELETE", "/v1/users/u1", key=project.full)).status == 204

    def waiting(task_id: str) -> Awaitable[float | None]:
        return redis.zscore(keys.scheduled_shard(shard_of(task_id)), task_id)

    assert await waiting(tasks["u1"][0]) is None
    assert await redis.hget(keys.scheduled_payloads(shard_of(tasks["u1"][0])),
                            tasks["u1"][0]) is None
    assert await waiting(tasks["u2"][0]) is not None
    [row] = await db.fetch(
        "SELECT kind, status, detail FROM message_logs WHERE project_id = $1 AND task_id = $2",
        project.id, tasks["u1"][0])
    assert (row["kind"], row["status"]) == ("canceled", "skipped")
    assert "erased" in row["detail"]


async def test_blank_segment_and_topic_names_are_refused_and_nothing_is_stored(
        api: Api, project: Project) -> None:
    """A send refuses a blank segment and a template a blank topic, so a user can never be
    reached through either: storing them would only hide a client's mistake."""
    await api.call("PUT", "/v1/users/blank", key=project.full, json={"segments": ["beta"]})
    segment = await api.call("PUT", "/v1/users/blank", key=project.full,
                             json={"segments": [" "]})
    assert segment.status == 400
    assert segment.fields == ["segments[0]"]
    topic = await api.call("PUT", "/v1/users/blank/preferences", key=project.full,
                           json={"topics": {" \t": False}})
    assert topic.status == 400
    assert topic.fields == ["topics. \\u0009"]  # the tab shown escaped
    user = await api.call("GET", "/v1/users/blank", key=project.full)
    assert user.body["segments"] == ["beta"]
    assert user.body["preferences"]["topics"] == {}
