"""The engine's generic content, sent when a template has no content for a channel or fails to
render: built from the send's data, which may be long, it must still be content the channel's
provider takes."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from notifkit.db.routing import Template
from notifkit.services.engine.render import cut, generic, render
from notifkit.templates import build_context


def _push_body_bytes(text: str) -> int:
    return len(json.dumps(text, ensure_ascii=False).encode()) - 2


@pytest.mark.parametrize("value", ["y" * 2100, "é" * 5000, "\n" * 3000])
def test_generic_sms_and_push_fit_what_their_providers_take(value: str) -> None:
    context = {"data": {"note": value, "amount": "12.00"}}
    template = Template(id="invoice-paid", topic=None, content={}, fallback=[], ai=None)

    sms = render(template, "sms", context).content["text"]
    push = render(template, "push", context).content["body"]

    # Twilio refuses a body over 1,600 characters (21617), FCM a message over 4 KB
    assert len(sms) <= 1600
    assert _push_body_bytes(push) <= 2048
    assert sms.startswith("Invoice paid: note:")
    assert sms.endswith("…")
    assert push.startswith("note:")
    assert push.endswith("…")


def test_a_generic_email_without_data_says_its_title_rather_than_nothing() -> None:
    assert generic("invoice-paid", "email", {"data": {}}) == {
        "subject": "Invoice paid", "text": "Invoice paid", "html": "<h1>Invoice paid</h1>"}


def test_short_generic_content_is_left_whole() -> None:
    context = {"data": {"amount": "12.00"}}
    assert generic("invoice-paid", "sms", context) == {"text": "Invoice paid: amount: 12.00"}
    assert generic("invoice-paid", "push", context) == {"title": "Invoice paid",
                                                        "body": "amount: 12.00"}


@pytest.mark.parametrize(("limit", "size"), [(1600, len), (2048, _push_body_bytes)])
def test_content_exactly_at_the_limit_is_left_whole_and_one_past_it_is_cut(
    limit: int, size: Callable[[str], int],
) -> None:
    assert cut("x" * limit, limit, size) == "x" * limit
    longer = cut("x" * (limit + 1), limit, size)
    assert longer.endswith("…")
    assert size(longer) <= limit


def _context(channel: str, data: dict[str, Any]) -> dict[str, Any]:
    return build_context(data=data, user={"id": "u1", "attributes": {}, "timezone": None,
                                          "locale": None},
                         notification={"id": "e", "template": "invoice-paid",
                                       "priority": "normal", "campaignId": None},
                         channel=channel)


@pytest.mark.parametrize(("channel", "content", "field"), [
    ("sms", {"text": "{{ data.note }}"}, "channels.sms.text"),
    ("email", {"subject": "{{ data.note }}", "text": "Paid"}, "channels.email.subject"),
    ("email", {"subject": " {{ data.note }}\n", "html": "<p>Paid</p>"},
     "channels.email.subject"),
])
def test_a_field_the_provider_refuses_blank_that_renders_blank_gets_generic_content(
    channel: str, content: dict[str, Any], field: str,
) -> None:
    # An SMS without a body (Twilio 21602) or an e-mail without a subject (Resend, SendGrid)
    # is refused for good: the recipient gets the generic content, and the row says why
    template = Template(id="invoice-paid", topic=None, content={channel: content}, fallback=[],
                        ai=None)
    context = _context(channel, {"note": None, "amount": "12.00"})

    rendered, error, _cuts = render(template, channel, context)

    assert rendered == generic("invoice-paid", channel, context)
    assert error == f"{field}: rendered empty"


def test_optional_or_non_blank_fields_are_sent_as_rendered() -> None:
    template = Template(id="invoice-paid", topic=None, fallback=[], ai=None, content={
        "email": {"subject": "Paid {{ data.note }}", "text": "{{ data.note }}"},
        "push": {"title": "{{ data.note }}", "body": "{{ data.note }}"}})
    email = _context("email", {"note": None})
    push = _context("push", {"note": None})
    assert render(template, "email", email) == ({"subject": "Paid ", "text": ""}, None, [])
    assert render(template, "push", push) == ({"title": "", "body": ""}, None, [])
