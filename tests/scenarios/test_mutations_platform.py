"""Each of priority_isolation, backpressure, scheduler_failover, quiet_hours_throttle,
workflow_wait_for_event, key_revocation, redis_restart and postgres_outage can fail: it passes
against the real system as is, and reports the violation when the guarantee it checks is
broken on purpose through NOTIFKIT_FAULT_INJECTION."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from scenarios import catalog
from scenarios.report import violations_text
from tests.scenarios.test_mutations import run_scenario, system_urls  # noqa: F401

# Each case runs a whole scenario twice (as is, then broken): minutes, not the default 120 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# (scenario, fault injected, small parameters, what the report must say when it is broken)
CASES: list[tuple[str, str, dict[str, Any], str]] = [
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
    ("workflow_wait_for_event", "ignore_workflow_events", {"users": 10, "timeout_s": 4},
     r"\(event sent\) got \['reminder', 'welcome'\]"),
    ("key_revocation", "unpublished_key_revocations", {"users": 2, "watch_s": 2.0},
     r"api-2 still accepted the revoked key"),
    ("redis_restart", "ack_before_process", {"messages": 600},
     r"notification\(s\) lost"),
    ("postgres_outage", "ack_before_process", {"messages": 300},
     r"notification\(s\) lost"),
]


@pytest.mark.usefixtures("system_urls")
@pytest.mark.parametrize(("name", "fault", "params", "expected"), CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_scenario_passes_and_reports_its_guarantee_broken(
    name: str, fault: str, params: dict[str, Any], expected: str, tmp_path: Path
) -> None:
    # Given the real system as it is, the scenario holds.
    clean = run_scenario(name, params, tmp_path, {})
    assert clean.ok, violations_text([clean])

    # When the guarantee it checks is broken on purpose, it says so.
    broken = run_scenario(name, params, tmp_path, {"NOTIFKIT_FAULT_INJECTION": fault})
    report = violations_text([broken])
    assert not broken.ok, f"{name} did not notice {fault}"
    assert re.search(expected, report), report


def test_every_scenario_of_this_half_has_a_mutation() -> None:
    covered = {case[0] for case in CASES}
    assert covered <= set(catalog.available())
    assert len(covered) == len(CASES)
