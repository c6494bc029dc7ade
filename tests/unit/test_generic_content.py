"""The engine's generic content, sent when a template has no content for a channel or fails to
render: built from the send's data, which may be long, it must still be content the channel's
provider takes."""

from __future__ import annotations

import json

import pytest

from notifkit.services.engine.render import generic


def _push_body_bytes(text: str) -> int:
    return len(json.dumps(text, ensure_ascii=False).encode()) - 2


@pytest.mark.parametrize("value", ["y" * 2100, "é" * 5000, "\n" * 3000])
def test_generic_sms_and_push_fit_what_their_providers_take(value: str) -> None:
    context = {"data": {"note": value, "amount": "12.00"}}

    sms = generic("invoice-paid", "sms", context)["text"]
    push = generic("invoice-paid", "push", context)["body"]

    # Twilio refuses a body over 1,600 characters (21617), FCM a message over 4 KB
    assert len(sms) <= 1600
    assert _push_body_bytes(push) <= 2048
    assert sms.startswith("Invoice paid: note:")
    assert sms.endswith("…")
    assert push.startswith("note:")
    assert push.endswith("…")


def test_short_generic_content_is_left_whole() -> None:
    context = {"data": {"amount": "12.00"}}
    assert generic("invoice-paid", "sms", context) == {"text": "Invoice paid: amount: 12.00"}
    assert generic("invoice-paid", "push", context) == {"title": "Invoice paid",
                                                        "body": "amount: 12.00"}
