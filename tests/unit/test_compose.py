"""compose.yaml stays consistent with the configuration: every variable it sets is one
notifkit reads, documented in the README, and the whole environment is valid settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from notifkit.config import Settings, parse_services

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
    return data


def notifkit_services() -> dict[str, dict[str, Any]]:
    return {name: spec for name, spec in compose()["services"].items()
            if spec.get("command", [None])[0] == "serve"}


def test_every_variable_compose_sets_is_documented_and_valid() -> None:
    readme = (ROOT / "README.md").read_text()
    services = notifkit_services()
    assert set(services) == {"api", "pipeline", "delivery"}
    for name, spec in services.items():
        env = {k: str(v).split(":-", 1)[-1].rstrip("}") if str(v).startswith("${") else str(v)
               for k, v in spec["environment"].items()}
        for variable in env:
            assert f"`{variable}`" in readme, f"{name} sets {variable}, not in the README"
        Settings.from_env(env)  # raises ConfigError naming any invalid variable


def test_the_roles_cover_every_service_once_and_only_the_api_migrates() -> None:
    covered: list[str] = []
    for name, spec in notifkit_services().items():
        covered += parse_services(spec["command"][2])
        migrates = spec["environment"]["AUTO_MIGRATE"] == "true"
        assert migrates == (name == "api")
    assert sorted(covered) == sorted(Settings().services)


def test_the_readme_names_the_admin_key_compose_falls_back_to() -> None:
    """compose seeds no demo, so its admin key is how a newcomer makes a first project."""
    value = str(compose()["services"]["api"]["environment"]["NOTIFKIT_ADMIN_KEY"])
    placeholder = value.split(":-", 1)[-1].rstrip("}")
    assert value.startswith("${NOTIFKIT_ADMIN_KEY:-")
    assert f"`{placeholder}`" in (ROOT / "README.md").read_text()


def test_the_image_can_sign_with_an_fcm_credentials_file() -> None:
    """FCM_CREDENTIALS_FILE signs with the `fcm` extra's cryptography: an image built without
    it refused every start that set the variable, the usual way to give FCM credentials."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    [install] = [line for line in dockerfile.splitlines() if "pip install" in line]
    extras = install.split("'.[", 1)[1].split("]'", 1)[0].split(",")
    assert "fcm" in extras, install


def test_the_roles_that_do_not_migrate_start_once_the_api_has() -> None:
    """pipeline and delivery run with AUTO_MIGRATE=false and stop at start on a schema that
    lacks a migration: started beside the api ("service_started"), a first `docker compose up`
    had each fail with a DB_SCHEMA error line and restart until the api had migrated. The api
    listens only once migrated, so its /health answering is the mark to wait for."""
    services = compose()["services"]
    check = services["api"]["healthcheck"]["test"]
    assert check[0] == "CMD"
    assert "http://127.0.0.1:8080/health" in " ".join(check)
    for name, spec in notifkit_services().items():
        if name != "api":
            assert spec["depends_on"]["api"] == {"condition": "service_healthy"}, name
