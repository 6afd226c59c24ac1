"""`eventide run` again with nothing new: no query starts Spark, no summary runs again (the sensors'
cursors, the summary's automation sensor's evaluation state among them, are kept in the Dagster
instance under the home); the Dagster daemon over the same home launches nothing either (one memory);
a new day with its marker then makes the daemon's automation sensor launch one summary run, for that
day only. Real Spark, Delta and Dagster (its daemon as `eventide ui` runs it, its runs in run workers
of their own)."""

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.scheduler.instigation import TickStatus

from examples.logs import SUMMARY_TABLE
from orchestration import cli
from orchestration.definitions import build_definitions
from orchestration.runner import AUTOMATION_JOB, WORKSPACE_FILE, _sensor_origin, load_cursors, run_all
from tests.conftest import REPO, land
from tests.spark_cluster import Daemon
from tests.transforms.test_logs_app import LOG_FILES, expected_summary, log_messages
from transforms import lake

pytestmark = pytest.mark.spark

NEW_DAY = "2004-03-10"  # the day of LOG_FILES[3]


def _summary(settings):
    return sorted((r["day"].isoformat(), r["status"], r["count"])
                  for r in lake.read(settings.table_path(SUMMARY_TABLE)).to_pylist())


def test_a_second_run_does_nothing_and_a_new_day_runs_only_that_day(spark, settings):
    import transforms.spark

    land(settings, "logs", log_messages(LOG_FILES[:3]))
    said, started = [], []
    assert run_all(settings, progress=said.append, started=lambda: started.append(list(said))).passed
    assert started == [["running the pipelines (bronze, apps, quarantine) through Dagster ..."]]  # once, first
    assert "  daily_return_code_summary: 1 run(s): 2004-03-07..2004-03-09" in said  # adjacent days: one run
    version = lake.version(settings.table_path(SUMMARY_TABLE))

    def no_spark(*args, **kwargs):
        raise AssertionError("a run with nothing new asked for a Spark session")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(transforms.spark, "get_spark", no_spark)
        mp.setattr("assets.resources.get_spark", no_spark)
        said.clear()
        assert run_all(settings, progress=said.append).passed
    assert "  nothing due" in said and not any("run(s)" in s for s in said)
    assert lake.version(settings.table_path(SUMMARY_TABLE)) == version  # nothing rewritten

    log = settings.home.parent / "daemon.log"
    assert {"new_segments_sensor", "daily_summary_automation"} == set(_sensor_names(settings))
    with dg.DagsterInstance.from_config(str(settings.dagster_home)) as instance:
        assert set(load_cursors(instance, build_definitions(settings.registry))) == set(_sensor_names(settings))
    runs_before = _run_ids(settings)
    ran = _tick_ids(settings)  # the ticks `eventide run` recorded of its own evaluations: not the daemon's
    with running_daemon(settings, log) as daemon:
        ticks = _wait_for(settings, daemon, lambda ticks, runs: all(len(t) >= 2 for t in ticks.values()), ran)
    for name, t in ticks.items():  # what `eventide run` did, the daemon does not redo
        assert all(tick.status == TickStatus.SKIPPED for tick in t), (name, [(x.status, x.skip_reason) for x in t])
    assert _run_ids(settings) == runs_before

    # A new day and its marker land (`eventide ingest --end-of-day`), the pipelines run (their sensor's
    # cursor moves with them); the daemon then launches one summary run, for that day only.
    assert cli.main(["ingest", "logs", str(LOG_FILES[3]), "--end-of-day"]) == 0
    assert run_all(settings, progress=said.append, summaries=False).passed
    runs_before = _run_ids(settings)
    ticks_before = {name: {t.tick_id for t in ts} for name, ts in ticks.items()}
    # A grace of a century: the day is due by its closed window alone, not by the clock (2004 is long over).
    with running_daemon(settings, log, EVENTIDE_DAY_GRACE_HOURS="876000") as daemon:
        def settled(ticks, runs):
            """The daemon launched a run and it ended, and each sensor ticked after that."""
            new = [r for r in runs if r.dagster_run.run_id not in runs_before]
            if not new or not all(r.dagster_run.is_finished for r in new):
                return False
            ended = max(r.end_time for r in new)
            return all(any(t.tick_id not in ticks_before[n] and t.timestamp > ended for t in ts) for n, ts in ticks.items())

        ticks = _wait_for(settings, daemon, settled, ran, timeout=300)
    with dg.DagsterInstance.from_config(str(settings.dagster_home)) as instance:
        new = [r for r in instance.get_runs() if r.run_id not in runs_before]
    assert [(r.job_name, r.tags.get("dagster/partition"), r.status, sorted(k.to_user_string() for k in r.asset_selection))
            for r in new] == [(AUTOMATION_JOB, NEW_DAY, dg.DagsterRunStatus.SUCCESS, [SUMMARY_TABLE])], daemon.tail()
    launched = [(name, t.run_ids) for name, ts in ticks.items() for t in ts
                if t.tick_id not in ticks_before[name] and t.status != TickStatus.SKIPPED]
    assert launched == [("daily_summary_automation", [new[0].run_id])], launched
    assert _summary(settings) == expected_summary()


