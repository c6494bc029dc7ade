"""Workflows: definitions of steps run per user, durable in PostgreSQL, serialised per instance.

    service.py   consumes workflow:inbound (triggers, events, wakes) and polls the timers
    runner.py    executes one instance's steps while holding its lock
    lock.py      lock:workflow:{instanceId} (SET NX PX, renewed, compare-and-delete)
    timers.py    notif:workflow:timers and the Lua script that moves due wakes to the stream

Definitions, validation and step paths live in :mod:`notifkit.workflow_defs`; queries in
:mod:`notifkit.db.workflows`.
"""

from notifkit.services.workflow.service import WorkflowService

__all__ = ["WorkflowService"]
