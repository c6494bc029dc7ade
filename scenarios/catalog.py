"""Every scenario by name. A scenario module exposes ``DESCRIPTION``, ``PARAMS`` (defaults)
and ``async def run(options: RunOptions, params: dict) -> ScenarioResult``; optionally
``CHOICES`` (a text parameter's allowed values), ``RANGES`` (a number's inclusive bounds; an
upper bound of ``math.inf`` for a least value alone), ``POSITIVE`` (numbers that must be more
than 0: a user count the sends cycle through, a rate they are paced at) and ``MORE_THAN`` (a
number that must be more than another parameter: the users beside the invalid ones among
them), which ``--set`` is checked against before anything starts."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

NAMES: tuple[str, ...] = (
    "crash_reclaim",
    "duplicate_send",
    "dlq_poison",
    "malformed",
    "rate_limit_429",
    "invalid_token",
    "fallback_chain",
    "provider_outage",
    "priority_isolation",
    "backpressure",
    "scheduler_failover",
    "quiet_hours_throttle",
    "workflow_wait_for_event",
    "key_revocation",
    "redis_restart",
    "postgres_outage",
)


def available() -> list[str]:
    """The scenarios of NAMES that have a module, in NAMES order."""
    return [name for name in NAMES if importlib.util.find_spec(f"scenarios.{name}") is not None]


def choices(module: ModuleType) -> dict[str, tuple[str, ...]]:
    """The values each text parameter of ``module`` can take (none declared: any)."""
    declared: dict[str, tuple[str, ...]] = getattr(module, "CHOICES", {})
    return declared


def ranges(module: ModuleType) -> dict[str, tuple[float, float]]:
    """The inclusive bounds of ``module``'s bounded number parameters (a probability, say)."""
    declared: dict[str, tuple[float, float]] = getattr(module, "RANGES", {})
    return declared


def positive(module: ModuleType) -> frozenset[str]:
    """The number parameters of ``module`` that must be more than 0."""
    declared: frozenset[str] = frozenset(getattr(module, "POSITIVE", ()))
    return declared


def more_than(module: ModuleType) -> dict[str, str]:
    """Each number parameter of ``module`` that must be more than another, and that other."""
    declared: dict[str, str] = getattr(module, "MORE_THAN", {})
    return declared


def load(name: str) -> ModuleType:
    if name not in NAMES:
        raise KeyError(name)
    return importlib.import_module(f"scenarios.{name}")
