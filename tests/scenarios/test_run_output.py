"""A run's table read by a reader that stops early (``python -m scenarios malformed | head``):
the run still ends by its invariants, with its results written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_a_table_nobody_reads_costs_neither_the_results_nor_the_status(
    redis_url: str, database_url: str, tmp_path: Path
) -> None:
    env = dict(os.environ, NOTIFKIT_TEST_REDIS_URL=redis_url,
               NOTIFKIT_TEST_DATABASE_URL=database_url)
    results = tmp_path / "results.json"
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the table is printed
    try:
        run = subprocess.run(
            [sys.executable, "-m", "scenarios", "run", "malformed", "--json", str(results)],
            env=env, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=240,
            check=False)
    finally:
        os.close(write_end)
    # It ended in a BrokenPipeError traceback, status 1, before writing the results.
    assert "Traceback" not in run.stderr, run.stderr
    assert run.returncode == 0, run.stderr
    [result] = json.loads(results.read_text())
    assert (result["name"], result["ok"]) == ("malformed", True)
