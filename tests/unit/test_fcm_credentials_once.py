"""FCM_CREDENTIALS_FILE is read, parsed and its key made to sign once per process start,
however often the settings are validated or copied on the way to the FCM transport, and a
file that cannot serve is still refused at start naming the setting."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from notifkit.config import ConfigError, Settings
from notifkit.server import NotifkitServer
from notifkit.transports.fcm import FcmTransport, ServiceAccount
from notifkit.transports.registry import build_transports
from tests.support.service_account import CLIENT_EMAIL, write_service_account


@pytest.fixture
def credentials(tmp_path: Path) -> Path:
    path = tmp_path / "service-account.json"
    write_service_account(path, "http://127.0.0.1:9/token")
    return path


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths ServiceAccount.load is asked to read, in order."""
    seen: list[str] = []
    load = ServiceAccount.load.__func__  # type: ignore[attr-defined]

    def counting(cls: type[ServiceAccount], path: str) -> ServiceAccount:
        seen.append(path)
        return load(cls, path)  # type: ignore[no-any-return]

    monkeypatch.setattr(ServiceAccount, "load", classmethod(counting))
    return seen


@pytest.mark.parametrize("env", [{}, {"NOTIFKIT_SIMULATOR_URL": "http://127.0.0.1:8025"}],
                         ids=["providers", "with-simulators"])
def test_the_file_is_loaded_once_from_settings_to_transport(
    credentials: Path, loads: list[str], env: dict[str, str]
) -> None:
    settings = Settings.from_env({**env, "FCM_PROJECT_ID": "p1",
                                  "FCM_CREDENTIALS_FILE": str(credentials)})
    server = NotifkitServer(settings=settings, services=["delivery"], worker_concurrency=4)
    transport = build_transports(server.settings)["push"]

    assert loads == [str(credentials)]
    assert isinstance(transport, FcmTransport)
    assert transport._account is settings.push.account
    assert transport._account is not None
    assert transport._account.client_email == CLIENT_EMAIL


def test_an_unusable_file_is_still_refused_naming_the_setting(
    credentials: Path, tmp_path: Path
) -> None:
    missing = tmp_path / "missing.json"
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"FCM_PROJECT_ID": "p1", "FCM_CREDENTIALS_FILE": str(missing)})
    assert refused.value.variable == "FCM_CREDENTIALS_FILE"
    # A copy of good settings given another file reads that one, and refuses it.
    good = Settings.from_env({"FCM_PROJECT_ID": "p1", "FCM_CREDENTIALS_FILE": str(credentials)})
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ConfigError) as refused:
        good.replace(push=dataclasses.replace(good.push, credentials_file=str(broken)))
    assert refused.value.variable == "FCM_CREDENTIALS_FILE"
    assert "not a JSON service-account file" in str(refused.value)


def test_a_transport_built_in_code_from_a_file_still_reads_it(
    credentials: Path, loads: list[str]
) -> None:
    options: dict[str, Any] = {"project_id": "p1", "credentials_file": str(credentials)}
    transport = FcmTransport(**options)
    assert loads == [str(credentials)]
    assert transport._account is not None
