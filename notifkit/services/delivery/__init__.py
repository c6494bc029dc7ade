"""The delivery service: transports, outbox, rate limits and failure classes
(see :mod:`.service` and :mod:`.outcomes`)."""

from __future__ import annotations

from notifkit.services.delivery.service import DeliveryService

__all__ = ["DeliveryService"]
