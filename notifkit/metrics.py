"""Prometheus metrics shared by every service in a process (exposed by the api at /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# ``channel`` is the entry's channel (email, sms, ...) where it has one, else "".
PROCESSED = Counter(
    "notifkit_processed_total", "Stream entries processed and acked.",
    ["service", "stream", "channel"],
)
FAILED = Counter(
    "notifkit_failed_total", "Failed processing attempts (left pending for reclaim).",
    ["service", "stream", "channel"],
)
DEAD_LETTERED = Counter(
    "notifkit_dead_lettered_total", "Entries moved to the DLQ.",
    ["service", "stream", "channel"],
)
MALFORMED = Counter(
    "notifkit_malformed_total", "Unparseable entries acked at once.", ["service", "stream"]
)
RECLAIMED = Counter(
    "notifkit_reclaimed_total", "Entries taken over by the reclaim sweep.", ["service", "stream"]
)
DELIVERIES = Counter(
    "notifkit_deliveries_total", "Provider send outcomes.", ["channel", "provider", "outcome"]
)
PROVIDER_LATENCY = Histogram(
    "notifkit_provider_latency_seconds", "Time a provider took to answer a send.",
    ["channel", "provider"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)

# Computed when /metrics is scraped (the api reads XLEN / XINFO GROUPS / XPENDING then).
STREAM_LENGTH = Gauge("notifkit_stream_length", "Entries in a stream.", ["stream"])
STREAM_DEPTH = Gauge(
    "notifkit_stream_depth",
    "Entries of a stream not yet finished: unread by its group plus pending (acked entries stay "
    "in the stream until trimmed, so its length is not its backlog; the DLQ's depth is its "
    "length).", ["stream"],
)
STREAM_PENDING = Gauge(
    "notifkit_stream_pending", "Entries delivered to a group but not yet acked.",
    ["stream", "group"],
)
STREAM_OLDEST_PENDING_AGE = Gauge(
    "notifkit_stream_oldest_pending_age_seconds",
    "Age of a group's oldest unacked entry (0 when none).", ["stream", "group"],
)
