"""The engine service: channel choice, rendering and routing (see :mod:`.service`)."""

from __future__ import annotations

from notifkit.services.engine.service import EngineService

__all__ = ["EngineService"]
