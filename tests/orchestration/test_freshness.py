"""Freshness: every bronze and app table carries Dagster's freshness policy (EVENTIDE_FRESHNESS_MINUTES,
or the sink's own), the daily summary its own; `eventide status` judges them with Dagster's evaluator
against the home's instance, and says what the freshness daemon of `eventide ui` records for the UI.

Dagster's freshness windows are at least a minute. Rather than wait one out, the test moves Dagster's
clock (dagster._time, what its evaluators and event log read) with Dagster's own test helper
`freeze_time`: the events, the instance, the evaluator and the daemon's iteration are the real ones."""

import datetime as dt
import json

import dagster as dg
import pytest
from dagster._core.definitions.freshness import FreshnessStateRecord
from dagster._core.test_utils import freeze_time
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import WorkspaceFileTarget
from dagster._daemon.freshness import FreshnessDaemon

from examples.logs import SUMMARY_TABLE
from orchestration.cli import main
from orchestration.definitions import build_definitions
from orchestration.runner import WORKSPACE_FILE
from orchestration.service import DagsterReporter
from orchestration.status import compute_status
from transforms import lake
from transforms.api import DeltaSink
from transforms.engine.sinks import BatchDone
from transforms.settings import ConfigError, Settings, reset_settings

pytestmark = pytest.mark.spark

QUIET_TABLE, BUSY_TABLE = "bronze_log_lines", "bronze_text"


def test_the_tables_fed_by_streams_and_the_summary_carry_freshness_policies(monkeypatch):
    monkeypatch.setenv("EVENTIDE_FRESHNESS_MINUTES", "30")
    graph = build_definitions(Settings().registry).resolve_asset_graph()
    policies = {n.key.to_user_string(): n.freshness_policy for n in graph.asset_nodes}
    fed_by_streams = ["bronze_log_lines", "bronze_market_data", "bronze_orders", "bronze_text",
                      "market_state", "word_count_updates", "word_totals"]
    for table in fed_by_streams:
        assert policies[table] == dg.FreshnessPolicy.time_window(fail_window=dt.timedelta(minutes=30),
                                                                 warn_window=dt.timedelta(minutes=15)), table
    # A sink's own freshness_minutes wins: log_windows closes about daily, order_rejections is quiet when healthy.
    assert policies["log_windows"].fail_window.to_timedelta() == dt.timedelta(hours=30)
    assert policies["order_rejections"] is None
    assert policies[SUMMARY_TABLE].fail_window.to_timedelta() == dt.timedelta(days=1, hours=7)  # grace 6 h + the hourly clock
    assert policies["quarantine"] is None and policies["landing_logs"] is None
    monkeypatch.setenv("EVENTIDE_FRESHNESS_MINUTES", "0")
    graph = build_definitions(Settings().registry).resolve_asset_graph()
    assert all(graph.get(dg.AssetKey(t)).freshness_policy is None for t in fed_by_streams)


def test_bad_freshness_windows_are_refused_with_what_to_do():
    with pytest.raises(ConfigError, match=r"EVENTIDE_FRESHNESS_MINUTES=0.5: must be 0 .* or at least 1"):
        Settings(freshness_minutes=0.5)
    with pytest.raises(ValueError, match=r"DeltaSink 't': freshness_minutes must be 0 .* got -1"):
        DeltaSink("t", freshness_minutes=-1)


def _report(reporter: DagsterReporter, *tables: str) -> None:
    """What `eventide serve` reports after batches that wrote rows into `tables`."""
    for i, table in enumerate(tables):
        reporter.on_batch(BatchDone(f"q_{table}", i, {table: 3}, [0.1], dt.datetime.now().timestamp(), False))
    assert reporter.flush(force=True) == len(tables)


def test_a_table_that_stopped_receiving_data_is_stale_in_status_and_for_the_daemon(spark, settings, monkeypatch, capsys):
    monkeypatch.setenv("EVENTIDE_FRESHNESS_MINUTES", "1")
    monkeypatch.setenv("DAGSTER_HOME", str(settings.dagster_home.absolute()))  # restored after the test
    reset_settings()
    settings = Settings.from_env()
    for table in (QUIET_TABLE, BUSY_TABLE, SUMMARY_TABLE):  # real Delta tables, so that status lists them
        lake.append_once(spark.createDataFrame([(1,)], "n int"), settings.table_path(table), "test", 0)

    start = dt.datetime.now(dt.timezone.utc)
    with freeze_time(start):
        reporter = DagsterReporter(settings)
        _report(reporter, QUIET_TABLE, BUSY_TABLE)
        fresh = {t.table: t.freshness for t in compute_status(settings).tables}
    assert fresh == {QUIET_TABLE: "PASS", BUSY_TABLE: "PASS", SUMMARY_TABLE: "UNKNOWN"}  # the summary: never materialized

    # What the UI shows comes from the freshness daemon: its iteration over the workspace as `eventide ui`
    # loads it (workspace.yaml: the code in a server process of its own, with this environment).
    with dg.DagsterInstance.get() as instance, \
            WorkspaceProcessContext(instance, WorkspaceFileTarget([str(WORKSPACE_FILE)])) as workspace:
        # 90 s later only bronze_text got data again: bronze_log_lines stopped receiving it, its window is 1 minute.
        later = start + dt.timedelta(seconds=90)
        with freeze_time(later):
            _report(reporter, BUSY_TABLE)
            tables = {t.table: t for t in compute_status(settings).tables}
            assert main(["status"]) == 0
            text = capsys.readouterr().out
            assert main(["status", "--format", "json"]) == 0
            doc = json.loads(capsys.readouterr().out)
            list(FreshnessDaemon().run_iteration(workspace))
            recorded = {t: FreshnessStateRecord.blocking_get(workspace.create_request_context(), dg.AssetKey(t))
                        for t in tables}

    assert {t: s.freshness for t, s in tables.items()} == {QUIET_TABLE: "FAIL", BUSY_TABLE: "PASS", SUMMARY_TABLE: "UNKNOWN"}
    assert {t: r.freshness_state.value for t, r in recorded.items()} == {t: s.freshness for t, s in tables.items()}
    assert tables[QUIET_TABLE].last_materialized == start.isoformat(timespec="milliseconds")
    assert tables[BUSY_TABLE].fail_after_seconds == 60.0 and tables[BUSY_TABLE].warn_after_seconds is None
    assert {t["table"]: t["freshness"] for t in doc["tables"]} == {t: s.freshness for t, s in tables.items()}
    table_rows = {line.split()[0]: line for line in text.split("\nTABLE ", 1)[1].splitlines()[1:] if line}
    assert table_rows[QUIET_TABLE].endswith("STALE (data 1.5 min ago; stale after 1.0 min)"), text
    assert table_rows[BUSY_TABLE].endswith("fresh (data 0.0 min ago; stale after 1.0 min)"), text
    assert table_rows[SUMMARY_TABLE].endswith("unknown (never materialized)"), text
