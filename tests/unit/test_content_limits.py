"""A template's own content longer than its channel's provider takes: an SMS text over Twilio's
1,600 characters (21617) or a push message over FCM's 4 KB was sent whole and refused for
good. It is cut to fit as generic and AI-written content are, by the same code."""

from __future__ import annotations

import json
from typing import Any

import pytest

from notifkit.db.routing import Template
from notifkit.services.ai import content_for
from notifkit.services.engine.render import Rendered, fit, render
from notifkit.templates import build_context
from simulators.providers.fcm import MAX_PAYLOAD_BYTES
from simulators.providers.twilio import MAX_BODY_CHARS


def _utf8(text: str) -> int:
    return len(json.dumps(text, ensure_ascii=False).encode()) - 2


def _render(channel: str, content: dict[str, Any], data: dict[str, Any]) -> Rendered:
    template = Template(id="invoice-paid", topic=None, content={channel: content},
                        fallback=[], ai=None)
    context = build_context(data=data, user={"id": "u1", "attributes": {}, "timezone": None,
                                             "locale": None},
                            notification={"id": "e", "template": "invoice-paid",
                                          "priority": "normal", "campaignId": None},
                            channel=channel)
    return render(template, channel, context)


def test_a_templates_sms_text_over_1600_characters_is_cut_and_the_cut_is_named() -> None:
    rendered = _render("sms", {"text": "Note: {{ data.note }}"}, {"note": "y" * 2000})

    assert rendered.content == {"text": "Note: " + "y" * 1593 + "…"}
    assert len(rendered.content["text"]) == 1600
    assert rendered.error is None
    assert rendered.cuts == ["sms text cut to 1,600 characters"]


@pytest.mark.parametrize(("text", "sent"), [
    ("日" * 1600, "日" * 1600),  # at the limit: whole
    ("日" * 1601, "日" * 1599 + "…"),
    ("😀" * 1601, "😀" * 1599 + "…"),
    ("a" * 1590 + " " * 20, "a" * 1590 + "…"),  # no blank before the ellipsis
])
def test_an_sms_text_is_measured_in_characters_as_twilio_counts_them(
    text: str, sent: str,
) -> None:
    rendered = _render("sms", {"text": "{{ data.t }}"}, {"t": text})

    assert rendered.content == {"text": sent}
    assert len(rendered.content["text"]) <= MAX_BODY_CHARS
    assert rendered.cuts == ([] if text == sent else ["sms text cut to 1,600 characters"])


@pytest.mark.parametrize(("body", "sent"), [
    ("é" * 1024, "é" * 1024),  # 2,048 bytes of UTF-8: whole
    ("é" * 1025, "é" * 1022 + "…"),  # a two-byte character does not straddle the limit
    ("日" * 683, "日" * 681 + "…"),  # 2,049 bytes
    ("😀" * 512, "😀" * 512),  # 2,048 bytes
    ("😀" * 513, "😀" * 511 + "…"),
    ('"' * 1024, '"' * 1024),  # JSON writes each as \", two bytes
    ('"' * 1025, '"' * 1022 + "…"),
])
def test_a_templates_push_body_is_cut_to_2_kb_of_utf8_at_a_character_boundary(
    body: str, sent: str,
) -> None:
    rendered = _render("push", {"title": "Paid", "body": "{{ data.b }}"}, {"b": body})

    assert rendered.content == {"title": "Paid", "body": sent}
    assert _utf8(rendered.content["body"]) <= 2048
    assert rendered.cuts == ([] if body == sent else ["push body cut to 2,048 bytes"])


@pytest.mark.parametrize(("title", "sent"), [
    ("é" * 512, "é" * 512),  # 1,024 bytes: whole
    ("é" * 513, "é" * 510 + "…"),
    ("日" * 2000, "日" * 340 + "…"),
])
def test_a_templates_push_title_is_cut_to_1_kb_of_utf8(title: str, sent: str) -> None:
    rendered = _render("push", {"title": "{{ data.t }}", "body": "Paid"}, {"t": title})

    assert rendered.content == {"title": sent, "body": "Paid"}
    assert rendered.cuts == ([] if title == sent else ["push title cut to 1,024 bytes"])


def test_a_push_message_cut_to_fit_is_one_fcm_takes() -> None:
    # FCM measures notification and data together; with the task id delivery adds, a title
    # and body cut as far as they go leave room for the template's own data
    data = {"invoice": "{{ data.n }}", "kind": "paid"}
    rendered = _render("push", {"title": "{{ data.t }}", "body": "{{ data.b }}", "data": data},
                       {"t": "日" * 5000, "b": "😀" * 5000, "n": "x" * 800})
    content = rendered.content

    message = {"data": {**content["data"], "notifkit_task_id": "0" * 36},
               "notification": {"title": content["title"], "body": content["body"]}}
    assert len(json.dumps(message, ensure_ascii=False).encode()) <= MAX_PAYLOAD_BYTES
    assert content["data"] == {"invoice": "x" * 800, "kind": "paid"}
    assert rendered.cuts == ["push title cut to 1,024 bytes", "push body cut to 2,048 bytes"]


def test_other_channels_and_fields_are_sent_as_rendered() -> None:
    long = "y" * 5000
    email = {"subject": long, "text": long, "html": long}
    assert fit("email", email) == (email, [])
    assert fit("inapp", {"text": long}) == ({"text": long}, [])
    assert fit("webhook", {"body": long}) == ({"body": long}, [])
    assert fit("push", {"title": "t", "body": "b", "data": {"k": long}}) == (
        {"title": "t", "body": "b", "data": {"k": long}}, [])


def test_fit_leaves_the_content_it_was_given_alone() -> None:
    content = {"text": "y" * 2000}
    fit("sms", content)
    assert content == {"text": "y" * 2000}


def test_generic_content_says_what_was_cut_as_a_templates_does() -> None:
    template = Template(id="invoice-paid", topic=None, content={}, fallback=[], ai=None)
    rendered = render(template, "sms", {"data": {"note": "y" * 2000}})
    assert rendered.cuts == ["sms text cut to 1,600 characters"]
    assert len(rendered.content["text"]) == 1600


def test_an_ai_channels_title_from_the_template_is_cut_as_the_answer_is() -> None:
    content = content_for("push", "😀" * 1000, {"title": "é" * 600})

    assert content == {"title": "é" * 510 + "…", "body": "😀" * 511 + "…"}
