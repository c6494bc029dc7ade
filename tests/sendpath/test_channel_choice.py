"""Channel choice as a property: whatever the preferences, contacts, suppressions and chain,
the engine never sends where the user said no, never to a suppressed address, and sends at
most one channel of the fallback chain."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from notifkit.db.logs import Kind
from notifkit.db.routing import Template
from notifkit.services.engine.channels import decide, template_channels

CHANNELS = ["email", "sms", "push", "inapp", "webhook"]
channel = st.sampled_from(CHANNELS)
targets = st.lists(st.sampled_from(["a", "b", "c"]), max_size=3, unique=True)


@st.composite
def situations(draw: st.DrawFn) -> tuple[dict[str, Any], Template, dict[tuple[str, str], str]]:
    template = Template(
        id="t", topic=draw(st.sampled_from([None, "billing"])),
        content={c: {"text": "x"} for c in draw(st.lists(channel, unique=True))},
        fallback=draw(st.lists(channel, unique=True, max_size=4)), ai=None,
    )
    message: dict[str, Any] = {
        "eventId": "e", "projectId": "p", "template": "t", "priority": "normal", "data": {},
        "channels": draw(st.one_of(st.none(), st.lists(channel, min_size=1, max_size=5))),
        "user": {"id": "u", "attributes": {}, "timezone": None, "locale": None},
        "contacts": draw(st.dictionaries(st.sampled_from(["email", "sms", "push", "webhook"]),
                                         targets)),
        "preferences": {
            "channels": draw(st.dictionaries(channel, st.booleans())),
            "topics": draw(st.dictionaries(st.just("billing"), st.booleans())),
            "quietHours": None,
        },
    }
    suppressed = draw(st.dictionaries(st.tuples(channel, st.sampled_from(["a", "b", "c"])),
                                      st.sampled_from(["bounce", "complaint", "unsubscribe"])))
    return message, template, suppressed


@given(situations())
def test_decisions_respect_every_no(
    situation: tuple[dict[str, Any], Template, dict[tuple[str, str], str]],
) -> None:
    """A send the user refused, or to a suppressed address, is the failure that costs trust
    (and money): it must be impossible, whatever the combination."""
    message, template, suppressed = situation
    decisions = decide(message, template, suppressed)  # type: ignore[arg-type]
    requested = message["channels"] or template_channels(template)
    prefs = message["preferences"]
    sent = [d for d in decisions if d.send]

    assert {d.channel for d in decisions} <= set(requested)
    assert len({d.channel for d in decisions}) == len(decisions)  # one decision per channel
    assert sum(1 for d in sent if d.channel in template.fallback) <= 1
    for d in sent:
        assert prefs["channels"].get(d.channel) is not False
        assert not (template.topic and prefs["topics"].get(template.topic) is False)
        assert d.destinations
        assert not any((d.channel, t) in suppressed for t in d.destinations)
        if d.channel != "inapp":
            assert set(d.destinations) <= set(message["contacts"].get(d.channel, []))
            # push goes to every device; any other channel to one address, the first (the
            # oldest) not suppressed, so a user with two e-mail addresses gets one e-mail
            live = [t for t in message["contacts"][d.channel] if (d.channel, t) not in suppressed]
            assert d.destinations == (live if d.channel == "push" else live[:1])
        assert set(d.chain) <= set(template.fallback) - {d.channel}
        # the route re-entered on a failure: the chain, with the channels passed over between
        assert [c for c in d.route if c in d.chain] == d.chain
        assert d.route[-1:] == d.chain[-1:]
        assert set(d.route) <= set(template.fallback) - {d.channel}
        for later in d.chain:  # a fallback the user cannot be reached on would only be skipped
            assert prefs["channels"].get(later) is not False
            assert later == "inapp" or any((later, t) not in suppressed
                                           for t in message["contacts"].get(later, []))
    for d in decisions:
        if not d.send:
            assert d.kind in (Kind.SKIPPED, Kind.SUPPRESSED)
            assert d.reason


def test_a_send_naming_no_channel_gets_the_templates_content_chain_and_ai_channels() -> None:
    template = Template(id="t", topic=None, content={"email": {"subject": "s"}},
                        fallback=["push", "email"],
                        ai={"model": "m", "prompt": "p", "channels": ["sms"]})
    assert sorted(template_channels(template)) == ["email", "push", "sms"]
