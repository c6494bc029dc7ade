"""The benchmark's report and its Celery baseline's broker address."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from benchmarks.baselines import celery_broker_url
from benchmarks.report import paced_cores


def test_paced_load_cpu_names_every_process_and_the_busy_share() -> None:
    figures = {"cores_used": {"api": 0.2, "pipeline": 0.414, "postgres": 0.48},
               "machine_cpu_busy": 0.873}
    assert paced_cores(figures) == "api 0.20, pipeline 0.41, postgres 0.48 (87%)"


def test_a_run_recorded_before_paced_cpu_was_measured_reads_as_a_dash() -> None:
    assert paced_cores({"p50_ms": 12.0}) == "–"
    assert paced_cores({"cores_used": {"api": 0.1}, "machine_cpu_busy": None}) == "api 0.10"


def test_a_tcp_redis_url_reaches_celery_unchanged() -> None:
    for url in ("redis://127.0.0.1:6379/0", "rediss://user:pw@cache.example:6380/3"):
        assert celery_broker_url(url) == url


def test_a_unix_socket_becomes_kombus_socket_url_with_its_database() -> None:
    url = celery_broker_url("unix:///run/redis/redis.sock?db=5&socket_timeout=3")
    parts = urlsplit(url)
    assert (parts.scheme, parts.netloc, parts.path) == ("redis+socket", "", "/run/redis/redis.sock")
    assert parse_qs(parts.query) == {"virtual_host": ["5"], "socket_timeout": ["3"]}
    assert "virtual_host=0" in celery_broker_url("unix:///tmp/r.sock")
