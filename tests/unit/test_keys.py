"""Every Redis name of CONTRACT §2, exactly, with and without a namespace.

Processes of different versions (and the operators' dashboards) share one Redis: a name that
drifts by one character splits the system in two without any error.
"""

from __future__ import annotations

import inspect
import re

import pytest

from notifkit.keys import PRIORITIES, SCHEDULER_SHARDS, Keys, shard_of

# name built by Keys("") -> the contract's name
CONTRACT_NAMES: list[tuple[str, str]] = [
    *((f"inbound:{p}", f"notifkit:stream:inbound:{p}") for p in PRIORITIES),
    *((f"enriched:{p}", f"notifkit:stream:enriched:{p}") for p in PRIORITIES),
    *((f"outbound:{p}", f"notifkit:stream:outbound:{p}") for p in PRIORITIES),
    ("ai_pending", "notifkit:stream:ai:pending"),
    ("scheduled", "notifkit:stream:scheduled"),
    ("workflow_inbound", "notifkit:stream:workflow:inbound"),
    ("events_inbound", "notifkit:stream:events:inbound"),
    ("dlq", "notifkit:stream:dlq"),
    ("scheduled_shard:7", "notif:scheduled:zset:7"),
    ("workflow_timers", "notif:workflow:timers"),
    ("scheduler_lock", "notif:lock:scheduler:poll"),
    ("workflow_lock:wf-1", "lock:workflow:wf-1"),
    ("throttle:p1:u1", "throttle:p1:user:u1"),
    ("processed:delivery:task-1", "notif:processed:delivery:task-1"),
    ("health:engine-host-42", "notif:health:engine-host-42"),
]


def build(keys: Keys, spec: str) -> str:
    name, *args = spec.split(":")
    if name in ("inbound", "enriched", "outbound"):
        return str(getattr(keys, name)(*args))
    value = getattr(keys, name)
    return str(value(*args) if callable(value) else value)


@pytest.mark.parametrize(("spec", "expected"), CONTRACT_NAMES)
def test_names_without_a_namespace_are_the_contract_names(spec: str, expected: str) -> None:
    assert build(Keys(), spec) == expected


@pytest.mark.parametrize(("spec", "expected"), CONTRACT_NAMES)
def test_a_namespace_prefixes_every_name(spec: str, expected: str) -> None:
    assert build(Keys("staging-2"), spec) == f"staging-2:{expected}"


@pytest.mark.parametrize(("spec", "expected"), CONTRACT_NAMES)
def test_a_namespace_written_with_its_separator_gets_no_second_one(spec: str,
                                                                   expected: str) -> None:
    assert build(Keys("staging-2:"), spec) == f"staging-2:{expected}"


def test_streams_of_each_kind_are_listed_in_priority_order() -> None:
    keys = Keys("ns")
    assert keys.inbound_all() == [
        "ns:notifkit:stream:inbound:critical",
        "ns:notifkit:stream:inbound:normal",
        "ns:notifkit:stream:inbound:low",
    ]
    assert [s.rsplit(":", 1)[1] for s in keys.enriched_all()] == list(PRIORITIES)
    assert [s.rsplit(":", 1)[1] for s in keys.outbound_all()] == list(PRIORITIES)
    assert len(set(keys.all_streams())) == 14
    assert all(s.startswith("ns:notifkit:stream:") for s in keys.all_streams())


def test_consumer_groups_are_named_by_service_and_live_inside_their_streams() -> None:
    # A group belongs to its (namespaced) stream, so the group name itself carries no prefix.
    assert Keys().group("delivery") == "notifkit:group:delivery"
    assert Keys("ns").group("delivery") == "notifkit:group:delivery"


def test_attempt_counters_name_the_group_and_the_entry() -> None:
    # Exactly CONTRACT §2 for every stream a group reads alone: the one counter there is.
    keys = Keys()
    for stream in (keys.ai_pending, keys.scheduled, keys.events_inbound, keys.workflow_inbound):
        assert keys.attempt_counters("notifkit:group:engine", "1-0", stream) == [
            "notif:attempts:notifkit:group:engine:1-0"
        ]
        assert keys.attempts("notifkit:group:engine", "1-0", stream) == (
            "notif:attempts:notifkit:group:engine:1-0"
        )


