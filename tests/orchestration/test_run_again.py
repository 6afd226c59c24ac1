"""`eventide run` again with nothing new: no query starts Spark, no summary runs again (the sensors'
cursors are kept in the Dagster instance under the home); the Dagster daemon over the same home
launches nothing either (one memory); a new day then runs just that day. Real Spark, Delta and
Dagster (its daemon as `eventide ui` runs it)."""

import os
import sys
import time
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.scheduler.instigation import TickStatus

from examples.logs import SUMMARY_TABLE
from orchestration.definitions import build_definitions
from orchestration.runner import WORKSPACE_FILE, _sensor_origin, load_cursors, run_all
from tests.conftest import REPO, land
from tests.spark_cluster import Daemon
from tests.transforms.test_logs_app import LOG_FILES, expected_summary, log_messages
from transforms import lake

pytestmark = pytest.mark.spark


def _summary(settings):
    return sorted((r["day"].isoformat(), r["status"], r["count"])
                  for r in lake.read(settings.table_path(SUMMARY_TABLE)).to_pylist())


def test_a_second_run_does_nothing_and_a_new_day_runs_only_that_day(spark, settings):
    import transforms.spark

    land(settings, "logs", log_messages(LOG_FILES[:3]))
    said = []
    assert run_all(settings, progress=said.append).passed
    assert "  daily_summary_job: 1 run(s): 2004-03-07..2004-03-09" in said  # adjacent days: one run
    version = lake.version(settings.table_path(SUMMARY_TABLE))
    daemon_launches_nothing(settings, settings.home.parent / "daemon.log")

    def no_spark(*args, **kwargs):
        raise AssertionError("a run with nothing new asked for a Spark session")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(transforms.spark, "get_spark", no_spark)
        mp.setattr("assets.resources.get_spark", no_spark)
        said.clear()
        assert run_all(settings, progress=said.append).passed
    assert "  nothing due" in said and not any("run(s)" in s for s in said)
    assert lake.version(settings.table_path(SUMMARY_TABLE)) == version  # nothing rewritten

    land(settings, "logs", log_messages(LOG_FILES[3:]))
    said.clear()
    assert run_all(settings, progress=said.append).passed
    assert "  daily_summary_job: 1 run(s): 2004-03-10" in said
    assert _summary(settings) == expected_summary()


def daemon_launches_nothing(settings, log: Path, ticks: int = 2, timeout: float = 180) -> None:
    """Run the Dagster daemon (as `eventide ui` does, over the workspace) until each sensor has ticked
    `ticks` times: every tick skipped and no run launched, since `eventide run` left their cursors."""
    defs = build_definitions(settings.registry)
    names = [s.name for s in defs.sensors]
    with dg.DagsterInstance.from_config(str(settings.dagster_home)) as instance:
        assert set(load_cursors(instance, defs)) == set(names)  # the pipelines' sensor's too
        runs_before = len(instance.get_runs())
    env = {**os.environ, "DAGSTER_HOME": str(settings.dagster_home.absolute()),
           "EVENTIDE_HOME": str(settings.home.absolute()), "EVENTIDE_APPS": settings.apps}
    daemon = Daemon("dagster-daemon", [str(Path(sys.executable).with_name("dagster-daemon")), "run",
                                       "-w", str(WORKSPACE_FILE)], log).start(env, REPO)
    try:
        deadline = time.monotonic() + timeout
        while True:
            with dg.DagsterInstance.from_config(str(settings.dagster_home)) as instance:
                seen = {n: instance.get_ticks(_sensor_origin(n).get_id(), _sensor_origin(n).get_selector().get_id())
                        for n in names}
                runs = instance.get_runs()
            if all(len(t) >= ticks for t in seen.values()):
                break
            assert daemon.running(), daemon.tail()
            assert time.monotonic() < deadline, f"sensor ticks after {timeout} s: {seen}\n{daemon.tail()}"
            time.sleep(2)
    finally:
        daemon.stop()
    for name, t in seen.items():
        assert all(tick.status == TickStatus.SKIPPED for tick in t), (name, [(x.status, x.skip_reason) for x in t])
    assert len(runs) == runs_before, [r.job_name for r in runs[: len(runs) - runs_before]]
