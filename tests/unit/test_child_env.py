"""Processes the scenarios and benchmarks start get their own settings, never the shell's."""

from __future__ import annotations

import re
from pathlib import Path

from notifkit import config
from notifkit.config import VARIABLES, Settings
from scenarios.processes import child_env


def test_every_variable_settings_reads_is_listed() -> None:
    source = Path(config.__file__).read_text()
    read = set(re.findall(r'env(?:, |\.get\()"([A-Z][A-Z0-9_]+)"', source))
    assert read, "the pattern no longer finds how config.py reads the environment"
    assert read == VARIABLES


def test_a_child_inherits_no_notifkit_setting_but_takes_what_it_is_given() -> None:
    shell = {"PATH": "/usr/bin", "HOME": "/root", "NOTIFKIT_SIMULATOR_URL": "http://elsewhere:1",
             "RESEND_BASE_URL": "http://elsewhere:2", "LOG_LEVEL": "DEBUG",
             "REDIS_URL": "redis://elsewhere:6379/0"}
    env = child_env(shell, REDIS_URL="redis://127.0.0.1:6379/3", DB_SCHEMA="run_1")
    assert (env["PATH"], env["HOME"]) == ("/usr/bin", "/root")
    assert (env["REDIS_URL"], env["DB_SCHEMA"]) == ("redis://127.0.0.1:6379/3", "run_1")
    assert not {"NOTIFKIT_SIMULATOR_URL", "RESEND_BASE_URL", "LOG_LEVEL"} & set(env)
    # What the child builds from it holds nothing from the shell.
    assert "elsewhere" not in repr(Settings.from_env(env))
