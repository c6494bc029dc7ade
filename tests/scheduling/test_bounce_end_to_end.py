"""A hard bounce from the provider simulator, all the way round: Resend (simulated) bounces a
message, posts a signed webhook to the api, the events service suppresses the address, and
the next send to it is skipped with the reason on its timeline."""

from __future__ import annotations

from typing import Any, cast

import aiohttp
import asyncpg

from notifkit.config import Settings
from notifkit.services.api.service import ApiService
from notifkit.services.delivery.service import DeliveryService
from notifkit.services.engine import EngineService
from notifkit.services.enricher import EnricherService
from notifkit.services.events import EventsService
from simulators import SimulatorServer

from .pipeline import EMAIL, RESEND_WEBHOOK_SECRET, add_template, add_user, drain, simulated_resend

BOUNCING = "bounced@resend.dev"  # the simulator bounces mail to it, as Resend's test inbox does


async def test_a_simulated_hard_bounce_suppresses_the_address_for_the_next_send(
    settings: Settings, db: asyncpg.Pool, project_id: str, sim: SimulatorServer,
) -> None:
    s = simulated_resend(settings, sim.base_url)
    await add_user(db, project_id, "u1", contacts=[("email", BOUNCING)])
    await add_template(db, project_id, "code", {"email": EMAIL})
    api = ApiService(s)
    await api.start()
    pipeline = [EnricherService(s), EngineService(s), DeliveryService(s), EventsService(s)]
    headers = {"Authorization": f"Bearer {s.admin_key}", "x-project-id": project_id}
    try:
        await sim.set_receipts(f"{api.base_url}/v1/webhooks/resend/{project_id}",
                               RESEND_WEBHOOK_SECRET)
        async with aiohttp.ClientSession(api.base_url, headers=headers) as http:

            async def notify() -> str:
                async with http.post("/v1/notifications",
                                     json={"to": "u1", "template": "code",
                                           "data": {"code": "1"}}) as reply:
                    assert reply.status == 202, await reply.text()
                    event_id: str = (await reply.json())["id"]
                    return event_id

            async def recipient(event_id: str) -> dict[str, Any]:
                async with http.get(f"/v1/notifications/{event_id}") as reply:
                    assert reply.status == 200, await reply.text()
                    [email] = [r for r in (await reply.json())["recipients"]
                               if r["channel"] == "email"]
                    return cast(dict[str, Any], email)

            # Given a first send that the provider accepted and then bounced, hard
            first = await notify()
            await drain(*pipeline)
            await sim.drain_receipts()
            await drain(*pipeline)
            # When the next notification goes to the same user
            second = await notify()
            await drain(*pipeline)

            # Then the first recipient's timeline shows the bounce and the address is
            # suppressed ...
            bounced = await recipient(first)
            assert [t["kind"] for t in bounced["timeline"]] == ["queued", "sent", "bounced"]
            assert bounced["status"] == "failed"
            row = await db.fetchrow("SELECT channel, target, reason FROM suppressions "
                                    "WHERE project_id = $1", project_id)
            assert dict(row) == {"channel": "email", "target": BOUNCING, "reason": "bounce"}
            # ... and the second send never reached the provider, with the reason recorded
            skipped = await recipient(second)
            assert skipped["status"] == "suppressed"
            [decision] = skipped["timeline"]
            assert decision["kind"] == "suppressed"
            assert "suppressed" in decision["detail"]
    finally:
        for service in pipeline:
            await service.close()
        await api.stop()
    assert len(await sim.messages("resend")) == 1
