"""Property tests for the pure dedup key functions (CONTRACT §4).

A dedup key that two different notifications share silently drops one of them; a key that
changes between two deliveries of the same notification lets a duplicate through. Both are
invisible in normal operation, so they are checked over generated inputs.

The keys are the contract's formats joined with ":" as they stand, so what keeps them apart is
what each part is: project, event and task ids are UUIDs made by notifkit, channels are a few
fixed words, and only a recipient id or a caller's idempotency key may hold anything (":"
over-represented below).
"""

from __future__ import annotations

from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from notifkit.dedup import (
    STAGES,
    ai_key,
    delivery_key,
    engine_key,
    enricher_key,
    enricher_page_key,
)
from notifkit.ids import is_uuid
from notifkit.keys import Keys
from notifkit.messages import CHANNELS

# Ids drawn afresh never repeat, so two inputs would differ in every id and a key that left
# one part out (the channel, the project) would still never collide. A few shared ids make
# inputs that differ in one part only.
SHARED_IDS = [f"0190a5c1-0000-7000-8000-{n:012x}" for n in range(1, 4)]
uuid = st.sampled_from(SHARED_IDS) | st.uuids().map(str)
channel = st.sampled_from(sorted(CHANNELS))
# Ids callers choose: tricky characters often, anything sometimes.
free_text = st.text(alphabet=st.sampled_from(":\\ab-1é"), max_size=6) | st.text(max_size=12)
recipient = st.sampled_from(["u1", "u2"]) | free_text
# A caller's idempotency key. One that is itself the id of another notification of the same
# project would share that notification's key: the contract's format cannot tell them apart,
# and ids are UUIDv7 that notifkit makes, so only a caller reusing an id as a key gets that.
caller_key = (st.sampled_from(["order-1", "order-2"])
              | free_text.filter(lambda k: bool(k) and not is_uuid(k)))

# One stage's significant inputs. For the enricher, a caller's idempotency key replaces the
# event id (that is what the key is for), so the event id is not part of that input.
enricher_input = st.one_of(
    st.tuples(st.just("enricher"), uuid, st.just("key"), caller_key),
    st.tuples(st.just("enricher"), uuid, st.just("event"), uuid),
)
engine_input = st.tuples(st.just("engine"), uuid, recipient, channel)
ai_input = st.tuples(st.just("ai"), uuid, recipient, channel)
delivery_input = st.tuples(st.just("delivery"), uuid)
any_input = st.one_of(enricher_input, engine_input, ai_input, delivery_input)
BY_STAGE = {"enricher": enricher_input, "engine": engine_input, "ai": ai_input,
            "delivery": delivery_input}


def dedup_key(spec: tuple[Any, ...]) -> str:
    """The dedup key of one generated input: (stage, *arguments)."""
    stage, *args = spec
    if stage == "enricher":
        project, kind, value = args
        if kind == "key":
            return enricher_key(project, idempotency_key=value, event_id="ignored")
        return enricher_key(project, idempotency_key=None, event_id=value)
    if stage == "engine":
        return engine_key(*args)
    if stage == "ai":
        return ai_key(*args)
    return delivery_key(*args)


def redis_name(spec: tuple[Any, ...]) -> str:
    return Keys("ns").processed(spec[0], dedup_key(spec))


def test_keys_are_the_contracts_formats() -> None:
    project, event = "0190a5c1-0000-7000-8000-000000000001", "0190a5c1-0000-7000-8000-00000000000e"
    assert enricher_key(project, idempotency_key="order-42", event_id=event) == \
        f"{project}:order-42"
    assert enricher_key(project, idempotency_key=None, event_id=event) == f"{project}:{event}"
    assert engine_key(event, "user:7", "email") == f"{event}:user:7:email"
    assert ai_key(event, "u1", "sms") == f"{event}:u1:sms:ai"
    assert delivery_key(event) == event
    assert Keys("").processed("delivery", event) == f"notif:processed:delivery:{event}"


@given(st.sampled_from(STAGES).flatmap(
    lambda stage: st.lists(BY_STAGE[stage], unique=True, min_size=2, max_size=30)))
@example([("engine", "0190a5c1-0000-7000-8000-000000000001", "a:b", "email"),
          ("engine", "0190a5c1-0000-7000-8000-000000000001", "a", "b:email")])
