"""Each scenario can fail: run it against the real system as is (it must pass), then with the
one guarantee it checks broken on purpose through NOTIFKIT_FAULT_INJECTION (it must report the
violation). A scenario that passes either way proves nothing."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from scenarios import catalog
from scenarios.harness import RunOptions
from scenarios.report import ScenarioResult, violations_text

# Each case runs a whole scenario twice (as is, then broken): minutes, not the default 120 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

BROKEN_DRAIN_TIMEOUT_S = 8.0
NEVER_DRAIN_WHEN_BROKEN = {"crash_reclaim", "malformed"}
# Broken runs that lose work only if the outage strikes while entries are between their early
# ack and their end: Redis killed in a quiet moment leaves nothing to lose (1 of 7 runs on one
# fast machine; three in a row once on a loaded 2-core machine during CI, while the same test
# alone there caught the break at once). So do crash_reclaim's kills under an early ack: a
# kill lands when its victim holds a pending entry, which under the break is only the moment
# between a read and its ack, and loses work only if an acked batch was still being worked on
# (one clean-clone CI run of three saw every kill land with nothing to lose). The break must
# show in one of these runs; the tries stop at the first that shows it.
BROKEN_TRIES = {"redis_restart": 6, "crash_reclaim": 3}

# Small, yet enough for a kill to catch each stage in flight: the kills wait for a victim
# working on an entry, and at 60 sends a second one kill found the enricher (a few
# milliseconds an entry) idle every time; two kills a stage at 150/s catch it.
CRASH_RECLAIM_SMALL: dict[str, Any] = {"users": 20, "messages": 60, "kills": 2,
                                       "send_rate_per_s": 150}

# (scenario, fault injected, small parameters, what the report must say when it is broken)
PIPELINE_CASES: list[tuple[str, str, dict[str, Any], str]] = [
    ("crash_reclaim", "skip_reclaim",
     CRASH_RECLAIM_SMALL,
     r"never drained|lost|killed consumers"),
    ("duplicate_send", "drop_idempotency_key",
     {"users": 10, "messages": 30, "lost_responses": 3, "probability": 0.3},
     r"resend accepted task .* despite its idempotency key"),
    ("dlq_poison", "skip_failed_event", {"users": 5, "messages": 5},
     r"no notification:failed event"),
    ("malformed", "retry_malformed", {"users": 2, "messages": 2},
     r"must be acked by the first|still unacked"),
    ("rate_limit_429", "ignore_retry_after", {"users": 10, "messages": 20},
     r"before its Retry-After ran out|dropped to the DLQ"),
    ("invalid_token", "keep_invalid_contacts", {"users": 6, "invalid_users": 2},
     r"reached FCM [0-9]+ times, expected exactly once"),
    ("fallback_chain", "skip_fallback", {"users": 12, "messages": 12},
     r"expected exactly once on"),
    ("provider_outage", "ack_before_process",
     {"users": 10, "outage_s": 4.0, "traffic_s": 5.0, "send_rate_per_s": 10},
     r"notification\(s\) lost"),
]

PLATFORM_CASES: list[tuple[str, str, dict[str, Any], str]] = [
    ("priority_isolation", "ignore_priority",
     {"backlog": 20_000, "critical": 20, "wait_s": 10.0},
     r"critical p99 under backlog .* exceeds|were not all delivered in time"),
    ("backpressure", "unbounded_reads",
     {"messages": 1500, "rate_per_s": 400.0, "min_backlog": 300},
     r"delivery held [0-9]+ entries pending, more than its concurrency"),
    ("scheduler_failover", "scheduler_lock_forever",
     {"messages": 60, "quiesce_s": 6.0},
     r"the poll lock did not pass"),
    ("quiet_hours_throttle", "ignore_quiet_hours", {},
     r"in quiet hours\) was not deferred"),
    ("workflow_wait_for_event", "ignore_workflow_events", {"users": 10, "timeout_s": 8},
     r"\(event sent\) got \['reminder', 'welcome'\]"),
    ("key_revocation", "unpublished_key_revocations", {"users": 2, "watch_s": 2.0},
     r"api-2 still accepted the revoked key"),
    ("redis_restart", "ack_before_process", {"messages": 6000, "rate_per_s": 1000.0},
     r"notification\(s\) lost"),
    ("postgres_outage", "ignore_outages", {"messages": 300},
     r"notifications were dead-lettered: the workers spent their attempts"),
]

CASES = PIPELINE_CASES + PLATFORM_CASES
# A second guarantee some scenarios check, each once passed by its scenario unnoticed.
MORE_CASES: list[tuple[str, str, dict[str, Any], str]] = [
    # Its kills waited for the victim to hold any pending entry, which stopped it between a
    # read and the ack that followed at once: every kill left the entries to the survivor.
    ("crash_reclaim", "ack_before_process",
     CRASH_RECLAIM_SMALL,
     r"lost|no (enricher|engine|delivery) kill caught an entry in flight"),
    # It checked only that each instance's steps were in order, which a survivor running an
    # instance the killed process still had locked does not upset.
    ("workflow_wait_for_event", "ignore_workflow_locks", {"users": 10, "timeout_s": 8},
     r"run without the instance lock"),
]


@pytest.fixture
def system_urls(redis_url: str, database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scenarios find Redis and PostgreSQL the way the fixtures did."""
    monkeypatch.setenv("NOTIFKIT_TEST_REDIS_URL", redis_url)
    monkeypatch.setenv("NOTIFKIT_TEST_DATABASE_URL", database_url)


def run_scenario(name: str, params: dict[str, Any], run_dir: Path,
                 env: dict[str, str]) -> ScenarioResult:
    module = catalog.load(name)
    options = RunOptions(name=name, seed=1, run_dir=run_dir, env=env)
    result: ScenarioResult = asyncio.run(module.run(options, {**module.PARAMS, **params}))
    return result


@pytest.mark.usefixtures("system_urls")
@pytest.mark.parametrize(("name", "fault", "params", "expected"), CASES + MORE_CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in CASES + MORE_CASES])
def test_scenario_passes_and_reports_its_guarantee_broken(
    name: str, fault: str, params: dict[str, Any], expected: str, tmp_path: Path
) -> None:
    # Given the real system as it is, the scenario holds.
    clean = run_scenario(name, params, tmp_path, {})
    assert clean.ok, violations_text([clean])

    # When the guarantee it checks is broken on purpose, it says so (where the break leaves
    # work pending forever, the system never drains: wait less for that).
    if name in NEVER_DRAIN_WHEN_BROKEN:
        params = {**params, "drain_timeout_s": BROKEN_DRAIN_TIMEOUT_S}
    for _ in range(BROKEN_TRIES.get(name, 1)):
        broken = run_scenario(name, params, tmp_path, {"NOTIFKIT_FAULT_INJECTION": fault})
        if not broken.ok:
            break
    report = violations_text([broken])
    assert not broken.ok, f"{name} did not notice {fault}"
    assert re.search(expected, report), report


def test_every_scenario_has_a_mutation() -> None:
    assert sorted(case[0] for case in CASES) == sorted(catalog.available())
    assert len({case[1] for case in PIPELINE_CASES}) == len(PIPELINE_CASES)
