"""Property tests for the pure dedup key functions (CONTRACT §4).

A dedup key that two different notifications share silently drops one of them; a key that
changes between two deliveries of the same notification lets a duplicate through. Both are
invisible in normal operation, so they are checked over generated inputs, with ``:`` and
``\\`` (the separator and the escape) over-represented.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from notifkit.dedup import STAGES, ai_key, delivery_key, engine_key, enricher_key
from notifkit.keys import Keys

# Parts of ids as they might arrive from callers: tricky characters often, anything sometimes.
part = st.text(alphabet=st.sampled_from(":\\ab-1é"), max_size=6) | st.text(max_size=12)
caller_key = part.filter(bool)  # an empty idempotency key means "none given"

# One stage's significant inputs. For the enricher, a caller's idempotency key replaces the
# event id (that is what the key is for), so the event id is not part of that input.
enricher_input = st.one_of(
    st.tuples(st.just("enricher"), part, st.just("key"), caller_key),
    st.tuples(st.just("enricher"), part, st.just("event"), part),
)
engine_input = st.tuples(st.just("engine"), part, part, part)
ai_input = st.tuples(st.just("ai"), part, part, part)
delivery_input = st.tuples(st.just("delivery"), part)
any_input = st.one_of(enricher_input, engine_input, ai_input, delivery_input)


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


# The inputs most likely to collide are not random ones but near neighbours: the same text
# cut at a different ":" (("a:b", "c") and ("a", "b:c")). Random draws almost never produce
# such pairs, so each drawn input is joined by its re-cut neighbours.
FREE_PARTS = {"enricher": (1, 3), "engine": (1, 2, 3), "ai": (1, 2, 3), "delivery": (1,)}


def recuts(parts: tuple[str, ...], limit: int = 12) -> Iterator[tuple[str, ...]]:
    """Other ways to cut ``":".join(parts)`` into as many parts, at its other colons."""
    joined = ":".join(parts)
    colons = [i for i, char in enumerate(joined) if char == ":"]
    for chosen in itertools.islice(itertools.combinations(colons, len(parts) - 1), limit):
        bounds = [-1, *chosen, len(joined)]
        yield tuple(joined[a + 1 : b] for a, b in itertools.pairwise(bounds))


def with_neighbours(specs: list[tuple[Any, ...]]) -> set[tuple[Any, ...]]:
    out = set(specs)
    for spec in specs:
        positions = FREE_PARTS[spec[0]]
        for parts in recuts(tuple(spec[i] for i in positions)):
            neighbour = list(spec)
            for position, value in zip(positions, parts, strict=True):
                neighbour[position] = value
            if neighbour[0] == "enricher" and neighbour[2] == "key" and not neighbour[3]:
                continue  # an empty caller key is no caller key
            out.add(tuple(neighbour))
    return out


@given(st.sampled_from(STAGES).flatmap(
    lambda stage: st.lists(
        {"enricher": enricher_input, "engine": engine_input, "ai": ai_input,
         "delivery": delivery_input}[stage],
        unique=True, min_size=2, max_size=30,
    )
))
def test_distinct_inputs_give_distinct_keys_within_a_stage(specs: list[tuple[Any, ...]]) -> None:
    """Two different notifications (say ("a:b", "c") and ("a", "b:c")) must never share a
    key within a stage, or the second is dropped as a duplicate of the first."""
    inputs = with_neighbours(specs)
    assert len({dedup_key(s) for s in inputs}) == len(inputs)


@given(st.lists(any_input, unique=True, min_size=2, max_size=40))
def test_distinct_inputs_give_distinct_redis_names_across_stages_and_projects(
    specs: list[tuple[Any, ...]],
) -> None:
    """Marks of every stage and every project live side by side in one Redis: the full
    ``notif:processed:{stage}:{key}`` name must tell all of them apart, so that one stage's
    (or one tenant's) mark never suppresses another's message."""
    inputs = with_neighbours(specs)
    assert len({redis_name(s) for s in inputs}) == len(inputs)


def split_key(key: str) -> tuple[str, ...]:
    """Undo the documented encoding: parts joined by ":", with "\\" and ":" escaped."""
    parts: list[str] = []
    current: list[str] = []
    chars = iter(key)
    for char in chars:
        if char == "\\":
            current.append(next(chars))
        elif char == ":":
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return tuple(parts)


def spelled_out(spec: tuple[Any, ...]) -> tuple[str, ...]:
    stage, *args = spec
    return (*args, "ai") if stage == "ai" else tuple(args)


@given(any_input)
def test_a_key_spells_out_exactly_its_inputs(spec: tuple[Any, ...]) -> None:
    """If the inputs can be read back from the key, no two inputs can share one, whatever
    ":" and "\\" they contain (a join that forgets to escape either one fails here). It also
    lets an operator read a mark in Redis."""
    assert split_key(dedup_key(spec)) == spelled_out(spec)


@given(any_input)
def test_keys_are_deterministic(spec: tuple[Any, ...]) -> None:
    """A redelivery of the same notification, possibly computed in another process, must
    produce the same key, or the duplicate is not recognised."""
    assert dedup_key(spec) == dedup_key(tuple(spec))
    assert redis_name(spec) == redis_name(spec)


@given(part, caller_key, part, part, part)
@example("p", "event:y", "e", "p:key", "y")  # "p:key:event:y" both ways, joined naively
@example("p:event", "x", "e", "p", "key:x")  # "p:event:key:x"
def test_the_idempotency_key_variant_never_equals_the_event_id_variant(
    project: str, idempotency_key: str, event_id: str, other_project: str, other_event: str,
) -> None:
    """A caller's idempotency key that happens to look like some event id (in this or any
    project) must not collide with that event's key: the two windows (24 h and 1 h) and
    meanings differ."""
    with_key = enricher_key(project, idempotency_key=idempotency_key, event_id=event_id)
    without = enricher_key(other_project, idempotency_key=None, event_id=other_event)
    assert with_key != without
    assert with_key != enricher_key(project, idempotency_key=None, event_id=idempotency_key)


@given(part, caller_key, part, part)
def test_with_a_caller_key_the_event_id_does_not_matter(
    project: str, idempotency_key: str, first_event: str, second_event: str,
) -> None:
    """Two API calls with one idempotency key get two event ids; they are one notification,
    so the enricher must see one key."""
    assert enricher_key(project, idempotency_key=idempotency_key, event_id=first_event) == (
        enricher_key(project, idempotency_key=idempotency_key, event_id=second_event)
    )


@given(part, part, part)
def test_the_ai_key_differs_from_the_engine_key_of_the_same_message(
    event_id: str, recipient_id: str, channel: str,
) -> None:
    """The AI stage keys on the same ids as the engine plus a tag; the two must differ even
    as bare keys, so a mark copied between stages can never pass for the other's."""
    assert ai_key(event_id, recipient_id, channel) != engine_key(event_id, recipient_id, channel)