def test_distinct_inputs_give_distinct_keys_within_a_stage(specs: list[tuple[Any, ...]]) -> None:
    """Two different notifications must never share a key within a stage, or the second is
    dropped as a duplicate of the first. (The example's second recipient cannot occur: its
    channel would be "b:email", not a channel; it shows why the fixed parts matter.)"""
    valid = [s for s in specs if s[0] not in ("engine", "ai") or s[3] in CHANNELS]
    assert len({dedup_key(s) for s in valid}) == len(valid)


@given(st.lists(any_input, unique=True, min_size=2, max_size=40))
def test_distinct_inputs_give_distinct_redis_names_across_stages_and_projects(
    specs: list[tuple[Any, ...]],
) -> None:
    """Marks of every stage and every project live side by side in one Redis: the full
    ``notif:processed:{stage}:{key}`` name must tell all of them apart, so that one stage's
    (or one tenant's) mark never suppresses another's message."""
    assert len({redis_name(s) for s in specs}) == len(specs)


@given(any_input)
def test_keys_are_deterministic(spec: tuple[Any, ...]) -> None:
    """A redelivery of the same notification, possibly computed in another process, must
    produce the same key, or the duplicate is not recognised."""
    assert dedup_key(spec) == dedup_key(tuple(spec))
    assert redis_name(spec) == redis_name(spec)


@given(uuid, caller_key, uuid, uuid, uuid)
def test_the_idempotency_key_variant_never_equals_the_event_id_variant(
    project: str, idempotency_key: str, event_id: str, other_project: str, other_event: str,
) -> None:
    """A caller's idempotency key must not collide with another notification's event key, in
    this or any project: the two windows (24 h and 1 h) and meanings differ."""
    with_key = enricher_key(project, idempotency_key=idempotency_key, event_id=event_id)
    assert with_key != enricher_key(other_project, idempotency_key=None, event_id=other_event)
    assert with_key != enricher_key(project, idempotency_key=None, event_id=event_id)


@given(uuid, caller_key, uuid, uuid)
def test_with_a_caller_key_the_event_id_does_not_matter(
    project: str, idempotency_key: str, first_event: str, second_event: str,
) -> None:
    """Two API calls with one idempotency key get two event ids; they are one notification,
    so the enricher must see one key."""
    assert enricher_key(project, idempotency_key=idempotency_key, event_id=first_event) == (
        enricher_key(project, idempotency_key=idempotency_key, event_id=second_event)
    )


@given(enricher_input, free_text, enricher_input)
def test_a_segment_page_key_never_equals_a_notification_key(
    spec: tuple[Any, ...], after: str, other: tuple[Any, ...],
) -> None:
    """A segment's continuation pages are marked beside whole notifications in the enricher's
    marks: a page must never pass for a notification, nor one page for another's."""
    page = enricher_page_key(dedup_key(spec), after)
    assert page != dedup_key(other)
    assert page != enricher_page_key(dedup_key(spec), after + "x")


@given(uuid, recipient, channel)
def test_the_ai_key_differs_from_the_engine_key_of_the_same_message(
    event_id: str, recipient_id: str, channel_name: str,
) -> None:
    """The AI stage keys on the same ids as the engine plus a tag; the two must differ even
    as bare keys, so a mark copied between stages can never pass for the other's."""
    assert ai_key(event_id, recipient_id, channel_name) != engine_key(
        event_id, recipient_id, channel_name)


@given(enricher_input, free_text, enricher_input, free_text)
@example(("enricher", "00000000-0000-7000-8000-000000000000", "key", "batch"), "de:u1",
         ("enricher", "00000000-0000-7000-8000-000000000000", "key", "batch:de"), "u1")
def test_pages_of_two_notifications_never_share_a_key(
    spec: tuple[Any, ...], after: str, other: tuple[Any, ...], other_after: str,
) -> None:
    """Callers' idempotency keys and user ids may both hold ':': a page of one notification
    that passed for a page of another would be dropped as its duplicate, and its recipients
    never enriched."""
    if dedup_key(spec) != dedup_key(other):
        assert enricher_page_key(dedup_key(spec), after) != enricher_page_key(
            dedup_key(other), other_after)
