"""The log assets through real in-process Dagster runs, Spark and Delta, on one home.

The module lands day_1..day_2 (each line a message, END_OF_DAY after each file), runs the pipelines,
lands day_3..day_4, runs again, then summarizes every day `eventide run` would. The tests below then
check the result, run everything again, backfill a deleted partition and tamper with partitions.
They share the home, so they run in file order.
"""

import datetime as dt
import socket
import threading
import time
from dataclasses import dataclass, field

import dagster as dg
import pyarrow as pa
import pytest

from examples import logs_assets
from examples.logs import SUMMARY_SCHEMA, SUMMARY_TABLE, WINDOWS_TABLE, stored_summary
from orchestration.runner import AUTOMATION_JOB, QUIET, dagster_instance, due_runs
from orchestration.sensors import PIPELINES_JOB
from tests.transforms.test_logs_app import LOG_FILES, expected_summary, log_messages, summary_rows
from transforms import lake
from transforms.ingestion.framing import DEFAULT_FRAMING
from transforms.settings import Settings, reset_settings

pytestmark = pytest.mark.spark

LOGS_PIPELINES = dg.define_asset_job("logs_pipelines", selection=dg.AssetSelection.assets("bronze_log_lines", WINDOWS_TABLE))
SUMMARY_CHECKS = dg.define_asset_job("summary_checks", selection=dg.AssetSelection.checks_for_assets(SUMMARY_TABLE))



def _defs() -> dg.Definitions:
    from orchestration.definitions import defs

    return dg.Definitions.merge(defs, dg.Definitions(jobs=[LOGS_PIPELINES, SUMMARY_CHECKS]))


DEFS = _defs()
DAYS = ["2004-03-07", "2004-03-08", "2004-03-09", "2004-03-10"]


