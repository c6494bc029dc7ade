"""Transports: how one message reaches one destination on one channel.

:mod:`.base` holds the :class:`~notifkit.transports.base.Transport` protocol and how provider
answers are classified; :mod:`.registry` builds the configured transports from Settings.
"""

from __future__ import annotations

from notifkit.transports.base import Message, Outcome, SendResult, Transport, TransportContext

__all__ = ["Message", "Outcome", "SendResult", "Transport", "TransportContext"]
