"""PostgreSQL: pools (:mod:`notifkit.db.pool`), versioned migrations (:mod:`notifkit.db.migrate`).

The data model itself is documented in ``migrations/0001_initial.sql``.
"""

from __future__ import annotations

from notifkit.db.migrate import MigrationError, migrate
from notifkit.db.pool import connect, create_pool

__all__ = ["MigrationError", "connect", "create_pool", "migrate"]
