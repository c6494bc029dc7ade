"""The order in which the test fixtures look for Redis and PostgreSQL.

Given fake probes, ``select`` must try the explicit URL, then testcontainers, then the local
default port, then the embedded hook, and stop at the first that works; ``require`` turns a
missing service into a skip outside CI and a failure in CI.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tests.support.services import (
    POSTGRES,
    REDIS,
    Probes,
    Service,
    ServiceUnavailable,
    Started,
    is_ci,
    redact,
    require,
    select,
)


@dataclass
class FakeWorld:
    docker: bool = False
    container_fails: bool = False
    answering: set[str] = field(default_factory=set)
    embedded: bool = False
    calls: list[str] = field(default_factory=list)

    def probes(self) -> Probes:
        def docker_available() -> bool:
            self.calls.append("docker")
            return self.docker

        def start_container(service: Service) -> Started:
            self.calls.append(f"container:{service.kind}")
            if self.container_fails:
                raise RuntimeError("image pull failed")
            return Started(f"{service.kind}://container", "testcontainers", lambda: None)

        def answers(service: Service, url: str) -> bool:
            self.calls.append(f"answers:{url}")
            return url in self.answering

        def start_embedded(service: Service) -> Started | None:
            self.calls.append(f"embedded:{service.kind}")
            if not self.embedded:
                return None
            return Started(f"{service.kind}://embedded", "embedded")

        return Probes(docker_available, start_container, answers, start_embedded)


@pytest.mark.parametrize("service", [REDIS, POSTGRES], ids=lambda s: s.kind)
def test_explicit_url_wins_and_nothing_else_is_probed(service: Service) -> None:
    world = FakeWorld(docker=True, answering={"x://given", service.local_url})
    selection = select(service, {service.env_var: "x://given"}, world.probes())
    assert selection.started is not None
    assert (selection.started.url, selection.started.source) == ("x://given", "env")
    assert world.calls == ["answers:x://given"]


def test_explicit_url_that_does_not_answer_is_fatal_even_outside_ci() -> None:
    world = FakeWorld(docker=True, answering={REDIS.local_url})
    env = {REDIS.env_var: "redis://:secret@nowhere:1/0"}
    selection = select(REDIS, env, world.probes())
    with pytest.raises(ServiceUnavailable) as caught:
        require(selection, env)
    assert caught.value.fatal
    assert REDIS.env_var in str(caught.value)
    assert "secret" not in str(caught.value)
    assert "container:redis" not in world.calls  # no silent fallback from an explicit choice


def test_testcontainers_come_before_the_local_port() -> None:
    world = FakeWorld(docker=True, answering={POSTGRES.local_url})
    selection = select(POSTGRES, {}, world.probes())
    assert selection.started is not None
    assert selection.started.source == "testcontainers"
    assert world.calls == ["docker", "container:postgres"]


def test_local_port_is_used_without_a_docker_engine() -> None:
    world = FakeWorld(docker=False, answering={REDIS.local_url})
    selection = select(REDIS, {}, world.probes())
    assert selection.started is not None
    assert (selection.started.url, selection.started.source) == (REDIS.local_url, "local")
    assert "embedded:redis" not in world.calls


def test_a_failing_container_falls_through_to_the_local_port() -> None:
    world = FakeWorld(docker=True, container_fails=True, answering={REDIS.local_url})
    selection = select(REDIS, {}, world.probes())
    assert selection.started is not None
    assert selection.started.source == "local"
    assert any("image pull failed" in note for note in selection.tried)


def test_embedded_server_is_the_last_resort() -> None:
    world = FakeWorld(docker=False, embedded=True)
    selection = select(POSTGRES, {}, world.probes())
    assert selection.started is not None
    assert selection.started.source == "embedded"
    assert world.calls == ["docker", f"answers:{POSTGRES.local_url}", "embedded:postgres"]


def test_missing_service_is_skipped_outside_ci_with_instructions() -> None:
    selection = select(REDIS, {}, FakeWorld().probes())
    with pytest.raises(ServiceUnavailable) as caught:
        require(selection, {})
    assert not caught.value.fatal
    message = str(caught.value)
    assert REDIS.env_var in message
    assert REDIS.local_url in message
    assert "Docker" in message


@pytest.mark.parametrize("value", ["true", "1", "yes", "TRUE"])
def test_missing_service_fails_the_run_in_ci(value: str) -> None:
    env = {"CI": value}
    selection = select(POSTGRES, env, FakeWorld().probes())
    with pytest.raises(ServiceUnavailable) as caught:
        require(selection, env)
    assert caught.value.fatal
    assert "CI" in str(caught.value)


@pytest.mark.parametrize(("value", "expected"), [("", False), ("0", False), ("false", False),
                                                 ("true", True), ("github", True)])
def test_ci_detection(value: str, expected: bool) -> None:
    assert is_ci({"CI": value}) is expected
    assert is_ci({}) is False


def test_redact_hides_only_the_password() -> None:
    assert redact("postgresql://u:pw@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert redact("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
