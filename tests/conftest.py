"""Shared fixtures: one Spark session for the whole run (a session costs ~5 s), a fresh
EVENTIDE_HOME per test, and helpers to land messages."""

import os
import sys
import time
from pathlib import Path

import pytest

os.environ.setdefault("JAVA_HOME", "/usr/lib/jvm/java-17-openjdk-amd64")
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
# The tests' JVMs live seconds to minutes: C1 only spends less CPU compiling (12% less CPU measured for
# test_lake.py; the suite is CPU-bound on two cores), and the serial collector less than G1's threads
# (JVM CPU of test_failure_isolation.py + test_new.py: 66.0 s against 68.4 and 70.0). Every run and
# serve the tests start inherits it.
os.environ.setdefault("EVENTIDE_SPARK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
# Spark's code generation off: the tests' queries are small, and compiling each plan's Java (Janino) cost
# more than it saved (CPU of test_failure_isolation + test_logs_app + test_new: 168-179 s against 191-199
# s). Production keeps it: at 1M lines it pays (`eventide run` 35.0/34.7 s with it, 39.8/40.3 s without).
# Adaptive execution off too: re-planning the tests' small queries at run time cost more than it saved (CPU
# of test_logs_app + test_engine + test_keyed_state, alternating: 166.2/169.7 s against 183.1/177.0 s;
# bench/README.md). Production keeps Spark's default (a 1M-line run measured the same either way).
os.environ.setdefault("EVENTIDE_SPARK_CONF", "spark.sql.codegen.wholeStage=false;spark.sql.codegen.factoryMode=NO_CODEGEN;"
                                             "spark.sql.adaptive.enabled=false")

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

    # This JVM lives as long as the worker (about 20 minutes) and runs hundreds of queries: C2 pays for it
    # here, unlike in the short JVMs above (four in-process files, two rounds, run two at a time as the
    # workers do: 324 and 329 s against 342 and 344 s with C1 only; G1 instead of serial: 340 s).
    session = get_spark(Settings(home=tmp_path_factory.mktemp("spark"), spark_master="local[2]",
                                spark_java_options="-XX:+UseSerialGC"))
    yield session
    stop_spark()


# What Eventide's own code sets in its process's environment: the CLI (`--app`, `--close-windows`, serve's
# JIT default) and `run_all` (the homes, for Dagster's resources).
LEFT_BY_THE_CLI = ("EVENTIDE_", "DAGSTER_HOME")


def _eventide_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(LEFT_BY_THE_CLI)}


@pytest.fixture(autouse=True)
def _environment_restored():
    """A test that calls the CLI or `run_all` in process leaves their variables in this worker's environment,
    and a later test's Settings() would read them (`--close-windows` left EVENTIDE_CLOSE_WINDOWS=1 for
    the next test on its worker): each test ends with Eventide's variables as it found them."""
    before = _eventide_environment()
    yield
    for key in _eventide_environment().keys() - before.keys():
        del os.environ[key]
    os.environ.update(before)


@pytest.fixture(autouse=True)
def _no_service_left_running():
    """A service a test started and did not stop (it failed first) is killed after it, with its JVM: else
    it would go on using a core through the rest of the suite."""
    from tests.services import Service

    yield
    while Service.live:
        Service.live.pop().kill_all()


def land(settings: Settings, stream: str, payloads, connection: str = "test") -> None:
    """Land payloads as the gateway would, and close the segment."""
    with Lander(settings) as lander:
        for p in payloads:
            lander.append(stream, p, connection)


def poll_until(queries, done, timeout: float) -> bool:
    """Poll live queries (transforms/engine/live.py), as `serve` does, until `done()` or the timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for q in queries:
            q.poll()
        if done():
            return True
        time.sleep(0.1)
    return False


# `make test` spreads the modules over two workers (pytest-xdist, --dist loadfile): the longest go
# first, so none of them starts last and runs alone at the end (from `--durations`, 2026-11-25).
LONGEST_FIRST = [
    "tests/assets/test_logs_automation.py",
    "tests/transforms/engine/test_multi_level.py",
    "tests/windows/test_levels.py",
    "tests/orchestration/test_serve_crash.py",
    "tests/windows/test_close_at_end.py",
    "tests/transforms/ingestion/test_kafka_acceptance.py",
    "tests/transforms/test_exactly_once.py",
    "tests/transforms/ingestion/test_kafka_sink.py",
    "tests/transforms/ingestion/test_kafka_sink_serve.py",
    "tests/orchestration/test_cluster.py",
    "tests/transforms/ingestion/test_kafka_faults.py",
    "tests/orchestration/test_run_again.py",
    "tests/orchestration/test_ui_browser.py",
    "tests/orchestration/test_demo.py",
    "tests/assets/test_logs_assets.py",
    "tests/orchestration/test_deadletter.py",
    "tests/orchestration/test_new.py",
    "tests/transforms/engine/test_keyed_state.py",
    "tests/transforms/test_lake.py",
    "tests/transforms/ingestion/test_kafka_source_cli.py",
    "tests/transforms/ingestion/test_kafka_source.py",
    "tests/orchestration/test_ui_backfill.py",
    # 45-72 s each in the 2026-11-29 suite, and not above: they went after the short files.
    "tests/orchestration/test_serve_ui.py",
    "tests/transforms/ingestion/test_kafka_log.py",
    "tests/orchestration/test_failure_isolation.py",
    "tests/transforms/test_own_session.py",
    "tests/orchestration/test_own_app.py",
    "tests/transforms/test_market_batch.py",
]


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
