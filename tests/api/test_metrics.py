"""/metrics shows the counters of every process, not only of the api's own."""

from __future__ import annotations

import asyncio
import sys
import textwrap

from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from notifkit import metrics, metrics_store
from notifkit.keys import Keys
from tests.api.conftest import Api


def _value(text: str, sample: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


async def _run_delivery_process(redis_url: str, namespace: str) -> None:
    """Another OS process, as a ``--services delivery`` one: it counts and flushes."""
    script = textwrap.dedent(f"""
        import asyncio
        from redis.asyncio import Redis
        from notifkit import metrics, metrics_store
        from notifkit.keys import Keys

        async def main():
            metrics.DELIVERIES.labels("sms", "twilio-elsewhere", "sent").inc(3)
            metrics.DEAD_LETTERED.labels("delivery", "s-elsewhere", "sms").inc()
            metrics.PROVIDER_LATENCY.labels("sms", "twilio-elsewhere").observe(0.2)
            redis = Redis.from_url({redis_url!r})
            await metrics_store.flush(redis, Keys({namespace!r}))
            await redis.aclose()

        asyncio.run(main())
    """)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", script)
    assert await proc.wait() == 0


async def test_metrics_include_counts_of_processes_without_the_api(api: Api) -> None:
    await _run_delivery_process(api.settings.redis_url, api.settings.namespace)
    metrics.DELIVERIES.labels("sms", "twilio-elsewhere", "sent").inc()  # this process: 1 more

    body = (await api.call("GET", "/metrics")).body
    assert _value(body, "notifkit_deliveries_total", channel="sms",
                  provider="twilio-elsewhere", outcome="sent") == 4.0
    assert _value(body, "notifkit_dead_lettered_total", service="delivery",
                  stream="s-elsewhere", channel="sms") == 1.0
    labels = {"channel": "sms", "provider": "twilio-elsewhere"}
    assert _value(body, "notifkit_provider_latency_seconds_count", **labels) == 1.0
    assert _value(body, "notifkit_provider_latency_seconds_bucket", le="0.1", **labels) == 0.0
    assert _value(body, "notifkit_provider_latency_seconds_bucket", le="0.25", **labels) == 1.0
    # Scraping again adds nothing twice.
    again = (await api.call("GET", "/metrics")).body
    assert _value(again, "notifkit_deliveries_total", channel="sms",
                  provider="twilio-elsewhere", outcome="sent") == 4.0


async def test_a_refused_flush_is_counted_by_the_next(redis: Redis, namespace: str) -> None:
    keys = Keys(namespace)
    await metrics_store.flush(redis, keys)  # whatever earlier tests counted
    metrics.RECLAIMED.labels("delivery", "s-refused").inc(2)
    broken = Redis.from_url("redis://127.0.0.1:1/0")
    try:
        await metrics_store.flush(broken, keys)
    except Exception:
        pass
    else:
        raise AssertionError("a flush to an unreachable Redis should fail")
    finally:
        await broken.aclose()
    await metrics_store.flush(redis, keys)
    totals = await metrics_store.read_totals(redis, keys)
    wanted = ("notifkit_reclaimed", "notifkit_reclaimed_total",
              (("service", "delivery"), ("stream", "s-refused")))
    assert totals[wanted] == 2.0