def _sensor_names(settings) -> list[str]:
    """The sensors the daemon ticks: those running by default (the pipelines' and the summary's automation)."""
    return [s.name for s in build_definitions(settings.registry).sensors
            if s.default_status == dg.DefaultSensorStatus.RUNNING]


def _run_ids(settings) -> set[str]:
    with dg.DagsterInstance.from_config(str(settings.dagster_home)) as instance:
        return {r.run_id for r in instance.get_runs()}


@contextmanager
def running_daemon(settings, log: Path, **env) -> Iterator[Daemon]:
    """The Dagster daemon over the workspace and the home, as `eventide ui` runs it; stopped (its
    process group: code server, run workers) on the way out."""
    env = {**os.environ, "DAGSTER_HOME": str(settings.dagster_home.absolute()),
           "EVENTIDE_HOME": str(settings.home.absolute()), "EVENTIDE_APPS": settings.apps,
           "EVENTIDE_SENSOR_INTERVAL_SECONDS": "5", **env}  # ticks every 5 s, not 30: the waits below are for ticks
    daemon = Daemon("dagster-daemon", [str(Path(sys.executable).with_name("dagster-daemon")), "run",
                                       "-w", str(WORKSPACE_FILE)], log).start(env, REPO)
    try:
        yield daemon
    finally:
        daemon.stop()


def _ticks(instance, name: str) -> list:
    return instance.get_ticks(_sensor_origin(name).get_id(), _sensor_origin(name).get_selector().get_id())


def _tick_ids(settings) -> dict[str, set]:
    with dg.DagsterInstance.from_config(str(settings.dagster_home)) as instance:
        return {n: {t.tick_id for t in _ticks(instance, n)} for n in _sensor_names(settings)}


def _wait_for(settings, daemon: Daemon, done, other: dict[str, set], timeout: float = 180) -> dict[str, list]:
    """Poll the instance until `done(ticks by sensor, run records)`; returns the finished ticks, without
    those whose ids are in `other`. A tick still in progress (STARTED) is left out: it has no outcome yet
    to judge (a clean clone's CI once read one mid-evaluation)."""
    names = _sensor_names(settings)
    deadline = time.monotonic() + timeout
    while True:
        with dg.DagsterInstance.from_config(str(settings.dagster_home)) as instance:
            ticks = {n: [t for t in _ticks(instance, n) if t.tick_id not in other[n] and t.status != TickStatus.STARTED]
                     for n in names}
            runs = instance.get_run_records()
        if done(ticks, runs):
            return ticks
        assert daemon.running(), daemon.tail()
        assert time.monotonic() < deadline, f"not done after {timeout} s: {ticks}\n{daemon.tail()}"
        time.sleep(2)
