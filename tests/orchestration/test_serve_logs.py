"""The log app under the service (gateway + live queries + follow-ups, in this process): the daily
summaries follow the log days sent over TCP with nothing run by hand, and a day without a marker is
closed by the clock once its grace is over (the summary's automation sensor, asked by serve's
follow-ups). Real sockets, real Spark, real Dagster runs."""

from __future__ import annotations

import datetime as dt
import itertools
import socket
import time

import pytest

from examples.logs import SUMMARY_TABLE, day_end_utc
from orchestration.service import Service
from tests.transforms.test_logs_app import LOG_FILES, expected_summary, log_messages, summary_rows
from transforms import lake
from transforms.ingestion.framing import DEFAULT_FRAMING
from transforms.ingestion.gateway import GatewayThread
from transforms.settings import Settings, reset_settings


@pytest.fixture
def logs_home(spark, tmp_path, monkeypatch):
    monkeypatch.setenv("EVENTIDE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("EVENTIDE_APPS", "examples.logs:app")
    monkeypatch.setenv("DAGSTER_HOME", "")  # dagster_instance points it into the home
    monkeypatch.setenv("EVENTIDE_UPKEEP_MINUTES", "0.05")  # a lake upkeep round every 3 s
    # A free port, not the app's 7101: a test in the other pytest worker may hold that one.
    monkeypatch.setenv("EVENTIDE_PORTS", "logs=0")
    reset_settings()
    yield Settings.from_env()
    reset_settings()


def _send(port: int, messages: list[bytes]) -> None:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"".join(DEFAULT_FRAMING.encode(m) for m in messages))
        s.shutdown(socket.SHUT_WR)
        s.recv(1)  # closed by the gateway once all is landed


def _summary(settings) -> list:
    path = settings.table_path(SUMMARY_TABLE)
    return summary_rows([lake.read(path)]) if lake.exists(path) else []


def _wait_for(what, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not what():
        time.sleep(0.5)
    return what()


@pytest.mark.spark
def test_summaries_follow_the_log_days_sent_to_the_service(logs_home):
    import gc

    lines = []
    gc.unfreeze()  # what this worker froze before: the service's own freeze is asserted below
    with GatewayThread(logs_home) as gw:
        service = Service(logs_home, say=lines.append, schedule_every=2.0).start()
        try:
            assert service.all_running.wait(120), lines
            assert _wait_for(lambda: gc.get_freeze_count() > 0, 10)  # its start, out of the collector's way
            _send(gw.gateway.bound_ports["logs"], log_messages())
            assert _wait_for(lambda: _summary(logs_home) == expected_summary(), 120), (_summary(logs_home), lines)
            bronze = logs_home.table_path("bronze_log_lines")
            assert _wait_for(lambda: lake.count(bronze) == len(log_messages()), 60)
            rounds = service.upkept
            assert _wait_for(lambda: service.upkept >= rounds + 3, 120), lines  # two whole rounds after the write
        finally:
            service.stop()
    assert service.error is None
    # The upkeep rounds after bronze's last write left it alone but once: serve's memory of an upkeep is
    # the table's own history (its latest commit ended one), so an idle table costs no job and no commit.
    after_write = _commits_since_last_write(bronze)
    assert after_write.count("VACUUM END") == 1, after_write
    assert any(line.startswith("daily_return_code_summary[") and "(asked by daily_summary_automation): done" in line
               for line in lines), lines
    # Dagster saw the tables change while it ran: runless materializations with latency metadata.
    from orchestration.runner import dagster_instance

    event = dagster_instance(logs_home).get_latest_materialization_event(_key("log_windows"))
    meta = event.asset_materialization.metadata
    assert meta["source"].value == "eventide serve" and meta["rows_added"].value > 0
    assert meta["latency_p99_seconds"].value >= meta["latency_p50_seconds"].value > 0


UPKEEP_OPERATIONS = ("OPTIMIZE", "VACUUM START", "VACUUM END")


def _commits_since_last_write(path) -> list[str]:
    """The operations of the table's commits after its last one that is not the upkeep's, oldest first."""
    from deltalake import DeltaTable

    operations = [h["operation"] for h in DeltaTable(str(path)).history()]  # newest first
    return list(reversed(list(itertools.takewhile(lambda op: op in UPKEEP_OPERATIONS, operations))))


def _key(name: str):
    import dagster as dg

    return dg.AssetKey(name)


@pytest.mark.spark
def test_a_day_without_a_marker_is_closed_by_the_clock(logs_home, monkeypatch):
    day_1 = log_messages(LOG_FILES[:1], markers=False)
    (day,) = {r[0] for r in expected_summary() if r[0] == expected_summary()[0][0]}
    # Dagster's evaluation of the summary's automation condition runs at the real time: the grace moves
    # the day's end past it instead of a fake clock (the condition reads the grace at each evaluation).
    now = dt.datetime.now(dt.timezone.utc)
    hours_to_now = (now - day_end_utc(dt.date.fromisoformat(day))) / dt.timedelta(hours=1)
    monkeypatch.setenv("EVENTIDE_DAY_GRACE_HOURS", str(hours_to_now + 24))  # over in a day: not yet
    lines = []
    with GatewayThread(logs_home) as gw:
        service = Service(logs_home, say=lines.append, schedule_every=1.0).start()
        try:
            assert service.all_running.wait(120), lines
            _send(gw.gateway.bound_ports["logs"], day_1)
            bronze = logs_home.table_path(logs_home.registry.stream("logs").bronze_table)
            assert _wait_for(lambda: lake.exists(bronze) and lake.count(bronze) == len(day_1), 60)
            time.sleep(3)  # the automation sensor is asked (every second) and finds nothing over
            assert _summary(logs_home) == []
            monkeypatch.setenv("EVENTIDE_DAY_GRACE_HOURS", str(hours_to_now - 24))  # over a day ago
            want = [r for r in expected_summary() if r[0] == day]
            assert _wait_for(lambda: _summary(logs_home) == want, 60), (_summary(logs_home), lines)
        finally:
            service.stop()
    assert any(line.startswith(f"daily_return_code_summary[{day}] (asked by daily_summary_automation): done")
               for line in lines), lines
