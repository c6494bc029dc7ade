"""The settings ``python -m notifkit dev`` runs with: its own defaults for what the environment
leaves unset, where a variable set to nothing (or blanks) counts as unset, as everywhere else."""

from __future__ import annotations

import socket

import pytest

from notifkit.__main__ import intended_log_format
from notifkit.config import ConfigError, Settings
from notifkit.dev import dev_environment, dev_host, refuse_ports_in_use

UNSET = ["", "  "]


def merged(environ: dict[str, str]) -> Settings:
    return Settings.from_env(dev_environment(
        environ, port=9080, host=dev_host(environ), redis_url="redis://127.0.0.1:6380/0",
        database_url="postgresql://postgres@127.0.0.1:5433/dev",
        simulator_url="http://127.0.0.1:8025"))


def test_unset_variables_get_the_dev_defaults() -> None:
    settings = merged({})
    assert settings.host == "127.0.0.1"
    assert (settings.reclaim_interval_s, settings.reclaim_min_idle_s) == (5, 5)
    assert settings.webhook_allow_private_networks is True
    assert settings.public_url == "http://127.0.0.1:9080"
    assert settings.simulator_url == "http://127.0.0.1:8025"


@pytest.mark.parametrize("blank", UNSET)
def test_a_variable_set_to_nothing_is_unset_for_dev_too(blank: str) -> None:
    # HOST= listened on every interface (0.0.0.0, the serve default) with the admin key in a
    # file; the others fell back to serve's defaults (a minute's reclaim, no private webhooks).
    settings = merged({name: blank for name in (
        "HOST", "RECLAIM_INTERVAL_SECONDS", "RECLAIM_MIN_IDLE_SECONDS",
        "WEBHOOK_ALLOW_PRIVATE_NETWORKS", "NOTIFKIT_PUBLIC_URL", "NOTIFKIT_SIMULATOR_URL")})
    assert settings.host == "127.0.0.1"
    assert (settings.reclaim_interval_s, settings.reclaim_min_idle_s) == (5, 5)
    assert settings.webhook_allow_private_networks is True
    assert settings.public_url == "http://127.0.0.1:9080"
    assert settings.simulator_url == "http://127.0.0.1:8025"


def test_variables_that_are_set_win_over_the_dev_defaults() -> None:
    settings = merged({"HOST": "0.0.0.0", "RECLAIM_INTERVAL_SECONDS": "2",
                       "WEBHOOK_ALLOW_PRIVATE_NETWORKS": "false",
                       "NOTIFKIT_PUBLIC_URL": "https://dev.example"})
    assert settings.host == "0.0.0.0"
    assert settings.reclaim_interval_s == 2
    assert settings.webhook_allow_private_networks is False
    assert settings.public_url == "https://dev.example"


@pytest.mark.parametrize("blank", UNSET)
def test_dev_logs_text_when_log_format_is_set_to_nothing(blank: str) -> None:
    assert intended_log_format("dev", {"LOG_FORMAT": blank}) == "text"
    assert intended_log_format("dev", {"LOG_FORMAT": "json"}) == "json"
    assert intended_log_format("serve", {"LOG_FORMAT": blank}) == "json"


@pytest.mark.parametrize(("host", "public_url"), [
    ("0.0.0.0", "http://127.0.0.1:9080"), ("::", "http://127.0.0.1:9080"),
    ("::1", "http://[::1]:9080"), ("localhost", "http://localhost:9080"),
    ("10.1.2.3", "http://10.1.2.3:9080"),
])
def test_links_point_where_the_api_listens(host: str, public_url: str) -> None:
    # HOST=::1 (or an address of one interface) put http://127.0.0.1:9080 in every unsubscribe
    # link, where nothing listened.
    assert merged({"HOST": host}).public_url == public_url


def test_a_port_in_use_is_refused_by_its_option_and_its_ipv6_twin_is_not() -> None:
    """The servers bind an IPv6 address alone (IPV6_V6ONLY): "::" beside another process's
    "0.0.0.0" on the same port binds, so the look before the start must not refuse it."""
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError) as refused:
            refuse_ports_in_use([("--port", "127.0.0.1", 0), ("--sim-port", "127.0.0.1", port)])
        assert refused.value.variable == "--sim-port"
        assert refused.value.problem == (
            f"cannot listen on 127.0.0.1:{port}: Address already in use")
        refuse_ports_in_use([("--port", "::", port)])
