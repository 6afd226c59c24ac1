"""Shared fixtures: one Spark session for the whole run (a session costs ~5 s), a fresh
EVENTIDE_HOME per test, and helpers to land messages."""

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("JAVA_HOME", "/usr/lib/jvm/java-17-openjdk-amd64")
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from transforms.ingestion.landing import Lander  # noqa: E402
from transforms.settings import Settings, reset_settings  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data" / "wallaroo"


@pytest.fixture
def settings(tmp_path, monkeypatch) -> Settings:
    """Settings rooted in a fresh tmp folder; the environment agrees (Dagster resources read it)."""
    monkeypatch.setenv("EVENTIDE_HOME", str(tmp_path / "home"))
    reset_settings()
    yield Settings.from_env()
    reset_settings()


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from transforms.spark import get_spark, stop_spark

    session = get_spark(Settings(home=tmp_path_factory.mktemp("spark"), spark_master="local[2]"))
    yield session
    stop_spark()


def land(settings: Settings, stream: str, payloads, connection: str = "test") -> None:
    """Land payloads as the gateway would, and close the segment."""
    with Lander(settings) as lander:
        for p in payloads:
            lander.append(stream, p, connection)