@pytest.mark.parametrize("priority", ["critical", "normal", "low"])
def test_a_priority_entry_is_counted_under_the_contracts_name_and_one_of_its_own(
    priority: str,
) -> None:
    # Ids are unique per stream only: 5-0 on the critical and the normal stream are two
    # entries. Each is counted under CONTRACT §2's name and, deciding, under its priority's.
    for namespace, prefix in (("", ""), ("ns", "ns:")):
        keys = Keys(namespace)
        deciding = f"{prefix}notif:attempts:notifkit:group:engine:5-0:{priority}"
        assert keys.attempts("notifkit:group:engine", "5-0", keys.enriched(priority)) == deciding
        assert keys.attempt_counters("notifkit:group:engine", "5-0", keys.enriched(priority)) == [
            deciding, f"{prefix}notif:attempts:notifkit:group:engine:5-0"
        ]
    keys = Keys()
    assert len({keys.attempts("notifkit:group:engine", "5-0", keys.enriched(p))
                for p in ("critical", "normal", "low")}) == 3


def test_scheduler_shards_are_the_sixteen_hex_digits() -> None:
    assert Keys().scheduled_shards() == [f"notif:scheduled:zset:{d}" for d in "0123456789abcdef"]
    assert Keys("ns").scheduled_zset("task-3f") == "ns:notif:scheduled:zset:f"


def test_health_keys_share_one_prefix_and_pattern() -> None:
    keys = Keys("ns")
    assert keys.health_prefix() == "ns:notif:health:"
    assert keys.health_pattern() == "ns:notif:health:*"
    assert keys.health("api-h-1").startswith(keys.health_prefix())


def test_an_unknown_priority_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown priority"):
        Keys().inbound("urgent")


@pytest.mark.parametrize(
    ("task_id", "shard"),
    [
        ("0190f3a2-7b1c-7def-8a9b-0123456789ab", "b"),
        ("0190F3A2-7B1C-7DEF-8A9B-0123456789AB", "b"),  # case does not matter
        ("task-42", "2"),
        ("abc-xyz", "c"),  # the last *hex* digit, skipping the rest
        ("f", "f"),
        ("zzz", "0"),  # no hex digit at all
        ("", "0"),
    ],
)
def test_shard_of_is_the_last_hex_digit_of_the_task_id(task_id: str, shard: str) -> None:
    assert shard_of(task_id) == shard
    assert shard in SCHEDULER_SHARDS


def _schema_patterns() -> list[re.Pattern[str]]:
    """The names the key schema (keys.py's header comment) lists, as patterns."""
    import notifkit.keys

    names = re.findall(r"^\s+((?:notif|notifkit|lock|throttle):\S+)", notifkit.keys.__doc__ or "",
                       re.MULTILINE)
    return [re.compile(re.sub(r"\\\{[^}]*\\\}", ".+", re.escape(name)) + "$") for name in names]


def _every_name(keys: Keys) -> dict[str, str]:
    """What each public builder of Keys makes, with made-up arguments."""
    made = {}
    for attr in dir(Keys):
        # Groups live inside streams; the health prefix and pattern are the health key's.
        if (attr.startswith("_") or attr.endswith("_all")
                or attr in ("namespace", "group", "health_prefix", "health_pattern")):
            continue
        value = getattr(keys, attr)
        if not callable(value):
            made[attr] = value
            continue
        params = [p for p in inspect.signature(value).parameters if p != "self"]
        args = {"priority": "normal", "stream": keys.enriched("normal"), "shard": "7"}
        names = value(*[args.get(p, f"x-{p}") for p in params])
        for name in names if isinstance(names, list) else [names]:
            made[f"{attr}:{name}"] = name
    return made


def test_the_key_schema_lists_every_name_keys_builds() -> None:
    # The header comment is the one place an operator reads to know what is in Redis.
    patterns = _schema_patterns()
    missing = [f"{attr} -> {name}" for attr, name in _every_name(Keys()).items()
               if not any(p.match(name) for p in patterns)]
    assert not missing, missing