class Receiver:
    """A TCP sink's far end: accepts connections one after another and keeps every byte."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.server.getsockname()[1]}"
        self.data = bytearray()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            conn, _ = self.server.accept()
            with conn:
                while chunk := conn.recv(65536):
                    self.data += chunk

    def wait_for(self, n_bytes: int, timeout: float = 5.0) -> bytes:
        deadline = time.time() + timeout
        while len(self.data) < n_bytes and time.time() < deadline:
            time.sleep(0.05)
        return bytes(self.data)


@dataclass
class Home:
    settings: Settings
    instance: dg.DagsterInstance
    lines_sink: Receiver
    json_sink: Receiver
    summary_runs: dict = field(default_factory=dict)  # day -> ExecuteInProcessResult


def materialize_pipelines(home: Home):
    result = DEFS.resolve_job_def(LOGS_PIPELINES.name).execute_in_process(instance=home.instance, run_config=QUIET)
    assert result.success
    return result


def summarize(home: Home, day: str, **kwargs):
    return DEFS.resolve_job_def(logs_assets.SUMMARY_JOB).execute_in_process(
        instance=home.instance, partition_key=day, run_config=QUIET, raise_on_error=False, **kwargs)


def materialization(result) -> dict:
    (ev,) = result.get_asset_materialization_events()
    return {k: getattr(v, "value", v) for k, v in ev.event_specific_data.materialization.metadata.items()}


def checks(result) -> dict[str, bool]:
    return {c.check_name: c.passed for c in result.get_asset_check_evaluations()}


def due_days(home: Home) -> list[str]:
    """The days `eventide run` summarizes: what the summary's automation sensor requests (Dagster's
    evaluation of DayDue; adjacent days come as one ranged run)."""
    runs = due_runs(DEFS, home.instance, skip_jobs=(PIPELINES_JOB,))
    assert {(r.job, r.requested_by, r.name) for r in runs} <= {
        (AUTOMATION_JOB, logs_assets.daily_summary_automation.name, SUMMARY_TABLE)}, runs
    return [d for r in runs for d in logs_assets.DAILY.get_partition_keys_in_range(
        dg.PartitionKeyRange(r.partition_key, r.through or r.partition_key))]


def _spark(home: Home):
    from transforms.spark import get_spark

    return get_spark(home.settings)


def delete_day(home: Home, day: str) -> None:
    """Empty one day's partition of the summary (what a user's mistake would do)."""
    lake.replace_where(_spark(home).createDataFrame(SUMMARY_SCHEMA.empty_table()), home.settings.table_path(SUMMARY_TABLE),
                       f"day = '{day}'", partition_by=["day"])


def summary_table(home: Home) -> list[tuple[str, int, int]]:
    return summary_rows([lake.read(home.settings.table_path(SUMMARY_TABLE))])


@pytest.fixture(scope="module")
def home(spark, tmp_path_factory):
    from tests.conftest import land

    with pytest.MonkeyPatch.context() as mp:
        lines_sink, json_sink = Receiver(), Receiver()
        mp.setenv("EVENTIDE_HOME", str(tmp_path_factory.mktemp("logs_assets") / "home"))
        mp.setenv("DAGSTER_HOME", "")  # dagster_instance points it into the home; restored afterwards
        mp.setenv("EVENTIDE_SINK_LOG_COUNTS", lines_sink.address)
        mp.setenv("EVENTIDE_SINK_LOG_WINDOWS_JSON", json_sink.address)
        reset_settings()
        settings = Settings.from_env()
        h = Home(settings, dagster_instance(settings), lines_sink, json_sink)
        land(settings, "logs", log_messages(LOG_FILES[:2]))
        materialize_pipelines(h)
        land(settings, "logs", log_messages(LOG_FILES[2:]))
        materialize_pipelines(h)
        days = due_days(h)
        assert days == DAYS
        h.summary_runs = {day: summarize(h, day) for day in days}
        yield h
    reset_settings()


def test_lineage_reads_landing_bronze_windows_summary_with_checks():
    from orchestration.definitions import defs

    graph = defs.resolve_asset_graph()
    parents = {k: {p.to_user_string() for p in graph.get(dg.AssetKey(k)).parent_keys}
               for k in ("bronze_log_lines", WINDOWS_TABLE, SUMMARY_TABLE)}
    assert "landing_logs" in parents["bronze_log_lines"]
    assert {"landing_logs", "bronze_log_lines"} <= parents[WINDOWS_TABLE]
    assert WINDOWS_TABLE in parents[SUMMARY_TABLE]
    assert {c.name for c in graph.asset_check_keys if c.asset_key == dg.AssetKey(SUMMARY_TABLE)} == {
        "rows_are_valid", "total_matches_bronze", "reconciles_with_bronze"}
    assert graph.get(dg.AssetKey(SUMMARY_TABLE)).group_name == graph.get(dg.AssetKey(WINDOWS_TABLE)).group_name == "logs"
    assert defs.resolve_job_def(logs_assets.SUMMARY_JOB).partitions_def == logs_assets.DAILY
    # The summary's one trigger: its automation condition, evaluated by its automation sensor (on by default).
    assert graph.get(dg.AssetKey(SUMMARY_TABLE)).automation_condition == logs_assets.SUMMARY_AUTOMATION
    summary_sensors = [s for s in defs.sensors if s.name == "daily_summary_automation"]
    assert [s.default_status for s in summary_sensors] == [dg.DefaultSensorStatus.RUNNING]
    assert not defs.schedules and not any(
        t.job_name == logs_assets.SUMMARY_JOB for s in defs.sensors if s.sensor_type.name == "STANDARD" for t in s.targets)


def test_summary_equals_the_readme_table_and_checks_pass(home):
    assert summary_table(home) == expected_summary()
    for day, result in home.summary_runs.items():
        assert result.success, day
        assert checks(result) == {"rows_are_valid": True, "total_matches_bronze": True, "reconciles_with_bronze": True}
        assert materialization(result)["source"] == "log_windows"
    windows = lake.read(home.settings.table_path(WINDOWS_TABLE)).to_pylist()
    assert len(windows) == 15 and {w["close_reason"] for w in windows} == {"marker"}


def test_tcp_sinks_send_seed_lines_and_wallaroo_json(home):
    expected_lines = "".join(f"{d} {s} {n}\n" for d, s, n in expected_summary()).encode()
    assert home.lines_sink.wait_for(len(expected_lines)) == expected_lines
    json_objects = [b'{"200": 147, "401": 48, "404": 1}', b'{"200": 478, "304": 12, "401": 67, "404": 2}',
                    b'{"200": 205, "302": 3, "304": 22, "401": 2, "408": 1}', b'{"200": 205, "302": 2, "304": 79}']
    framed = DEFAULT_FRAMING.encode_many(json_objects)
    assert home.json_sink.wait_for(len(framed)) == framed


def test_a_day_is_due_when_its_window_closed_before_the_clock_says_so(home, monkeypatch):
    """DayDue by the windows alone: a day whose closed windows hold more lines than its summary is due
    before it is over by the clock; so is it to the automation sensor (a grace of a century keeps the
    clock out of it). Summarized again, nothing is due."""
    before_any_day_ended = dt.datetime(2004, 3, 7, tzinfo=dt.timezone.utc)
    assert logs_assets.days_due(home.settings, before_any_day_ended) == []  # every closed window summarized
    delete_day(home, "2004-03-09")
    assert logs_assets.days_due(home.settings, before_any_day_ended) == [dt.date(2004, 3, 9)]
    monkeypatch.setenv("EVENTIDE_DAY_GRACE_HOURS", "876000")
    assert due_days(home) == ["2004-03-09"]
    assert summarize(home, "2004-03-09").success
    assert due_days(home) == [] and logs_assets.days_due(home.settings, before_any_day_ended) == []
    assert summary_table(home) == expected_summary()


def test_running_again_changes_nothing(home):
    paths = [home.settings.table_path(t) for t in ("bronze_log_lines", WINDOWS_TABLE, SUMMARY_TABLE)]
    versions = [lake.version(p) for p in paths]
    materialize_pipelines(home)
    assert due_days(home) == []  # nothing new: the automation asks for nothing
    for day in DAYS:  # and a summary run anyway replaces nothing
        result = summarize(home, day)
        assert result.success and materialization(result)["replaced"] is False
    assert [lake.version(p) for p in paths] == versions
    assert summary_table(home) == expected_summary()


def test_automation_and_backfill_restore_a_deleted_partition(home, capsys):
    from orchestration.backfill import backfill

    assert due_days(home) == []  # every day over by the clock is summarized
    delete_day(home, "2004-03-08")
    assert stored_summary(home.settings, "2004-03-08").num_rows == 0
    assert due_days(home) == ["2004-03-08"]

    assert backfill(home.settings, "2004-03-08") == 0
    out = capsys.readouterr().out
    assert "daily_summary_job, 1 day(s)" in out
    assert "2004-03-08: replaced, 4 rows, 559 lines from bronze_log_lines (3 checks passed" in out
    assert summary_table(home) == expected_summary()
    assert due_days(home) == []
    # A run of a backfill launched from the Dagster UI carries `dagster/backfill`: recomputed from bronze too.
    result = summarize(home, "2004-03-07", tags={"dagster/backfill": "from-the-ui"})
    assert result.success and materialization(result)["source"] == "bronze_log_lines"
    assert summary_table(home) == expected_summary()


def test_checks_fail_on_tampered_partitions(home):
    path = home.settings.table_path(SUMMARY_TABLE)

    def tamper(day: str, change):
        rows = change(stored_summary(home.settings, day).to_pylist())
        lake.replace_where(_spark(home).createDataFrame(pa.Table.from_pylist(rows, schema=SUMMARY_SCHEMA)), path,
                           f"day = '{day}'", partition_by=["day"])

    def run_checks(day: str) -> dict[str, bool]:
        # Checks alone: Dagster 1.13 refuses partition_key for a checks-only job; the tag is what it sets.
        result = DEFS.resolve_job_def(SUMMARY_CHECKS.name).execute_in_process(
            instance=home.instance, run_config=QUIET, raise_on_error=False, tags={"dagster/partition": day})
        assert not result.success or all(checks(result).values())  # a failed blocking check fails the run
        return checks(result)

    assert set(run_checks("2004-03-09").values()) == {True}
    tamper("2004-03-09", lambda rows: rows + [{"day": dt.date(2004, 3, 9), "status": 700, "count": 1}])
    assert run_checks("2004-03-09") == {"rows_are_valid": False, "total_matches_bronze": False, "reconciles_with_bronze": False}

    tamper("2004-03-10", lambda rows: [{**r, "count": r["count"] - (r["status"] == 200)} for r in rows])
    assert run_checks("2004-03-10") == {"rows_are_valid": True, "total_matches_bronze": False, "reconciles_with_bronze": False}

    # Materializing the partition again replaces the tampered rows; its checks pass.
    result = summarize(home, "2004-03-10")
    assert result.success and materialization(result)["replaced"] is True
    assert set(checks(result).values()) == {True}


def test_a_backfill_of_many_days_is_one_run_with_each_days_checks(home, capsys):
    from orchestration.backfill import backfill
    from orchestration.runner import RANGE_END, RANGE_START, runs_as_one

    def check_records(run_id: str) -> dict[tuple[str, str], bool]:
        out = {}
        for name in ("rows_are_valid", "total_matches_bronze", "reconciles_with_bronze"):
            key = dg.AssetCheckKey(dg.AssetKey(SUMMARY_TABLE), name)
            for rec in home.instance.event_log_storage.get_asset_check_execution_history(key, limit=50):
                if rec.run_id == run_id and rec.partition is not None:
                    out[(rec.partition, name)] = rec.status.value == "SUCCEEDED"
        return out

    # The checks over a range, one run: each day gets its own evaluation; 2004-03-09 is still tampered.
    result = DEFS.resolve_job_def(SUMMARY_CHECKS.name).execute_in_process(
        instance=home.instance, run_config=QUIET, raise_on_error=False,
        tags={RANGE_START: DAYS[0], RANGE_END: DAYS[-1]})
    per_day = {(c.partition, c.check_name): c.passed for c in result.get_asset_check_evaluations() if c.partition}
    assert per_day == {(d, n): d != "2004-03-09" for d in DAYS
                       for n in ("rows_are_valid", "total_matches_bronze", "reconciles_with_bronze")}
    assert check_records(result.run_id) == per_day  # what the Dagster UI shows per partition
    assert not any(c.passed for c in result.get_asset_check_evaluations() if c.partition is None)  # the range's

    # A backfill of the four days, one of them deleted, one tampered: one run, each day recounted and checked.
    delete_day(home, "2004-03-08")
    assert runs_as_one(DEFS.resolve_job_def(logs_assets.SUMMARY_JOB))
    capsys.readouterr()
    assert backfill(home.settings, DAYS[0], DAYS[-1]) == 0
    out = capsys.readouterr().out
    assert "daily_summary_job, 4 day(s) in one run" in out and "1 of 1 run(s) done" in out, out
    assert "2004-03-08: replaced, 4 rows, 559 lines from bronze_log_lines (3 checks passed" in out
    assert "2004-03-09: replaced" in out and "2004-03-07: unchanged" in out
    assert summary_table(home) == expected_summary()
    (run,) = home.instance.get_runs(limit=1)
    assert run.tags[RANGE_START] == DAYS[0] and run.tags[RANGE_END] == DAYS[-1]
    assert check_records(run.run_id) == {(d, n): True for d in DAYS
                                          for n in ("rows_are_valid", "total_matches_bronze", "reconciles_with_bronze")}
