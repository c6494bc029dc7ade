"""Template routes: validation at PUT (syntax errors by channel, field and line) and preview."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from notifkit.services.api.routes import templates as template_routes
from notifkit.templates import template_errors
from notifkit.unsubscribe import verify_token
from tests.api.conftest import Api, Project
from tests.support.compiling import watch_compiles
from tests.support.held_check import HeldCheck

INVOICE = {
    "topic": "billing",
    "channels": {
        "email": {"subject": "Invoice {{ data.number }}",
                  "html": "<p>Hi {{ user.attributes.name | default('there') }}, "
                          "{{ data.amount }}</p><a href='{{ unsubscribeUrl }}'>x</a>",
                  "text": "Paid: {{ data.amount }}"},
        "sms": {"text": "Paid {{ data.amount }}"},
        "push": {"title": "Paid", "body": "{{ data.amount }}", "data": {"n": "{{ data.number }}"}},
        "inapp": {"text": "Invoice {{ data.number }} paid", "url": "/invoices/{{ data.number }}"},
        "webhook": {"body": "{\"amount\": \"{{ data.amount }}\"}"},
    },
    "fallback": ["push", "sms", "email"],
}


async def test_put_creates_then_replaces(api: Api, project: Project) -> None:
    created = await api.call("PUT", "/v1/templates/invoice", key=project.full, json=INVOICE)
    assert created.status == 201
    assert created.body["channels"] == INVOICE["channels"]
    assert created.body["fallback"] == ["push", "sms", "email"]
    assert created.body["topic"] == "billing"
    replaced = await api.call("PUT", "/v1/templates/invoice", key=project.full,
                              json={"channels": {"sms": {"text": "hi"}}})
    assert replaced.status == 200
    fetched = await api.call("GET", "/v1/templates/invoice", key=project.full)
    assert fetched.body == replaced.body
    assert fetched.body["topic"] is None
    assert (await api.call("GET", "/v1/templates/nope", key=project.full)).status == 404


async def test_null_clears_topic_fallback_and_ai_alike(api: Api, project: Project) -> None:
    """Given a template with a fallback chain, when it is PUT again with the null a GET shows
    for a template without one, then the chain is cleared, as null clears topic and ai."""
    await api.call("PUT", "/v1/templates/invoice", key=project.full, json=INVOICE)
    cleared = await api.call("PUT", "/v1/templates/invoice", key=project.full, json={
        "channels": INVOICE["channels"], "topic": None, "fallback": None, "ai": None})
    assert cleared.status == 200, cleared.body
    assert cleared.body["fallback"] is None
    assert cleared.body["topic"] is None
    fetched = await api.call("GET", "/v1/templates/invoice", key=project.full)
    assert fetched.body["fallback"] is None


async def test_a_syntax_error_names_channel_field_and_line(api: Api, project: Project) -> None:
    reply = await api.call("PUT", "/v1/templates/t", key=project.full, json={"channels": {
        "email": {"subject": "ok", "html": "<p>\nline two\n{{ data.x + }}</p>"},
        "sms": {"text": "{% for %}"}}})
    assert reply.status == 400
    details = {d["field"]: d["message"] for d in reply.error["details"]}
    assert set(details) == {"channels.email.html", "channels.sms.text"}
    assert "line 3" in details["channels.email.html"]
    assert "line 1" in details["channels.sms.text"]


async def test_what_jinja_parses_but_cannot_compile_is_a_400_at_save(
    api: Api, project: Project
) -> None:
    """An unknown filter or test, or nesting Python refuses to compile, fails every render:
    refused when the template is saved, naming the field, not at each send."""
    reply = await api.call("PUT", "/v1/templates/t", key=project.full, json={"channels": {
        "sms": {"text": "{{ data.x | no_such_filter }}"},
        "inapp": {"text": "{{ data.x is no_such_test }}"},
        "push": {"title": "ok",
                 "body": "{% for a in b %}" * 25 + "x" + "{% endfor %}" * 25}}})
    assert reply.status == 400, reply.body
    details = {d["field"]: d["message"] for d in reply.error["details"]}
    assert set(details) == {"channels.sms.text", "channels.inapp.text", "channels.push.body"}
    assert "no_such_filter" in details["channels.sms.text"]
    assert "no_such_test" in details["channels.inapp.text"]
    assert "nested too deeply" in details["channels.push.body"]
    # Behind a condition too (Jinja leaves that one to the render): a misspelt filter in the
    # VIP paragraph would otherwise fail every VIP's send. Only a filter the template itself
    # asks about first (``is filter``) may be one this environment lacks.
    behind = await api.call("PUT", "/v1/templates/t", key=project.full, json={"channels": {
        "sms": {"text": "{% if data.vip %}\n{{ data.x | uper }}{% endif %}ok"},
        "inapp": {"text": "{{ data.x | no_such_filter if data.y else 'z' }}"},
        "push": {"title": "{% if data.vip %}{% if data.x is no_such_test %}x{% endif %}"
                          "{% endif %}", "body": "ok"}}})
    assert behind.status == 400, behind.body
    details = {d["field"]: d["message"] for d in behind.error["details"]}
    assert set(details) == {"channels.sms.text", "channels.inapp.text", "channels.push.title"}
    assert "uper" in details["channels.sms.text"]
    assert "line 2" in details["channels.sms.text"]
    assert "no_such_test" in details["channels.push.title"]
    guarded = await api.call("PUT", "/v1/templates/t", key=project.full, json={"channels": {
        "sms": {"text": "{% if 'markdown' is filter %}{{ data.x | markdown }}{% endif %}ok"}}})
    assert guarded.status == 201, guarded.body


async def test_a_template_compiles_while_the_api_answers_other_requests(
    api: Api, project: Project, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Compiling the largest fields takes seconds; on the event loop it held every request.
    check = HeldCheck(template_errors)
    monkeypatch.setattr(template_routes, "template_errors", check)
    other, put = await check.answers_meanwhile(
        api.call("PUT", "/v1/templates/t", key=project.full,
                 json={"channels": {"sms": {"text": "hi"}}}),
        lambda: api.call("GET", "/v1/templates/t", key=project.full),
    )
    assert (other.status, put.status) == (404, 201)


async def test_a_preview_compiles_a_template_new_to_the_process_beside_the_event_loop(
    api: Api, project: Project, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from notifkit.ids import uuid7

    compiled = watch_compiles(monkeypatch)
    text = f"Paid {{{{ data.amount }}}} ({uuid7()})"  # saving checks it, uncached
    prompt = f"Say {{{{ data.amount }}}} ({uuid7()})"
    put = await api.call("PUT", "/v1/templates/t", key=project.full, json={
        "channels": {"sms": {"text": text}},
        "ai": {"model": "m", "prompt": prompt, "channels": ["sms"]}})
    assert put.status == 201, put.body
    preview = await api.call("POST", "/v1/templates/t/preview", key=project.full,
                             json={"data": {"amount": "5"}})
    assert preview.status == 200, preview.body
    assert preview.body["channels"]["sms"]["text"] == text.replace("{{ data.amount }}", "5")
    assert sorted(compiled) == sorted([(text, False), (prompt, False)])


async def test_an_email_with_a_subject_alone_is_a_template(api: Api, project: Project) -> None:
    """API.md gives an e-mail's content as {"subject", "html"?, "text"?}: a subject alone is
    content the server takes (201), shows and previews as it is; the email goes out with an
    empty body, as every transport sends one."""
    body = {"channels": {"email": {"subject": "Your export of {{ data.n }} rows is ready"}}}
    saved = await api.call("PUT", "/v1/templates/export-ready", key=project.full, json=body)
    assert saved.status == 201, saved.body
    assert saved.body["channels"] == body["channels"]
    preview = await api.call("POST", "/v1/templates/export-ready/preview", key=project.full,
                             json={"data": {"n": 3}})
    assert preview.status == 200, preview.body
    assert preview.body["channels"] == {"email": {"subject": "Your export of 3 rows is ready"}}


async def test_content_keys_fallback_and_ai_are_checked(api: Api, project: Project) -> None:
    reply = await api.call("PUT", "/v1/templates/t", key=project.full, json={
        "channels": {"email": {"html": "x", "body": "y"}, "fax": {}, "push": "x",
                     "webhook": {"body": 3}},
        "fallback": ["sms", "pager"],
        "ai": {"model": "", "prompt": "{{", "channels": []},
    })
    assert reply.status == 400
    assert set(reply.fields) == {
        "channels.email.subject", "channels.email.body", "channels.fax", "channels.push",
        "channels.webhook.body", "fallback[1]", "ai.model", "ai.channels"}
    # Content no provider would take: empty required fields
    undeliverable = await api.call("PUT", "/v1/templates/t", key=project.full, json={
        "channels": {"sms": {"text": ""}, "email": {"subject": ""},
                     "push": {"title": "", "body": "b"}, "inapp": {"text": ""}}})
    assert set(undeliverable.fields) == {
        "channels.sms.text", "channels.email.subject", "channels.push.title",
        "channels.inapp.text"}
    script = await api.call("PUT", "/v1/templates/t", key=project.full, json={
        "channels": {"inapp": {"text": "x", "url": "javascript:alert(1)"}}})
    assert script.fields == ["channels.inapp.url"]
    # ... unless the AI writes that channel: then the fields are placeholders
    placeholders = await api.call("PUT", "/v1/templates/t-ai", key=project.full, json={
        "channels": {"sms": {"text": ""}}, "ai": {"model": "m", "prompt": "p",
                                                   "channels": ["sms"]}})
    assert placeholders.status == 201
    # A fallback channel without content gets generic content, as a send naming it does:
    # API.md sets no other rule on the chain.
    no_content = await api.call("PUT", "/v1/templates/t-chain", key=project.full, json={
        "channels": {"email": {"subject": "s", "text": "t"}},
        "fallback": ["push", "sms", "email"]})
    assert no_content.status == 201, no_content.body
    assert no_content.body["fallback"] == ["push", "sms", "email"]
    empty = await api.call("PUT", "/v1/templates/t", key=project.full, json={"channels": {}})
    assert empty.fields == ["channels"]
    prompt = await api.call("PUT", "/v1/templates/t", key=project.full, json={
        "channels": {}, "ai": {"model": "m", "prompt": "{% if %}", "channels": ["email"]}})
    assert prompt.fields == ["ai.prompt"]
    blank = await api.call("PUT", "/v1/templates/t", key=project.full, json={
        "channels": {}, "ai": {"model": " ", "prompt": " \n\t", "channels": ["email"]}})
    assert (blank.status, set(blank.fields)) == (400, {"ai.model", "ai.prompt"})
    # A model name goes out verbatim in the provider call: a control character in it would
    # fail every send of the template, so it is refused here.
    for model in ("gpt-4o\n", "gpt\x00mini", "gpt-4o\x7f", "m\x85"):
        control = await api.call("PUT", "/v1/templates/t", key=project.full, json={
            "channels": {}, "ai": {"model": model, "prompt": "p", "channels": ["email"]}})
        assert (control.status, control.error["code"], control.fields) == (
            400, "validation_error", ["ai.model"]), model
        assert control.error["details"][0]["message"].startswith("must not contain")
    ai_only = await api.call("PUT", "/v1/templates/t", key=project.full, json={
        "channels": {}, "ai": {"model": "m", "prompt": "Write to {{ user.id }}",
                               "channels": ["email"]}, "fallback": ["email"]})
    assert ai_only.status == 201


async def test_preview_renders_every_channel_with_the_documented_context(
    api: Api, project: Project
) -> None:
    await api.call("PUT", "/v1/templates/invoice", key=project.full, json=INVOICE)
    await api.call("PUT", "/v1/users/u1", key=project.full,
                   json={"attributes": {"name": "<Ada>"}})
    reply = await api.call("POST", "/v1/templates/invoice/preview", key=project.full,
                           json={"userId": "u1", "data": {"amount": "12.00", "number": 7}})
    assert reply.status == 200, reply.body
    channels = reply.body["channels"]
    assert channels["email"]["subject"] == "Invoice 7"
    assert channels["email"]["html"].startswith("<p>Hi &lt;Ada&gt;, 12.00</p>")
    assert channels["sms"] == {"text": "Paid 12.00"}
    assert channels["push"]["data"] == {"n": "7"}
    assert channels["inapp"]["url"] == "/invoices/7"
    href = channels["email"]["html"].split("href='")[1].split("'")[0]
    token = parse_qs(urlsplit(href.replace("&amp;", "&")).query)["token"][0]
    claims = verify_token(api.settings.secret, token)
    assert (claims.project_id, claims.user_id, claims.channel, claims.topic, claims.preview) == (
        project.id, "u1", "email", "billing", True)


async def test_a_previews_unsubscribe_link_changes_nothing(api: Api, project: Project) -> None:
    """The author trying the rendered link would otherwise turn the topic off for the user
    the preview was rendered for (a real one, named by userId), with no suppression."""
    await api.call("PUT", "/v1/templates/invoice", key=project.full, json=INVOICE)
    await api.call("PUT", "/v1/users/u1", key=project.full, json={
        "contacts": [{"channel": "email", "target": "u1@example.com"}]})
    reply = await api.call("POST", "/v1/templates/invoice/preview", key=project.full,
                           json={"userId": "u1", "data": {"amount": "1", "number": 1}})
    href = reply.body["channels"]["email"]["html"].split("href='")[1].split("'")[0]
    link = urlsplit(href.replace("&amp;", "&"))
    for method in ("GET", "POST"):
        followed = await api.call(method, f"{link.path}?{link.query}")
        assert followed.status == 200, followed.body
        assert followed.body == {"unsubscribed": False, "channel": "email", "topic": "billing",
                                 "suppressed": False, "preview": True}
    preferences = await api.call("GET", "/v1/users/u1/preferences", key=project.full)
    assert preferences.body["topics"] == {}
    suppressions = await api.call("GET", "/v1/suppressions", key=project.full)
    assert suppressions.body["items"] == []


async def test_preview_shows_an_in_app_script_link_left_out_as_delivery_leaves_it_out(
    api: Api, project: Project
) -> None:
    """A link the data makes a script URL (``{{ data.link }}`` of ``javascript:...``) is
    dropped by the in-app transport; the preview showed it as the message's url, so the
    preview promised a link the recipient never got."""
    put = await api.call("PUT", "/v1/templates/linked", key=project.full, json={
        "channels": {"inapp": {"text": "Open", "url": "{{ data.link }}"}}})
    assert put.status == 201, put.body
    for link, shown in (("javascript:alert(1)", None), (" JavaScript:alert(1)", None),
                        ("https://example.com/a", "https://example.com/a")):
        reply = await api.call("POST", "/v1/templates/linked/preview", key=project.full,
                               json={"data": {"link": link}})
        assert reply.status == 200, reply.body
        assert reply.body["channels"]["inapp"] == {"text": "Open", "url": shown}, link


async def test_preview_renders_the_ai_prompt_for_each_channel_it_writes(
    api: Api, project: Project
) -> None:
    """The ai service renders the prompt once per channel, with that channel, the e-mail's
    unsubscribeUrl and a digest's items; the preview rendered it once with none of them, so
    a prompt every send renders (the link in an e-mail's prompt, a digest's items) was a 400
    and one that reads ``channel`` showed what no channel gets."""
    put = await api.call("PUT", "/v1/templates/written", key=project.full, json={
        "channels": {"sms": {"text": "Hi"}},
        "ai": {"model": "gpt-4o-mini", "channels": ["email", "sms"], "prompt":
               "{{ items | length }} for {{ channel }} {{ data.x }}"
               "{% if channel == 'email' %} {{ unsubscribeUrl[:4] }}{% endif %}"}})
    assert put.status == 201, put.body
    reply = await api.call("POST", "/v1/templates/written/preview", key=project.full, json={
        "data": {"x": "X"}, "items": [{"data": {}, "at": None}, {"data": {}, "at": None}]})
    assert reply.status == 200, reply.body
    assert reply.body["ai"]["prompts"] == {"email": "2 for email X http", "sms": "2 for sms X"}
    assert reply.body["ai"]["prompt"] == "2 for email X http"  # the first channel's
    link_only = await api.call("PUT", "/v1/templates/linked-ai", key=project.full, json={
        "channels": {"email": {"subject": "S"}},
        "ai": {"model": "gpt-4o-mini", "channels": ["email"],
               "prompt": "End with {{ unsubscribeUrl }}"}})
    assert link_only.status == 201, link_only.body
    reply = await api.call("POST", "/v1/templates/linked-ai/preview", key=project.full,
                           json={"data": {}})
    assert reply.status == 200, reply.body
    assert "/v1/unsubscribe?token=" in reply.body["ai"]["prompt"]
    # a channel whose prompt does not render is named
    await api.call("PUT", "/v1/templates/linked-ai", key=project.full, json={
        "channels": {"email": {"subject": "S"}},
        "ai": {"model": "gpt-4o-mini", "channels": ["email", "sms"],
               "prompt": "End with {{ unsubscribeUrl }}"}})
    failed = await api.call("POST", "/v1/templates/linked-ai/preview", key=project.full,
                            json={"data": {}})
    assert failed.status == 400, failed.body
    [problem] = failed.error["details"]
    assert problem["field"] == "ai.prompt"
    assert problem["message"].startswith("for sms: 'unsubscribeUrl' is undefined")


async def test_preview_errors_name_the_field(api: Api, project: Project) -> None:
    await api.call("PUT", "/v1/templates/invoice", key=project.full, json=INVOICE)
    missing = await api.call("POST", "/v1/templates/invoice/preview", key=project.full,
                             json={"data": {"amount": "1"}})
    assert missing.status == 400
    assert missing.error["code"] == "template_render_error"
    assert "channels.email.subject" in missing.fields
    ghost = await api.call("POST", "/v1/templates/invoice/preview", key=project.full,
                           json={"userId": "ghost", "data": {}})
    assert ghost.fields == ["userId"]
    unknown = await api.call("POST", "/v1/templates/nope/preview", key=project.full,
                             json={"data": {}})
    assert unknown.status == 404


async def test_preview_of_a_field_a_send_would_not_go_out_with_blank_is_a_400_naming_it(
    api: Api, project: Project
) -> None:
    """An SMS text or an e-mail subject that renders blank is a failed render for a send
    (it gets the generic content): the preview says so rather than show the blank."""
    await api.call("PUT", "/v1/templates/blank", key=project.full, json={"channels": {
        "email": {"subject": "{{ data.title }}", "text": "hello"},
        "sms": {"text": "{{ data.note }}"},
        "push": {"title": "{{ data.title }}", "body": "b"},
    }})
    reply = await api.call("POST", "/v1/templates/blank/preview", key=project.full,
                           json={"data": {"title": " ", "note": ""}})
    assert reply.status == 400, reply.body
    assert reply.error["code"] == "template_render_error"
    assert sorted(reply.fields) == ["channels.email.subject", "channels.sms.text"]
    filled = await api.call("POST", "/v1/templates/blank/preview", key=project.full,
                            json={"data": {"title": "Hi", "note": "n"}})
    assert filled.status == 200, filled.body
    assert filled.body["channels"]["sms"]["text"] == "n"


async def test_preview_of_an_ai_template_takes_blank_fields_the_model_fills(
    api: Api, project: Project
) -> None:
    """A channel the model writes may leave its body blank (the answer fills it) and its
    e-mail subject or push title blank (the answer's first sentence): the PUT takes such a
    template and every send goes out with the model's text, but the preview answered 400
    "renders empty ..., so a send gets the generic content instead", which no send does."""
    put = await api.call("PUT", "/v1/templates/ai-blank", key=project.full, json={
        "channels": {"email": {"subject": "{{ data.subject }}"}, "sms": {"text": ""},
                     "push": {"title": "", "body": ""}},
        "ai": {"model": "gpt-4o-mini", "prompt": "Write to {{ data.name }}",
               "channels": ["email", "sms", "push"]}})
    assert put.status == 201, put.body
    reply = await api.call("POST", "/v1/templates/ai-blank/preview", key=project.full,
                           json={"data": {"subject": " ", "name": "Ann"}})
    assert reply.status == 200, reply.body
    assert reply.body["ai"]["prompts"] == {"email": "Write to Ann", "sms": "Write to Ann",
                                           "push": "Write to Ann"}
    # A channel the model does not write is still held to the rule.
    await api.call("PUT", "/v1/templates/ai-blank", key=project.full, json={
        "channels": {"email": {"subject": "{{ data.subject }}", "text": "t"},
                     "sms": {"text": ""}},
        "ai": {"model": "gpt-4o-mini", "prompt": "Write", "channels": ["sms"]}})
    reply = await api.call("POST", "/v1/templates/ai-blank/preview", key=project.full,
                           json={"data": {"subject": " "}})
    assert reply.status == 400, reply.body
    assert reply.fields == ["channels.email.subject"]


async def test_preview_of_a_digest_template_renders_the_items_given(
    api: Api, project: Project
) -> None:
    """A digest template loops over ``items`` (each ``{"data", "at"}``), which no send through
    the API carries; the preview takes them in its body so such a template can be tried."""
    await api.call("PUT", "/v1/templates/weekly", key=project.full, json={"channels": {
        "sms": {"text": "{{ items | length }}: {% for i in items %}{{ i.data.n }}@{{ i.at }} "
                        "{% endfor %}"}}})
    items = [{"data": {"n": 1}, "at": "2026-12-01T09:00:00Z"}, {"data": {"n": 2}}]
    reply = await api.call("POST", "/v1/templates/weekly/preview", key=project.full,
                           json={"items": items})
    assert reply.status == 200, reply.body
    # ``at`` as a digest step hands it over: in UTC, to the millisecond.
    assert reply.body["channels"]["sms"]["text"] == "2: 1@2026-12-01T09:00:00.000Z 2@ "
    # Without items it renders as a send outside a digest would: ``items`` is undefined.
    plain = await api.call("POST", "/v1/templates/weekly/preview", key=project.full, json={})
    assert plain.status == 400, plain.body
    assert plain.fields == ["channels.sms.text"]


async def test_preview_items_times_read_as_a_digest_s_do_in_utc(
    api: Api, project: Project
) -> None:
    """A digest's template sees each trigger's time as the API writes every time (UTC, with
    milliseconds), so the preview hands over the time given in that spelling, not as typed."""
    await api.call("PUT", "/v1/templates/weekly", key=project.full, json={"channels": {
        "sms": {"text": "{% for i in items %}{{ i.at }}|{{ i.at[:10] }} {% endfor %}"}}})
    items = [{"data": {}, "at": "2026-12-01T00:30:00+01:00"},
             {"data": {}, "at": "2026-12-01t09:00:00.5z"}]
    reply = await api.call("POST", "/v1/templates/weekly/preview", key=project.full,
                           json={"items": items})
    assert reply.status == 200, reply.body
    assert reply.body["channels"]["sms"]["text"] == (
        "2026-11-30T23:30:00.000Z|2026-11-30 2026-12-01T09:00:00.500Z|2026-12-01 ")


@pytest.mark.parametrize(("items", "fields"), [
    ("x", ["items"]),
    ([{"data": {}}] * 1001, ["items"]),
    ([{"data": {}}, 3], ["items[1]"]),
    ([{"data": []}], ["items[0].data"]),
    ([{"at": "yesterday"}], ["items[0].at"]),
    ([{"data": {}, "when": 1}], ["items[0].when"]),
])
async def test_preview_items_that_are_not_digest_items_are_a_400_naming_them(
    api: Api, project: Project, items: Any, fields: list[str]
) -> None:
    await api.call("PUT", "/v1/templates/weekly", key=project.full,
                   json={"channels": {"sms": {"text": "{{ items | length }}"}}})
    reply = await api.call("POST", "/v1/templates/weekly/preview", key=project.full,
                           json={"items": items})
    assert reply.status == 400, reply.body
    assert reply.fields == fields


async def test_preview_errors_name_the_line_the_template_failed_on(
    api: Api, project: Project
) -> None:
    """A render error says where, as a syntax error does: the line of the field that failed."""
    body = {"channels": {"email": {"subject": "Invoice", "text": (
        "Hello {{ user.id }},\n\nyour total is {{ data.total }}\n"
        "{% for line in data.lines %}\n{{ line.amount / line.count }}\n{% endfor %}")}}}
    put = await api.call("PUT", "/v1/templates/lines", key=project.full, json=body)
    assert put.status in (200, 201), put.body
    missing = await api.call("POST", "/v1/templates/lines/preview", key=project.full,
                             json={"data": {"lines": []}})
    assert missing.status == 400
    assert missing.error["details"][0]["field"] == "channels.email.text"
    assert missing.error["details"][0]["message"].endswith("(line 3)")
    zero = await api.call("POST", "/v1/templates/lines/preview", key=project.full,
                          json={"data": {"total": 1, "lines": [{"amount": 1, "count": 0}]}})
    assert zero.status == 400
    assert zero.error["details"][0]["message"] == "ZeroDivisionError: division by zero (line 5)"


async def test_preview_of_output_json_cannot_carry_is_a_400(api: Api, project: Project) -> None:
    for source in ("{{ '\\ud800' }}", "a{{ '%c' % 0 }}b"):
        body = {"channels": {"sms": {"text": source}}}
        put = await api.call("PUT", "/v1/templates/odd", key=project.full, json=body)
        assert put.status in (200, 201)
        reply = await api.call("POST", "/v1/templates/odd/preview", key=project.full,
                               json={"data": {}})
        assert reply.status == 400
        assert reply.fields == ["channels.sms.text"]


async def test_push_data_using_a_key_fcm_reserves_is_a_400(api: Api, project: Project) -> None:
    """FCM refuses every message whose data uses a reserved key: such a template was stored
    and each of its pushes dead-lettered. It is refused at save, naming the key; keys that
    merely contain the words pass."""
    for key in ("from", "message_type", "google.c.a.e", "gcm.notification.x"):
        body = {"channels": {"push": {"title": "t", "body": "b", "data": {key: "v", "k": "v"}}}}
        reply = await api.call("PUT", "/v1/templates/reserved", key=project.full, json=body)
        assert (reply.status, reply.fields) == (400, [f"channels.push.data.{key}"]), reply.body
    fine = {"channels": {"push": {"title": "t", "body": "b",
                                  "data": {"sender_from": "v", "my_google": "v", "From": "v"}}}}
    assert (await api.call("PUT", "/v1/templates/reserved", key=project.full,
                           json=fine)).status == 201


async def test_a_nested_field_is_held_to_the_field_length_limit(api: Api, project: Project) -> None:
    """Push data and a webhook body object hold template strings as the other fields do, and
    so as long as they may be (100,000 characters): longer ones were stored, each taking
    seconds to compile wherever the template is first rendered."""
    long = "x" * (template_routes.MAX_TEMPLATE_CHARS + 1)
    reply = await api.call("PUT", "/v1/templates/t", key=project.full, json={"channels": {
        "push": {"title": "t", "body": "b", "data": {"ok": "x", "k": long}},
        "webhook": {"body": {"a": {"b": [1, long]}}}}})
    assert reply.status == 400
    assert reply.fields == ["channels.push.data.k", "channels.webhook.body.a.b[1]"]
    assert "100000 characters" in reply.error["details"][0]["message"]
    fits = "x" * template_routes.MAX_TEMPLATE_CHARS
    reply = await api.call("PUT", "/v1/templates/t", key=project.full, json={"channels": {
        "push": {"title": "t", "body": "b", "data": {"k": fits}},
        "webhook": {"body": {"a": {"b": [1, fits]}}}}})
    assert reply.status == 201
