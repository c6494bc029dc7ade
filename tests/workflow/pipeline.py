"""Helpers for running workflows through the real send path into the provider simulators."""

from __future__ import annotations

from typing import Any

import asyncpg

from notifkit.config import AiSettings, EmailSettings, Settings
from notifkit.services.base import Service
from simulators import SimulatorServer


def simulated(settings: Settings, sim: SimulatorServer) -> Settings:
    """``settings`` with e-mail (Resend) and the AI endpoint pointed at the simulator, and
    entries reclaimable at once so a drain runs whole retry cycles."""
    return settings.replace(
        email=EmailSettings(transport="resend", resend_api_key="re_test",
                            resend_base_url=sim.base_url),
        ai=AiSettings(api_key="sk-test", base_url=f"{sim.base_url}/v1", model="gpt-4o-mini"),
        reclaim_min_idle_s=0.0, provider_timeout_s=5.0,
    )


async def add_user(db: asyncpg.Pool, project_id: str, user_id: str, email: str,
                   attributes: dict[str, Any] | None = None) -> None:
    await db.execute(
        "INSERT INTO users (project_id, id, attributes) VALUES ($1, $2, $3)",
        project_id, user_id, attributes or {},
    )
    await db.execute(
        "INSERT INTO user_contacts (project_id, user_id, channel, target) "
        "VALUES ($1, $2, 'email', $3)", project_id, user_id, email,
    )


async def add_template(db: asyncpg.Pool, project_id: str, template_id: str,
                       channels: dict[str, Any], ai: dict[str, Any] | None = None) -> None:
    await db.execute(
        "INSERT INTO templates (project_id, id, content, ai) VALUES ($1, $2, $3, $4)",
        project_id, template_id, channels, ai,
    )


async def drain(*services: Service, max_rounds: int = 50) -> None:
    """Run every service until a whole round finds nothing to do."""
    for _ in range(max_rounds):
        done = 0
        for service in services:
            done += await service.run_until_idle()
        if not done:
            return
    raise AssertionError(f"the pipeline was still busy after {max_rounds} rounds")
