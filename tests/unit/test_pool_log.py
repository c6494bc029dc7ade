"""asyncpg's own warnings while PostgreSQL is unreachable: one line each, naming the setting."""

from __future__ import annotations

import logging

import pytest

from notifkit.config import Settings
from notifkit.db.pool import DatabaseUnavailable, PoolFloorFilter, create_pool


async def test_a_failed_pool_refill_is_one_line_naming_database_url(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a pool created while PostgreSQL is unreachable (the filter is installed first)
    settings = Settings(database_url="postgresql://postgres@127.0.0.1:1/notifkit_pool_log")
    with pytest.raises(DatabaseUnavailable):
        await create_pool(settings)
    assert any(isinstance(f, PoolFloorFilter) for f in logging.getLogger("asyncpg.pool").filters)

    # When asyncpg reports a failed try to refill a pool, as it does after an outage
    caplog.set_level(logging.WARNING, logger="asyncpg.pool")
    try:
        raise ConnectionError("unexpected connection_lost() call")
    except ConnectionError:
        logging.getLogger("asyncpg.pool").warning(
            "Failed to restore the pool connection floor; retrying", exc_info=True)

    # Then the record is one line that names the setting and the cause, without a traceback
    [record] = [r for r in caplog.records if r.name == "asyncpg.pool"]
    assert record.levelno == logging.WARNING
    assert record.exc_info is None
    message = record.getMessage()
    assert "DATABASE_URL" in message
    assert "ConnectionError: unexpected connection_lost() call" in message
    assert "\n" not in message


def test_other_asyncpg_pool_records_pass_unchanged() -> None:
    record = logging.makeLogRecord({"name": "asyncpg.pool", "msg": "something else",
                                    "levelno": logging.WARNING})
    assert PoolFloorFilter().filter(record)
    assert record.getMessage() == "something else"
